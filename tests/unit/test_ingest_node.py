"""The ingest node's shell without Kafka: the client registry, the store pipeline (order,
acknowledgements, timeouts, backpressure), Will Messages waiting out their delay (stored,
then timed by their partition's owner), downlink delivery and the ends of a node's life
(services/ingest/node.py and the modules it wires).

The node's Kafka side is its ``send`` callable; here :class:`Producer` records every record
and leaves its acknowledgement to the test, so each test decides when (and whether) Kafka
answers. Clients are :class:`Shell` stand-ins for sockets, fed with codec-encoded bytes.
The same node against the real broker is tests/integration/test_ingest_backpressure.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError
from test_ingest_support import make_settings

from services.common.auth.authenticate import Authenticator, NoCredentials
from services.common.auth.authorize import ALLOW_ALL_RULE
from services.common.mqtt.codec import StreamDecoder, encode
from services.common.mqtt.packets import (
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PubAck,
    Publish,
    SubAck,
    Subscribe,
    SubscriptionRequest,
    Will,
)
from services.common.mqtt.properties import Properties
from services.common.mqtt.reason_codes import ReasonCode
from services.common.records import (
    DelayedCancel,
    DelayedOutcome,
    DelayedRecord,
    DisconnectCause,
    Downlink,
    EventKind,
    Headers,
    KafkaRecord,
    Origin,
    PublishMeta,
    RetainedRequest,
    SessionRecord,
    Target,
    WillRecord,
    decode_meta,
    decode_session,
    decode_subscriptions,
    delayed_outcome,
    delayed_record,
    delayed_tombstone,
    encode_meta,
    encode_session,
    encode_subscriptions,
    parse_client_event,
    parse_delayed,
    parse_msg_all,
    parse_will,
)
from services.common.sessions import new_connection_id
from services.common.subscription import LiveFrom, Subscription
from services.ingest.connection import ServerConnection
from services.ingest.fan_out import FanOut
from services.ingest.node import IngestNode
from services.ingest.registry import ClientRegistry
from services.ingest.store_pipeline import ReadLiveFrom
from tests.waiting import wait_for

NOW_MS = 1_700_000_000_000


@dataclass
class Sent:
    """One record the node produced, and its acknowledgement (the test resolves it)."""

    topic: str
    key: bytes
    value: bytes | None
    headers: Headers | None
    ack: asyncio.Future[object]


@dataclass(frozen=True)
class Metadata:
    """What Kafka answers for a stored record."""

    offset: int


class Producer:
    """The node's ``send``: records what it is given; Kafka answers when the test says."""

    def __init__(self) -> None:
        self.sent: list[Sent] = []
        self.refused: set[bytes] = set()  # values the producer refuses at once
        self._offset = 100

    async def send(
        self, topic: str, key: bytes, value: bytes | None, headers: Headers | None
    ) -> Awaitable[object]:
        if value in self.refused:
            raise KafkaConnectionError("the producer's buffer stayed full")
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self.sent.append(Sent(topic, key, value, headers, future))
        return future

    def answer(self, *sent: Sent) -> None:
        """Kafka stored these records (all unanswered ones when none is named)."""
        for record in sent or self.sent:
            if not record.ack.done():
                self._offset += 1
                record.ack.set_result(Metadata(self._offset))

    def on(self, topic: str) -> list[Sent]:
        """The records sent to ``topic``, in order."""
        return [s for s in self.sent if s.topic == topic]


class WillCommits:
    """The node's ``commit_will`` (or ``commit_delayed``): the transactions it committed
    (partition, records); the next ``failures`` commits fail as Kafka would."""

    def __init__(self) -> None:
        self.done: list[tuple[int, list[KafkaRecord]]] = []
        self.failures = 0

    async def __call__(self, partition: int, records: list[KafkaRecord]) -> None:
        if self.failures:
            self.failures -= 1
            raise KafkaConnectionError("Kafka is down")
        self.done.append((partition, records))


class Shell:
    """A client's socket as the node sees it: what was written (decoded as a client of
    ``version`` would), whether reading is paused, whether it was closed."""

    def __init__(self, node: IngestNode, version: int = 5) -> None:
        self.connection = ServerConnection(node.context, new_connection_id())
        self.node = node
        self.version = version
        self.decoder = StreamDecoder(protocol_version=version)
        self.received: list[Packet] = []
        self.reading: list[bool] = [True]
        self.pending_at_resume: list[int] = []
        self.keep_alive_changes = 0
        self.closed = False
        self.closed_at: float | None = None  # the event loop's clock

    def write(self, data: bytes) -> None:
        self.received += self.decoder.feed(data)

    def close(self) -> None:
        self.closed = True
        self.closed_at = asyncio.get_running_loop().time()

    def pause_reading(self) -> None:
        self.reading.append(False)

    def resume_reading(self) -> None:
        self.reading.append(True)
        self.pending_at_resume.append(self.node.pending_records)

    def keep_alive_changed(self) -> None:
        self.keep_alive_changes += 1

    def write_buffer_size(self) -> int:
        return 0  # everything written is decoded at once

    def send(self, *packets: Packet) -> None:
        """The client sends ``packets`` (one read of the socket)."""
        data = b"".join(encode(p, self.version) for p in packets)
        self.node.run(self, self.connection.receive_data(data))

    def lose(self) -> None:
        """The socket is gone (as the server's connection_lost does)."""
        self.node.unregister(self)
        self.node.run(self, self.connection.connection_lost())

    def of(self, kind: type[Any]) -> list[Any]:
        return [p for p in self.received if isinstance(p, kind)]


def _node(
    producer: Producer,
    synced: asyncio.Event | None = None,
    commits: WillCommits | None = None,
    delayed_commits: WillCommits | None = None,
    read_live_from: ReadLiveFrom | None = None,
    **settings: Any,
) -> IngestNode:
    """A node on ``producer``; its state topics are read up to date at once, or when
    ``synced`` is set; its will transactions go to ``commits``, its delayed publications'
    to ``delayed_commits``."""

    async def sync_state() -> None:
        if synced is not None:
            await synced.wait()

    async def no_app_topics(client_id: str) -> None:
        raise AssertionError(f"{client_id} is not an APPLICATION client")

    values = {"node_id": "n1", "topic_prefix": "t.", "kafka_request_timeout_seconds": 5.0}
    values.update(settings)
    return IngestNode(
        make_settings(**values),
        producer.send,
        sync_state,
        no_app_topics,
        commit_will=commits or WillCommits(),
        commit_delayed=delayed_commits or WillCommits(),
        authenticator=Authenticator(
            NoCredentials(), allow_anonymous=True, anonymous_rules=(ALLOW_ALL_RULE,)
        ),
        fetch_credential=NoCredentials().get,
        read_live_from=read_live_from,
        clock=lambda: NOW_MS,
    )


async def _connected(
    node: IngestNode, producer: Producer, client_id: str = "c1", version: int = 5, **connect: Any
) -> Shell:
    shell = Shell(node, version)
    before = len(producer.on(node.names.client_sessions))
    shell.send(Connect(version, client_id, connect.pop("clean_start", True), 30, **connect))
    await wait_for(
        lambda: len(producer.on(node.names.client_sessions)) > before, "the session record"
    )
    producer.answer()
    await wait_for(lambda: shell.of(ConnAck), "CONNACK")
    return shell


# ---------------------------------------------------------------------- registry


class _Stub:
    def __init__(self, client_id: str) -> None:
        self.connection = type("C", (), {"client_id": client_id})()


def test_the_registry_keeps_one_connection_per_client_id() -> None:
    registry = ClientRegistry()
    first, second = _Stub("a"), _Stub("a")
    assert registry.register(first, "a") is None  # type: ignore[arg-type]
    assert registry.register(second, "a") is first  # type: ignore[arg-type]
    registry.unregister(first)  # type: ignore[arg-type]  # replaced already: no effect
    assert registry.get("a") is second
    registry.unregister(second)  # type: ignore[arg-type]
    assert registry.get("a") is None and len(registry) == 0


# ---------------------------------------------------------------------- connect, takeover


async def test_connack_follows_the_stored_session_record() -> None:
    producer = Producer()
    node = _node(producer)
    shell = Shell(node)
    shell.send(Connect(5, "c1", True, 30))
    await wait_for(lambda: producer.sent, "the session record")
    [record] = producer.sent
    assert (record.topic, record.key) == ("t.client.sessions", b"c1")
    assert record.value is not None and decode_session(record.value).connected
    assert shell.received == []  # no CONNACK before Kafka has the record
    producer.answer()
    await wait_for(lambda: shell.received, "CONNACK")
    assert shell.of(ConnAck)[0].reason_code == 0
    assert node.registry.get("c1") is shell
    assert shell.keep_alive_changes == 1  # the timer is set to Keep Alive from the CONNACK
    assert shell.connection.state.session_offset == 101  # the record's offset


async def test_a_second_connection_on_the_node_takes_the_first_over() -> None:
    producer = Producer()
    node = _node(producer)
    first = await _connected(node, producer)
    second = await _connected(node, producer)
    assert [d.reason_code for d in first.of(Disconnect)] == [0x8E] and first.closed
    assert node.registry.get("c1") is second and not second.closed


async def test_a_newer_connection_on_another_node_takes_the_session_over() -> None:
    producer = Producer()
    node = _node(producer)
    shell = await _connected(node, producer)
    elsewhere = SessionRecord("n2", b"x" * 16, True, 5, True, False)
    node.apply_state("t.client.sessions", b"c1", encode_session(elsewhere), 500)
    assert [d.reason_code for d in shell.of(Disconnect)] == [0x8E] and shell.closed
    assert node.registry.get("c1") is None
    assert node.sessions["c1"] == elsewhere


async def test_state_records_fill_the_session_lookup() -> None:
    producer = Producer()
    node = _node(producer)
    record = SessionRecord("n2", b"x" * 16, False, 5, False, True)
    subs = [Subscription("c9", "a/#", 1)]
    node.apply_state("t.client.sessions", b"c9", encode_session(record), 1)
    node.apply_state("t.client.subscriptions", b"c9", encode_subscriptions(subs), 2)
    assert node.previous_session("c9") == (record, subs)
    node.apply_state("t.client.subscriptions", b"c9", None, 3)
    node.apply_state("t.client.sessions", b"c9", None, 4)
    assert node.previous_session("c9") == (None, [])


@pytest.mark.parametrize(("ended_at", "present"), [(60, False), (None, True)])
async def test_a_session_its_holder_ended_before_the_new_connect_record_is_not_resumed(
    ended_at: int | None, present: bool
) -> None:
    producer = Producer()
    node = _node(producer)
    held = SessionRecord("n2", b"x" * 16, True, 5, False, True, session_expiry_interval=60)
    node.apply_state("t.client.sessions", b"c1", encode_session(held), 50)
    shell = Shell(node)
    shell.send(Connect(5, "c1", False, 30, properties=Properties(session_expiry_interval=60)))
    await wait_for(lambda: node.registry.watching("c1") is shell, "the connection watching")
    await wait_for(lambda: producer.on("t.client.sessions"), "the connect record")
    if ended_at is not None:  # the holder's DISCONNECT (Session Expiry Interval 0) landed
        node.apply_state("t.client.sessions", b"c1", None, ended_at)
    producer.answer()  # the connect record, at offset 101: after the tombstone
    if not present:
        await wait_for(lambda: len(producer.on("t.client.sessions")) == 2, "a new session")
        producer.answer()
    await wait_for(lambda: shell.of(ConnAck), "CONNACK")
    assert shell.of(ConnAck)[0].session_present is present
    assert node.registry.get("c1") is shell and node.registry.watching("c1") is None


async def test_a_delivery_before_connack_reaches_the_client_after_it() -> None:
    producer = Producer()
    synced = asyncio.Event()
    node = _node(producer, synced)
    held = SessionRecord("n2", b"x" * 16, True, 5, False, True, session_expiry_interval=60)
    node.apply_state("t.client.sessions", b"c1", encode_session(held), 50)
    shell = Shell(node)
    shell.send(Connect(5, "c1", False, 30, properties=Properties(session_expiry_interval=60)))
    await wait_for(lambda: producer.on("t.client.sessions"), "the connect record")
    producer.answer()
    # A store read the connect record and resent what was in flight; the state sync
    # CONNACK waits for is not done yet.
    meta = PublishMeta("t", 1, False, NOW_MS, 5)
    assert node.deliver(Downlink(meta, b"resent", [Target("c1", 1, False, (), 3, True)])) == 1
    assert shell.received == []
    synced.set()
    await wait_for(lambda: shell.of(Publish), "the delivery")
    assert [type(p) for p in shell.received] == [ConnAck, Publish]


class Log:
    """Kafka's ``client.sessions`` / ``client.subscriptions`` as the nodes read them: each
    record a producer had stored is appended in the order the test says, and every node
    applies it at its offset (the state readers)."""

    def __init__(self, *nodes: IngestNode) -> None:
        self.nodes = nodes
        self.offset = 1000

    def land(self, *records: Sent) -> None:
        for record in records:
            if record.topic not in ("t.client.sessions", "t.client.subscriptions"):
                continue
            self.offset += 1
            for node in self.nodes:
                node.apply_state(
                    record.topic, record.key, record.value, self.offset, record.headers or ()
                )


async def test_a_late_clean_session_delete_leaves_a_newer_persistent_session() -> None:
    """The interleaving of issue 22.1, across two nodes: a clean session on n1 ends, its
    delete stays on its way; meanwhile the client starts a persistent session on n2,
    subscribes and disconnects; only then does n1's delete land. The persistent session,
    its subscriptions and its stored messages stay, and n2 writes its records again so that
    compaction keeps them, not the delete."""
    one, two = Producer(), Producer()
    node1, node2 = _node(one, node_id="n1"), _node(two, node_id="n2")
    log = Log(node1, node2)
    sessions, subscriptions = "t.client.sessions", "t.client.subscriptions"

    clean = await _connected(node1, one, "c1", 4)
    clean.send(Subscribe(1, [SubscriptionRequest("a/#", 1)]))
    await wait_for(lambda: one.on(subscriptions), "the clean session's subscriptions")
    one.answer()
    log.land(*one.sent)
    clean.lose()
    await wait_for(lambda: len(one.on(sessions)) == 2, "the clean session's delete")
    deletes = [s for s in one.sent if s.value is None]
    assert {s.topic for s in deletes} == {sessions, subscriptions}  # sent, not yet stored

    persistent = await _connected(node2, two, "c1", 4, clean_start=False)
    persistent.send(Subscribe(1, [SubscriptionRequest("b/#", 1)]))
    await wait_for(lambda: two.on(subscriptions), "the persistent session's subscriptions")
    two.answer()
    persistent.send(Disconnect())
    await wait_for(lambda: len(two.on(sessions)) == 2, "the persistent session's end")
    two.answer()
    log.land(*two.sent)
    [ended] = [decode_session(s.value) for s in two.on(sessions)[1:] if s.value]
    assert ended.persistent and not ended.connected

    written = len(two.sent)
    one.answer()
    log.land(*deletes)  # the late delete lands last
    for node in (node1, node2):
        record, subs = node.previous_session("c1")
        assert record == ended
        assert [s.topic_filter for s in subs] == ["b/#"]
    await wait_for(lambda: len(two.sent) == written + 2, "n2 writing the session again")
    rewritten = two.sent[written:]
    assert [(s.topic, s.value) for s in rewritten] == [
        (sessions, encode_session(ended)),
        (subscriptions, [s for s in two.on(subscriptions) if s.value][-1].value),
    ]
    assert len(one.on(sessions)) == 2  # n1 wrote its connect record and its delete only


async def test_a_clean_sessions_own_delete_deletes_it() -> None:
    producer = Producer()
    node = _node(producer)
    log = Log(node)
    shell = await _connected(node, producer, "c1", 4)
    log.land(*producer.sent)
    shell.lose()
    await wait_for(lambda: len(producer.on("t.client.sessions")) == 2, "the delete")
    producer.answer()
    log.land(producer.on("t.client.sessions")[-1])
    assert node.previous_session("c1") == (None, [])


async def test_the_socket_closes_after_a_disconnects_end_records_are_stored() -> None:
    producer = Producer()
    node = _node(producer)
    shell = await _connected(node, producer)
    shell.send(Disconnect())
    await wait_for(lambda: len(producer.on("t.client.sessions")) == 2, "the end record")
    assert not shell.closed  # a reconnect after the close must find the session ended
    producer.answer()
    await wait_for(lambda: shell.closed, "the close")


# ---------------------------------------------------------------------- store pipeline


async def test_records_leave_in_order_and_pubacks_follow_kafka_in_publish_order() -> None:
    producer = Producer()
    node = _node(producer)
    shell = await _connected(node, producer)
    shell.send(*(Publish("t", bytes([i]), 1, packet_id=i + 1) for i in range(3)))
    await wait_for(lambda: len(producer.on("t.msg.all")) == 3, "three msg.all records")
    first, second, third = producer.on("t.msg.all")
    assert [r.value for r in (first, second, third)] == [b"\x00", b"\x01", b"\x02"]
    producer.answer(third, second)
    await wait_for(lambda: node.pending_records == 1, "two answers handled")
    producer.answer(first)
    await wait_for(lambda: len(shell.of(PubAck)) == 3, "three PUBACKs")
    # Kafka answered 3 and 2 first; the PUBACKs still leave in PUBLISH order (MQTT 4.6).
    assert [p.packet_id for p in shell.of(PubAck)] == [1, 2, 3]


async def test_a_record_kafka_does_not_answer_fails_after_the_request_timeout() -> None:
    producer = Producer()
    node = _node(producer, kafka_request_timeout_seconds=0.05)
    shell = await _connected(node, producer)
    shell.send(Publish("t", b"lost", 1, packet_id=7))
    await wait_for(lambda: shell.closed, "the connection closed: the outcome is unknown")
    assert shell.of(PubAck) == []
    assert [d.reason_code for d in shell.of(Disconnect)] == [0x80]
    assert node.pending_records == 0


async def test_publishes_queued_behind_one_kafka_refused_are_not_written() -> None:
    producer = Producer()
    producer.refused.add(b"\x01")
    node = _node(producer)
    shell = await _connected(node, producer)
    shell.send(*(Publish("t", bytes([i]), 1, packet_id=i + 1) for i in range(3)))
    await wait_for(lambda: node.pending_records == 1, "the second and third refused")
    producer.answer()
    await wait_for(lambda: shell.closed, "the connection closed")
    # Written after the refused one, the third would be stored ahead of its resending.
    assert [r.value for r in producer.on("t.msg.all")] == [b"\x00"]
    assert [(p.packet_id, p.reason_code) for p in shell.of(PubAck)] == [(1, 0)]
    assert [d.reason_code for d in shell.of(Disconnect)] == [0x80]


async def test_a_flood_pauses_reading_until_half_the_records_are_answered() -> None:
    producer = Producer()
    node = _node(producer, ingest_max_pending_records=4)
    shell = await _connected(node, producer)
    shell.send(*(Publish("flood", bytes([i])) for i in range(10)))
    assert shell.reading == [True, False]  # past 4 pending records: no more reading
    await wait_for(lambda: len(producer.on("t.msg.all")) == 10, "every record sent")
    producer.answer()
    await wait_for(lambda: shell.reading[-1], "reading again")
    assert shell.reading == [True, False, True]
    assert shell.pending_at_resume == [2]  # once half of the 4 allowed were left


# ---------------------------------------------------------------------- client.events


async def test_client_events_are_written_and_nothing_waits_for_them() -> None:
    producer = Producer()
    node = _node(producer)
    shell = await _connected(node, producer)
    [connected] = producer.on("t.client.events")  # sent after CONNACK, not answered
    assert parse_client_event(connected.key, connected.value)[1].kind is EventKind.CONNECTED
    assert node.pending_records == 0  # not a store effect: it never pauses a publisher
    shell.send(Publish("t", b"x", 1, packet_id=1))
    await wait_for(lambda: producer.on("t.msg.all"), "the msg.all record")
    producer.answer(*producer.on("t.msg.all"))
    await wait_for(lambda: shell.of(PubAck), "the PUBACK, with the event still unanswered")
    assert not connected.ack.done()


# ---------------------------------------------------------------------- Will Messages


def _will(delay: int, retain: bool = False) -> dict[str, Any]:
    will = Will("status/c1", b"gone", 0, retain, Properties(will_delay_interval=delay))
    return {
        "will": will,
        "clean_start": False,
        "properties": Properties(session_expiry_interval=60),
    }


async def test_a_will_without_delay_follows_the_clients_last_publishes() -> None:
    producer = Producer()
    node = _node(producer)
    shell = await _connected(node, producer, **_will(0, retain=True))
    shell.send(Publish("t", b"last"))
    shell.lose()
    await wait_for(lambda: len(producer.on("t.msg.all")) == 2, "the will's record")
    assert [r.value for r in producer.on("t.msg.all")] == [b"last", b"gone"]
    [retained] = producer.on("t.msg.retained")  # Will Retain [MQTT-3.1.2-17]
    assert (retained.key, retained.value) == (b"status/c1", b"gone")


async def test_a_delayed_will_is_stored_before_the_sessions_end() -> None:
    producer = Producer()
    node = _node(producer)
    shell = await _connected(node, producer, **_will(30))
    shell.lose()
    await wait_for(lambda: producer.on("t.client.wills"), "the will's record")
    [stored] = producer.on("t.client.wills")
    client_id, connection_id, waiting = parse_will(stored.key, stored.value)
    assert (client_id, connection_id) == ("c1", shell.connection.state.connection_id)
    assert waiting is not None and waiting.due_at_ms == NOW_MS + 30_000
    assert producer.on("t.msg.all") == []
    ends = len(producer.on("t.client.sessions"))
    await asyncio.sleep(0)  # the pipeline would send the session's end now if it did not wait
    assert len(producer.on("t.client.sessions")) == ends
    producer.answer(stored)
    await wait_for(lambda: len(producer.on("t.client.sessions")) > ends, "the session's end")
    [end] = producer.on("t.client.sessions")[ends:]
    assert end.value is not None and not decode_session(end.value).connected


def _waiting_will(
    node: IngestNode, connection_id: bytes, due_in_ms: int, session_offset: int = 7
) -> WillRecord:
    """A will of client c1 read from partition 3 of client.wills."""
    meta = PublishMeta("status/c1", 1, False, NOW_MS - 1000, 5)
    waiting = WillRecord(
        "c1", connection_id, NOW_MS + due_in_ms, session_offset, encode_meta(meta), b"gone"
    )
    node.wills.apply(3, ("c1", connection_id), waiting)
    return waiting


def _own_session(node: IngestNode, connection_id: bytes, offset: int = 7) -> None:
    record = SessionRecord("n1", connection_id, False, 5, True, True, connected_at_ms=NOW_MS - 9000)
    node.apply_state("t.client.sessions", b"c1", encode_session(record), offset)


async def test_an_owned_will_is_published_when_due_with_its_tombstone() -> None:
    commits = WillCommits()
    node = _node(Producer(), commits=commits)
    mine = b"m" * 16
    _own_session(node, mine)
    _waiting_will(node, mine, due_in_ms=0)
    assert commits.done == []  # nothing before the partition's replay is complete
    await node.wills.go_live(3)
    await wait_for(lambda: commits.done, "the will's transaction")
    [(partition, records)] = commits.done
    assert partition == 3
    published, tombstone = records
    assert (published.topic, published.key, published.value) == ("t.msg.all", b"c1", b"gone")
    assert decode_meta(dict(published.headers)["m"]).received_at_ms == NOW_MS  # stamped now
    assert (tombstone.topic, tombstone.value) == ("t.client.wills", None)
    assert parse_will(tombstone.key, None)[:2] == ("c1", mine)
    assert "c1" not in node.wills


@pytest.mark.parametrize(("clean_start", "published"), [(False, False), (True, True)])
async def test_a_newer_connection_settles_an_owned_will(clean_start: bool, published: bool) -> None:
    commits = WillCommits()
    node = _node(Producer(), commits=commits)
    mine = b"m" * 16
    _own_session(node, mine)
    _waiting_will(node, mine, due_in_ms=60_000)
    await node.wills.go_live(3)
    assert "c1" in node.wills and commits.done == []
    stale = SessionRecord("n2", b"x" * 16, True, 5, clean_start, True)
    node.apply_state("t.client.sessions", b"c1", encode_session(stale), 7)  # not newer
    assert "c1" in node.wills
    node.apply_state("t.client.sessions", b"c1", encode_session(stale), 50)
    await wait_for(lambda: commits.done, "the will settled")
    [(_, records)] = commits.done
    assert [r.topic for r in records] == ["t.msg.all"] * published + ["t.client.wills"]
    assert "c1" not in node.wills


async def test_a_will_settled_before_it_was_read_is_not_published() -> None:
    commits = WillCommits()
    node = _node(Producer(), commits=commits)
    mine = b"m" * 16
    await node.wills.go_live(3)
    newer = SessionRecord("n2", b"x" * 16, True, 5, False, True, connected_at_ms=NOW_MS)
    node.apply_state("t.client.sessions", b"c1", encode_session(newer), 9)
    _waiting_will(node, mine, due_in_ms=60_000)  # read after the reconnect
    await wait_for(lambda: commits.done, "the will discarded")
    assert [r.topic for r in commits.done[0][1]] == ["t.client.wills"]


async def test_a_will_whose_transaction_failed_is_tried_again() -> None:
    commits = WillCommits()
    commits.failures = 1
    node = _node(Producer(), commits=commits)
    mine = b"m" * 16
    _own_session(node, mine)
    _waiting_will(node, mine, due_in_ms=0)
    await node.wills.go_live(3)
    await wait_for(lambda: commits.done, "the will published on the second try", 5.0)
    assert [r.topic for r in commits.done[0][1]] == ["t.msg.all", "t.client.wills"]


async def test_the_wills_of_a_revoked_partition_are_left_to_its_next_owner() -> None:
    commits = WillCommits()
    node = _node(Producer(), commits=commits)
    mine = b"m" * 16
    _own_session(node, mine)
    await node.wills.go_live(3)
    await node.wills.go_live(4)
    _waiting_will(node, mine, due_in_ms=0)  # its timer is set, to fire at once
    node.wills.revoke({3})
    assert "c1" not in node.wills
    # A will of partition 4 due at once too: its timer fires after the revoked one's would.
    other = b"o" * 16
    ended = SessionRecord("n1", other, False, 5, True, True, connected_at_ms=NOW_MS - 9000)
    node.apply_state("t.client.sessions", b"c2", encode_session(ended), 8)
    meta = encode_meta(PublishMeta("status/c2", 0, False, NOW_MS, 5))
    node.wills.apply(4, ("c2", other), WillRecord("c2", other, NOW_MS, 8, meta, b"marker"))
    await wait_for(lambda: commits.done, "the other partition's will")
    assert [records[0].key for _, records in commits.done] == [b"c2"]


# ---------------------------------------------------------------------- delayed publications


def _waiting_delayed(
    node: IngestNode, delayed_id: bytes, due_in_ms: int, retain: bool = False
) -> DelayedRecord:
    """A delayed message of client c1 to ``a/b`` read from partition 2 of msg.delayed."""
    meta = encode_meta(PublishMeta("a/b", 1, retain, NOW_MS - 5000, 5))
    waiting = DelayedRecord("c1", delayed_id, NOW_MS + due_in_ms, meta, b"later")
    node.delayed.apply(2, ("c1", delayed_id), waiting)
    return waiting


async def test_an_owned_delayed_message_is_published_when_due_with_its_tombstone() -> None:
    commits = WillCommits()
    node = _node(Producer(), delayed_commits=commits)
    mine = b"d" * 24
    _waiting_delayed(node, mine, due_in_ms=0, retain=True)
    assert commits.done == []  # nothing before the partition's replay is complete
    await node.delayed.go_live(2)
    await wait_for(lambda: commits.done, "the delayed message's transaction")
    [(partition, records)] = commits.done
    assert partition == 2
    published, retained, tombstone = records
    assert (published.topic, published.key, published.value) == ("t.msg.all", b"c1", b"later")
    meta = decode_meta(dict(published.headers)["m"])
    assert (meta.topic, meta.received_at_ms) == ("a/b", NOW_MS)  # stamped at publication
    assert (retained.topic, retained.key) == ("t.msg.retained", b"a/b")
    assert (tombstone.topic, tombstone.value) == ("t.msg.delayed", None)
    assert parse_delayed(tombstone.key, None)[:2] == ("c1", mine)
    assert len(node.delayed) == 0


class HeldCommits(WillCommits):
    """``commit_delayed`` whose first transaction stays open until the test releases it:
    a publication under way, as Kafka holds it between produce and commit."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, partition: int, records: list[KafkaRecord]) -> None:
        self.entered.set()
        await self.release.wait()
        await super().__call__(partition, records)


def _outcomes(commits: WillCommits) -> list[tuple[list[str], DelayedOutcome | None]]:
    """Each transaction's topics (without the prefix) and its tombstone's outcome."""
    return [
        ([r.topic.removeprefix("t.") for r in records], delayed_outcome(records[-1].headers))
        for _, records in commits.done
    ]


def _cancel(node: IngestNode, delayed_id: bytes) -> None:
    """An administrator's cancel request, as the owner reads it from partition 2."""
    node.delayed.apply(2, ("c1", delayed_id), DelayedCancel("c1", delayed_id))


async def test_a_cancelled_delayed_message_is_never_published_and_its_tombstone_says_so() -> None:
    commits = WillCommits()
    node = _node(Producer(), delayed_commits=commits)
    _waiting_delayed(node, b"r" * 24, due_in_ms=0)
    _cancel(node, b"r" * 24)  # read while the partition is replayed: decided once live
    await node.delayed.go_live(2)
    _waiting_delayed(node, b"x" * 24, due_in_ms=60_000)
    _cancel(node, b"x" * 24)
    await wait_for(lambda: len(commits.done) == 2, "both cancels' transactions")
    assert _outcomes(commits) == [(["msg.delayed"], DelayedOutcome.CANCELLED)] * 2
    assert len(node.delayed) == 0
    assert node.delayed.ended == {"cancelled": 2}


async def test_a_cancel_read_while_the_publication_is_under_way_leaves_it_published() -> None:
    commits = HeldCommits()
    node = _node(Producer(), delayed_commits=commits)
    await node.delayed.go_live(2)
    _waiting_delayed(node, b"r" * 24, due_in_ms=0)
    await asyncio.wait_for(commits.entered.wait(), 5)  # its transaction is open
    _cancel(node, b"r" * 24)
    commits.release.set()
    await wait_for(lambda: commits.done, "the publication's commit")
    # Published once, and said so: no discard follows (the cancel came too late).
    assert _outcomes(commits) == [(["msg.all", "msg.delayed"], DelayedOutcome.PUBLISHED)]
    assert node.delayed.ended == {"published": 1}
    assert len(node.delayed) == 0


async def test_a_cancel_of_a_message_that_waits_no_more_is_answered_gone() -> None:
    commits = WillCommits()
    node = _node(Producer(), delayed_commits=commits)
    await node.delayed.go_live(2)
    _cancel(node, b"p" * 24)  # published (its tombstone read) before the request
    await wait_for(lambda: commits.done, "the answer")
    assert _outcomes(commits) == [(["msg.delayed"], DelayedOutcome.GONE)]
    assert node.delayed.ended == {}


async def test_the_node_counts_the_delayed_messages_msg_delayed_holds_and_its_own() -> None:
    producer = Producer()
    node = _node(producer)
    shell = await _connected(node, producer)
    names, counts = node.names, node.context.delayed
    meta = encode_meta(PublishMeta("a", 1, False, NOW_MS, 5))
    other = delayed_record(names, DelayedRecord("c1", b"o" * 24, NOW_MS + 9000, meta, b"x"))
    node.apply_state(names.msg_delayed, other.key, other.value, 7)  # the state reader's
    shell.send(Publish("$delayed/60/a", b"mine", qos=1, packet_id=1))
    await wait_for(lambda: producer.on(names.msg_delayed), "the delayed record")
    assert counts.of("c1") == 2  # counted before Kafka answered
    [sent] = producer.on(names.msg_delayed)
    sent.ack.set_exception(KafkaConnectionError("Kafka is down"))
    await wait_for(lambda: counts.of("c1") == 1, "the failed store no longer counted")
    gone = delayed_tombstone(names, "c1", b"o" * 24, DelayedOutcome.PUBLISHED)
    node.apply_state(names.msg_delayed, gone.key, gone.value, 8)
    assert counts.total == 0


# ---------------------------------------------------------------------- downlink


async def test_a_downlink_record_reaches_the_targets_connected_here() -> None:
    producer = Producer()
    node = _node(producer)
    a = await _connected(node, producer, "a")
    b = await _connected(node, producer, "b", version=4)
    meta = PublishMeta("news", 0, False, NOW_MS, 5)
    targets = [Target("a", 0), Target("elsewhere", 0), Target("b", 0)]
    assert node.deliver(Downlink(meta, b"hello", targets)) == 2
    assert [(p.topic, p.payload) for p in a.of(Publish)] == [("news", b"hello")]
    assert [(p.topic, p.payload) for p in b.of(Publish)] == [("news", b"hello")]


async def test_a_downlink_record_brings_its_origin_to_the_connection() -> None:
    # What a replay's switch drops a live copy by (services/ingest/handle_replay.py).
    producer = Producer()
    node = _node(producer)
    a = await _connected(node, producer, "a")
    meta = PublishMeta("news", 0, False, NOW_MS, 5)
    replay = Subscription("a", "news", 0, live_from=LiveFrom((5,), every_message=True))
    assert a.connection.replay_switch(replay, (9,)) == (9,)
    a.connection.replayed(FanOut(meta, b"replayed", NOW_MS, Origin(0, 7, 0)), Target("a", 0))
    node.deliver(Downlink(meta, b"replayed", [Target("a", 0)], Origin(0, 7, 0)))
    node.deliver(Downlink(meta, b"live", [Target("a", 0)], Origin(0, 9, 0)))
    assert [p.payload for p in a.of(Publish)] == [b"live"]


# ---------------------------------------------------------------------- start and stop


async def test_sessions_left_connected_by_a_previous_process_are_ended() -> None:
    producer = Producer()
    node = _node(producer)
    mine = SessionRecord("n1", b"a" * 16, True, 5, False, True)
    gone = SessionRecord("n1", b"b" * 16, True, 5, True, False)
    other = SessionRecord("n2", b"c" * 16, True, 5, True, False)
    for key, record in ((b"p", mine), (b"q", gone), (b"r", other)):
        node.apply_state("t.client.sessions", key, encode_session(record), 1)
    node.apply_state(
        "t.client.subscriptions", b"q", encode_subscriptions([Subscription("q", "x", 0)]), 2
    )
    ending = asyncio.create_task(node.reconcile())
    await wait_for(lambda: len(producer.sent) == 3, "three end records")
    producer.answer()
    assert await ending == 2
    written = {(s.topic, s.key): s.value for s in producer.sent}
    persistent = written[("t.client.sessions", b"p")]
    assert persistent is not None and not decode_session(persistent).connected
    assert written[("t.client.sessions", b"q")] is None
    assert written[("t.client.subscriptions", b"q")] is None


async def test_shutdown_disconnects_everyone_and_waits_for_their_records() -> None:
    producer = Producer()
    node = _node(producer)
    shell = await _connected(node, producer, **_will(30))
    stopping = asyncio.create_task(node.shut_down())
    await wait_for(lambda: shell.closed, "the close")
    assert [d.reason_code for d in shell.of(Disconnect)] == [0x8B]
    # The will waits out its delay in Kafka, for whichever node owns its partition.
    await wait_for(lambda: producer.on("t.client.wills"), "the waiting will, stored")
    assert producer.on("t.msg.all") == []
    assert not stopping.done()  # its records are not answered yet
    producer.answer()
    await wait_for(lambda: len(producer.on("t.client.sessions")) == 2, "the session's end")
    producer.answer()
    await asyncio.wait_for(stopping, 5)
    ended = producer.on("t.client.sessions")[-1].value
    assert ended is not None and not decode_session(ended).connected
    _, event = parse_client_event(b"c1", producer.on("t.client.events")[-1].value)
    assert (event.kind, event.cause) == (EventKind.DISCONNECTED, DisconnectCause.SERVER_SHUTDOWN)


async def test_a_drain_waits_its_notice_then_disconnects_in_paced_batches() -> None:
    producer = Producer()
    node = _node(producer, drain_notice_seconds=0.3, drain_rate=20.0)
    shells = [
        await _connected(node, producer, f"c{i}", version=5 if i % 2 else 4) for i in range(6)
    ]
    loop = asyncio.get_running_loop()
    started = loop.time()
    drained = await asyncio.wait_for(node.drain(60.0, ReasonCode.USE_ANOTHER_SERVER), 10)
    assert drained == 6
    closed_at = sorted(shell.closed_at or 0.0 for shell in shells)
    assert closed_at[0] - started >= 0.3  # the load balancer's notice came first
    # One at once, then 20 a second: the sixth a quarter of a second after the first.
    assert closed_at[-1] - closed_at[0] >= 0.25
    for shell in shells:
        codes = [d.reason_code for d in shell.of(Disconnect)]
        assert codes == ([0x9C] if shell.version == 5 else []), codes  # 3.1.1: closed only
    # Each session's end record, as a lost socket's (persistent or not, as it decides).
    await wait_for(lambda: len(producer.on("t.client.sessions")) == 12, "the end records")
    events = [parse_client_event(b"c1", r.value)[1] for r in producer.on("t.client.events")]
    assert {e.cause for e in events if e.kind is EventKind.DISCONNECTED} == {
        DisconnectCause.SERVER_SHUTDOWN
    }


async def test_a_drain_without_clients_does_not_wait_for_the_load_balancer() -> None:
    node = _node(Producer(), drain_notice_seconds=60.0)
    assert await asyncio.wait_for(node.drain(60.0), 10) == 0


# ---------------------------------------------------------------------- retained cut


async def test_a_subscription_is_stored_with_the_msg_all_offsets_read_after_its_subscribe() -> None:
    """A SUBSCRIBE that asks for retained messages: its subscription record waits for
    ``msg.all``'s end offsets, asked for after the SUBSCRIBE arrived, and carries them as
    its cut (issue 22.2), as does its retained request. A later SUBSCRIBE without retained
    messages (Retain Handling 2) reads none and leaves the earlier cut as it was."""
    reads: list[asyncio.Future[tuple[int, ...]]] = []

    async def read_live_from() -> tuple[int, ...]:
        reads.append(asyncio.get_running_loop().create_future())
        return await reads[-1]

    producer = Producer()
    node = _node(producer, read_live_from=read_live_from)
    shell = await _connected(node, producer)
    subscriptions, msg_all = node.names.client_subscriptions, node.names.msg_all
    shell.send(Subscribe(1, [SubscriptionRequest("a/#", 1)]))
    await wait_for(lambda: reads, "msg.all's end offsets asked for")
    assert producer.on(subscriptions) == [] and producer.on(msg_all) == []
    reads[0].set_result((4, 2))
    await wait_for(lambda: producer.on(msg_all), "the retained request")
    [stored] = producer.on(subscriptions)
    assert stored.value is not None
    [sub] = decode_subscriptions("c1", stored.value)
    assert sub.live_from is not None and sub.live_from.offsets == (4, 2)
    [request] = producer.on(msg_all)
    asked = parse_msg_all(request.key, request.value, request.headers)
    assert isinstance(asked, RetainedRequest)
    assert [s.live_from.offsets for s in asked.subscriptions if s.live_from] == [(4, 2)]
    producer.answer()
    await wait_for(lambda: shell.of(SubAck), "SUBACK")
    shell.send(Subscribe(2, [SubscriptionRequest("b", 1, retain_handling=2)]))
    await wait_for(lambda: len(producer.on(subscriptions)) == 2, "the second subscriptions")
    value = producer.on(subscriptions)[1].value
    assert value is not None
    cuts = {s.topic_filter: s.live_from for s in decode_subscriptions("c1", value)}
    assert cuts["b"] is None and len(reads) == 1
    assert cuts["a/#"] is not None and cuts["a/#"].offsets == (4, 2)
