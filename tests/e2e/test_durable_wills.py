"""Will Messages waiting out their Will Delay Interval outlive the ingest node that held
their connection (MQTT 5.0 3.1.3.2.2; docs/guarantees/index.md).

Runs last (``disruptive``): the test kills ingest node 1 with SIGKILL while two wills of its
former connections wait, and starts it again before it ends. The will is in
``client.wills`` before the connection's session reads as ended; the ingest node that owns
its partition (node 2, once node 1's partitions have moved) publishes it after the delay,
or discards it when the session is resumed first.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from services.common.kafka.names import TopicNames
from services.common.records import decode_session, parse_will
from tests.e2e.clients import (
    RawSocket,
    aio_client,
    collect,
    publish_packet,
    session_connect_packet,
    unique,
    until_marker,
)
from tests.e2e.kafka_view import latest_state, waiting_of
from tests.servers import LocalCluster
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.disruptive]

NODE = "ingest-node1"

#: Seconds after its due time that a will of node 1 may take to be published by node 2:
#: the consumer session timeout, a rebalance, the fence and replay of the partitions, and
#: the will's transaction, which Kafka may time out once on a loaded machine (at a load
#: average of 60 it took more than ``kafka_request_timeout_seconds``, 10 s, and was
#: committed when tried again a second later).
TAKEOVER = 30.0

#: The Will Delay Interval of the will a resumed session cancels (seconds): how long its
#: discard may take, node 1's partitions moved first (more than 15 s at a load average of
#: 40), before it would be due.
RESUMED_DELAY = 30


async def _disconnected(cluster: LocalCluster, client_id: str) -> bool:
    sessions, _ = await latest_state(cluster)
    value = sessions.get(client_id)
    return value is not None and not decode_session(value).connected


async def _waiting_wills(cluster: LocalCluster, client_id: str) -> int:
    """How many wills of ``client_id`` wait in ``client.wills`` now."""
    names = TopicNames.from_settings(cluster.settings)
    return await waiting_of(cluster, names.client_wills, parse_will, client_id)


async def _waiting_wills_is(cluster: LocalCluster, client_id: str, count: int) -> bool:
    return await _waiting_wills(cluster, client_id) == count


def _will_connect(client_id: str, topic: str, delay: int) -> bytes:
    """A v5 CONNECT of a persistent session with a Will Message (payload ``gone``) on
    ``topic`` and a Will Delay Interval of ``delay`` seconds."""
    return session_connect_packet(
        client_id,
        level=5,
        clean_start=False,
        session_expiry=600,
        will=(topic, b"gone"),
        will_delay=delay,
    )


async def _lose(cluster: LocalCluster, client_id: str, connect: bytes) -> float:
    """Connect ``client_id`` to node 1 and lose its socket; return once the session reads as
    ended (its will is stored by then), with when the socket was lost
    (``time.monotonic()``)."""
    node1, _ = cluster.node_ports
    with RawSocket(node1) as raw:
        raw.connect_accepted(connect)
    lost_at = time.monotonic()  # closed without DISCONNECT: the will is armed
    await wait_for(lambda: _disconnected(cluster, client_id), "the session's end")
    assert await _waiting_wills(cluster, client_id) == 1
    return lost_at


async def test_a_killed_nodes_waiting_wills_are_published_or_cancelled_by_the_other_node(
    cluster: LocalCluster,
) -> None:
    """One ``kill -9`` of node 1 while two wills of its former connections wait: one is
    published by node 2 after its Will Delay Interval; the other is discarded, its session
    resumed on node 2 right after the kill (before node 1's partitions have moved). (It was
    two tests, each killing node 1 and waiting out the move of its partitions.)"""
    _, node2 = cluster.node_ports
    durable_id, resumed_id = unique("durable"), unique("resumed")
    durable_topic, resumed_topic = unique("e2e/durable-will"), unique("e2e/resumed-will")
    # Room for the checks before the kill (each reads topics from their beginning).
    delay = 10
    durable_connect = _will_connect(durable_id, durable_topic, delay)
    resumed_connect = _will_connect(resumed_id, resumed_topic, RESUMED_DELAY)
    try:
        async with (
            aio_client(node2, unique("watcher")) as watcher,
            aio_client(node2, unique("watcher")) as resumed_watcher,
        ):
            await watcher.subscribe(durable_topic, qos=1)
            await resumed_watcher.subscribe(resumed_topic, qos=1)
            await _lose(cluster, resumed_id, resumed_connect)
            lost_at = await _lose(cluster, durable_id, durable_connect)
            assert cluster.kill(NODE)
            # Else node 1 may have published it itself: the test would prove nothing.
            assert time.monotonic() - lost_at < delay, "node 1 killed after the will was due"

            async def durable_will() -> tuple[bytes, float, int | None]:
                [will] = await collect(watcher, 1, timeout=delay + TAKEOVER)
                return will.payload, time.monotonic(), cluster.pid(NODE)

            # Timed as it arrives: the loop is left free (the raw socket's reads in threads).
            arrival = asyncio.create_task(durable_will())
            try:
                with RawSocket(node2) as again:
                    # The session is resumed, on node 2.
                    assert await asyncio.to_thread(again.connect_accepted, resumed_connect)
                    # The owner of the will's partition (node 2, once node 1's partitions
                    # moved) discards it: a tombstone, committed with no publication.
                    await wait_for(
                        lambda: _waiting_wills_is(cluster, resumed_id, 0),
                        "the will discarded",
                        RESUMED_DELAY,
                    )
                    # The tombstone was committed with the will's publication or alone; had it
                    # been published, its msg.all record (this client's key) would come before
                    # the marker this client publishes now, and no record is left to publish.
                    marker = publish_packet(
                        resumed_topic.encode(), b"marker", qos=1, packet_id=1, v5=True
                    )
                    again.send(marker)
                    kind, _ = await asyncio.to_thread(again.read_packet)
                    assert kind == 0x40  # PUBACK
                    assert await until_marker(resumed_watcher, b"marker") == []
                payload, arrived_at, node1_pid = await arrival
            finally:
                arrival.cancel()  # a no-op once it is done
        assert node1_pid is None  # through node 2: node 1 is still down
        assert payload == b"gone"
        assert arrived_at - lost_at >= delay  # not before its Will Delay Interval
        await wait_for(lambda: _waiting_wills_is(cluster, durable_id, 0), "the will's tombstone")
    finally:
        cluster.start(NODE)
