"""The delayed publications API (``/api/delayed``): list the messages published to
``$delayed/<seconds>/<topic>`` that still wait, cancel one (docs/concepts/delayed-publish.md).

Reads come from ``msg.delayed`` as the admin service follows it
(:class:`~services.admin.state.ClientState`); a cancel writes the message's tombstone
(:func:`~services.common.records.delayed_tombstone`) and is audited. The ingest node that
owns the message's partition reads the tombstone and forgets the message; a message whose
publication was committed first is published all the same (the cancel came too late, and
it no longer shows in the list).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query, Request

from services.admin import models
from services.admin.auth import ERRORS, User
from services.admin.context import UNAVAILABLE, Limit, Offset, audited, context_of, synced
from services.admin.retained_api import payload_preview
from services.common.records import DELAYED_ID_SIZE, DelayedRecord, decode_meta, delayed_tombstone

router = APIRouter(prefix="/api/delayed", tags=["delayed"])
"""Included by :func:`services.admin.api.create_app`."""

DELAYED_ID = rf"^[0-9a-f]{{{2 * DELAYED_ID_SIZE}}}$"
"""A delayed publication's id in the API: its ``msg.delayed`` id in lowercase hex."""

_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": models.Problem, "description": "No such delayed publication waits."}
}


def _at(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def _delayed_view(delayed: DelayedRecord) -> models.DelayedView:
    meta = decode_meta(delayed.meta_raw)
    text, encoding = payload_preview(delayed.payload)
    return models.DelayedView(
        id=delayed.delayed_id.hex(),
        client_id=delayed.client_id,
        topic=meta.topic,
        qos=meta.qos,
        retain=meta.retain,
        payload_size=len(delayed.payload),
        payload=text,
        payload_encoding=encoding,
        received_at=_at(meta.received_at_ms),
        due_at=_at(delayed.due_at_ms),
    )


@router.get("", response_model=models.DelayedPage, responses=ERRORS)
async def delayed(
    request: Request,
    user: User,
    offset: Offset = 0,
    limit: Limit = 50,
    client_id: Annotated[
        str | None,
        Query(max_length=65535, description="Only this client's (its Client Identifier)."),
    ] = None,
) -> models.DelayedPage:
    """The delayed publications still waiting, the soonest due first."""
    context = context_of(request)
    await synced(context)
    waiting = sorted(
        (d for d in context.state.delayed.values() if client_id in (None, d.client_id)),
        key=lambda d: (d.due_at_ms, d.delayed_id),
    )
    return models.DelayedPage(
        total=len(waiting),
        offset=offset,
        limit=limit,
        items=[_delayed_view(d) for d in waiting[offset : offset + limit]],
    )


@router.delete(
    "/{delayed_id}",
    response_model=models.Accepted,
    status_code=202,
    responses={**ERRORS, **_NOT_FOUND, **UNAVAILABLE},
)
async def cancel_delayed(
    request: Request,
    user: User,
    delayed_id: Annotated[
        str, Path(pattern=DELAYED_ID, description="The id GET /api/delayed lists.")
    ],
) -> models.Accepted:
    """Cancel a delayed publication that still waits: it is not published."""
    context = context_of(request)
    await synced(context)

    async def change() -> models.Accepted:
        waiting = context.state.delayed.get(bytes.fromhex(delayed_id))
        if waiting is None:
            raise HTTPException(404, f"no delayed publication {delayed_id} waits")
        record = delayed_tombstone(context.state.names, waiting.client_id, waiting.delayed_id)
        await context.writer.write([record])
        detail = {"client_id": waiting.client_id, "topic": decode_meta(waiting.meta_raw).topic}
        return models.Accepted(action="cancel-delayed", target=delayed_id, detail=detail)

    return await audited(context, user, "cancel-delayed", delayed_id, {}, change)
