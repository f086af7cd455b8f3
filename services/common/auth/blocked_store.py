"""Blocked clients in PostgreSQL (table ``mqtt_blocked``, migration
``services/common/stores/migrations/0021_blocked_clients.sql``), what manages them, and how
an ingest node follows them.

Every change is announced, once committed, on the PostgreSQL channel :data:`CHANNEL` by a
trigger (plain SQL changes too). The ingest nodes follow it on the credentials' listening
connection (:meth:`services.common.auth.store.CredentialStore.listen`, its ``also``
channels: one mechanism for both), and :class:`BlockedFollower` loads the blocks in force
again after each announcement and after every reconnect of that connection, so every node
refuses a new block within the notification's delay plus one query (milliseconds).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import psycopg
from psycopg.rows import dict_row

from services.common.auth.blocked import (
    Block,
    BlockError,
    BlockKind,
    BlockList,
    ConnectGate,
    check_reason,
    normalize,
)
from services.common.clock import now_ms
from services.common.stores.base import StoreUnavailable
from services.common.stores.postgres_pool import Connection, MigratedPool

log = logging.getLogger(__name__)

T = TypeVar("T")

CHANNEL = "cormorant_blocked"
"""The PostgreSQL NOTIFY channel of changes of the blocked clients."""

RELOAD_BACKOFF_SECONDS = 1.0
"""Pause before loading the blocks again after PostgreSQL failed to answer."""

_COLUMNS = "id, kind, value, reason, expires_at, created_at, created_by"


class BlockConflict(ValueError):
    """A block of the same kind and value exists already."""


class BlockNotFound(LookupError):
    """No block has that id (or kind and value)."""


def _ms(at: datetime | None) -> int | None:
    return None if at is None else round(at.timestamp() * 1000)


def _at(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC)


def _block(row: dict[str, Any]) -> Block:
    return Block(
        row["id"],
        BlockKind(row["kind"]),
        row["value"],
        row["reason"],
        _ms(row["expires_at"]),
        _ms(row["created_at"]) or 0,
        row["created_by"],
    )


def new_block(
    kind: BlockKind,
    value: str,
    *,
    reason: str = "",
    expires_at_ms: int | None = None,
    created_by: str = "",
    now: int | None = None,
) -> Block:
    """A new block (not stored yet) of ``kind`` and ``value`` (normalised, :func:`normalize`),
    expiring at ``expires_at_ms`` (Unix ms; None: never). Raises
    :class:`~.blocked.BlockError` for an invalid value, a too long reason, or an expiry not
    after ``now`` (Unix ms; the clock's when None)."""
    now = now_ms() if now is None else now
    if expires_at_ms is not None and expires_at_ms <= now:
        raise BlockError("a block's expiry must be in the future")
    return Block(
        uuid.uuid4(),
        kind,
        normalize(kind, value),
        check_reason(reason),
        expires_at_ms,
        now,
        created_by,
    )


class BlockedStore:
    """The ``mqtt_blocked`` table, through ``pool`` (the credential store's:
    :attr:`services.common.auth.store.CredentialStore.pool`). Every method raises
    :class:`~services.common.stores.base.StoreUnavailable` when PostgreSQL cannot answer
    in time."""

    def __init__(self, pool: MigratedPool) -> None:
        self._pool = pool

    async def _run(self, what: str, body: Callable[[Connection], Awaitable[T]]) -> T:
        try:
            return await self._pool.run(what, body)
        except psycopg.errors.UniqueViolation:
            raise BlockConflict("a block of this kind and value exists already") from None

    async def add(self, block: Block) -> Block:
        """Store ``block`` (expired blocks are deleted first, so one may be added again);
        returns it as stored. Raises :class:`BlockConflict`."""

        async def body(conn: Connection) -> Block:
            await conn.execute("DELETE FROM mqtt_blocked WHERE expires_at <= now()")
            cursor = conn.cursor(row_factory=dict_row)
            await cursor.execute(
                f"INSERT INTO mqtt_blocked ({_COLUMNS})"
                " VALUES (%s, %s, %s, %s, %s, %s, %s)"
                f" RETURNING {_COLUMNS}",
                (
                    block.id,
                    block.kind.value,
                    block.value,
                    block.reason,
                    _at(block.expires_at_ms),
                    _at(block.created_at_ms),
                    block.created_by,
                ),
            )
            row = await cursor.fetchone()
            assert row is not None
            return _block(row)

        return await self._run("block", body)

    async def extend(self, block: Block) -> None:
        """Store ``block`` (a flapping client's), or lengthen the expiry of the block of its
        kind and value to ``block``'s; a block that never expires stays so."""

        async def body(conn: Connection) -> None:
            await conn.execute(
                f"INSERT INTO mqtt_blocked ({_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (kind, value) DO UPDATE"
                " SET expires_at = EXCLUDED.expires_at, reason = EXCLUDED.reason,"
                " created_by = EXCLUDED.created_by"
                " WHERE mqtt_blocked.expires_at < EXCLUDED.expires_at",
                (
                    block.id,
                    block.kind.value,
                    block.value,
                    block.reason,
                    _at(block.expires_at_ms),
                    _at(block.created_at_ms),
                    block.created_by,
                ),
            )

        await self._run("block", body)

    async def list(self, include_expired: bool = False) -> list[Block]:
        """The blocks (in force only, unless ``include_expired``), by kind and value."""
        where = "true" if include_expired else "expires_at IS NULL OR expires_at > now()"

        async def body(conn: Connection) -> list[Block]:
            cursor = conn.cursor(row_factory=dict_row)
            await cursor.execute(
                f"SELECT {_COLUMNS} FROM mqtt_blocked WHERE {where} ORDER BY kind, value"
            )
            return [_block(row) for row in await cursor.fetchall()]

        return await self._run("list blocks", body)

    async def delete(self, block_id: uuid.UUID) -> Block:
        """Delete the block with that id; returns it. Raises :class:`BlockNotFound`."""
        return await self._delete("id = %s", (block_id,), f"no block has id {block_id}")

    async def delete_value(self, kind: BlockKind, value: str) -> Block:
        """Delete the block of ``kind`` and ``value`` (normalised as :func:`normalize`
        does; raises :class:`~.blocked.BlockError` if it is invalid); returns it. Raises
        :class:`BlockNotFound`."""
        value = normalize(kind, value)
        return await self._delete(
            "kind = %s AND value = %s", (kind.value, value), f"no {kind.value} block {value!r}"
        )

    async def _delete(self, where: str, params: tuple[Any, ...], missing: str) -> Block:
        async def body(conn: Connection) -> Block | None:
            cursor = conn.cursor(row_factory=dict_row)
            await cursor.execute(
                f"DELETE FROM mqtt_blocked WHERE {where} RETURNING {_COLUMNS}", params
            )
            row = await cursor.fetchone()
            return None if row is None else _block(row)

        deleted = await self._run("unblock", body)
        if deleted is None:
            raise BlockNotFound(missing)
        return deleted


class BlockedFollower:
    """Keeps ``gate.blocks`` equal to the blocks in force in ``store`` (see the module):
    :meth:`changed` after each announcement or reconnect, :meth:`run` as a task."""

    def __init__(self, store: BlockedStore, gate: ConnectGate) -> None:
        self.store = store
        self.gate = gate
        self._stale = asyncio.Event()
        self._stale.set()
        self._generation = 0
        self.loaded = asyncio.Event()

    def changed(self) -> None:
        """The blocks changed, or changes may have been missed: load them again."""
        self._generation += 1
        self._stale.set()

    async def run(self) -> None:
        """Load the blocks whenever they may be stale, until cancelled. A load that raced
        with a change is done again; PostgreSQL unreachable is logged and tried again after
        :data:`RELOAD_BACKOFF_SECONDS` (the blocks loaded before stay in force)."""
        while True:
            await self._stale.wait()
            self._stale.clear()
            generation = self._generation
            try:
                blocks = await self.store.list()
            except StoreUnavailable as exc:
                log.warning("blocked clients not loaded: %s", exc)
                self._stale.set()
                await asyncio.sleep(RELOAD_BACKOFF_SECONDS)
                continue
            self.gate.blocks = BlockList(blocks)
            self.loaded.set()
            if generation != self._generation:
                self._stale.set()
