"""APPLICATION clients end to end (TBMQ's fan-in clients): every message matched for a
persistent APPLICATION client goes through its own Kafka topic, and app_delivery delivers
it from there within the client's Receive Maximum, committing only what was acknowledged.

Client ids matching ``app-*`` are APPLICATION clients in the test cluster
(``application_client_ids``). Third-party clients throughout (paho-mqtt); the publishers of
the fan-in test are raw sockets, many per thread, to keep the machine free for the broker.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from services.common.kafka.names import TopicNames
from services.common.records import ClientKind, decode_session
from tests.e2e.clients import RawPublishers, unique, wait_until
from tests.e2e.kafka_view import latest_state
from tests.e2e.test_persistent import DRAIN, Publisher, Subscriber, _numbered
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
