"""Following PostgreSQL change notifications (:mod:`services.common.stores.notifications`)
on the test session's real PostgreSQL: every listened channel's notifications in the order
they were sent, and a listener whose connection the server ended listens again by itself
and says so (``on_connected``) before what comes next."""

from __future__ import annotations

import asyncio
import uuid

import psycopg

from services.common.stores.notifications import follow
from services.common.stores.postgres_pool import MigratedPool
from tests.waiting import wait_for


async def _notify(dsn: str, *messages: tuple[str, str]) -> None:
    """Send ``messages`` (channel, payload), each committed on its own."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for channel, payload in messages:
            await conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))


async def _end_listeners(dsn: str, channel: str) -> int:
    """Terminate the server processes of the connections whose last statement listened to
    ``channel``; how many there were."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cursor = await conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = %s",
            (f"LISTEN {channel}",),
        )
        return len(await cursor.fetchall())


async def test_notifications_of_every_channel_arrive_in_order_and_survive_a_lost_connection(
    postgres_server: str,
) -> None:
    first, second = (f"test_{name}_{uuid.uuid4().hex[:8]}" for name in ("first", "second"))
    seen: list[tuple[str, str]] = []
    connected: list[int] = []
    pool = MigratedPool(postgres_server, name="notifications test", timeout=5.0, pool_size=1)
    task = asyncio.create_task(
        follow(
            pool,
            [first, second],
            lambda n: seen.append((n.channel, n.payload)),
            lambda: connected.append(len(seen)),
            "test notifications",
        )
    )
    try:
        await wait_for(lambda: connected == [0], "the listener connected")
        sent = [(first, "a"), (second, "b"), (first, "c")]
        await _notify(postgres_server, *sent)
        await wait_for(lambda: seen == sent, f"{sent} in order, got {seen}")

        # The last LISTEN is the second channel's: that statement names the connection.
        assert await _end_listeners(postgres_server, second) == 1
        await wait_for(lambda: len(connected) == 2, "the listener connected again")
        await _notify(postgres_server, (second, "after"))
        await wait_for(lambda: seen[3:] == [(second, "after")], "the notification after it")
        assert connected == [0, 3]  # reconnected before anything new was announced
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await pool.close()
