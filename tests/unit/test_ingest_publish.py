"""Inbound PUBLISH, its acknowledgements and the v5 PUBLISH rules of the sans-IO ingest core,
with QoS 2 exactly once across reconnects (unreleased ids in the session record).

MQTT 3.1.1 sections 3.3-3.7, 4.3, 4.6; MQTT 5.0 sections 3.3-3.7, 4.3, 4.6, 4.9, 3.3.2.3.4.
"""

from __future__ import annotations

import pytest
from test_ingest_support import NOW_MS, Client, closes, make_settings, of_type, only, store_effects

from services.common.mqtt.packets import (
    Disconnect,
    PacketType,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
)
from services.common.mqtt.properties import Properties, decode_properties
from services.common.mqtt.reason_codes import ReasonCode
from services.common.records import PublishMeta, SessionRecord
from services.ingest.effects import Effect, Send, StorePublish, StoreRetained, StoreSession

VERSIONS = [4, 5]
PREVIOUS_SESSION = b"the-old-session!"


def _connected(version: int, **settings: int) -> Client:
    client = Client(version, make_settings(**settings))
    client.connect()
    return client


def _disconnect_code(client: Client, effects: list[Effect]) -> int:
    """The Reason Code of the v5 DISCONNECT the effects send, after checking they close."""
    assert closes(effects)
    assert client.conn.closed
    disconnect: Disconnect = only(client.packets(effects), Disconnect)
    return disconnect.reason_code


# ---------------------------------------------------------------------- QoS 0 / 1


@pytest.mark.parametrize("version", VERSIONS)
def test_qos0_is_stored_and_never_acknowledged(version: int) -> None:
    client = _connected(version)
    effects = client.send(Publish("a/b", b"payload"))
    store = only(effects, StorePublish)
    assert effects == [store]
    assert store.payload == b"payload"
    assert store.meta == PublishMeta("a/b", 0, False, NOW_MS, version, b"")
    assert client.stored(store.token) == []


@pytest.mark.parametrize("version", VERSIONS)
def test_qos1_puback_only_after_stored(version: int) -> None:
    client = _connected(version)
    effects = client.send(Publish("a/b", b"x", qos=1, packet_id=7))
    store = only(effects, StorePublish)
    assert effects == [store]
    assert store.meta.qos == 1
    assert client.packets(client.stored(store.token)) == [PubAck(7)]
    assert client.stored(store.token) == []  # a second answer is ignored


@pytest.mark.parametrize("version", VERSIONS)
def test_acks_leave_in_arrival_order_when_kafka_answers_out_of_order(version: int) -> None:
    client = _connected(version)
    effects = client.send(*(Publish("t", b"", qos=1, packet_id=i) for i in (10, 11, 12)))
    tokens = [s.token for s in of_type(effects, StorePublish)]
    assert len(tokens) == 3
    assert client.stored(tokens[2]) == []
    assert client.packets(client.stored(tokens[0])) == [PubAck(10)]
    assert client.packets(client.stored(tokens[1])) == [PubAck(11), PubAck(12)]


def test_acks_of_mixed_qos_keep_arrival_order() -> None:
    client = _connected(5)
    effects = client.send(
        Publish("t", b"", qos=2, packet_id=1),
        Publish("t", b"", qos=0),
        Publish("t", b"", qos=1, packet_id=2),
    )
    q2, q0, q1 = (s.token for s in of_type(effects, StorePublish))
    assert client.stored(q0) == []
    assert client.stored(q1) == []
    assert client.packets(client.stored(q2)) == [PubRec(1), PubAck(2)]


# ---------------------------------------------------------------------- store failures


UNKNOWN_OUTCOME = Disconnect(
    ReasonCode.UNSPECIFIED_ERROR,
    Properties(reason_string="a PUBLISH could not be stored: publish it again"),
)
"""What a v5 client gets when a PUBLISH's store failed: its outcome is unknown."""


def test_v5_failed_store_closes_instead_of_refusing() -> None:
    """Issue 22.3: the idempotent producer may still write a record whose store failed, so
    the client is not told it was refused (it would publish it again, as a new message):
    the connection closes, and the client resends it (DUP) after reconnecting."""
    client = _connected(5)
    effects = client.send(
        Publish("t", b"", qos=1, packet_id=1), Publish("t", b"", qos=1, packet_id=2)
    )
    first, second = (s.token for s in of_type(effects, StorePublish))
    assert client.stored(second) == []
    failed = client.store_failed(first)
    assert client.packets(failed) == [UNKNOWN_OUTCOME]  # no PUBACK 0x80, nor for 2
    assert closes(failed) and client.conn.closed


def test_v5_failed_qos2_store_closes_without_pubrec() -> None:
    client = _connected(5)
    store = only(client.send(Publish("t", b"", qos=2, packet_id=3)), StorePublish)
    failed = client.store_failed(store.token)
    assert client.packets(failed) == [UNKNOWN_OUTCOME]
    assert closes(failed)


def test_v311_failed_store_closes_without_puback() -> None:
    client = _connected(4)
    effects = client.send(
        Publish("t", b"", qos=1, packet_id=1),
        Publish("t", b"", qos=1, packet_id=2),
        Publish("t", b"", qos=1, packet_id=3),
    )
    first, second, third = (s.token for s in of_type(effects, StorePublish))
    assert client.packets(client.stored(first)) == [PubAck(1)]
    failed = client.store_failed(second)
    assert client.packets(failed) == []
    assert closes(failed)
    assert client.conn.closed
    # Nothing after the failed one is acknowledged on the closing connection.
    assert client.stored(third) == []
    assert client.send(Publish("t", b"", qos=1, packet_id=4)) == []


def test_v311_failure_behind_stored_ones_acks_those_first() -> None:
    client = _connected(4)
    effects = client.send(
        Publish("t", b"", qos=1, packet_id=1), Publish("t", b"", qos=1, packet_id=2)
    )
    first, second = (s.token for s in of_type(effects, StorePublish))
    assert client.store_failed(second) == []
    out = client.stored(first)
    assert client.packets(out) == [PubAck(1)]
    assert closes(out)


def test_qos0_store_failure_is_silent() -> None:
    client = _connected(4)
    store = only(client.send(Publish("t", b"")), StorePublish)
    assert client.store_failed(store.token) == []
    assert not client.conn.closed


# ---------------------------------------------------------------------- QoS 2


@pytest.mark.parametrize("version", VERSIONS)
def test_qos2_pubrec_after_stored_then_pubrel_pubcomp(version: int) -> None:
    client = _connected(version)
    store = only(client.send(Publish("t", b"m", qos=2, packet_id=9)), StorePublish)
    assert store.meta.qos == 2
    assert client.packets(client.stored(store.token)) == [PubRec(9)]
    # A resend before PUBREL is acknowledged again but not stored again (MQTT 4.3.3).
    again = client.send(Publish("t", b"m", qos=2, dup=True, packet_id=9))
    assert store_effects(again) == []
    assert client.packets(again) == [PubRec(9)]
    assert client.packets(client.send(PubRel(9))) == [PubComp(9)]
    # After PUBCOMP the identifier is free: the same id is a new message.
    assert isinstance(
        only(client.send(Publish("t", b"n", qos=2, packet_id=9)), StorePublish), StorePublish
    )


def test_qos2_resend_while_the_first_is_being_stored_is_not_stored_twice() -> None:
    client = _connected(5)
    store = only(client.send(Publish("t", b"m", qos=2, packet_id=4)), StorePublish)
    again = client.send(Publish("t", b"m", qos=2, dup=True, packet_id=4))
    assert store_effects(again) == []
    assert client.packets(again) == []
    answers = client.packets(client.stored(store.token))
    assert answers and all(p == PubRec(4) for p in answers)
    assert client.packets(client.send(PubRel(4))) == [PubComp(4)]


def test_qos2_resend_of_a_failing_store_is_never_acknowledged_as_success() -> None:
    client = _connected(5)
    store = only(client.send(Publish("t", b"m", qos=2, packet_id=4)), StorePublish)
    client.send(Publish("t", b"m", qos=2, dup=True, packet_id=4))
    failed = client.store_failed(store.token)
    assert client.packets(failed) == [UNKNOWN_OUTCOME]
    assert closes(failed)


def test_pubrel_for_unknown_id_gets_pubcomp_0x92() -> None:
    client = _connected(5)
    comp = only(client.packets(client.send(PubRel(77))), PubComp)
    assert comp.packet_id == 77
    assert comp.reason_code == ReasonCode.PACKET_IDENTIFIER_NOT_FOUND


def test_v311_pubrel_for_unknown_id_still_gets_pubcomp() -> None:
    client = _connected(4)
    assert client.packets(client.send(PubRel(77))) == [PubComp(77)]


# ---------------------------------------------------------------------- topic names


def test_v5_wildcard_topic_is_disconnect_0x90() -> None:
    client = _connected(5)
    effects = client.send(Publish("a/+/b", b"", qos=1, packet_id=1))
    assert store_effects(effects) == []
    assert _disconnect_code(client, effects) == ReasonCode.TOPIC_NAME_INVALID


def test_v311_wildcard_topic_closes() -> None:
    client = _connected(4)
    effects = client.send(Publish("a/#", b""))
    assert store_effects(effects) == []
    assert client.packets(effects) == []
    assert closes(effects)


def test_publishes_before_a_bad_one_in_the_same_read_are_kept() -> None:
    client = _connected(5)
    effects = client.send(Publish("ok", b"1"), Publish("bad/#", b"2"), Publish("ok", b"3"))
    assert [s.payload for s in of_type(effects, StorePublish)] == [b"1"]
    assert closes(effects)


# ---------------------------------------------------------------------- topic aliases


def test_topic_alias_is_set_and_reused() -> None:
    client = _connected(5, topic_alias_maximum=4)
    first = only(
        client.send(Publish("a/b", b"1", properties=Properties(topic_alias=2))), StorePublish
    )
    reused = only(
        client.send(Publish("", b"2", properties=Properties(topic_alias=2))), StorePublish
    )
    assert first.meta.topic == reused.meta.topic == "a/b"
    assert first.meta.properties == reused.meta.properties == b""  # the alias is not forwarded
    changed = client.send(Publish("c", b"3", properties=Properties(topic_alias=2)))
    again = client.send(Publish("", b"4", properties=Properties(topic_alias=2)))
    assert only(changed, StorePublish).meta.topic == only(again, StorePublish).meta.topic == "c"


def test_unknown_topic_alias_is_a_protocol_error() -> None:
    client = _connected(5, topic_alias_maximum=4)
    effects = client.send(Publish("", b"", properties=Properties(topic_alias=3)))
    assert store_effects(effects) == []
    assert _disconnect_code(client, effects) == ReasonCode.PROTOCOL_ERROR


def test_topic_alias_over_the_maximum_is_0x94() -> None:
    client = _connected(5, topic_alias_maximum=4)
    effects = client.send(Publish("a", b"", properties=Properties(topic_alias=5)))
    assert _disconnect_code(client, effects) == ReasonCode.TOPIC_ALIAS_INVALID


def test_topic_alias_when_none_were_offered_is_0x94() -> None:
    client = _connected(5, topic_alias_maximum=0)
    effects = client.send(Publish("a", b"", properties=Properties(topic_alias=1)))
    assert _disconnect_code(client, effects) == ReasonCode.TOPIC_ALIAS_INVALID


# ---------------------------------------------------------------------- flow control


def test_receive_maximum_exceeded_is_0x93() -> None:
    client = _connected(5, receive_maximum=2)
    ok = client.send(Publish("t", b"", qos=1, packet_id=1), Publish("t", b"", qos=2, packet_id=2))
    assert len(of_type(ok, StorePublish)) == 2
    assert len(of_type(client.send(Publish("t", b"")), StorePublish)) == 1  # QoS 0 not counted
    effects = client.send(Publish("t", b"", qos=1, packet_id=3))
    assert store_effects(effects) == []
    assert _disconnect_code(client, effects) == ReasonCode.RECEIVE_MAXIMUM_EXCEEDED


def test_receive_maximum_counts_qos2_until_pubcomp() -> None:
    client = _connected(5, receive_maximum=1)
    store = only(client.send(Publish("t", b"", qos=2, packet_id=1)), StorePublish)
    client.stored(store.token)  # PUBREC sent, PUBCOMP not yet
    effects = client.send(Publish("t", b"", qos=1, packet_id=2))
    assert _disconnect_code(client, effects) == ReasonCode.RECEIVE_MAXIMUM_EXCEEDED


def test_receive_maximum_frees_up_after_acknowledgement() -> None:
    client = _connected(5, receive_maximum=1)
    for packet_id in (1, 2, 3):
        store = only(client.send(Publish("t", b"", qos=1, packet_id=packet_id)), StorePublish)
        assert client.packets(client.stored(store.token)) == [PubAck(packet_id)]
    store = only(client.send(Publish("t", b"", qos=2, packet_id=4)), StorePublish)
    client.stored(store.token)
    client.send(PubRel(4))
    assert isinstance(
        only(client.send(Publish("t", b"", qos=1, packet_id=5)), StorePublish), StorePublish
    )


def test_v311_has_no_receive_maximum() -> None:
    client = _connected(4, receive_maximum=1)
    effects = client.send(*(Publish("t", b"", qos=1, packet_id=i) for i in (1, 2, 3)))
    assert len(of_type(effects, StorePublish)) == 3
    assert not client.conn.closed


# ---------------------------------------------------------------------- retain and properties


@pytest.mark.parametrize("version", VERSIONS)
def test_retain_is_stored_with_the_flag_and_kept_as_the_retained_message(version: int) -> None:
    # Retained messages are available (CONNACK says nothing else, MQTT 5.0 3.2.2.3.5): the
    # PUBLISH goes to msg.all with RETAIN as sent and to msg.retained (MQTT 3.3.1.3), and
    # PUBACK waits for both.
    client = Client(version)
    connack = client.connect()
    assert connack.properties.retain_available is None
    effects = client.send(Publish("t", b"keep", qos=1, retain=True, packet_id=1))
    store, retained = only(effects, StorePublish), only(effects, StoreRetained)
    assert effects.index(store) < effects.index(retained)
    assert store.meta.retain is True and (retained.meta, retained.payload) == (store.meta, b"keep")
    assert client.packets(client.stored(retained.token)) == []
    assert client.packets(client.stored(store.token)) == [PubAck(1)]
    assert not client.conn.closed


@pytest.mark.parametrize("qos", [0, 1])
def test_a_retained_message_not_stored_is_not_acknowledged(qos: int) -> None:
    client = _connected(5)
    effects = client.send(Publish("t", b"", qos=qos, retain=True, packet_id=qos or None))
    retained = only(effects, StoreRetained)
    assert retained.payload == b""  # empty: deletes the topic's retained message
    out = client.store_failed(retained.token)
    if qos:
        failed = client.stored(only(effects, StorePublish).token)
        assert client.packets(failed) == [UNKNOWN_OUTCOME]
        assert closes(failed)
    else:
        assert out == []


def test_without_retain_nothing_goes_to_msg_retained() -> None:
    client = _connected(4)
    assert of_type(client.send(Publish("t", b"x", qos=1, packet_id=1)), StoreRetained) == []


def test_v5_client_subscription_identifier_is_a_protocol_error() -> None:
    client = _connected(5)
    effects = client.send(Publish("t", b"", properties=Properties(subscription_identifiers=[3])))
    assert _disconnect_code(client, effects) == ReasonCode.PROTOCOL_ERROR


def test_v5_properties_are_forwarded_without_the_topic_alias() -> None:
    client = _connected(5, topic_alias_maximum=2)
    sent = Properties(
        payload_format_indicator=1,
        message_expiry_interval=30,
        content_type="application/json",
        response_topic="reply/here",
        correlation_data=b"\x00\x01",
        user_properties=[("k", "v"), ("k", "w")],
        topic_alias=1,
    )
    store = only(
        client.send(Publish("t", b"{}", qos=1, packet_id=1, properties=sent)), StorePublish
    )
    forwarded, end = decode_properties(store.meta.properties, 0, PacketType.PUBLISH)
    assert end == len(store.meta.properties)
    assert forwarded == Properties(
        payload_format_indicator=1,
        message_expiry_interval=30,
        content_type="application/json",
        response_topic="reply/here",
        correlation_data=b"\x00\x01",
        user_properties=[("k", "v"), ("k", "w")],
    )
    assert store.meta.protocol_version == 5


def test_publish_too_large_is_disconnect_0x95() -> None:
    client = _connected(5, max_packet_size=128)
    effects = client.send(Publish("t", b"x" * 200))
    assert store_effects(effects) == []
    assert _disconnect_code(client, effects) == ReasonCode.PACKET_TOO_LARGE


def test_received_time_comes_from_the_clock() -> None:
    client = _connected(4)
    client.now = NOW_MS + 1234
    assert only(client.send(Publish("t", b"")), StorePublish).meta.received_at_ms == NOW_MS + 1234


# ------------------------------------------------------------ QoS 2 of persistent sessions


def _persistent(version: int, unreleased: tuple[int, ...] = ()) -> Client:
    """A client resuming a persistent session whose record lists ``unreleased`` ids."""
    previous = SessionRecord(
        node_id="node-b",
        connection_id=bytes(16),
        connected=False,
        protocol_version=version,
        clean_start=False,
        persistent=True,
        session_id=PREVIOUS_SESSION,
        updated_at_ms=NOW_MS,
        unreleased=unreleased,
    )
    client = Client(version, previous=(previous, []))
    assert client.connect(clean_start=False).session_present
    return client


def _session_record(effects: list[Effect]) -> StoreSession:
    """The one session record of ``effects``: the resumed session's, connected."""
    store = only(effects, StoreSession)
    assert store.record is not None and store.record.connected
    assert store.record.session_id == PREVIOUS_SESSION
    return store


def _recorded(effects: list[Effect]) -> tuple[int, ...]:
    """The unreleased Packet Identifiers listed by the one session record of ``effects``."""
    record = _session_record(effects).record
    assert record is not None
    return record.unreleased


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("record_first", [True, False])
def test_pubrec_waits_for_the_message_and_a_session_record_listing_its_id(
    version: int, record_first: bool
) -> None:
    client = _persistent(version, unreleased=(3,))
    effects = client.send(Publish("t", b"m", qos=2, packet_id=9))
    publish, record = effects
    assert isinstance(publish, StorePublish)
    assert _recorded(effects) == (3, 9)
    first, second = (record, publish) if record_first else (publish, record)
    assert client.stored(first.token) == []
    assert client.packets(client.stored(second.token)) == [PubRec(9)]


def test_one_session_record_serves_every_qos2_publish_of_a_read() -> None:
    client = _persistent(5)
    effects = client.send(
        Publish("t", b"", qos=2, packet_id=1),
        Publish("t", b"", qos=1, packet_id=2),
        Publish("t", b"", qos=2, packet_id=3),
    )
    assert [type(e) for e in effects] == [StorePublish] * 3 + [StoreSession]
    assert _recorded(effects) == (1, 3)
    assert client.packets(client.store_all(effects)) == [PubRec(1), PubAck(2), PubRec(3)]


@pytest.mark.parametrize("version", VERSIONS)
def test_non_persistent_sessions_keep_qos2_ids_in_memory_only(version: int) -> None:
    client = _connected(version)
    effects = client.send(Publish("t", b"", qos=2, packet_id=4))
    assert [type(e) for e in effects] == [StorePublish]
    client.store_all(effects)
    assert client.send(PubRel(4)) == [Send(client.conn.state.encode(PubComp(4)))]


@pytest.mark.parametrize("version", VERSIONS)
def test_pubcomp_waits_for_a_session_record_without_the_id(version: int) -> None:
    client = _persistent(version, unreleased=(5, 6))
    effects = client.send(PubRel(5))
    assert client.packets(effects) == []
    assert _recorded(effects) == (6,)
    assert client.packets(client.stored(_session_record(effects).token)) == [PubComp(5)]
    assert client.conn.state.unreleased_qos2 == {6}


@pytest.mark.parametrize("version", VERSIONS)
def test_a_resumed_session_acknowledges_a_resend_without_publishing_it(version: int) -> None:
    client = _persistent(version, unreleased=(7,))
    effects = client.send(Publish("t", b"again", qos=2, dup=True, packet_id=7))
    assert store_effects(effects) == []
    assert client.packets(effects) == [PubRec(7)]
    released = client.send(PubRel(7))
    assert client.packets(client.store_all(released)) == [PubComp(7)]
    # Released: the identifier now names a new message.
    fresh = client.send(Publish("t", b"new", qos=2, packet_id=7))
    assert only(fresh, StorePublish).payload == b"new"


def test_a_clean_start_forgets_the_stored_ids() -> None:
    previous = SessionRecord(
        "node-b", bytes(16), False, 5, False, True, session_id=PREVIOUS_SESSION, unreleased=(7,)
    )
    client = Client(5, previous=(previous, []))
    client.connect(clean_start=True)
    assert client.conn.state.unreleased_qos2 == set()
    assert isinstance(
        only(client.send(Publish("t", b"", qos=2, packet_id=7)), StorePublish), StorePublish
    )


@pytest.mark.parametrize("failing", ["session record", "message"])
def test_v5_a_failed_qos2_store_closes_and_the_end_record_leaves_the_id_out(failing: str) -> None:
    client = _persistent(5, unreleased=(2,))
    publish, record = client.send(Publish("t", b"", qos=2, packet_id=8))
    stored, failing_one = (publish, record) if failing == "session record" else (record, publish)
    assert client.stored(stored.token) == []
    effects = client.store_failed(failing_one.token)
    assert client.packets(effects) == [UNKNOWN_OUTCOME]
    assert closes(effects)
    end = only(client.lost(), StoreSession).record
    assert end is not None and not end.connected
    assert end.unreleased == (2,)  # 8 may be in Kafka, but was never acknowledged


def test_v311_failed_qos2_store_closes_and_the_end_record_leaves_the_id_out() -> None:
    client = _persistent(4, unreleased=(2,))
    publish, record = client.send(Publish("t", b"", qos=2, packet_id=8))
    client.stored(record.token)
    assert closes(client.store_failed(publish.token))
    end = only(client.lost(), StoreSession).record
    assert end is not None and not end.connected
    assert end.unreleased == (2,)  # resent after the reconnect, 8 is stored again


@pytest.mark.parametrize("version", VERSIONS)
def test_a_pubrel_that_cannot_be_recorded_closes_and_keeps_the_id(version: int) -> None:
    client = _persistent(version, unreleased=(5,))
    record = only(client.send(PubRel(5)), StoreSession)
    effects = client.store_failed(record.token)
    assert of_type(client.packets(effects), PubComp) == []
    assert closes(effects)
    if version == 5:
        assert only(client.packets(effects), Disconnect).reason_code == 0x80
    end = only(client.lost(), StoreSession).record
    assert end is not None and end.unreleased == (5,)  # the client resends PUBREL


def test_end_record_lists_only_acknowledged_ids() -> None:
    client = _persistent(5, unreleased=(1,))
    client.store_all(client.send(Publish("t", b"", qos=2, packet_id=2)))
    client.send(Publish("t", b"", qos=2, packet_id=3))  # not stored yet: no PUBREC sent
    client.send(PubRel(1))  # its record not stored yet: PUBCOMP not sent
    end = only(client.lost(), StoreSession).record
    assert end is not None and end.unreleased == (1, 2)


def test_records_while_connected_list_pending_ids_and_leave_out_releasing_ones() -> None:
    client = _persistent(5, unreleased=(1, 2))
    release = only(client.send(PubRel(1)), StoreSession)
    effects = client.send(Publish("t", b"", qos=2, packet_id=3))
    assert _recorded(effects) == (2, 3)
    assert client.packets(client.stored(release.token)) == [PubComp(1)]
