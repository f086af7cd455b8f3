"""The delayed publications API (``/api/delayed``): list the messages published to
``$delayed/<seconds>/<topic>`` that still wait, cancel one (docs/concepts/delayed-publish.md).

Reads come from ``msg.delayed`` as the admin service follows it
(:class:`~services.admin.state.ClientState`). A cancel is audited, and ends in exactly one
of two outcomes, which the answer states: cancelled (202: it is never published) or
published already (409). Racing the due time, only the ingest node owning the message's
partition can tell which, so the cancel is a request written in that partition
(:func:`~services.common.records.delayed_cancel_record`); the owner cancels the message
unless its publication is under way, and writes the tombstone that says which happened
(:mod:`services.ingest.timed_records`); the answer waits for that tombstone, at most
``delayed_cancel_timeout_seconds`` (then 504: undecided yet, the request stays queued).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Annotated, Any, NoReturn

from fastapi import APIRouter, HTTPException, Path, Query, Request

from services.admin import models
from services.admin.auth import ERRORS, User
from services.admin.context import UNAVAILABLE, Limit, Offset, audited, context_of, synced
from services.admin.retained_api import payload_preview
from services.common.records import (
    DELAYED_ID_SIZE,
    DelayedOutcome,
    DelayedRecord,
    decode_meta,
    delayed_cancel_record,
)

router = APIRouter(prefix="/api/delayed", tags=["delayed"])
"""Included by :func:`services.admin.api.create_app`."""

DELAYED_ID = rf"^[0-9a-f]{{{2 * DELAYED_ID_SIZE}}}$"
"""A delayed publication's id in the API: its ``msg.delayed`` id in lowercase hex."""

_CANCEL_ANSWERS: dict[int | str, dict[str, Any]] = {
    404: {"model": models.Problem, "description": "No such delayed publication waits."},
    409: {
        "model": models.Problem,
        "description": "Published already (at its due time, once): too late to cancel.",
    },
    504: {
        "model": models.Problem,
        "description": "No ingest node decided within delayed_cancel_timeout_seconds: the "
        "cancel request stays queued (GET /api/delayed shows whether it still waits).",
    },
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
    responses={**ERRORS, **_CANCEL_ANSWERS, **UNAVAILABLE},
)
async def cancel_delayed(
    request: Request,
    user: User,
    delayed_id: Annotated[
        str, Path(pattern=DELAYED_ID, description="The id GET /api/delayed lists.")
    ],
) -> models.Accepted:
    """Cancel a delayed publication that still waits. 202: cancelled, it is never
    published; 409: it was published already (its due time came first)."""
    context = context_of(request)
    await synced(context)
    state = context.state
    ident = bytes.fromhex(delayed_id)

    async def change() -> models.Accepted:
        waiting = state.delayed.get(ident)
        if waiting is None:
            _gone(delayed_id, state.delayed_ended.get(ident), ident in state.delayed_ended)
        ended = state.delayed_end(ident)
        try:
            await context.writer.write(
                [delayed_cancel_record(state.names, waiting.client_id, ident)]
            )
            timeout = context.settings.delayed_cancel_timeout_seconds
            try:
                async with asyncio.timeout(timeout):
                    outcome = await ended
            except TimeoutError:
                raise HTTPException(
                    504,
                    f"the cancel of delayed publication {delayed_id} is stored, but no ingest "
                    f"node decided it within {timeout:g} s (is any running?): it is "
                    "cancelled unless its publication comes first; GET /api/delayed shows "
                    "whether it still waits",
                ) from None
        finally:
            ended.cancel()
        if outcome is not DelayedOutcome.CANCELLED:
            _gone(delayed_id, outcome, True)
        meta = decode_meta(waiting.meta_raw)
        detail = {"client_id": waiting.client_id, "topic": meta.topic, "outcome": "cancelled"}
        return models.Accepted(action="cancel-delayed", target=delayed_id, detail=detail)

    return await audited(context, user, "cancel-delayed", delayed_id, {}, change)


def _gone(delayed_id: str, outcome: DelayedOutcome | None, known: bool) -> NoReturn:
    """Raise the answer for a delayed publication that does not wait (any more): 409 if
    it was published (or ended unsaid), else 404 (``known``: it ended as ``outcome``)."""
    if not known:
        raise HTTPException(404, f"no delayed publication {delayed_id} waits")
    if outcome is DelayedOutcome.CANCELLED:
        raise HTTPException(404, f"no delayed publication {delayed_id} waits: it was cancelled")
    if outcome is DelayedOutcome.PUBLISHED:
        raise HTTPException(
            409,
            f"delayed publication {delayed_id} was published already (at its due time, "
            "once): too late to cancel",
        )
    raise HTTPException(409, f"delayed publication {delayed_id} no longer waits")
