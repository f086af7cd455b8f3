"""Outbound PUBLISH to a subscriber (``ServerConnection.deliver`` / ``release``) and its
acknowledgements, the node's own and store-assigned deliveries, and Message Expiry.

MQTT 3.1.1 sections 4.3.2, 4.3.3, 4.4; MQTT 5.0 sections 3.1.2.11.3 (Receive Maximum),
3.1.2.11.4 (Maximum Packet Size), 3.3.2.3.3 (Message Expiry Interval), 4.3.3, 4.9 (flow
control).
"""

from __future__ import annotations

import pytest
from test_ingest_support import CONNECTION_ID, NOW_MS, Client, closes, fan_out, of_type, only

from services.common.auth.authorize import DENY_ALL
from services.common.metrics import DROPPED, Drop
from services.common.mqtt.codec import encode
from services.common.mqtt.packets import (
    Connect,
    Disconnect,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
)
from services.common.mqtt.properties import Properties
from services.common.mqtt.reason_codes import ReasonCode
from services.common.records import AckKind, Target, expiry_deadline
from services.ingest.delivery import MAX_QUEUED
from services.ingest.effects import Effect, Send, StoreAcks, StoreSession
from services.ingest.fan_out import remaining_interval

VERSIONS = [4, 5]


def _connected(version: int, properties: Properties | None = None) -> Client:
    client = Client(version)
    client.connect("sub", properties=properties)
    return client


def _delivered(client: Client, packet: Publish) -> list[Publish]:
    packets = client.packets(client.conn.deliver(packet))
    publishes = of_type(packets, Publish)
    assert publishes == packets
    return publishes


def _acked(client: Client, packet: Publish) -> list[Publish]:
    """PUBACK ``packet``; returns the PUBLISHes that released."""
    assert packet.packet_id is not None
    packets = client.packets(client.send(PubAck(packet.packet_id)))
    publishes = of_type(packets, Publish)
    assert publishes == packets
    return publishes


@pytest.mark.parametrize("version", VERSIONS)
def test_qos0_is_sent_without_packet_identifier(version: int) -> None:
    client = _connected(version)
    assert _delivered(client, Publish("t", b"hello")) == [Publish("t", b"hello")]


def test_qos0_uses_the_fan_outs_shared_encoding() -> None:
    client, other = _connected(5), _connected(5)
    message = fan_out("t", b"once")
    effects = client.conn.deliver_routed(message, Target("sub", 0, False, (4,)))
    shared = encode(Publish("t", b"once", properties=Properties(subscription_identifiers=[4])), 5)
    assert effects == [Send(shared)]
    [again] = other.conn.deliver_routed(message, Target("sub", 0, False, (4,)))
    assert isinstance(again, Send) and again.data is effects[0].data  # type: ignore[union-attr]


@pytest.mark.parametrize("version", VERSIONS)
def test_qos1_gets_distinct_packet_identifiers(version: int) -> None:
    client = _connected(version)
    sent = [_delivered(client, Publish("t", bytes([i]), qos=1))[0] for i in range(3)]
    ids = [p.packet_id for p in sent]
    assert None not in ids
    assert len(set(ids)) == 3
    assert [p.payload for p in sent] == [b"\x00", b"\x01", b"\x02"]
    assert all(p.qos == 1 for p in sent)


def test_packet_identifiers_wrap_and_skip_those_in_flight() -> None:
    client = _connected(5)
    first = _delivered(client, Publish("t", b"", qos=1))[0]
    assert first.packet_id == 1
    client.conn.state.last_packet_id = 65534
    ids = [_delivered(client, Publish("t", b"", qos=1))[0].packet_id for _ in range(3)]
    assert ids == [65535, 2, 3]  # 1 is still in flight


def test_client_receive_maximum_queues_the_rest_in_order() -> None:
    client = _connected(5, Properties(receive_maximum=2))
    sent = [_delivered(client, Publish("t", bytes([i]), qos=1)) for i in range(5)]
    assert [len(s) for s in sent] == [1, 1, 0, 0, 0]
    first, second = sent[0][0], sent[1][0]
    # A QoS 0 message does not wait behind the window.
    assert _delivered(client, Publish("t", b"q0")) == [Publish("t", b"q0")]

    released = _acked(client, first)
    assert [p.payload for p in released] == [b"\x02"]
    released += _acked(client, second)
    assert [p.payload for p in released] == [b"\x02", b"\x03"]
    in_flight = {p.packet_id for p in released}
    assert len(in_flight) == 2 and None not in in_flight
    # Still two in flight: the fifth waits.
    assert len(client.conn.state.outbound) == 2
    assert len(client.conn.state.outbound_queue) == 1


def test_v311_has_no_outbound_window_limit_below_65535() -> None:
    client = _connected(4)
    sent = [_delivered(client, Publish("t", b"", qos=1)) for _ in range(200)]
    assert all(len(s) == 1 for s in sent)


def test_unknown_puback_is_ignored() -> None:
    client = _connected(5)
    effects = client.send(PubAck(999))
    assert effects == []
    assert not client.conn.closed


def test_packets_over_the_client_maximum_packet_size_are_dropped() -> None:
    client = _connected(5, Properties(maximum_packet_size=64))
    assert client.conn.deliver(Publish("t", b"x" * 100)) == []
    assert client.conn.deliver(Publish("t", b"x" * 100, qos=1)) == []
    assert client.conn.state.outbound == {}  # a dropped QoS 1 takes no window slot
    small = _delivered(client, Publish("t", b"ok", qos=1))
    assert len(small) == 1 and small[0].payload == b"ok"
    assert len(encode(small[0], 5)) <= 64


def test_encoded_qos0_over_the_maximum_packet_size_is_dropped() -> None:
    client = _connected(5, Properties(maximum_packet_size=32))
    assert client.conn.deliver_routed(fan_out("t", b"y" * 40), Target("sub", 0)) == []


def test_subscription_identifiers_and_properties_reach_a_v5_client() -> None:
    client = _connected(5)
    props = Properties(content_type="text/plain", subscription_identifiers=[1, 7])
    got = _delivered(client, Publish("t", b"p", qos=1, properties=props))
    assert got[0].properties == props


def test_nothing_is_delivered_before_connack() -> None:
    client = Client(5)
    store = only(client.send(Connect(5, "c", True, 30)), StoreSession)
    assert client.conn.deliver(Publish("t", b"x", qos=1)) == []
    client.stored(store.token)
    assert len(_delivered(client, Publish("t", b"x", qos=1))) == 1


def test_nothing_is_delivered_after_close() -> None:
    client = _connected(5)
    assert closes(client.conn.keep_alive_expired())
    assert client.conn.deliver(Publish("t", b"x")) == []


# ---------------------------------------------------------------------- QoS 2 (MQTT 4.3.3)


@pytest.mark.parametrize("version", VERSIONS)
def test_qos2_publish_pubrec_pubrel_pubcomp(version: int) -> None:
    client = _connected(version)
    [sent] = _delivered(client, Publish("t", b"two", qos=2))
    assert sent.qos == 2 and sent.packet_id is not None
    assert client.packets(client.send(PubRec(sent.packet_id))) == [PubRel(sent.packet_id)]
    assert client.send(PubComp(sent.packet_id)) == []
    assert client.conn.state.outbound == {}


def test_qos2_counts_against_receive_maximum_until_pubcomp() -> None:
    # MQTT 5.0 4.9: the send quota comes back with PUBCOMP, not with PUBREC.
    client = _connected(5, Properties(receive_maximum=1))
    [first] = _delivered(client, Publish("t", b"1", qos=2))
    assert _delivered(client, Publish("t", b"2", qos=1)) == []
    assert first.packet_id is not None
    assert client.packets(client.send(PubRec(first.packet_id))) == [PubRel(first.packet_id)]
    released = client.packets(client.send(PubComp(first.packet_id)))
    assert [(p.payload, p.qos) for p in of_type(released, Publish)] == [(b"2", 1)]


def test_pubrec_with_a_failure_code_ends_the_delivery() -> None:
    client = _connected(5, Properties(receive_maximum=1))
    [first] = _delivered(client, Publish("t", b"1", qos=2))
    assert _delivered(client, Publish("t", b"2", qos=2)) == []
    assert first.packet_id is not None
    answer = client.packets(client.send(PubRec(first.packet_id, ReasonCode.UNSPECIFIED_ERROR)))
    # No PUBREL for a refused message; its window slot is free for the next one.
    assert of_type(answer, PubRel) == []
    assert [p.payload for p in of_type(answer, Publish)] == [b"2"]


@pytest.mark.parametrize(("version", "code"), [(5, 0x92), (4, 0x00)])
def test_pubrec_for_an_unknown_id_gets_pubrel_not_found(version: int, code: int) -> None:
    client = _connected(version)
    [rel] = client.packets(client.send(PubRec(42)))
    assert isinstance(rel, PubRel)
    assert (rel.packet_id, rel.reason_code) == (42, code)


def test_pubrec_again_after_pubrel_resends_pubrel() -> None:
    client = _connected(5)
    [sent] = _delivered(client, Publish("t", b"", qos=2))
    assert sent.packet_id is not None
    client.send(PubRec(sent.packet_id))
    assert client.packets(client.send(PubRec(sent.packet_id))) == [PubRel(sent.packet_id)]


def test_unknown_pubcomp_is_ignored() -> None:
    client = _connected(5)
    assert client.send(PubComp(9)) == []
    assert not client.conn.closed


@pytest.mark.parametrize(
    ("qos", "answer"),
    [(2, PubAck), (1, PubRec), (2, PubComp)],
    ids=["puback-for-qos2", "pubrec-for-qos1", "pubcomp-before-pubrel"],
)
def test_an_acknowledgement_of_the_wrong_kind_is_a_protocol_error(qos: int, answer: type) -> None:
    client = _connected(5)
    [sent] = _delivered(client, Publish("t", b"", qos=qos))
    effects = client.send(answer(sent.packet_id))
    assert only(client.packets(effects), Disconnect).reason_code == ReasonCode.PROTOCOL_ERROR
    assert closes(effects)


# ---------------------------------------------------------------------- store-assigned


def _acks(effects: list[Effect]) -> list[tuple[AckKind, int]]:
    """The acknowledgements the effects write to client.acks (one record at most)."""
    records = of_type(effects, StoreAcks)
    assert len(records) <= 1
    if not records:
        return []
    assert records[0].record.session_id == CONNECTION_ID  # the session of this connection
    assert effects[-1] is records[0]  # after everything else of the call
    return records[0].record.acks


def _stored(qos: int, packet_id: int, payload: bytes = b"", dup: bool = False) -> Publish:
    """A downlink message whose Packet Identifier a message store assigned."""
    return Publish("t", payload, qos=qos, dup=dup, packet_id=packet_id)


@pytest.mark.parametrize("version", VERSIONS)
def test_store_assigned_packet_identifier_and_dup_are_used_as_they_are(version: int) -> None:
    client = _connected(version)
    assert _delivered(client, _stored(1, 700, b"a")) == [_stored(1, 700, b"a")]
    assert _delivered(client, _stored(2, 701, b"b", dup=True)) == [_stored(2, 701, b"b", True)]


def test_store_assigned_deliveries_do_not_wait_for_the_window() -> None:
    # The store keeps at most the client's Receive Maximum in flight itself.
    client = _connected(5, Properties(receive_maximum=1))
    assert len(_delivered(client, _stored(1, 5))) == 1
    assert len(_delivered(client, _stored(1, 6))) == 1
    # The node's own deliveries count the store's in flight.
    assert _delivered(client, Publish("t", b"own", qos=1)) == []
    assert client.packets(client.send(PubAck(5))) == []
    [own] = of_type(client.packets(client.send(PubAck(6))), Publish)
    assert own.payload == b"own"


def test_the_nodes_own_identifiers_skip_the_stores_in_flight() -> None:
    client = _connected(5)
    _delivered(client, _stored(1, 2))
    assert [_delivered(client, Publish("t", b"", qos=1))[0].packet_id for _ in range(2)] == [1, 3]


def test_store_assigned_id_already_in_flight_is_not_sent_twice() -> None:
    client = _connected(5)
    assert len(_delivered(client, _stored(1, 5))) == 1
    assert client.conn.deliver(_stored(1, 5)) == []


@pytest.mark.parametrize("version", VERSIONS)
def test_pubacks_of_store_deliveries_go_to_client_acks_in_one_record(version: int) -> None:
    client = _connected(version)
    for packet_id in (10, 11):
        _delivered(client, _stored(1, packet_id))
    [own] = _delivered(client, Publish("t", b"", qos=1))
    assert own.packet_id is not None
    effects = client.send(PubAck(11), PubAck(own.packet_id), PubAck(10, 0x80))
    # Any Reason Code completes a QoS 1 delivery; the node's own deliveries are not reported.
    assert _acks(effects) == [(AckKind.PUBACK, 11), (AckKind.PUBACK, 10)]


def test_qos2_store_delivery_reports_pubrec_then_pubcomp() -> None:
    client = _connected(5)
    _delivered(client, _stored(2, 30))
    effects = client.send(PubRec(30))
    assert client.packets(effects) == [PubRel(30)]
    assert _acks(effects) == [(AckKind.PUBREC, 30)]
    assert _acks(client.send(PubComp(30))) == [(AckKind.PUBCOMP, 30)]


def test_failed_pubrec_of_a_store_delivery_reports_it_complete() -> None:
    client = _connected(5)
    _delivered(client, _stored(2, 31))
    effects = client.send(PubRec(31, ReasonCode.QUOTA_EXCEEDED))
    assert client.packets(effects) == []
    assert _acks(effects) == [(AckKind.PUBREC, 31), (AckKind.PUBCOMP, 31)]
    assert client.conn.state.outbound == {}


@pytest.mark.parametrize(("version", "code"), [(5, 0x00), (4, 0x00)])
def test_release_sends_pubrel_and_expects_pubcomp(version: int, code: int) -> None:
    client = _connected(version)
    effects = client.conn.release(40)
    assert client.packets(effects) == [PubRel(40, code)]
    assert _acks(client.send(PubComp(40))) == [(AckKind.PUBCOMP, 40)]
    assert client.conn.state.outbound == {}


def test_release_counts_in_the_window_until_pubcomp() -> None:
    client = _connected(5, Properties(receive_maximum=1))
    client.conn.release(40)
    assert _delivered(client, Publish("t", b"", qos=1)) == []
    assert len(of_type(client.packets(client.send(PubComp(40))), Publish)) == 1


def test_release_of_an_id_used_by_the_nodes_own_delivery_is_ignored() -> None:
    client = _connected(5)
    [own] = _delivered(client, Publish("t", b"", qos=1))
    assert own.packet_id is not None
    assert client.conn.release(own.packet_id) == []


def test_release_before_connack_is_ignored() -> None:
    client = Client(5)
    client.send(Connect(5, "c", True, 30))
    assert client.conn.release(1) == []


@pytest.mark.parametrize("qos", [1, 2])
def test_store_delivery_over_the_maximum_packet_size_is_reported_complete(qos: int) -> None:
    # MQTT 5.0 3.1.2.11.4: discarded, and the server behaves as if it had been delivered.
    client = _connected(5, Properties(maximum_packet_size=64))
    effects = client.conn.deliver(_stored(qos, 50, b"x" * 100))
    assert client.packets(effects) == []
    done = [(AckKind.PUBACK, 50)] if qos == 1 else [(AckKind.PUBREC, 50), (AckKind.PUBCOMP, 50)]
    assert _acks(effects) == done
    assert client.conn.state.outbound == {}


# ---------------------------------------------------------------------- Message Expiry


def test_expiry_helpers() -> None:
    assert expiry_deadline(Properties(), NOW_MS) is None
    assert expiry_deadline(Properties(message_expiry_interval=5), NOW_MS) == NOW_MS + 5000
    assert remaining_interval(NOW_MS + 5000, NOW_MS) == 5
    assert remaining_interval(NOW_MS + 5000, NOW_MS + 1) == 5  # rounded up: never 0 while live
    assert remaining_interval(NOW_MS + 5000, NOW_MS + 4999) == 1
    assert remaining_interval(NOW_MS + 5000, NOW_MS + 5000) is None
    assert remaining_interval(NOW_MS + 5000, NOW_MS + 9000) is None


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_the_interval_sent_is_what_is_left(qos: int) -> None:
    client = _connected(5)
    client.now = NOW_MS + 2500
    packet = Publish("t", b"", qos=qos, properties=Properties(message_expiry_interval=10))
    [sent] = of_type(client.packets(client.conn.deliver(packet, NOW_MS + 10_000)), Publish)
    assert sent.properties.message_expiry_interval == 8  # 7.5 s left, rounded up


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_an_expired_message_is_not_delivered(version: int, qos: int) -> None:
    client = _connected(version)
    client.now = NOW_MS + 10_000
    packet = Publish("t", b"", qos=qos, properties=Properties(message_expiry_interval=10))
    assert client.conn.deliver(packet, NOW_MS + 10_000) == []
    assert client.conn.state.outbound == {}


def test_an_expired_message_is_not_sent_from_its_encoded_bytes_either() -> None:
    client = _connected(5)
    message = fan_out("t", b"", Properties(message_expiry_interval=1))  # at NOW_MS
    client.now = NOW_MS + 999
    shared = encode(Publish("t", b"", properties=Properties(message_expiry_interval=1)), 5)
    assert client.conn.deliver_routed(message, Target("sub", 0)) == [Send(shared)]
    client.now = NOW_MS + 1000
    assert client.conn.deliver_routed(message, Target("sub", 0)) == []


def test_a_message_expiring_in_the_queue_is_dropped_and_the_next_one_sent() -> None:
    client = _connected(5, Properties(receive_maximum=1))
    [held] = _delivered(client, Publish("t", b"held", qos=1))
    short = Publish("t", b"short", qos=1, properties=Properties(message_expiry_interval=1))
    long = Publish("t", b"long", qos=1, properties=Properties(message_expiry_interval=60))
    assert client.conn.deliver(short, NOW_MS + 1000) == []
    assert client.conn.deliver(long, NOW_MS + 60_000) == []
    client.now = NOW_MS + 1500  # "short" expired while it waited for the window
    released = _acked(client, held)
    assert [(p.payload, p.properties.message_expiry_interval) for p in released] == [(b"long", 59)]


def test_v311_subscriber_gets_no_interval_but_the_expiry_still_applies() -> None:
    client = _connected(4)
    client.now = NOW_MS + 500
    packet = Publish("t", b"", qos=1, properties=Properties())
    [sent] = of_type(client.packets(client.conn.deliver(packet, NOW_MS + 1000)), Publish)
    assert sent.properties == Properties()
    client.now = NOW_MS + 1000
    assert client.conn.deliver(Publish("t", b"", qos=1), NOW_MS + 1000) == []


def test_an_expired_store_delivery_is_reported_complete_unless_it_is_a_resend() -> None:
    client = _connected(5)
    client.now = NOW_MS + 5000
    effects = client.conn.deliver(_stored(1, 60), NOW_MS + 1000)
    assert client.packets(effects) == []
    assert _acks(effects) == [(AckKind.PUBACK, 60)]
    # A resend (DUP) was on its way before it expired: it goes out, with the least interval.
    resend = client.conn.deliver(_stored(2, 61, dup=True), NOW_MS + 1000)
    [sent] = client.packets(resend)
    assert isinstance(sent, Publish) and sent.packet_id == 61 and sent.dup
    assert sent.properties.message_expiry_interval == 1
    assert _acks(resend) == []


def test_each_drop_is_counted_by_its_reason() -> None:
    """cormorant_messages_dropped_total: expired, queue full, too large, not authorized."""
    before = dict(DROPPED)
    client = _connected(5, Properties(receive_maximum=1, maximum_packet_size=64))
    client.now = NOW_MS + 10_000
    assert client.conn.deliver(Publish("t", b"", qos=1), NOW_MS + 10_000) == []
    assert client.conn.deliver(Publish("t", b"x" * 100)) == []
    client.now = NOW_MS
    _delivered(client, Publish("t", b"held", qos=1))
    for _ in range(MAX_QUEUED + 2):
        assert client.conn.deliver(Publish("t", b"q", qos=1)) == []
    client.conn.state.authorizer = DENY_ALL
    assert client.conn.deliver(Publish("t", b"")) == []
    assert {reason: DROPPED[reason] - before[reason] for reason in Drop} == {
        Drop.NO_SUBSCRIBER: 0,
        Drop.EXPIRED: 1,
        Drop.QUEUE_FULL: 2,
        Drop.STORE_FULL: 0,
        Drop.NOT_AUTHORIZED: 1,
        Drop.TOO_LARGE: 1,
        Drop.SESSION_GONE: 0,
    }
