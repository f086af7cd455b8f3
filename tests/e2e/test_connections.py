"""More than 10,000 idle MQTT connections through the local cluster's HAProxy (issue 22.5).

One HAProxy process holds two open files per connection, so this machine's hard open-file
limit of 20,000 caps one process at 9,950 connections. The cluster runs several HAProxy
processes on the one listen port (services/local/haproxy.py) and ``cormorant status``
reports their summed ceiling; this test opens more connections than one process could take.

The clients are raw asyncio sockets (a CONNECT, then reading the CONNACK): a third-party
client per connection would cost a thread or a task tree each, and these stay idle.
"""

from __future__ import annotations

import asyncio
import contextlib

from services.local import haproxy, open_files
from tests.e2e.clients import HOST, TIMEOUT, connect_packet, unique
from tests.servers import LocalCluster
from tests.waiting import wait_for

#: Connections opened: more than one HAProxy process takes under a hard limit of 20,000.
CONNECTIONS = 10_050

#: CONNECTs in flight at once: enough to keep both ingest nodes busy, few enough that
#: their connection rate limits (per node and per address) are seldom reached.
IN_FLIGHT = 200

#: Seconds the whole run may take (both ingest nodes accept about 700 connects/s each on a
#: quiet 2-core machine; a loaded one is several times slower).
DEADLINE = 240.0

CONNACK_ACCEPTED = b"\x20\x02\x00\x00"


async def _open(port: int, prefix: str, gate: asyncio.Semaphore) -> asyncio.StreamWriter:
    """One accepted MQTT 3.1.1 connection (clean session, Keep Alive 60 s), its writer
    returned; a CONNECT refused for a connection rate limit (CONNACK 0x03) is tried again."""
    async with gate:
        while True:
            reader, writer = await asyncio.open_connection(HOST, port)
            writer.write(connect_packet(unique(prefix)))
            connack = await asyncio.wait_for(reader.readexactly(4), TIMEOUT)
            if connack == CONNACK_ACCEPTED:
                return writer
            assert connack == b"\x20\x02\x00\x03", connack  # Server unavailable: a rate limit
            writer.close()


async def test_more_than_ten_thousand_idle_connections_through_haproxy(
    cluster: LocalCluster,
) -> None:
    soft = open_files.raise_soft_limit()
    assert soft > CONNECTIONS + 1_000, f"the test process may open only {soft} files"
    ceiling = haproxy.max_connections(cluster.settings)
    assert ceiling is not None and ceiling > CONNECTIONS, ceiling
    before = cluster.connections()
    gate = asyncio.Semaphore(IN_FLIGHT)
    prefix = unique("idle")
    opening = [
        asyncio.ensure_future(_open(cluster.mqtt_port, prefix, gate)) for _ in range(CONNECTIONS)
    ]
    try:
        done = await asyncio.wait_for(asyncio.gather(*opening), DEADLINE)
        assert len(done) == CONNECTIONS
        await wait_for(
            lambda: cluster.connections() >= CONNECTIONS,
            f"{CONNECTIONS} more connections counted by the ingest nodes",
            TIMEOUT,
        )
    finally:
        for task in opening:
            task.cancel()
        writers = [
            task.result()
            for task in opening
            if task.done() and not task.cancelled() and task.exception() is None
        ]
        for writer in writers:
            writer.close()
        for writer in writers:
            with contextlib.suppress(OSError):
                await writer.wait_closed()
    await wait_for(
        lambda: cluster.connections() <= before,
        "the idle connections closed on the ingest nodes",
        DEADLINE,
    )
