"""The ingest nodes API (``/api/nodes``): drain a node by hand (``cormorant drain``).

A drain is an :class:`~services.common.records.AdminDrain` command on the node's downlink
topic (``msg.downlink.<node>``), which that node alone reads, from its end, as it reads an
administrator's disconnect: no new listener on the nodes, and the admin API's own
authentication and audit. The node then leaves the load balancer's rotation (``/ready``
fails, its listeners close) and disconnects its clients with Reason Code 0x9C Use another
server, paced by ``drain_rate`` within the window asked for; it stays up, out of rotation,
until it is stopped (docs/operations/drain.md).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request

from services.admin import models
from services.admin.auth import ERRORS, User
from services.admin.context import UNAVAILABLE, AdminContext, audited, context_of, synced
from services.common.records import AdminDrain, admin_drain_record

router = APIRouter(prefix="/api/nodes", tags=["nodes"])
"""Included by :func:`services.admin.api.create_app`."""

_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": models.Problem, "description": "No such ingest node."}
}


async def _known(context: AdminContext, node_id: str) -> bool:
    """Whether ``node_id`` is an ingest node: one a connected client's session names, or
    one the cluster's probes find (a node without clients). Either way no command goes to
    a topic no node reads (nor creates one, where Kafka creates topics on first use)."""
    if any(
        session.connected and session.node_id == node_id
        for session in context.state.sessions.values()
    ):
        return True
    await context.sampler.sample()
    return any(
        probe.service == "ingest" and probe.node_id == node_id for probe in context.sampler.probes
    )


@router.post(
    "/{node_id}/drain",
    response_model=models.Accepted,
    status_code=202,
    responses={**ERRORS, **_NOT_FOUND, **UNAVAILABLE},
)
async def drain(
    request: Request,
    node_id: str,
    user: User,
    window: Annotated[
        float,
        Query(
            ge=0,
            le=3600,
            description="The longest the node takes to disconnect its clients (seconds; "
            "its drain_rate paces them, faster if needed to finish within it).",
        ),
    ] = 60.0,
) -> models.Accepted:
    """Drain ingest node ``node_id``: it leaves the load balancer's rotation, stops
    accepting, and disconnects its clients (DISCONNECT 0x9C Use another server, MQTT 5.0
    3.14.2.1) in paced batches within ``window`` seconds; it stays up, out of rotation,
    until stopped."""
    context = context_of(request)

    async def change() -> models.Accepted:
        await synced(context)
        if not await _known(context, node_id):
            raise HTTPException(404, f"no ingest node {node_id!r}")
        command = AdminDrain(round(window * 1000))
        await context.writer.write([admin_drain_record(context.state.names, node_id, command)])
        return models.Accepted(action="drain", target=node_id, detail={"window": window})

    return await audited(context, user, "drain", node_id, {"window": window}, change)
