"""Will Messages waiting out their Will Delay Interval outlive the ingest node that held
their connection (MQTT 5.0 3.1.3.2.2; docs/guarantees/index.md).

Runs last (``disruptive``): each test kills ingest node 1 with SIGKILL while a will of one of
its former connections waits, and starts it again before it ends. The will is in
``client.wills`` before the connection's session reads as ended; the ingest node that owns
its partition (node 2, once node 1's partitions have moved) publishes it after the delay,
or discards it when the session is resumed first.
"""

from __future__ import annotations

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

#: Seconds node 1's client.wills partitions take to move to node 2 after a kill: the
#: consumer session timeout and a rebalance, with room for a loaded machine.
TAKEOVER = 15.0


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


async def _lose_and_kill(
    cluster: LocalCluster, client_id: str, connect: bytes, delay: float
) -> float:
    """Connect ``client_id`` to node 1, lose its socket, and kill -9 node 1 once the
    session reads as ended (its will is stored by then), before the will's ``delay``
    (seconds) has passed; returns when the socket was lost (``time.monotonic()``)."""
    node1, _ = cluster.node_ports
    with RawSocket(node1) as raw:
        raw.connect_accepted(connect)
    lost_at = time.monotonic()  # closed without DISCONNECT: the will is armed
    await wait_for(lambda: _disconnected(cluster, client_id), "the session's end")
    assert await _waiting_wills(cluster, client_id) == 1
    assert cluster.kill(NODE)
    # Else node 1 may have published it itself: the test would prove nothing.
    assert time.monotonic() - lost_at < delay, "node 1 killed after the will was due"
    return lost_at


async def test_a_waiting_will_is_published_by_the_other_node_after_its_node_was_killed(
    cluster: LocalCluster,
) -> None:
    _, node2 = cluster.node_ports
    client_id = unique("durable")
    topic = unique("e2e/durable-will")
    # Room for the checks before the kill (each reads topics from their beginning).
    delay = 10
    connect = _will_connect(client_id, topic, delay)
    try:
        async with aio_client(node2, unique("watcher")) as watcher:
            await watcher.subscribe(topic, qos=1)
            lost_at = await _lose_and_kill(cluster, client_id, connect, delay)
            [will] = await collect(watcher, 1, timeout=delay + TAKEOVER)
            arrived_at = time.monotonic()
            assert cluster.pid(NODE) is None  # through node 2: node 1 is still down
        assert will.payload == b"gone"
        assert arrived_at - lost_at >= delay  # not before its Will Delay Interval
        await wait_for(lambda: _waiting_wills_is(cluster, client_id, 0), "the will's tombstone")
    finally:
        cluster.start(NODE)


async def test_a_resumed_session_cancels_the_will_of_a_killed_node(
    cluster: LocalCluster,
) -> None:
    _, node2 = cluster.node_ports
    client_id = unique("resumed")
    topic = unique("e2e/resumed-will")
    delay = 30
    connect = _will_connect(client_id, topic, delay)
    try:
        async with aio_client(node2, unique("watcher")) as watcher:
            await watcher.subscribe(topic, qos=1)
            await _lose_and_kill(cluster, client_id, connect, delay)
            with RawSocket(node2) as again:
                assert again.connect_accepted(connect)  # the session is resumed, on node 2
                # The owner of the will's partition (node 2, once node 1's partitions
                # moved) discards it: a tombstone, committed with no publication.
                await wait_for(
                    lambda: _waiting_wills_is(cluster, client_id, 0),
                    "the will discarded",
                    TAKEOVER,
                )
                # The tombstone was committed with the will's publication or alone; had it
                # been published, its msg.all record (this client's key) would come before
                # the marker this client publishes now, and no record is left to publish.
                again.send(publish_packet(topic.encode(), b"marker", qos=1, packet_id=1, v5=True))
                kind, _ = again.read_packet()
                assert kind == 0x40  # PUBACK
                assert await until_marker(watcher, b"marker") == []
    finally:
        cluster.start(NODE)
