"""Following PostgreSQL change notifications (``LISTEN``) across the loss of the server.

The credential store (:meth:`services.common.auth.store.CredentialStore.listen`, with the
blocked clients' channel on the same connection) and the integrations store
(:meth:`services.common.integrations.store.IntegrationStore.listen`) follow their tables'
change announcements (``NOTIFY`` from a trigger, so plain SQL changes are announced too)
the same way: on a connection of their own, outside the pool (a pooled connection would be
given back between operations and its ``LISTEN`` lost), reconnecting after
:data:`RECONNECT_SECONDS` when PostgreSQL is lost. A notification sent while the listening
connection was down is lost for good: the caller learns that from ``on_connected`` and
reloads (or forgets) what it holds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

import psycopg

from services.common.stores.postgres_pool import MigratedPool

log = logging.getLogger(__name__)

RECONNECT_SECONDS = 1.0
"""Pause before a change listener tries PostgreSQL again after losing it."""


async def follow(
    pool: MigratedPool,
    channels: Sequence[str],
    on_notification: Callable[[psycopg.Notify], None],
    on_connected: Callable[[], None],
    what: str,
) -> None:
    """Follow the notifications of ``channels`` (PostgreSQL channel names, trusted
    identifiers: they are not quoted) on a connection of ``pool``'s server until cancelled.

    ``on_connected()`` each time the listening connection is (re)established, after its
    ``LISTEN``\\ s (what was announced while it was down is not announced again), then
    ``on_notification(notification)`` for each notification, in the order PostgreSQL sends
    them (its ``channel`` and ``payload``). The schema is migrated first
    (:meth:`MigratedPool.ensure_ready`). Losing PostgreSQL (``psycopg.Error``,
    ``OSError``, ``TimeoutError``) is logged as ``what`` (e.g. "credential changes") not
    followed, with the server's address and never its password, and the connection is
    made again after :data:`RECONNECT_SECONDS`; nothing is raised but cancellation and
    what the callbacks raise.
    """
    while True:
        try:
            await pool.ensure_ready()
            conn = await pool.connect_unpooled()
            async with conn:
                for channel in channels:
                    await conn.execute(f"LISTEN {channel}")
                on_connected()
                async for notification in conn.notifies():
                    on_notification(notification)
        except (psycopg.Error, OSError, TimeoutError) as exc:
            log.warning(
                "%s from PostgreSQL at %s not followed: %r; again in %s s",
                what,
                pool.address,
                exc,
                RECONNECT_SECONDS,
            )
        await asyncio.sleep(RECONNECT_SECONDS)
