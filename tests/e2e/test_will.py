"""Will Messages through the whole cluster (MQTT 3.1.2.5; MQTT 5.0 3.1.2.5, 3.1.3.2.2,
3.14.2.1): published when a connection ends without a normal DISCONNECT, after the Will Delay
Interval unless the client reconnects first, on either node.

The subscriber sits on the other node than the client whose Will Message it waits for, so
each Will Message crosses Kafka (msg.all → router → msg.downlink.<node>).
"""

from __future__ import annotations

import asyncio
import time

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.e2e.clients import (
    TIMEOUT,
    PahoClient,
    RawSocket,
    aio_client,
    collect,
    publish_packet,
    session_connect_packet,
    unique,
    until_marker,
)
from tests.servers import LocalCluster

pytestmark = pytest.mark.cluster

KEEP_ALIVE_TIMEOUT = 0x8D
DISCONNECT_WITH_WILL_MESSAGE = 0x04

#: Seconds the Will Delay Interval tests use: long enough for a reconnect to land first.
WILL_DELAY = 4


@pytest.mark.parametrize("level", [4, 5], ids=["v311", "v5"])
async def test_socket_loss_publishes_the_will(cluster: LocalCluster, level: int) -> None:
    node1, node2 = cluster.node_ports
    topic = unique("e2e/will-lost")
    async with aio_client(node2, unique("watcher")) as watcher:
        await watcher.subscribe(topic, qos=1)
        with RawSocket(node1) as raw:
            connect = session_connect_packet(
                unique("dies"), level=level, clean_start=True, will=(topic, b"lost")
            )
            assert not raw.connect_accepted(connect)
        [will] = await collect(watcher, 1)
    assert (str(will.topic), will.payload) == (topic, b"lost")


#: How much earlier than 1.5 times Keep Alive after the CONNACK the client may read the
#: DISCONNECT (seconds): the CONNACK took a moment to reach it.
EARLY = 0.5
#: How much later the DISCONNECT and the Will Message may land (seconds). The exact deadline
#: is pinned by tests/unit/test_ingest_connect.py with a clock; here scheduling on a loaded
#: machine adds to it (a load average of 24 on 2 cores delayed one by 1.1 s), still far
#: below the 10 s connect timeout the timer used to wait for (the DISCONNECT came 9.3 s
#: after the CONNACK).
LATE = 1.5
#: Seconds from the DISCONNECT to the Will Message's arrival on another node: its path
#: through Kafka transactions (client.wills, msg.all, the router's downlink records), each
#: read committed: seconds on a loaded machine (a load average of 24 on 2 cores).
WILL_PATH = 5.0


@pytest.mark.parametrize("keep_alive", [1, 2])
async def test_keep_alive_timeout_publishes_the_will(
    cluster: LocalCluster, keep_alive: int
) -> None:
    """Silent right after its CONNACK: DISCONNECT 0x8D at 1.5 times Keep Alive (MQTT 3.1.2.10)
    counted from the CONNACK, not at the connect timeout (10 s) armed when the CONNECT came
    and its credentials were still being checked; the Will Message follows at once."""
    node1, node2 = cluster.node_ports
    topic = unique("e2e/will-silent")
    silence = 1.5 * keep_alive
    async with aio_client(node2, unique("watcher")) as watcher:
        await watcher.subscribe(topic, qos=1)
        with RawSocket(node1) as raw:
            connect = session_connect_packet(
                unique("silent"),
                level=5,
                clean_start=True,
                keep_alive=keep_alive,
                will=(topic, b"silent"),
            )
            assert not raw.connect_accepted(connect)
            connacked = time.monotonic()  # the server sent it a little before

            def disconnect() -> tuple[float, int, bytes]:
                kind, body = raw.read_packet()
                return time.monotonic() - connacked, kind, body

            disconnected = asyncio.create_task(asyncio.to_thread(disconnect))
            [will] = await collect(watcher, 1)
            will_at = time.monotonic() - connacked
            closed_at, kind, body = await disconnected
            assert raw.read_until_closed() == b""
        assert (kind, body[:1]) == (0xE0, bytes([KEEP_ALIVE_TIMEOUT])), (kind, body)
    assert will.payload == b"silent"
    assert silence - EARLY <= closed_at <= silence + LATE, (closed_at, will_at)
    assert closed_at - EARLY <= will_at <= closed_at + WILL_PATH, (closed_at, will_at)


@pytest.mark.parametrize("version", [4, 5], ids=["v311", "v5"])
async def test_a_normal_disconnect_publishes_no_will(cluster: LocalCluster, version: int) -> None:
    node1, node2 = cluster.node_ports
    topic = unique("e2e/will-normal")
    client_id = unique("leaves")
    async with aio_client(node2, unique("watcher")) as watcher:
        await watcher.subscribe(topic, qos=1)
        leaving = PahoClient(node1, client_id, version=version)
        leaving.will_set(topic, b"should not be sent", 1)
        assert leaving.connect() == 0
        leaving.close()  # DISCONNECT (v5: Reason Code 0x00)
        # The same client's next message comes first: a will would have come before it
        # (one client id, one msg.all partition, MQTT 4.6).
        async with aio_client(node1, client_id, version) as again:
            await again.publish(topic, b"marker", qos=1)
        assert await until_marker(watcher, b"marker") == []


async def test_disconnect_with_will_message_publishes_it(cluster: LocalCluster) -> None:
    node1, node2 = cluster.node_ports
    topic = unique("e2e/will-asked")
    will_props = Properties(PacketTypes.WILLMESSAGE)
    will_props.ContentType = "text/plain"
    will_props.UserProperty = ("reason", "asked")
    async with aio_client(node2, unique("watcher")) as watcher:
        await watcher.subscribe(topic, qos=1)
        leaving = PahoClient(node1, unique("asks"))
        leaving.will_set(topic, b"as asked", 1, will_props)
        assert leaving.connect() == 0
        leaving.disconnect(DISCONNECT_WITH_WILL_MESSAGE)
        [will] = await collect(watcher, 1)
    assert will.payload == b"as asked"
    assert will.properties is not None
    assert will.properties.ContentType == "text/plain"  # type: ignore[attr-defined]
    assert will.properties.UserProperty == [("reason", "asked")]  # type: ignore[attr-defined]


def _delayed_will_client(client_id: str, topic: str) -> bytes:
    """A v5 CONNECT continuing a session (expiry 60 s) with a delayed Will Message."""
    return session_connect_packet(
        client_id,
        level=5,
        clean_start=False,
        session_expiry=60,
        will=(topic, b"delayed"),
        will_delay=WILL_DELAY,
    )


async def test_the_will_waits_out_its_delay(cluster: LocalCluster) -> None:
    node1, node2 = cluster.node_ports
    topic = unique("e2e/will-delay")
    async with aio_client(node2, unique("watcher")) as watcher:
        await watcher.subscribe(topic, qos=1)
        with RawSocket(node1) as raw:
            raw.connect_accepted(_delayed_will_client(unique("late"), topic))
        closed = time.monotonic()
        [will] = await collect(watcher, 1, timeout=WILL_DELAY + TIMEOUT)
        waited = time.monotonic() - closed
    assert will.payload == b"delayed"
    assert waited >= WILL_DELAY - 0.1, f"published {waited:.2f}s after the close"


async def test_a_reconnect_on_the_other_node_cancels_a_delayed_will(
    cluster: LocalCluster,
) -> None:
    node1, node2 = cluster.node_ports
    client_id = unique("returns")
    topic = unique("e2e/will-cancelled")
    async with aio_client(node1, unique("watcher")) as watcher:
        await watcher.subscribe(topic, qos=1)
        with RawSocket(node1) as raw:
            raw.connect_accepted(_delayed_will_client(client_id, topic))
        # Back before the delay has passed, continuing the session on the other node.
        with RawSocket(node2) as again:
            back = session_connect_packet(client_id, level=5, clean_start=False, session_expiry=60)
            assert again.connect_accepted(back)
            # A Will Delay is wall time: let it pass (no synchronisation). Then the client's
            # own next message comes first: the will, had its timer fired, would have been
            # written before it (one client id, one msg.all partition, MQTT 4.6).
            await asyncio.sleep(WILL_DELAY + 1.0)
            again.send(publish_packet(topic.encode(), b"marker", qos=1, v5=True))
            assert again.read_packet()[0] == 0x40  # PUBACK
            assert await until_marker(watcher, b"marker") == []
            again.send(b"\xe0\x00")  # DISCONNECT, normal
