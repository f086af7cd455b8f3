"""Integrations in PostgreSQL (table ``integrations``, migrations
``services/common/stores/migrations/0043_integrations.sql`` and
``0060_integration_kinds.sql``) and their change notifications.

Every insert, update and delete is announced, once committed, on the PostgreSQL channel
:data:`CHANNEL` by a trigger (plain SQL changes too); :meth:`IntegrationStore.listen`
follows it, and the integrations stage loads the integrations again after each
announcement and after each reconnect (:mod:`services.integrations.stage`).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg
from psycopg.rows import dict_row

from services.common.integrations.model import (
    Integration,
    IntegrationError,
    IntegrationKind,
    PayloadFormat,
    SinkSecrets,
    sink_from_json,
)
from services.common.settings import Settings
from services.common.stores.notifications import follow
from services.common.stores.postgres_pool import Connection, MigratedPool, password_of

log = logging.getLogger(__name__)

T = TypeVar("T")

CHANNEL = "cormorant_integrations"
"""The PostgreSQL NOTIFY channel of changes of the integrations."""

_COLUMNS = (
    "id, name, enabled, kind, topic_filters, client_id_filter, payload_format, sink, secrets, "
    "revision, created_at, updated_at"
)


class IntegrationConflict(ValueError):
    """An integration with that name exists already."""


class IntegrationNotFound(LookupError):
    """No integration has that name (or id)."""


def _integration(row: dict[str, Any]) -> Integration:
    kind = IntegrationKind(row["kind"])
    return Integration(
        id=row["id"],
        name=row["name"],
        kind=kind,
        topic_filters=tuple(row["topic_filters"]),
        sink=sink_from_json(kind, row["sink"]),
        payload_format=PayloadFormat(row["payload_format"]),
        client_id_filter=row["client_id_filter"],
        enabled=row["enabled"],
        secrets=SinkSecrets.from_json(row["secrets"]),
        revision=row["revision"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


def _values(integration: Integration) -> dict[str, Any]:
    return {
        "id": integration.id,
        "name": integration.name,
        "enabled": integration.enabled,
        "kind": integration.kind.value,
        "topic_filters": list(integration.topic_filters),
        "client_id_filter": integration.client_id_filter,
        "payload_format": integration.payload_format.value,
        "sink": json.dumps(integration.sink.to_json()),
        "secrets": json.dumps(integration.secrets.to_json()),
    }


def _ref_clause(ref: str) -> tuple[str, tuple[Any, ...]]:
    """The WHERE clause finding an integration by name, or by id when ``ref`` is one."""
    try:
        return "id = %s", (uuid.UUID(ref),)
    except ValueError:
        return "name = %s", (ref,)


class IntegrationStore:
    """The ``integrations`` table through ``pool`` (a :class:`MigratedPool`). Every method
    raises :class:`~services.common.stores.base.StoreUnavailable` when PostgreSQL cannot
    answer in time."""

    def __init__(self, pool: MigratedPool) -> None:
        self._pool = pool

    @classmethod
    def from_settings(cls, settings: Settings) -> IntegrationStore:
        """A store with a pool of its own on ``settings.postgres_dsn`` (the PostgreSQL
        settings' password and TLS, ``store_timeout_seconds`` per operation)."""
        pool = MigratedPool(
            settings.postgres_dsn,
            name="integration store",
            timeout=settings.store_timeout_seconds,
            pool_size=2,
            password=password_of(settings),
            sslmode=settings.postgres_sslmode,
            sslrootcert=settings.postgres_sslrootcert,
        )
        return cls(pool)

    async def _run(self, what: str, body: Callable[[Connection], Awaitable[T]]) -> T:
        try:
            return await self._pool.run(what, body)
        except psycopg.errors.UniqueViolation:
            raise IntegrationConflict("an integration with this name exists already") from None
        except psycopg.errors.CheckViolation as exc:
            raise IntegrationError(f"not stored: {exc.diag.message_primary}") from None

    async def _select(self, what: str, where: str, params: tuple[Any, ...]) -> list[Integration]:
        async def body(conn: Connection) -> list[Integration]:
            cursor = conn.cursor(row_factory=dict_row)
            await cursor.execute(
                f"SELECT {_COLUMNS} FROM integrations WHERE {where} ORDER BY name", params
            )
            return [_integration(row) for row in await cursor.fetchall()]

        return await self._run(what, body)

    async def all(self) -> list[Integration]:
        """Every integration, by name."""
        return await self._select("list integrations", "true", ())

    async def enabled(self) -> list[Integration]:
        """The enabled integrations, by name."""
        return await self._select("load integrations", "enabled", ())

    async def get(self, ref: str) -> Integration:
        """The integration named ``ref`` (or with id ``ref``). Raises
        :class:`IntegrationNotFound`."""
        where, params = _ref_clause(ref)
        found = await self._select("show integration", where, params)
        if not found:
            raise IntegrationNotFound(f"no integration {ref!r}")
        return found[0]

    async def insert(self, integration: Integration) -> Integration:
        """Store a new (checked) integration; returns it as stored. Raises
        :class:`IntegrationConflict`."""
        values = _values(integration)

        async def body(conn: Connection) -> Integration:
            cursor = conn.cursor(row_factory=dict_row)
            await cursor.execute(
                f"INSERT INTO integrations ({', '.join(values)})"
                f" VALUES ({', '.join('%(' + k + ')s' for k in values)}) RETURNING {_COLUMNS}",
                values,
            )
            row = await cursor.fetchone()
            assert row is not None
            return _integration(row)

        return await self._run("add integration", body)

    async def update(self, ref: str, change: Callable[[Integration], Integration]) -> Integration:
        """Apply ``change`` (the stored integration → the new one, checked; it may raise
        :class:`~.model.IntegrationError`) to the integration ``ref`` in one transaction
        (the row locked meanwhile); returns it as stored. Raises
        :class:`IntegrationNotFound` and :class:`IntegrationConflict`."""
        where, params = _ref_clause(ref)

        async def body(conn: Connection) -> Integration:
            cursor = conn.cursor(row_factory=dict_row)
            await cursor.execute(
                f"SELECT {_COLUMNS} FROM integrations WHERE {where} FOR UPDATE", params
            )
            row = await cursor.fetchone()
            if row is None:
                raise IntegrationNotFound(f"no integration {ref!r}")
            values = _values(change(_integration(row)))
            del values["id"]
            await cursor.execute(
                f"UPDATE integrations SET {', '.join(f'{k} = %({k})s' for k in values)}"
                f" WHERE id = %(id)s RETURNING {_COLUMNS}",
                {**values, "id": row["id"]},
            )
            stored = await cursor.fetchone()
            assert stored is not None
            return _integration(stored)

        return await self._run("update integration", body)

    async def delete(self, ref: str) -> Integration:
        """Delete the integration ``ref``; returns it as it was. Raises
        :class:`IntegrationNotFound`."""
        where, params = _ref_clause(ref)

        async def body(conn: Connection) -> Integration:
            cursor = conn.cursor(row_factory=dict_row)
            await cursor.execute(
                f"DELETE FROM integrations WHERE {where} RETURNING {_COLUMNS}", params
            )
            row = await cursor.fetchone()
            if row is None:
                raise IntegrationNotFound(f"no integration {ref!r}")
            return _integration(row)

        return await self._run("delete integration", body)

    async def listen(self, on_change: Callable[[], None]) -> None:
        """Follow the change notifications until cancelled: ``on_change()`` once the
        listening connection is (re)established (what changed while it was down is not
        announced) and after each announced change. Reconnects after
        :data:`~services.common.stores.notifications.RECONNECT_SECONDS` when PostgreSQL is
        lost (logged: :func:`~services.common.stores.notifications.follow`)."""
        await follow(self._pool, [CHANNEL], lambda _: on_change(), on_change, "integration changes")

    async def close(self) -> None:
        """Close the pool's connections."""
        await self._pool.close()
