"""The subscriptions API (``/api/subscriptions``): every client's subscriptions, from the
state topics (:class:`~services.admin.state.ClientState`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from services.admin import models
from services.admin.auth import ERRORS, User
from services.admin.context import (
    ClientIdPattern,
    Limit,
    Offset,
    client_id_matches,
    context_of,
    synced,
)
from services.common.subscription import Subscription

router = APIRouter(prefix="/api/subscriptions", tags=["subscriptions"])
"""Included by :func:`services.admin.api.create_app`."""


def view(sub: Subscription) -> models.SubscriptionView:
    """``sub`` as the API shows it (MQTT 3.8.3.1: its Subscription Options)."""
    return models.SubscriptionView(
        client_id=sub.client_id,
        topic_filter=sub.topic_filter,
        qos=sub.qos,
        no_local=sub.no_local,
        retain_as_published=sub.retain_as_published,
        retain_handling=sub.retain_handling,
        subscription_identifier=sub.subscription_identifier,
    )


@router.get("", response_model=models.SubscriptionPage, responses=ERRORS)
async def subscriptions(
    request: Request,
    user: User,
    offset: Offset = 0,
    limit: Limit = 50,
    search: Annotated[
        str | None, Query(max_length=256, description="Part of the Topic Filter.")
    ] = None,
    client_id: Annotated[str | None, Query(max_length=65535, description="One client's.")] = None,
    pattern: ClientIdPattern = None,
) -> models.SubscriptionPage:
    """Every subscription, by client id, filtered."""
    context = context_of(request)
    await synced(context)
    matching = [
        sub
        for sub in context.state.all_subscriptions()
        if (client_id is None or sub.client_id == client_id)
        and client_id_matches(pattern, sub.client_id)
        and (search is None or search in sub.topic_filter)
    ]
    return models.SubscriptionPage(
        total=len(matching),
        offset=offset,
        limit=limit,
        items=[view(s) for s in matching[offset : offset + limit]],
    )
