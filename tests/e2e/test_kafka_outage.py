"""Kafka unreachable: nothing is acknowledged that Kafka did not store, nothing is refused
that Kafka may still store, and service resumes.

Runs last (``disruptive``): it stops the test cluster's Kafka, then starts it again and
waits until both ingest nodes and the router serve again. Meanwhile HAProxy's health
checks (``/ready``) take every node out of rotation, and put them back once Kafka is.
"""

from __future__ import annotations

import time

import pytest

from services.local import haproxy
from tests.e2e.clients import (
    TIMEOUT,
    PahoClient,
    RawSocket,
    aio_client,
    collect,
    connect_packet,
    publish_packet,
    unique,
)
from tests.servers import KAFKA_REQUEST_TIMEOUT, LocalCluster
from tests.waiting import wait_for, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.disruptive]

#: Seconds beyond the Kafka request timeout that a refusal may take (scheduling, linger).
MARGIN = 3.0

#: Seconds the cluster may take to serve again once Kafka is back.
RECOVERY_TIMEOUT = 120.0

CONNACK_ACCEPTED = b"\x20\x02\x00\x00"
CONNACK_SERVER_UNAVAILABLE_V311 = b"\x20\x02\x00\x03"
SERVER_UNAVAILABLE = 0x88


def _connect_v5(raw: RawSocket, client_id: str) -> bytes:
    """Send a v5 CONNECT; return the CONNACK's flags and reason code."""
    raw.send(connect_packet(client_id, level=5))
    head = raw.read(2)
    assert head[:1] == b"\x20" and len(head) == 2, head
    return raw.read(head[1])[:2]


async def _round_trip(sub_port: int, pub_port: int) -> None:
    """A QoS 1 message from a client on ``pub_port`` reaches one on ``sub_port``."""
    topic = unique("e2e/recovered")
    async with (
        aio_client(sub_port, unique("sub")) as sub,
        aio_client(pub_port, unique("pub"), 4) as pub,
    ):
        await sub.subscribe(topic, qos=1)
        await pub.publish(topic, b"back", qos=1)
        [message] = await collect(sub, 1, timeout=10)
    assert message.payload == b"back"


async def _wait_until_served(cluster: LocalCluster) -> None:
    """Retry round trips across both nodes and through HAProxy until they all succeed."""
    node1, node2 = cluster.node_ports

    async def served() -> bool:
        try:
            await _round_trip(node1, node2)
            await _round_trip(node2, node1)
            await _round_trip(cluster.mqtt_port, cluster.mqtt_port)
        except Exception:  # any failure means "not yet": retried until the deadline
            return False
        return True

    await wait_for(served, "the cluster serving again after Kafka", RECOVERY_TIMEOUT)


async def test_no_puback_without_kafka_and_service_resumes(cluster: LocalCluster) -> None:
    node1, node2 = cluster.node_ports
    topic = unique("e2e/outage")
    v5 = PahoClient(node1, unique("outage5"))
    v3 = RawSocket(node2)
    try:
        assert v5.connect() == 0
        v3.send(connect_packet(unique("outage3")))
        assert v3.read(4) == CONNACK_ACCEPTED
        before = v5.publish(topic, b"ok", 1)
        wait_until(lambda: before in v5.snapshot()[0], "the first PUBACK", TIMEOUT)
        assert v5.snapshot()[0][before] == 0

        assert cluster.stop("kafka")
        try:
            started = time.monotonic()
            mid = v5.publish(topic, b"lost", 1)
            v3.send(publish_packet(topic.encode(), b"lost", qos=1))
            # Neither acknowledged nor refused: the producer may still write the record once
            # Kafka is back, and a client told "refused" (v5 PUBACK 0x80) would publish it
            # again as a new message. Both connections are closed; the clients resend the
            # PUBLISH after reconnecting (issue 22.3).
            assert v3.read_until_closed(KAFKA_REQUEST_TIMEOUT + MARGIN) == b""
            wait_until(lambda: v5.snapshot()[1], "the v5 DISCONNECT", MARGIN)
            assert time.monotonic() - started < KAFKA_REQUEST_TIMEOUT + MARGIN
            pubacks, disconnects = v5.snapshot()
            assert mid not in pubacks, pubacks[mid]
            assert [d.value for d in disconnects] == [0x80]

            # New connections are refused with the CONNACK the protocol has for this.
            for port in (node1, node2):
                with RawSocket(port) as raw:
                    raw.send(connect_packet(unique("refused3")))
                    answer = raw.read_until_closed(KAFKA_REQUEST_TIMEOUT + MARGIN)
                    assert answer == CONNACK_SERVER_UNAVAILABLE_V311
                with RawSocket(port) as raw:
                    assert _connect_v5(raw, unique("refused5")) == bytes([0, SERVER_UNAVAILABLE])
                    assert raw.read_until_closed(MARGIN) == b""
            every_server = {
                haproxy.server_name(kind, node)
                for kind in haproxy.KINDS
                for node in range(1, cluster.settings.ingest_nodes + 1)
            }
            wait_until(
                lambda: set(haproxy.out_of_rotation(cluster.settings)) == every_server,
                "HAProxy taking every node out of rotation",
                TIMEOUT,
            )
        finally:
            cluster.start("kafka")
    finally:
        v5.close()
        v3.close()
    await _wait_until_served(cluster)
    wait_until(lambda: haproxy.in_rotation(cluster.settings), "every node in rotation", TIMEOUT)
