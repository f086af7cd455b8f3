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
from aiokafka.admin import AIOKafkaAdminClient

from services.common.kafka.names import TopicNames
from services.common.kafka.partitioner import partition_of
from services.common.records import ClientKind, decode_session
from tests.e2e.clients import (
    TIMEOUT,
    PahoClient,
    RawPublishers,
    RawSocket,
    log_excerpt,
    unique,
)
from tests.e2e.kafka_view import latest_state
from tests.e2e.test_persistent import (
    DRAIN,
    Publisher,
    Received,
    Subscriber,
    _ack,
    _expect,
    _numbered,
    _raw_subscriber,
    _read_packet,
)
from tests.servers import LocalCluster
from tests.waiting import wait_until

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
        wait_until(lambda: len(sub.first_copies()) >= 200, "200 live messages", DRAIN)
        sub.stop()
        offline = _numbered(300, "off")
        publisher.publish(topic, offline)
        publisher.wait_acked(500)
    finally:
        publisher.close()
    assert sub.connect(cluster.mqtt_port) is True  # its session and topic are there
    try:
        wait_until(lambda: len(sub.first_copies()) >= 500, "500 messages", DRAIN)
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
            wait_until(lambda t=threshold: len(mine()) >= t, f"{threshold} deliveries", DRAIN)
            sub.stop(clean=False)  # the connection dropped without DISCONNECT
            sub.connect(cluster.mqtt_port)  # and the application back at once
        publishers.join(DRAIN)
        assert publishers.errors == []
        acked = set(publishers.acked)
        wait_until(lambda: acked <= mine(), "every acknowledged message", DRAIN)
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


def _expect_one_of(sock: RawSocket, kinds: tuple[int, ...]) -> Received:
    """The next packet, which must be of one of ``kinds``."""
    got = _read_packet(sock)
    assert got is not None and got.kind in kinds, f"expected one of {kinds}, got {got}"
    return got


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
        sock.send(_ack(0x50, first[0][0]))  # PUBREC of the first: it is released
        # Receive Maximum 3: the fourth waits. Had it been sent with the first three, it
        # would come before the PUBREL that this PUBREC asks for (one partition, in order).
        _expect(sock, 6)  # PUBREL from the node
        sock.close()  # gone before PUBCOMP, with two more unacknowledged
        sock = _raw_subscriber(node2, client_id, "", 2, rm=3)
        got = [_read_packet(sock) for _ in range(3)]
        kinds = sorted(p.kind for p in got if p is not None)
        assert kinds == [3, 3, 6], got  # two PUBLISHes again and the PUBREL
        again = [p.publish() for p in got if p is not None and p.kind == 3]
        assert sorted(again) == sorted((pid, True, payload) for pid, _, payload in first[1:])
        rest: list[tuple[int, bool, bytes]] = []  # what the freed window slots bring
        for pid, _, _ in again:
            sock.send(_ack(0x50, pid))
            while (got_packet := _expect_one_of(sock, (3, 6))).kind == 3:
                rest.append(got_packet.publish())
            assert got_packet.body[:2] == struct.pack(">H", pid)
            sock.send(_ack(0x70, pid))
        sock.send(_ack(0x70, first[0][0]))
        rest += [_expect(sock, 3).publish() for _ in range(2 - len(rest))]
        assert [(dup, payload) for _, dup, payload in rest] == [
            (False, p) for p in _numbered(5)[3:]
        ]
    finally:
        publisher.close()
        sock.close()


# ------------------------------------------------------------------ app_delivery instances


@pytest.mark.disruptive
def test_kill_9_of_app_delivery_mid_stream_loses_nothing(cluster: LocalCluster) -> None:
    run = uuid.uuid4().hex[:8]
    sub = Subscriber(_app_id("k9"), version=5)
    sub.connect(cluster.mqtt_port)
    sub.subscribe(f"k9/{run}/#", 1)
    publishers = RawPublishers(
        cluster.mqtt_port, 20, 300, lambda i: f"k9/{run}/{i}", tag=run, inflight=5
    )
    publishers.start()
    try:
        wait_until(lambda: len(set(sub.payloads())) >= 2000, "the first deliveries", DRAIN)
        assert cluster.kill("app-delivery")
        cluster.start("app-delivery")
        publishers.join(DRAIN)
        assert publishers.errors == []
        acked = set(publishers.acked)
        wait_until(lambda: acked <= set(sub.payloads()), "every acknowledged message", DRAIN)
    finally:
        sub.stop()
    assert len(acked) == 6000
    assert set(sub.payloads()) == acked
    assert all(dup for _, dup in sub.duplicates()), "a redelivery without DUP"


def _ids_on_partitions(partitions: range, count: int) -> list[str]:
    """APPLICATION client ids whose state records land on ``partitions`` (one each), so
    that every instance of a rebalanced group owns some of them."""
    wanted = set(partitions)
    ids: dict[int, str] = {}
    while len(ids) < len(wanted):
        candidate = _app_id("r")
        partition = partition_of(candidate, count)
        if partition in wanted and partition not in ids:
            ids[partition] = candidate
    return [ids[p] for p in sorted(ids)]


def _served_by(cluster: LocalCluster, instance: str, clients: list[str]) -> set[str]:
    """The clients whose feed ``instance`` started (its log says so)."""
    lines = log_excerpt(cluster.log(instance), "delivering from its topic")
    return {c for c in clients if any(f"'{c}'" in line for line in lines)}


@pytest.mark.disruptive
def test_app_delivery_instances_share_clients_and_a_third_rebalances_them(
    cluster: LocalCluster,
) -> None:
    partitions = cluster.settings.state_topic_partitions
    clients = _ids_on_partitions(range(10), partitions)
    topic = unique("e2e/rebalance")
    subs = [Subscriber(client_id, version=5) for client_id in clients]
    extra = ["app-delivery-2", "app-delivery-3"]
    cluster.start_instance("app-delivery", extra[0])
    publisher = Publisher(cluster.mqtt_port)
    try:
        for sub in subs:
            sub.connect(cluster.mqtt_port)
            sub.subscribe(topic, 1)
        payloads = _numbered(400, "rb")
        publisher.publish(topic, payloads[:200], pace=0.005)
        for instance in ("app-delivery", extra[0]):
            assert _served_by(cluster, instance, clients), f"{instance} served no client"
        # Joins the group: the clients are rebalanced.
        cluster.start_instance("app-delivery", extra[1])
        publisher.publish(topic, payloads[200:], pace=0.005)
        publisher.wait_acked(400)
        for sub in subs:
            wait_until(lambda s=sub: set(payloads) <= set(s.payloads()), sub.client_id, DRAIN)
        assert _served_by(cluster, extra[1], clients), "the third instance served no client"
    finally:
        publisher.close()
        for sub in subs:
            sub.stop()
        for instance in extra:
            cluster.stop_extra(instance)
    for sub in subs:
        assert set(sub.payloads()) == set(payloads)
        # Per-publisher order of first arrivals (MQTT 4.6), across the rebalance.
        assert sub.first_copies() == payloads
        assert all(dup for _, dup in sub.duplicates()), "a redelivery without DUP"


# ------------------------------------------------------------------ Shared Subscriptions


def test_a_shared_group_of_three_device_members_gets_about_a_third_each(
    cluster: LocalCluster,
) -> None:
    topic = unique("e2e/share-dev")
    members = [PahoClient(cluster.mqtt_port, unique(f"dev-m{i}")) for i in range(3)]
    publisher = Publisher(cluster.node_ports[0])
    try:
        for member in members:
            assert member.connect() == 0
            member.subscribe(f"$share/devs/{topic}", 1)
        payloads = _numbered(300, "sh")
        publisher.publish(topic, payloads)
        publisher.wait_acked(300)

        def got(member: PahoClient) -> list[bytes]:
            return [bytes(m.payload) for m in list(member.messages.queue)]

        wait_until(lambda: sum(len(got(m)) for m in members) >= 300, "300 deliveries", DRAIN)
        shares = [got(m) for m in members]
    finally:
        publisher.close()
        for member in members:
            member.close()
    assert sorted(p for share in shares for p in share) == payloads  # each message once
    assert all(80 <= len(share) <= 120 for share in shares), [len(s) for s in shares]


async def _group_members(cluster: LocalCluster, group: str) -> int:
    """How many members of consumer ``group`` hold partitions now."""
    admin = AIOKafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
    await admin.start()
    try:
        [description] = await admin.describe_consumer_groups([group])
        [_, _, state, _, _, members, *_] = description.groups[0]
        return len(members) if state == "Stable" else 0
    finally:
        await admin.close()


def test_application_members_of_a_shared_group_split_its_topic_through_kafka(
    cluster: LocalCluster,
) -> None:
    run = uuid.uuid4().hex[:8]
    topic_filter = f"appshare/{run}/#"
    members = [Subscriber(_app_id(f"sh{i}"), version=5) for i in range(3)]
    group = TopicNames.from_settings(cluster.settings).app_shared_group("apps", topic_filter)
    try:
        for member in members:
            member.connect(cluster.mqtt_port)
            member.subscribe(f"$share/apps/{topic_filter}", 1)
        # Kafka spreads the group topic's partitions once all three consumers have joined.
        wait_until(
            lambda: asyncio.run(_group_members(cluster, group)) == 3, "3 group members", DRAIN
        )
        publishers = RawPublishers(
            cluster.mqtt_port, 30, 20, lambda i: f"appshare/{run}/{i}", tag=run
        )
        publishers.start()
        publishers.join(DRAIN)
        assert publishers.errors == []
        acked = set(publishers.acked)

        def union() -> set[bytes]:
            return {p for m in members for p in m.payloads()}

        wait_until(lambda: acked <= union(), "every acknowledged message", DRAIN)
    finally:
        for member in members:
            member.stop()
    assert len(acked) == 600 and union() == acked
    assert all(member.payloads() for member in members), "a member got nothing"
    assert sum(len(set(m.payloads())) for m in members) == 600  # no message to two members


# ------------------------------------------------------------------ topics' life


async def _topics(cluster: LocalCluster) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


def test_a_session_that_ends_or_expires_deletes_its_topic(cluster: LocalCluster) -> None:
    names = TopicNames.from_settings(cluster.settings)
    ended, expiring = _app_id("end"), _app_id("exp")
    for client_id, expiry in ((ended, 3600), (expiring, 1)):
        client = PahoClient(cluster.mqtt_port, client_id, clean_start=False, session_expiry=expiry)
        assert client.connect() == 0
        client.close()
    assert {names.app(ended), names.app(expiring)} <= asyncio.run(_topics(cluster))
    # Clean Start with no Session Expiry Interval: the persistent session is gone.
    client = PahoClient(cluster.mqtt_port, ended, clean_start=True, session_expiry=0)
    assert client.connect() == 0
    client.close()
    wait_until(
        lambda: not {names.app(ended), names.app(expiring)} & asyncio.run(_topics(cluster)),
        "both topics deleted",
        DRAIN,
    )
    sessions, subscribed = asyncio.run(latest_state(cluster))
    assert sessions.get(expiring, b"") is None and expiring not in subscribed


@pytest.mark.disruptive
def test_kill_9_of_the_subscribers_ingest_node_loses_nothing(cluster: LocalCluster) -> None:
    node1, node2 = cluster.node_ports
    topic = unique("e2e/app-node")
    sub = Subscriber(_app_id("node"), version=4)
    sub.connect(node1)
    sub.subscribe(topic, 1)
    publisher = Publisher(node2)
    payloads = _numbered(1500)
    try:
        publisher.publish(topic, payloads[:500], pace=0.001)
        wait_until(lambda: len(sub.first_copies()) >= 200, "the first deliveries", DRAIN)
        assert cluster.kill("ingest-node1")
        publisher.publish(topic, payloads[500:1000], pace=0.001)  # while it is down
        sub.connect(node2)  # its node died: the application comes back on the other one
        cluster.start("ingest-node1")
        publisher.publish(topic, payloads[1000:], pace=0.001)
        publisher.wait_acked(len(payloads))
        acked = set(publisher.acked)
        wait_until(lambda: acked <= set(sub.payloads()), "every acknowledged message", DRAIN)
    finally:
        publisher.close()
        sub.stop()
    assert acked == set(payloads)
    assert sub.first_copies() == payloads  # per-publisher order (MQTT 4.6)
    assert all(dup for _, dup in sub.duplicates()), "a redelivery without DUP"
