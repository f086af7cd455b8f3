"""The audit trail API (``/api/audit``): who changed what, and when
(:meth:`~services.admin.users.AdminUsers.audit_trail`)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from services.admin import models
from services.admin.auth import ERRORS, User
from services.admin.context import Limit, Offset, context_of
from services.admin.users import AuditEntry

router = APIRouter(prefix="/api/audit", tags=["audit"])
"""Included by :func:`services.admin.api.create_app`."""


def _audit(entry: AuditEntry) -> models.AuditView:
    return models.AuditView(
        id=entry.id,
        at=entry.at,
        username=entry.username,
        action=entry.action,
        target=entry.target,
        detail=entry.detail,
        status=entry.status,
    )


@router.get("", response_model=models.AuditPage, responses=ERRORS)
async def audit(
    request: Request, user: User, offset: Offset = 0, limit: Limit = 50
) -> models.AuditPage:
    """Who changed what, and when: the newest first."""
    total, entries = await context_of(request).users.audit_trail(offset, limit)
    return models.AuditPage(
        total=total,
        offset=offset,
        limit=limit,
        items=[_audit(entry) for entry in entries],
    )
