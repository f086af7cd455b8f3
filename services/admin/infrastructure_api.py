"""The infrastructure API (``/api/infrastructure``): Kafka brokers and partitions, Redis,
PostgreSQL, HAProxy's rotation and each service process's CPU and memory, for the
console's infrastructure page (:mod:`services.admin.infrastructure`)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from services.admin.auth import ERRORS, User
from services.admin.context import context_of
from services.admin.infrastructure import Infrastructure, infrastructure

router = APIRouter(prefix="/api", tags=["cluster"])
"""Included by :func:`services.admin.api.create_app`."""


@router.get("/infrastructure", response_model=Infrastructure, responses=ERRORS)
async def show_infrastructure(request: Request, user: User) -> Infrastructure:
    """Each part asked now, within 5 s: one that does not answer says so (``reachable:
    false`` and its error) and the others are still shown."""
    context = context_of(request)
    return await infrastructure(context.settings, context.store, context.users, context.sampler)
