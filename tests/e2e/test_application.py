"""APPLICATION clients end to end (TBMQ's fan-in clients): every message matched for a
persistent APPLICATION client goes through its own Kafka topic, and app_delivery delivers
it from there within the client's Receive Maximum, committing only what was acknowledged.

Client ids matching ``app-*`` are APPLICATION clients in the test cluster
(``application_client_ids``). Third-party clients throughout (paho-mqtt); the publishers of
the fan-in test are raw sockets, many per thread, to keep the machine free for the broker.
"""

from __future__ import annotations

import asyncio
import struct
import time
import uuid

import pytest

from services.common.kafka.names import TopicNames
from services.common.records import ClientKind, decode_session
from tests.e2e.clients import TIMEOUT, PahoClient, RawPublishers, unique, wait_until
from tests.e2e.kafka_view import latest_state
from tests.e2e.test_persistent import (
    DRAIN,
    Publisher,
    Subscriber,
    _ack,
    _expect,
    _numbered,
    _quiet,
    _raw_subscriber,
    _read_packet,
)
from tests.servers import LocalCluster

pytestmark = pytest.mark.cluster


def _app_id(tag: str) -> str:
    return unique(f"app-{tag}")


def test_an_application_subscriber_gets_live_and_offline_messages_in_order(
    cluster: LocalCluster,
) -> None:
    node1, node2 = cluster.node_ports
    topic = unique("e2e/app")
    sub = Subscriber(_app_id("sub"), version=5)
    assert sub.connect(node1) is False
    sub.subscribe(topic, 1)
    publisher = Publisher(node2)
    try:
        live = _numbered(200, "live")
        publisher.publish(topic, live)
        wait_until(lambda: len(sub.first_copies()) >= 200, DRAIN, "200 live messages")
        sub.stop()
        offline = _numbered(300, "off")
        publisher.publish(topic, offline)
        publisher.wait_acked(500)
    finally:
        publisher.close()
    assert sub.connect(cluster.mqtt_port) is True  # its session and topic are there
    try:
        wait_until(lambda: len(sub.first_copies()) >= 500, DRAIN, "500 messages")
    finally:
        sub.stop()
    assert sub.first_copies() == live + offline
    # The session record says APPLICATION, and the client has its own topic.
    sessions, _ = asyncio.run(latest_state(cluster))
    value = sessions[sub.client_id]
    assert value is not None and decode_session(value).kind is ClientKind.APPLICATION
    names = TopicNames.from_settings(cluster.settings)
    assert names.app(sub.client_id).startswith(names.prefix + "msg.app.")


@pytest.mark.disruptive
def test_fan_in_of_50000_messages_survives_two_subscriber_kills(cluster: LocalCluster) -> None:
    """The issue's scenario: 100 publishers, 50,000 QoS 1 messages, one APPLICATION
    subscriber on ``devices/#`` whose connection is dropped hard twice mid-stream."""
    started = time.monotonic()
    run = uuid.uuid4().hex[:8]
    sub = Subscriber(_app_id("fanin"), version=4)
    sub.connect(cluster.mqtt_port)
    sub.subscribe("devices/#", 1)
    publishers = RawPublishers(
        cluster.mqtt_port, 100, 500, lambda i: f"devices/{run}/d{i:03d}/telemetry", tag=run
    )
    total = publishers.count * publishers.messages

    def mine() -> set[bytes]:
        return {p for p in sub.payloads() if p.startswith(run.encode())}

    publishers.start()
    try:
        for threshold in (total // 3, 2 * total // 3):  # kill at a third, at two thirds
            wait_until(lambda t=threshold: len(mine()) >= t, DRAIN, f"{threshold} deliveries")
            sub.stop(clean=False)  # the connection dropped without DISCONNECT
            sub.connect(cluster.mqtt_port)  # and the application back at once
        publishers.join(DRAIN)
        assert publishers.errors == []
        acked = set(publishers.acked)
        wait_until(lambda: acked <= mine(), DRAIN, "every acknowledged message")
    finally:
        sub.stop()
    received = mine()
    assert len(acked) == total
    assert len(received) == len(acked), f"{len(received - acked)} unacknowledged received"
    repeats = sub.duplicates()
    assert all(dup for _, dup in repeats), "a redelivery without DUP"
    print(
        f"fan-in: {total} messages, {len(repeats)} redelivered, {time.monotonic() - started:.1f} s"
    )


def test_unacknowledged_deliveries_come_again_with_dup_the_same_ids_and_receive_maximum(
    cluster: LocalCluster,
) -> None:
    node1, node2 = cluster.node_ports
    topic = unique("e2e/app-dup")
    client_id = _app_id("dup")
    sock = _raw_subscriber(node1, client_id, topic, 2, rm=3)
    publisher = PahoClient(node2, unique("q2pub"))
    publisher.connect()
    try:
        for payload in _numbered(5):
            publisher.client.publish(topic, payload, qos=2).wait_for_publish(TIMEOUT)
        first = [_expect(sock, 3).publish() for _ in range(3)]
        assert [(dup, payload) for _, dup, payload in first] == [(False, p) for p in _numbered(3)]
        _quiet(sock, 1.0)  # Receive Maximum 3: the fourth waits
        sock.send(_ack(0x50, first[0][0]))  # PUBREC of the first: it is released
        _expect(sock, 6)  # PUBREL from the node
        sock.close()  # gone before PUBCOMP, with two more unacknowledged
        sock = _raw_subscriber(node2, client_id, "", 2, rm=3)
        got = [_read_packet(sock) for _ in range(3)]
        kinds = sorted(p.kind for p in got if p is not None)
        assert kinds == [3, 3, 6], got  # two PUBLISHes again and the PUBREL
        again = [p.publish() for p in got if p is not None and p.kind == 3]
        assert sorted(again) == sorted((pid, True, payload) for pid, _, payload in first[1:])
        for pid, _, _ in again:
            sock.send(_ack(0x50, pid))
            assert _expect(sock, 6).body[:2] == struct.pack(">H", pid)
            sock.send(_ack(0x70, pid))
        sock.send(_ack(0x70, first[0][0]))
        rest = [_expect(sock, 3).publish() for _ in range(2)]
        assert [(dup, payload) for _, dup, payload in rest] == [
            (False, p) for p in _numbered(5)[3:]
        ]
    finally:
        publisher.close()
        sock.close()
