"""The sessions API (``/api/sessions``): list sessions (connected clients, and persistent
sessions waiting for theirs), show one, disconnect its client, end it.

Reads come from the state topics (:class:`~services.admin.state.ClientState`) and the
DEVICE store; changes go to Kafka (:mod:`services.admin.commands`) and are audited.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, Request

from services.admin import models, subscriptions_api
from services.admin.auth import ERRORS, User
from services.admin.cluster import Probe
from services.admin.commands import disconnect_records
from services.admin.context import (
    UNAVAILABLE,
    AdminContext,
    ClientIdPattern,
    Limit,
    Offset,
    audited,
    client_id_matches,
    context_of,
    synced,
)
from services.common.metrics import PROTOCOL_VERSIONS
from services.common.records import SessionRecord
from services.common.sessions import DeliveryPath, delivery_path, kept_seconds
from services.common.stores.base import StoreError

log = logging.getLogger(__name__)

router = APIRouter(prefix="/api/sessions", tags=["sessions"])
"""Included by :func:`services.admin.api.create_app`."""

_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": models.Problem, "description": "No such session."}
}


def _ms(value: int) -> datetime | None:
    return datetime.fromtimestamp(value / 1000, UTC) if value else None


def _summary(context: AdminContext, client_id: str, session: SessionRecord) -> dict[str, Any]:
    return {
        "client_id": client_id,
        "connected": session.connected,
        "node_id": session.node_id,
        "protocol_version": PROTOCOL_VERSIONS.get(session.protocol_version, "unknown"),
        "kind": session.kind.name,
        "persistent": session.persistent,
        "clean_start": session.clean_start,
        "session_expiry_interval": session.session_expiry_interval,
        "connected_at": _ms(session.connected_at_ms),
        "updated_at": _ms(session.updated_at_ms),
        "client_address": context.state.address_of(client_id, session),
        "subscriptions": len(context.state.subscriptions.get(client_id, ())),
    }


def _app_lag(probes: list[Probe], client_id: str) -> int | None:
    for probe in probes:
        for labels, value in probe.samples.get("cormorant_app_client_lag_records", ()):
            if labels.get("client_id") == client_id:
                return int(value)
    return None


def _session_of(context: AdminContext, client_id: str) -> SessionRecord:
    session = context.state.sessions.get(client_id)
    if session is None:
        raise HTTPException(404, f"no session of client {client_id!r}")
    return session


@router.get("", response_model=models.ClientPage, responses=ERRORS)
async def sessions(
    request: Request,
    user: User,
    offset: Offset = 0,
    limit: Limit = 50,
    search: Annotated[
        str | None, Query(max_length=256, description="Part of the client id.")
    ] = None,
    connected: Annotated[bool | None, Query(description="Connected or not.")] = None,
    node: Annotated[str | None, Query(max_length=64, description="Ingest node id.")] = None,
    kind: Annotated[Literal["DEVICE", "APPLICATION"] | None, Query()] = None,
    persistent: Annotated[bool | None, Query()] = None,
    pattern: ClientIdPattern = None,
) -> models.ClientPage:
    """Sessions (connected clients, and persistent sessions waiting for theirs), by
    client id, filtered."""
    context = context_of(request)
    await synced(context)
    matching = [
        (client_id, session)
        for client_id, session in sorted(context.state.sessions.items())
        if (search is None or search in client_id)
        and client_id_matches(pattern, client_id)
        and (connected is None or session.connected == connected)
        and (node is None or session.node_id == node)
        and (kind is None or session.kind.name == kind)
        and (persistent is None or session.persistent == persistent)
    ]
    page = matching[offset : offset + limit]
    return models.ClientPage(
        total=len(matching),
        offset=offset,
        limit=limit,
        items=[models.ClientSummary(**_summary(context, c, s)) for c, s in page],
    )


@router.get(
    "/{client_id:path}",
    response_model=models.SessionDetail,
    responses={**ERRORS, **_NOT_FOUND},
)
async def session_detail(request: Request, client_id: str, user: User) -> models.SessionDetail:
    """One session: its connection, subscriptions, and what waits for it."""
    context = context_of(request)
    await synced(context)
    session = _session_of(context, client_id)
    stats = None
    if delivery_path(session) is DeliveryPath.PERSISTED:
        try:
            stats = await context.store.stats(client_id)
        except StoreError as exc:
            log.info("stored messages of %r unknown: %r", client_id, exc)
    return models.SessionDetail(
        **_summary(context, client_id, session),
        connection_id=session.connection_id.hex(),
        session_id=session.session_id.hex(),
        receive_maximum=session.receive_maximum,
        kept_seconds=(
            kept_seconds(session, context.settings.session_expiry_max_seconds)
            if session.persistent
            else None
        ),
        subscription_list=[
            subscriptions_api.view(s) for s in context.state.subscriptions.get(client_id, ())
        ],
        stored_messages=None if stats is None else stats.stored,
        dropped_messages=None if stats is None else stats.dropped,
        app_lag=_app_lag(context.sampler.probes, client_id),
    )


@router.post(
    "/{client_id:path}/disconnect",
    response_model=models.Accepted,
    status_code=202,
    responses={
        **ERRORS,
        **_NOT_FOUND,
        **UNAVAILABLE,
        409: {"model": models.Problem, "description": "The client is not connected."},
    },
)
async def disconnect(request: Request, client_id: str, user: User) -> models.Accepted:
    """Disconnect the client (DISCONNECT 0x98 Administrative action); its session
    stays as its Session Expiry Interval says."""
    context = context_of(request)

    async def change() -> models.Accepted:
        await synced(context)
        session = _session_of(context, client_id)
        if not session.connected:
            raise HTTPException(409, f"client {client_id!r} is not connected")
        await context.writer.write(
            disconnect_records(context.state.names, client_id, session, end_session=False)
        )
        return models.Accepted(
            action="disconnect", target=client_id, detail={"node_id": session.node_id}
        )

    return await audited(context, user, "disconnect", client_id, {}, change)


@router.delete(
    "/{client_id:path}",
    response_model=models.Accepted,
    status_code=202,
    responses={**ERRORS, **_NOT_FOUND, **UNAVAILABLE},
)
async def delete_session(request: Request, client_id: str, user: User) -> models.Accepted:
    """End the session: a connected client is disconnected (0x98) and its session
    ends with the connection; its subscriptions and stored messages are deleted."""
    context = context_of(request)

    async def change() -> models.Accepted:
        await synced(context)
        session = _session_of(context, client_id)
        await context.writer.write(
            disconnect_records(context.state.names, client_id, session, end_session=True)
        )
        return models.Accepted(
            action="delete-session",
            target=client_id,
            detail={"node_id": session.node_id, "was_connected": session.connected},
        )

    return await audited(context, user, "delete-session", client_id, {}, change)
