"""The blocked clients API (``/api/blocked``): list, add, delete.

The same code as ``cormorant blocked`` (:class:`~services.common.auth.blocked_store.
BlockedStore`, over the credential store's PostgreSQL pool): checked as the CLI checks,
and every change reaches the ingest nodes within a second (a blocked client's next CONNECT
gets 0x8A Banned; v3.1.1: 0x05). Every change is audited.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from services.admin import models
from services.admin.auth import ERRORS, User
from services.admin.context import StoreChangeAudit
from services.common.auth.blocked import (
    MAX_REASON_BYTES,
    MAX_VALUE_BYTES,
    Block,
    BlockError,
    BlockKind,
)
from services.common.auth.blocked_store import (
    BlockConflict,
    BlockedStore,
    BlockNotFound,
    new_block,
)
from services.common.clock import now_ms

router = APIRouter(prefix="/api/blocked", tags=["blocked clients"])
"""Included by :func:`services.admin.api.create_app`."""

BlockKindName = Literal["client_id", "username", "address", "client_id_regex"]

_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": models.Problem, "description": "No such block."}
}
_CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {"model": models.Problem, "description": "A block of this kind and value exists."}
}
_UNAVAILABLE: dict[int | str, dict[str, Any]] = {
    503: {"model": models.Problem, "description": "PostgreSQL did not answer."}
}


class BlockView(BaseModel):
    """One block. ``value`` is normalised (an address as its CIDR network); times are
    Unix milliseconds (``expires_at_ms`` null: until deleted)."""

    id: uuid.UUID
    kind: BlockKindName
    value: str
    reason: str
    expires_at_ms: int | None
    created_at_ms: int
    created_by: str


class BlockListView(BaseModel):
    """The blocks, by kind and value."""

    blocked: list[BlockView]


class NewBlock(BaseModel):
    """A block to add: ``kind`` and ``value`` (a client id or user name exactly, an IP
    address or CIDR network, a regular expression the whole client id matches), an
    optional ``reason`` and ``expires_in_seconds`` (null: until deleted)."""

    model_config = ConfigDict(extra="forbid")

    kind: BlockKindName
    value: str = Field(min_length=1, max_length=MAX_VALUE_BYTES)
    reason: str = Field("", max_length=MAX_REASON_BYTES)
    expires_in_seconds: float | None = Field(None, gt=0, le=10 * 365 * 86400)


def _store(request: Request) -> BlockedStore:
    return BlockedStore(request.app.state.context.credentials.store.pool)


def view(block: Block) -> BlockView:
    """``block`` as the API shows it."""
    return BlockView(
        id=block.id,
        kind=block.kind.value,
        value=block.value,
        reason=block.reason,
        expires_at_ms=block.expires_at_ms,
        created_at_ms=block.created_at_ms,
        created_by=block.created_by,
    )


_audited = StoreChangeAudit(invalid=BlockError, not_found=BlockNotFound, conflict=BlockConflict)
"""Carries out a change of the blocks and audits it (422, 404, 409 for their errors)."""


@router.get("", response_model=BlockListView, responses={**ERRORS, **_UNAVAILABLE})
async def list_blocks(
    request: Request,
    user: User,
    include_expired: Annotated[bool, Query(description="Expired blocks too.")] = False,
) -> BlockListView:
    """The blocks in force (and the expired ones, if asked), by kind and value."""
    found = await _store(request).list(include_expired)
    return BlockListView(blocked=[view(b) for b in found])


@router.post(
    "",
    status_code=201,
    response_model=BlockView,
    responses={**ERRORS, **_CONFLICT, **_UNAVAILABLE},
)
async def add_block(request: Request, body: NewBlock, user: User) -> BlockView:
    """Block a client id, user name, address or network, or client id expression; every
    ingest node refuses the clients it names within a second (0x8A Banned)."""
    now = now_ms()
    expires = None
    if body.expires_in_seconds is not None:
        expires = now + round(body.expires_in_seconds * 1000)

    async def change() -> Block:
        block = new_block(
            BlockKind(body.kind),
            body.value,
            reason=body.reason,
            expires_at_ms=expires,
            created_by=user,
            now=now,
        )
        return await _store(request).add(block)

    detail = {"kind": body.kind, "expires_in_seconds": body.expires_in_seconds}
    added = await _audited(request, user, "block", body.value, detail, change, 201)
    return view(added)


@router.delete("/{block_id}", status_code=204, responses={**ERRORS, **_NOT_FOUND, **_UNAVAILABLE})
async def delete_block(
    request: Request,
    block_id: Annotated[uuid.UUID, Path(description="The block's id.")],
    user: User,
) -> Response:
    """Lift a block."""
    await _audited(
        request,
        user,
        "unblock",
        str(block_id),
        {},
        lambda: _store(request).delete(block_id),
        204,
    )
    return Response(status_code=204)
