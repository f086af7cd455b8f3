"""Replay subscriptions end to end (``$replay/<since>/<filter>``, docs/concepts/replay.md).

A subscriber joining late with ``$replay/1h/<filter>`` gets the messages published before
its SUBSCRIBE, then the live ones, each exactly once and in per-publisher order (MQTT 4.6),
with messages of several publishers racing the SUBSCRIBE (the switch) among them; v5
history carries ``replayed=true``. The history respects the subscriber's
Receive Maximum: with manual acknowledgements the replay waits for them. A router killed
with SIGKILL in the middle of a replay loses and repeats nothing. A persistent session
(DEVICE or APPLICATION) whose connection ends mid-replay (DISCONNECT, or kill -9 of its
ingest node) resumes it on the other node: the rest of the history, then what was
published meanwhile, each once but for resends with DUP=1 and the Packet Identifier of
their first copy (MQTT 4.4). Clients: paho-mqtt (MQTT 5
and 3.1.1) and mosquitto_sub.
"""

from __future__ import annotations

import queue

import paho.mqtt.client as paho
import pytest

from tests.e2e.clients import TIMEOUT, MosquittoSub, PahoClient, unique
from tests.servers import LocalCluster
from tests.waiting import wait_until

pytestmark = pytest.mark.cluster

#: Messages of each publisher before the SUBSCRIBE, and in flight while it is made.
HISTORY = 20
SWITCH = 40

#: Publishers racing the SUBSCRIBE.
PUBLISHERS = 3

#: Seconds a router started again may take to route again (it rejoins its group).
ROUTER_BACK = 60.0


def _published(publisher: PahoClient, topic: str, seqs: range) -> None:
    """Publish ``<seq>`` at QoS 1 for each of ``seqs`` and wait for every PUBACK."""
    mids = [publisher.publish(topic, str(seq).encode(), 1) for seq in seqs]
    wait_until(lambda: all(mid in publisher.snapshot()[0] for mid in mids), "PUBACKs")


def _until_markers(
    sub: PahoClient, markers: set[bytes], timeout: float = TIMEOUT, ack: bool = False
) -> list[paho.MQTTMessage]:
    """The messages ``sub`` receives until every payload of ``markers`` came (included)."""
    got: list[paho.MQTTMessage] = []
    missing = set(markers)
    while missing:
        try:
            message = sub.messages.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"markers {missing} missing after {len(got)} messages") from None
        if ack:
            sub.ack(message)
        got.append(message)
        missing.discard(message.payload)
    return got


def _until_last(sub: PahoClient, topics: list[str], last: int) -> list[paho.MQTTMessage]:
    """The messages ``sub`` receives until payload ``last`` came on each of ``topics``."""
    got: list[paho.MQTTMessage] = []
    waiting = set(topics)
    while waiting:
        try:
            message = sub.messages.get(timeout=TIMEOUT)
        except queue.Empty:
            raise AssertionError(f"{waiting} unfinished after {len(got)} messages") from None
        got.append(message)
        if message.payload == str(last).encode():
            waiting.discard(message.topic)
    return got


def _replayed(message: paho.MQTTMessage) -> bool:
    props = getattr(message.properties, "UserProperty", None) or []
    return ("replayed", "true") in props


@pytest.mark.parametrize("version", [4, 5], ids=["v311", "v5"])
def test_a_late_subscriber_gets_the_history_then_live_messages_once_each(
    cluster: LocalCluster, version: int
) -> None:
    base = unique("e2e/replay")
    publishers = [PahoClient(cluster.mqtt_port, unique(f"pub{i}")) for i in range(PUBLISHERS)]
    sub = PahoClient(cluster.mqtt_port, unique("sub"), version, receive_maximum=3)
    try:
        for pub in publishers:
            pub.connect()
            _published(pub, f"{base}/{pub.client_id}", range(HISTORY))
        assert sub.connect() == 0
        # The switch: every publisher has PUBLISHes in flight while the SUBSCRIBE is stored
        # (paho sends them as their PUBACKs free its window), so some are stored between the
        # cut being read and the subscription record; each must arrive once, in its place.
        mids: dict[str, list[int]] = {pub.client_id: [] for pub in publishers}
        racing = range(HISTORY, HISTORY + SWITCH)
        for seq in racing[: SWITCH // 2]:
            for pub in publishers:
                mids[pub.client_id].append(pub.publish(f"{base}/{pub.client_id}", b"%d" % seq, 1))
        sub.client.subscribe(f"$replay/1h/{base}/#", 1)
        for seq in racing[SWITCH // 2 :]:
            for pub in publishers:
                mids[pub.client_id].append(pub.publish(f"{base}/{pub.client_id}", b"%d" % seq, 1))
        assert [code.value for code in sub.subacks.get(timeout=TIMEOUT)] == [1]
        for pub in publishers:
            sent = mids[pub.client_id]
            wait_until(lambda p=pub, s=sent: all(m in p.snapshot()[0] for m in s), "PUBACKs")
        # The markers, after the SUBACK and the racing messages: what comes before them
        # is all there is (a duplicate or a loss shows in the sequence).
        end = HISTORY + SWITCH
        for pub in publishers:
            _published(pub, f"{base}/{pub.client_id}", range(end, end + 1))
        got = _until_last(sub, [f"{base}/{pub.client_id}" for pub in publishers], end)
        by_publisher: dict[str, list[int]] = {}
        for message in got:
            by_publisher.setdefault(message.topic, []).append(int(message.payload))
        assert by_publisher == {
            f"{base}/{pub.client_id}": list(range(end + 1)) for pub in publishers
        }, str(by_publisher)
        if version == 5:
            history = [m for m in got if int(m.payload) < HISTORY]
            live = [m for m in got if int(m.payload) >= end]
            assert all(_replayed(m) for m in history)
            assert not any(_replayed(m) for m in live)
    finally:
        for client in (*publishers, sub):
            client.close()


def test_mosquitto_sub_replays_with_mqtt_311(cluster: LocalCluster) -> None:
    base = unique("e2e/replay-mosq")
    pub = PahoClient(cluster.mqtt_port, unique("pub"))
    try:
        pub.connect()
        _published(pub, f"{base}/t", range(3))
        sub = MosquittoSub(cluster.mqtt_port, f"$replay/15m/{base}/#", qos=1, count=4)
        _published(pub, f"{base}/t", range(3, 4))
        assert sub.messages() == [f"{base}/t {seq}" for seq in range(4)]
    finally:
        pub.close()


@pytest.mark.disruptive
def test_exactly_once_across_a_router_killed_mid_replay(cluster: LocalCluster) -> None:
    base = unique("e2e/replay-kill")
    pub = PahoClient(cluster.mqtt_port, unique("pub"))
    sub = PahoClient(cluster.mqtt_port, unique("sub"), receive_maximum=1, manual_ack=True)
    history = 30
    try:
        pub.connect()
        _published(pub, f"{base}/t", range(history))
        sub.connect()
        assert [code.value for code in sub.subscribe(f"$replay/1h/{base}/#", 1)] == [1]
        first = sub.messages.get(timeout=TIMEOUT)  # the replay waits for its PUBACK
        assert (first.payload, sub.messages.empty()) == (b"0", True)
        assert cluster.kill("router")
        try:
            _published(pub, f"{base}/t", range(history, history + 10))  # stored, not routed
        finally:
            cluster.start("router")
        sub.ack(first)
        got = [first, *_until_markers(sub, {str(history + 9).encode()}, ROUTER_BACK, ack=True)]
        _published(pub, f"{base}/t", range(history + 10, history + 11))
        got += _until_markers(sub, {str(history + 10).encode()}, ack=True)
        assert [int(m.payload) for m in got] == list(range(history + 11))
        assert all(_replayed(m) for m in got[:history])
        assert not any(_replayed(m) for m in got[history:])
    finally:
        pub.close()
        sub.close()


@pytest.mark.parametrize(
    ("kind", "end"),
    [
        ("dev", "disconnect"),  # a DEVICE: device_persist stores its live messages
        pytest.param("app", "kill", marks=pytest.mark.disruptive),  # app_delivery's
    ],
)
def test_a_persistent_session_resumes_its_replay_on_the_other_node(
    cluster: LocalCluster, kind: str, end: str
) -> None:
    """The first connection ends mid-replay with a DISCONNECT, or a kill -9 of its ingest
    node (nothing is stored at the end of a connection: the two leave the same); the
    session resumes on the other node."""
    node1, node2 = cluster.node_ports
    base = unique("e2e/replay-persistent")
    history, acked, live = 60, 40, 5
    pub = PahoClient(node2, unique("pub"))  # not on the node that may be killed
    sub_id = unique(f"{kind}-replay")  # app-*: an APPLICATION client in the test cluster

    def subscriber(port: int) -> PahoClient:
        return PahoClient(port, sub_id, clean_start=False, session_expiry=300,
                          receive_maximum=2, manual_ack=True)  # fmt: skip

    first, second = subscriber(node1), subscriber(node2)
    try:
        pub.connect()
        _published(pub, f"{base}/t", range(history))
        assert first.connect() == 0
        assert [code.value for code in first.subscribe(f"$replay/1h/{base}/#", 2)] == [1]
        got = _until_markers(first, {str(acked - 1).encode()}, ack=True)
        # Two more in flight (Receive Maximum 2), not acknowledged: then gone.
        got += [first.messages.get(timeout=TIMEOUT) for _ in range(2)]
        if end == "kill":
            assert cluster.kill("ingest-node1")
        first.close()
        # Published while the session is disconnected: kept by its message store, live.
        _published(pub, f"{base}/t", range(history, history + live))
        assert second.connect() == 0
        last = history + live
        got += _until_markers(second, {str(last - 1).encode()}, ack=True)
        _published(pub, f"{base}/t", range(last, last + 1))  # live on the resumed session
        got += _until_markers(second, {str(last).encode()}, ack=True)
    finally:
        for client in (pub, first, second):
            client.close()
        if end == "kill":
            cluster.start("ingest-node1")
    seqs = [int(m.payload) for m in got]
    firsts = [seq for i, seq in enumerate(seqs) if seq not in seqs[:i]]
    repeats = [m for i, m in enumerate(got) if int(m.payload) in seqs[:i]]
    assert firsts == list(range(last + 1)), seqs  # everything, in per-publisher order
    # A repeat is a resend (DUP) of what the first connection may not have seen
    # acknowledged: from the last progress stored (every 32 messages), not from the start.
    assert len(repeats) >= 2 and all(m.dup for m in repeats), seqs  # at least those in flight
    # ... with the Packet Identifier of its first copy (MQTT 4.4 [MQTT-4.4.0-1])
    first_ids: dict[int, int] = {}
    for m in got:
        first_ids.setdefault(int(m.payload), m.mid)
    assert [m.mid for m in repeats] == [first_ids[int(m.payload)] for m in repeats], seqs
    assert all(int(m.payload) >= 32 - 2 for m in repeats), seqs
    assert all(_replayed(m) for m in got if int(m.payload) < history)
    assert not any(_replayed(m) for m in got if int(m.payload) >= history)
