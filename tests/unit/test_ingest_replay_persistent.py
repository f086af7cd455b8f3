"""A persistent session's replay subscription in the sans-IO ingest core, with
bytes alone (docs/concepts/replay.md, "Persistent sessions"): QoS 1 at most, its progress
stored before anything past it is sent and kept with the subscription record, resumed at
a reconnect (DUP on what may have been sent, nothing the client acknowledged sent again,
the live copies a message store sends again dropped and reported complete), the held
live messages waiting for the replay's own Packet Identifiers, and the ``msg.all``
origin the message stores send on (device_persist keeps it with the stored message)."""

from __future__ import annotations

from test_ingest_support import NOW_MS, Client, fan_out, make_settings, of_type, only

from services.common.kafka.names import TopicNames
from services.common.mqtt.packets import (
    ConnAck,
    Connect,
    PubAck,
    Publish,
    SubAck,
    Subscribe,
    SubscriptionRequest,
)
from services.common.mqtt.properties import Properties
from services.common.records import (
    AckKind,
    ClientKind,
    Downlink,
    Origin,
    SessionRecord,
    StoredRecord,
    Target,
    decode_stored,
    decode_subscriptions,
    downlink_record,
    encode_meta,
    encode_stored,
    encode_subscriptions,
    origin_of,
    parse_downlink,
)
from services.common.subscription import LiveFrom, ReplayProgress, Subscription
from services.ingest.effects import (
    CreateAppTopic,
    StartReplay,
    StoreAcks,
    StoreSession,
    StoreSubscriptions,
)
from services.ingest.fan_out import FanOut

APP = "app-1"
CUT = (10, 20)  # the first cut, one offset per msg.all partition
SECOND = (15, 20)  # the second cut


def _at(partition: int, offset: int, payload: bytes, qos: int = 1) -> FanOut:
    message = fan_out("t/a", payload, qos=qos)
    message.origin = Origin(partition, offset, 0)
    return message


def _app(previous: tuple[SessionRecord | None, list[Subscription]] = (None, [])) -> Client:
    """A persistent APPLICATION client (v5, Clean Start 0, Session Expiry 60 s), connected."""
    client = Client(5, make_settings(application_client_ids=["app-*"]), previous)
    props = Properties(session_expiry_interval=60)
    effects = client.send(Connect(5, APP, False, 30, properties=props))
    record = only(client.stored(only(effects, CreateAppTopic).token), StoreSession)
    client.conn.session_stored_at(1)
    client.log = client.stored(record.token)
    assert only(client.packets(client.log), ConnAck).reason_code == 0
    return client


def _subscribed(client: Client) -> Subscription:
    """SUBSCRIBE ``$replay/1h/t/#`` at QoS 2, stored; the first cut filled in as the shell
    does, and the second read: the subscription."""
    effects = client.send(Subscribe(1, [SubscriptionRequest("$replay/1h/t/#", 2)]))
    start = only(client.store_all(effects), StartReplay)
    assert start.subscription.live_from is not None
    start.subscription.live_from.offsets = CUT
    assert client.conn.replay_switch(start.subscription, SECOND) == SECOND
    return start.subscription


def test_an_application_session_replays_at_qos_1_at_most() -> None:
    client = _app()
    effects = client.send(Subscribe(1, [SubscriptionRequest("$replay/1h/t/#", 2)]))
    assert client.packets(client.store_all(effects)) == [SubAck(1, [1])]


def test_the_progress_is_stored_before_the_reader_goes_past_it() -> None:
    client = _app()
    _subscribed(client)
    conn = client.conn
    effects = conn.replay_mark("t/#", (3, 20), (5, 20))
    assert not conn.replay_marked("t/#")  # the reader sends nothing past (3, 20) yet
    [stored] = only(effects, StoreSubscriptions).subscriptions
    assert stored.replay == ReplayProgress(SECOND, (3, 20), (5, 20))
    client.stored(only(effects, StoreSubscriptions).token)
    assert conn.replay_marked("t/#")
    ids = [
        only(client.packets(conn.replayed(_at(0, offset, b"%d" % offset), Target(APP, 1), "t/#")),
             Publish).packet_id
        for offset in (3, 4)
    ]  # fmt: skip
    client.send(PubAck(ids[1]))
    # next: the oldest message in flight (3), not where the reader got (5)
    mark = only(conn.replay_mark("t/#", (5, 20), (5, 20)), StoreSubscriptions)
    assert mark.subscriptions[0].replay == ReplayProgress(SECOND, (3, 20), (5, 20))
    client.send(PubAck(ids[0]))
    mark = only(conn.replay_mark("t/#", (5, 20), (5, 20)), StoreSubscriptions)
    assert mark.subscriptions[0].replay == ReplayProgress(SECOND, (5, 20), (5, 20))
    # what the record keeps, and what survives it
    back = decode_subscriptions(APP, encode_subscriptions(mark.subscriptions))
    assert back[0].replay == ReplayProgress(SECOND, (5, 20), (5, 20))
    assert back[0].live_from is not None and back[0].live_from.offsets == CUT


def _resumed() -> tuple[Client, Subscription]:
    progress = ReplayProgress(SECOND, next=(12, 20), sent=(14, 20))
    live_from = LiveFrom(CUT, every_message=True)
    subscription = Subscription(APP, "t/#", 1, live_from=live_from, replay=progress)
    return _app(_session([subscription])), subscription


def test_a_resumed_session_resumes_its_replay_and_holds_live_copies() -> None:
    client, subscription = _resumed()
    assert only(client.log, StartReplay).subscription is subscription
    conn = client.conn
    # app_delivery sends again what was unacknowledged: live copies, held behind the replay
    in_window = Target(APP, 1, packet_id=7, dup=True)
    after_cut = Target(APP, 1, packet_id=9)
    assert conn.deliver_routed(_at(0, 11, b"live-11"), in_window) == []
    assert conn.deliver_routed(_at(1, 25, b"live-25"), after_cut) == []
    assert conn.replay_switch(subscription, SECOND) == SECOND
    conn.replay_seen(_at(0, 11, b"live-11"))  # acknowledged on the earlier connection
    resent = only(client.packets(conn.replayed(_at(0, 13, b"13"), Target(APP, 1, dup=True))),
                  Publish)  # fmt: skip
    assert (resent.payload, resent.dup) == (b"13", True)
    fresh = only(client.packets(conn.replayed(_at(0, 14, b"14"), Target(APP, 1))), Publish)
    assert (fresh.payload, fresh.dup) == (b"14", False)
    client.send(PubAck(resent.packet_id), PubAck(fresh.packet_id))
    effects = conn.replay_finished("t/#")
    # the copy of 11 was replayed on the earlier connection: dropped, app_delivery told
    assert [p.payload for p in of_type(client.packets(effects), Publish)] == [b"live-25"]
    assert only(effects, StoreAcks).record.acks == [(AckKind.PUBACK, 7)]


def test_held_store_deliveries_wait_for_the_replays_packet_ids() -> None:
    client = _app()
    _subscribed(client)
    conn = client.conn
    replayed = only(client.packets(conn.replayed(_at(0, 3, b"old"), Target(APP, 1), "t/#")),
                    Publish)  # fmt: skip
    same_id = Target(APP, 1, packet_id=replayed.packet_id or 0)
    assert conn.deliver_routed(_at(1, 30, b"live"), same_id) == []
    assert client.packets(conn.replay_finished("t/#")) == []  # its identifier is in flight
    after = client.send(PubAck(replayed.packet_id or 0))
    [live] = of_type(client.packets(after), Publish)
    assert (live.payload, live.packet_id) == (b"live", replayed.packet_id)


def test_app_delivery_sends_the_msg_all_origin_the_reroute_filter_does_not_read() -> None:
    names = TopicNames("")
    meta = encode_meta(fan_out("t/a", b"x").meta)
    record = downlink_record(names, "n1", b"p", meta, b"x", [Target(APP, 1)], Origin(2, 40, 0))
    _, _, value, headers = record
    downlink = parse_downlink(value, headers)
    assert isinstance(downlink, Downlink) and downlink.origin == Origin(2, 40, 0)
    # Not the o header the node's RerouteFilter reads as the router's (origin_of's
    # default): app_delivery's resends and its lag behind the router pass it.
    assert origin_of(headers) is None


def test_device_persist_keeps_the_origin_with_the_stored_message() -> None:
    target = Target(APP, 1, packet_id=3)
    stored = StoredRecord(bytes(16), b"meta", target, b"payload", Origin(1, 2**40, 0))
    assert decode_stored(encode_stored(stored)) == stored
    # one stored before origins were kept still decodes, without one
    older = StoredRecord(bytes(16), b"meta", target, b"payload")
    assert decode_stored(encode_stored(older)) == older


def _session(subscriptions: list[Subscription]) -> tuple[SessionRecord, list[Subscription]]:
    """The session record and subscriptions a reconnect of :data:`APP` finds stored."""
    record = SessionRecord(
        node_id="node-b",
        connection_id=bytes(16),
        session_id=bytes(16),
        connected=False,
        protocol_version=5,
        clean_start=False,
        persistent=True,
        kind=ClientKind.APPLICATION,
        session_expiry_interval=60,
        updated_at_ms=NOW_MS,
    )
    return record, subscriptions


def test_a_resend_after_a_reconnect_carries_its_original_packet_id() -> None:
    client = _app()
    _subscribed(client)
    conn = client.conn
    mark = only(conn.replay_mark("t/#", (3, 20), (6, 20)), StoreSubscriptions)
    client.stored(mark.token)
    sent = {
        offset: only(client.packets(conn.replayed(_at(0, offset, b"%d" % offset),
                                                  Target(APP, 1), "t/#")), Publish)
        for offset in (3, 4, 5)
    }  # fmt: skip
    assert all(not p.dup for p in sent.values())
    client.send(PubAck(sent[3].packet_id or 0))
    mark = only(conn.replay_mark("t/#", (6, 20), (6, 20)), StoreSubscriptions)
    stored = decode_subscriptions(APP, encode_subscriptions(mark.subscriptions))
    assert stored[0].replay is not None and stored[0].replay.next == (4, 20)
    # The connection ends; the session resumes (another node) from what Kafka kept.
    resumed = _app(_session(stored))
    start = only(resumed.log, StartReplay).subscription
    assert resumed.conn.replay_switch(start, SECOND) == SECOND
    again = {
        offset: only(resumed.packets(resumed.conn.replayed(
            _at(0, offset, b"%d" % offset), Target(APP, 1, dup=True), "t/#")), Publish)
        for offset in (4, 5)
    }  # fmt: skip
    # DUP=1 and the Packet Identifier of the first send (MQTT 4.4 [MQTT-4.4.0-1])
    assert [(p.payload, p.dup, p.packet_id) for p in again.values()] == [
        (b"4", True, sent[4].packet_id),
        (b"5", True, sent[5].packet_id),
    ]
    # The client acknowledges by that identifier (its session still held it): done.
    resumed.send(PubAck(sent[4].packet_id or 0), PubAck(sent[5].packet_id or 0))
    mark = only(resumed.conn.replay_mark("t/#", (6, 20), (6, 20)), StoreSubscriptions)
    assert mark.subscriptions[0].replay == ReplayProgress(SECOND, (6, 20), (6, 20))


def test_each_replay_of_a_session_has_its_own_block_of_packet_ids() -> None:
    client = _app()
    _subscribed(client)
    effects = client.send(Subscribe(2, [SubscriptionRequest("$replay/1h/u/#", 1)]))
    other = only(client.store_all(effects), StartReplay).subscription
    assert other.live_from is not None
    other.live_from.offsets = CUT
    client.conn.replay_switch(other, SECOND)
    first = only(client.packets(client.conn.replayed(_at(0, 3, b"t"), Target(APP, 1), "t/#")),
                 Publish)  # fmt: skip
    second = only(client.packets(client.conn.replayed(_at(0, 3, b"u"), Target(APP, 1), "u/#")),
                  Publish)  # fmt: skip
    assert (first.packet_id, second.packet_id) == (3 + 1, 4095 + 3 + 1)
    mark = only(client.conn.replay_mark("u/#", (4, 20), (4, 20)), StoreSubscriptions)
    blocks = {s.topic_filter: s.replay and s.replay.packet_ids for s in mark.subscriptions}
    back = decode_subscriptions(APP, encode_subscriptions(mark.subscriptions))
    assert blocks == {s.topic_filter: s.replay and s.replay.packet_ids for s in back}
    assert blocks == {"t/#": 0, "u/#": 1}


def test_the_reader_waits_while_a_message_packet_id_is_in_flight() -> None:
    client = _app()
    conn = client.conn
    # a message store's delivery in flight before the replay, with identifier 2055
    store = Target(APP, 1, packet_id=2055)
    assert client.packets(conn.deliver_routed(_at(1, 99, b"s"), store))
    _subscribed(client)
    message = _at(1, 7, b"x")
    packet_id = conn.replay_packet_id("t/#", message, Target(APP, 1))
    assert packet_id == 2047 + 7 + 1  # msg.all partition 1's span of the block
    assert not conn.replay_room(packet_id) and conn.replay_room()
    client.send(PubAck(packet_id))
    assert conn.replay_room(packet_id)
    sent = only(client.packets(conn.replayed(message, Target(APP, 1), "t/#")), Publish)
    assert sent.packet_id == packet_id
    # the offset a span further on has the same identifier: it waits for the PUBACK
    later = _at(1, 7 + 2047, b"y")
    assert conn.replay_packet_id("t/#", later, Target(APP, 1)) == packet_id
    assert not conn.replay_room(packet_id)
    client.send(PubAck(packet_id))
    assert conn.replay_room(packet_id)
    assert conn.replay_packet_id("t/#", message, Target(APP, 0)) == 0  # QoS 0: none
