"""The retained messages API (``/api/retained``): list the retained messages whose Topic
Name matches a Topic Filter, delete one topic's (MQTT 3.3.1.3).

Reads come from the state topics (:class:`~services.admin.state.ClientState`); a delete
goes to Kafka (:func:`~services.admin.commands.retained_delete_record`) and is audited.
"""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, Request

from services.admin import models
from services.admin.auth import ERRORS, User
from services.admin.commands import retained_delete_record
from services.admin.context import UNAVAILABLE, Limit, Offset, audited, context_of, synced
from services.common.mqtt.errors import MQTTError
from services.common.topics.validation import validate_topic_filter, validate_topic_name

router = APIRouter(prefix="/api/retained", tags=["retained"])
"""Included by :func:`services.admin.api.create_app`."""

#: Payload bytes of a retained message shown by the API.
PAYLOAD_PREVIEW = 1024

TOPIC_NAME = r"^[^+#\x00]+$"
"""A Topic Name, as the OpenAPI document says it (MQTT 4.7.1, 4.7.3: no wildcard, no
U+0000); :func:`validate_topic_name` is the rule itself."""

TOPIC_FILTER = r"^(#|(\+|[^+#/\x00]*)(/(\+|[^+#/\x00]*))*(/#)?)$"
"""A Topic Filter, as the OpenAPI document says it (MQTT 4.7.1: ``+`` a whole level, ``#``
the last whole level); :func:`validate_topic_filter` is the rule itself."""

TOPIC_CHARS = 16383
"""The longest Topic Name or Filter the API takes, in characters: any 16,383 characters
fit in MQTT's 65,535 bytes of UTF-8 (MQTT 1.5.4)."""


def payload_preview(payload: bytes) -> tuple[str, Literal["utf-8", "base64"]]:
    """The first :data:`PAYLOAD_PREVIEW` bytes of a message's payload as the API shows
    them: as text if they are UTF-8, else in base64; and which of the two."""
    preview = payload[:PAYLOAD_PREVIEW]
    try:
        return preview.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(preview).decode("ascii"), "base64"


def _retained_view(topic: str, message: Any) -> models.RetainedView:
    payload: bytes = message.payload
    text, encoding = payload_preview(payload)
    return models.RetainedView(
        topic=topic,
        qos=message.meta.qos,
        payload_size=len(payload),
        payload=text,
        payload_encoding=encoding,
        received_at=datetime.fromtimestamp(message.meta.received_at_ms / 1000, UTC),
    )


@router.get("", response_model=models.RetainedPage, responses=ERRORS)
async def retained(
    request: Request,
    user: User,
    offset: Offset = 0,
    limit: Limit = 50,
    topic_filter: Annotated[
        str,
        Query(
            alias="filter",
            min_length=1,
            max_length=TOPIC_CHARS,
            pattern=TOPIC_FILTER,
            description="An MQTT Topic Filter (MQTT 4.7.1).",
        ),
    ] = "#",
) -> models.RetainedPage:
    """The retained messages whose Topic Name matches the Topic Filter (MQTT 4.7)."""
    try:
        validate_topic_filter(topic_filter)
    except MQTTError as exc:
        raise HTTPException(422, f"not a Topic Filter: {exc.message}") from exc
    context = context_of(request)
    await synced(context)
    matching = sorted(context.state.retained.match(topic_filter), key=lambda item: item[0])
    return models.RetainedPage(
        total=len(matching),
        offset=offset,
        limit=limit,
        items=[_retained_view(t, m) for t, m in matching[offset : offset + limit]],
    )


@router.delete(
    "",
    response_model=models.Accepted,
    status_code=202,
    responses={**ERRORS, **UNAVAILABLE},
)
async def delete_retained(
    request: Request,
    user: User,
    topic: Annotated[
        str,
        Query(
            min_length=1,
            max_length=TOPIC_CHARS,
            pattern=TOPIC_NAME,
            description="An MQTT Topic Name (no wildcards).",
        ),
    ],
) -> models.Accepted:
    """Delete the retained message of a topic (as an empty retained PUBLISH does)."""
    try:
        validate_topic_name(topic)
    except MQTTError as exc:
        raise HTTPException(422, f"not a Topic Name: {exc.message}") from exc
    context = context_of(request)

    async def change() -> models.Accepted:
        await context.writer.write([retained_delete_record(context.state.names, topic)])
        return models.Accepted(action="delete-retained", target=topic, detail={})

    return await audited(context, user, "delete-retained", topic, {}, change)
