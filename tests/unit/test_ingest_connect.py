"""CONNECT / CONNACK, keep alive, DISCONNECT and session end of the sans-IO ingest core.

MQTT 3.1.1 sections 3.1, 3.2, 3.14, 4.8; MQTT 5.0 sections 3.1, 3.2, 3.14, 4.13.
"""

from __future__ import annotations

import pytest
from test_ingest_support import (
    ANONYMOUS,
    CONNECTION_ID,
    LATER,
    NODE_ID,
    NOW_MS,
    SESSION_OFFSET,
    Client,
    closes,
    fan_out,
    make_settings,
    of_type,
    only,
    store_effects,
)

from services.common.auth.principal import Accepted
from services.common.mqtt.codec import encode
from services.common.mqtt.packets import (
    ConnAck,
    Connect,
    Disconnect,
    PingReq,
    PingResp,
    PubAck,
    Publish,
    PubRel,
    Subscribe,
    SubscriptionRequest,
    UnsubAck,
    Unsubscribe,
    Will,
)
from services.common.mqtt.properties import Properties
from services.common.mqtt.reason_codes import ReasonCode
from services.common.records import ClientKind, SessionRecord, Target
from services.common.sessions import assigned_client_id, client_kind, is_persistent
from services.common.settings import Settings
from services.common.subscription import Subscription
from services.ingest.effects import (
    Authenticate,
    Close,
    Connected,
    CreateAppTopic,
    Send,
    StorePublish,
    StoreSession,
    StoreSubscriptions,
    SyncState,
    WatchSession,
)
from services.ingest.handle_connect import orphaned_session_end

VERSIONS = [4, 5]
PREVIOUS_SESSION_ID = b"previous-session"


def _record(
    persistent: bool, connected: bool = False, expiry: int = 3600, age_ms: int = 1000
) -> SessionRecord:
    return SessionRecord(
        node_id="node-b",
        connection_id=bytes(16),
        session_id=PREVIOUS_SESSION_ID,
        connected=connected,
        protocol_version=5,
        clean_start=not persistent,
        persistent=persistent,
        session_expiry_interval=expiry if persistent else 0,
        updated_at_ms=NOW_MS - age_ms,
    )


# ---------------------------------------------------------------------- accepted CONNECT


@pytest.mark.parametrize("version", VERSIONS)
def test_connack_only_after_the_session_record_is_stored(version: int) -> None:
    client = Client(version)
    effects = client.send(Connect(version, "dev-1", True, 30))
    assert of_type(effects, Send) == []
    record = only(effects, StoreSession)
    assert effects == [record]
    assert record.record == SessionRecord(
        node_id=NODE_ID,
        connection_id=CONNECTION_ID,
        connected=True,
        protocol_version=version,
        clean_start=True,
        persistent=False,
        session_expiry_interval=0,
        connected_at_ms=NOW_MS,
        updated_at_ms=NOW_MS,
        session_id=CONNECTION_ID,  # a new session is named after the connection starting it
        owner="anonymous",  # who may resume it
    )
    assert client.conn.client_id == "dev-1"
    assert not client.conn.awaiting_connect

    after = client.stored(record.token)
    assert isinstance(after[0], Send)
    assert after[1:] == [Connected("dev-1")]
    connack = only(client.packets(after), ConnAck)
    assert connack.reason_code == 0
    assert connack.session_present is False


def test_v5_connack_advertises_the_server_limits() -> None:
    settings = make_settings(receive_maximum=7, max_packet_size=4096, topic_alias_maximum=3)
    connack = Client(5, settings).connect()
    props = connack.properties
    assert props.receive_maximum == 7
    assert props.maximum_packet_size == 4096
    assert props.topic_alias_maximum == 3
    assert props.retain_available is None  # absent: retained messages are available (3.2.2.3.5)
    assert props.assigned_client_identifier is None


def test_v5_connack_omits_topic_alias_maximum_when_aliases_are_off() -> None:
    connack = Client(5, settings=make_settings(topic_alias_maximum=0)).connect()
    assert connack.properties.topic_alias_maximum is None


def test_v3_connack_has_no_properties() -> None:
    client = Client(4)
    client.connect()
    data = b"".join(e.data for e in client.log if isinstance(e, Send))
    assert data == bytes([0x20, 0x02, 0x00, 0x00])


def test_mqtt_3_1_connect_is_accepted() -> None:
    client = Client(3)
    connack = client.connect("old-client")
    assert connack.reason_code == 0
    assert client.conn.state.protocol_version == 3


# ---------------------------------------------------------------------- client identifiers


def test_v5_empty_client_id_gets_an_assigned_identifier() -> None:
    client = Client(5)
    connack = client.connect("")
    assigned = connack.properties.assigned_client_identifier
    assert assigned
    assert client.conn.client_id == assigned
    assert client.looked_up == [assigned]
    assert Connected(assigned) in client.log


def test_assigned_identifiers_differ_between_connections() -> None:
    first, second = Client(5), Client(5)
    first.connect("")
    second.connect("")
    assert first.conn.client_id != second.conn.client_id
    assert first.conn.client_id.startswith("assigned-")  # the server's generator's


def test_the_server_generates_distinct_assigned_identifiers() -> None:
    ids = {assigned_client_id() for _ in range(100)}
    assert len(ids) == 100 and all(i.startswith("cormorant-") for i in ids)


def test_v311_empty_client_id_with_clean_session_is_assigned_one() -> None:
    client = Client(4)
    connack = client.connect("")
    assert connack.reason_code == 0
    assert client.conn.client_id != ""
    assert connack.properties == Properties()


def test_v311_empty_client_id_without_clean_session_is_rejected_with_0x02() -> None:
    client = Client(4)
    effects = client.send(Connect(4, "", False, 30))
    assert store_effects(effects) == []
    assert client.packets(effects) == [ConnAck(False, 0x02)]
    assert closes(effects)
    assert client.conn.closed


def test_mqtt_3_1_requires_a_client_identifier() -> None:
    client = Client(3)
    effects = client.send(Connect(3, "", True, 30))
    assert client.packets(effects) == [ConnAck(False, 0x02)]
    assert closes(effects)


# ---------------------------------------------------------------------- refused CONNECT


def _connect_bytes(name: bytes, level: int, flags: int = 0x02) -> bytes:
    body = len(name).to_bytes(2, "big") + name + bytes([level, flags, 0, 30]) + b"\x00\x01c"
    return bytes([0x10, len(body)]) + body


@pytest.mark.parametrize(
    "raw",
    [
        _connect_bytes(b"MQTT", 6),
        _connect_bytes(b"MQTT", 3),
        _connect_bytes(b"MQIsdp", 4),
        _connect_bytes(b"MQTX", 4),
    ],
)
def test_unsupported_protocol_level_gets_connack_0x01_then_close(raw: bytes) -> None:
    client = Client(4)
    effects = client.send_bytes(raw)
    assert effects[0] == Send(bytes([0x20, 0x02, 0x00, 0x01]))
    assert isinstance(effects[1], Close)
    assert len(effects) == 2
    assert client.conn.closed


def test_malformed_v311_connect_is_closed_without_connack() -> None:
    raw = bytearray(encode(Connect(4, "c", True, 30), 4))
    raw[9] |= 0x01  # the reserved Connect Flags bit (MQTT-3.1.2-3)
    client = Client(4)
    effects = client.send_bytes(bytes(raw))
    assert effects == [effects[-1]]
    assert closes(effects)
    assert client.conn.closed


def test_malformed_v5_connect_closes_without_accepting() -> None:
    # Receive Maximum 0 is a Protocol Error in CONNECT (MQTT 5.0 3.1.2.11.3).
    raw = encode(Connect(5, "c", True, 30, properties=Properties(receive_maximum=1)), 5)
    raw = raw.replace(b"\x21\x00\x01", b"\x21\x00\x00")
    client = Client(5)
    effects = client.send_bytes(raw)
    assert closes(effects)
    assert store_effects(effects) == []
    for connack in of_type(client.packets(effects), ConnAck):
        assert connack.reason_code >= 0x80


def test_first_packet_other_than_connect_closes_without_answer() -> None:
    client = Client(4)
    effects = client.send(PingReq())
    assert effects == [effects[0]]
    assert isinstance(effects[0], Close)
    assert client.conn.closed
    assert client.send(Connect(4, "c", True, 30)) == []


def test_v5_invalid_will_topic_gets_connack_0x90() -> None:
    client = Client(5)
    effects = client.send(Connect(5, "c", True, 30, will=Will("a/+", b"bye")))
    connack = only(client.packets(effects), ConnAck)
    assert connack.reason_code == ReasonCode.TOPIC_NAME_INVALID
    assert closes(effects)
    assert store_effects(effects) == []


def test_v311_invalid_will_topic_closes_without_a_misleading_connack() -> None:
    client = Client(4)
    effects = client.send(Connect(4, "c", True, 30, will=Will("a/#", b"bye")))
    assert client.packets(effects) == []
    assert closes(effects)
    assert store_effects(effects) == []


def test_v311_oversized_connect_closes_without_connack() -> None:
    client = Client(4, make_settings(max_packet_size=64))
    effects = client.send(Connect(4, "c" * 100, True, 30))
    assert client.packets(effects) == []
    assert closes(effects)


@pytest.mark.parametrize(("version", "code"), [(5, 0x88), (4, 0x03)])
def test_failed_session_store_refuses_with_server_unavailable(version: int, code: int) -> None:
    client = Client(version)
    record = only(client.send(Connect(version, "c", True, 30)), StoreSession)
    effects = client.store_failed(record.token)
    connack = only(client.packets(effects), ConnAck)
    assert connack.reason_code == code
    assert closes(effects)
    assert not any(isinstance(e, Connected) for e in effects)
    assert client.conn.closed
    assert client.lost() == []
    assert client.conn.stored(record.token) == []


# ---------------------------------------------------------------------- after CONNECT


def test_a_second_connect_of_an_unknown_protocol_gets_a_valid_disconnect() -> None:
    # Found by the fuzzer (tests/fuzz): decoded as a CONNECT, its Protocol Name made the
    # server send DISCONNECT 0x84, a Reason Code DISCONNECT may not carry (MQTT 5.0 3.14.2.1).
    client = Client(5)
    client.connect()
    second = bytearray(encode(Connect(5, "c1", True, 30), 5))
    second[4:8] = b"MQIs"  # Protocol Name "MQIs", no protocol this server speaks
    effects = client.send_bytes(bytes(second))
    assert only(client.packets(effects), Disconnect).reason_code == ReasonCode.PROTOCOL_ERROR
    assert closes(effects)


@pytest.mark.parametrize("version", VERSIONS)
def test_second_connect_is_a_protocol_error(version: int) -> None:
    client = Client(version)
    client.connect()
    effects = client.send(Connect(version, "c1", True, 30))
    packets = client.packets(effects)
    if version == 5:
        assert only(packets, Disconnect).reason_code == ReasonCode.PROTOCOL_ERROR
        assert len(packets) == 1
    else:
        assert packets == []
    assert closes(effects)
    assert client.conn.closed


def test_packets_pipelined_after_connect_wait_for_the_connack() -> None:
    client = Client(5)
    effects = client.send(
        Connect(5, "c", True, 30),
        Subscribe(1, [SubscriptionRequest("t/#", 1)]),
        Publish("t/1", b"x", qos=1, packet_id=2),
        PingReq(),
    )
    record = only(effects, StoreSession)
    assert effects == [record]

    after = client.stored(record.token)
    assert isinstance(after[0], Send)
    assert isinstance(only(client.packets(after[:1]), ConnAck), ConnAck)
    assert after[1] == Connected("c")
    subs = only(after, StoreSubscriptions)
    publish = only(after, StorePublish)
    assert after.index(subs) < after.index(publish)
    assert client.packets(after[2:]) == [PingResp()]

    acked = client.stored(publish.token)
    assert client.packets(acked) == [PubAck(2)]


def test_pipelined_disconnect_ends_the_session_after_connack() -> None:
    client = Client(5)
    record = only(client.send(Connect(5, "c", True, 30), Disconnect()), StoreSession)
    after = client.stored(record.token)
    assert isinstance(only(client.packets(after), ConnAck), ConnAck)
    assert [type(e) for e in after] == [Send, Connected, StoreSession]
    assert only(after, StoreSession).record is None
    assert client.store_all(after) == [Close("client sent DISCONNECT")]


def test_pipelined_bad_publish_gets_its_disconnect_after_connack() -> None:
    client = Client(5)
    record = only(client.send(Connect(5, "c", True, 30), Publish("a/#", b"")), StoreSession)
    after = client.stored(record.token)
    packets = client.packets(after)
    assert isinstance(packets[0], ConnAck)
    assert only(packets, Disconnect).reason_code == ReasonCode.TOPIC_NAME_INVALID
    assert store_effects(after) == []
    assert closes(after)


def test_protocol_error_before_connack_sends_no_disconnect() -> None:
    # MQTT-3.14.0-1: no DISCONNECT before a successful CONNACK.
    client = Client(5)
    record = only(client.send(Connect(5, "c", True, 30)), StoreSession)
    effects = client.send_bytes(b"\x00\x00")  # reserved packet type 0: malformed
    assert client.packets(effects) == []
    assert closes(effects)
    assert client.stored(record.token) == []
    # The session record may be in Kafka: the end records still follow.
    assert of_type(client.lost(), StoreSession) != []


def test_pingreq_gets_pingresp() -> None:
    client = Client(4)
    client.connect()
    assert client.packets(client.send(PingReq(), PingReq())) == [PingResp(), PingResp()]


def test_bytes_split_anywhere_still_form_packets() -> None:
    client = Client(5)
    data = encode(Connect(5, "split", True, 30), 5)
    effects = []
    for i in range(len(data)):
        effects += client.send_bytes(data[i : i + 1])
    assert only(effects, StoreSession).record is not None
    assert client.conn.client_id == "split"


# ---------------------------------------------------------------------- keep alive


def test_keep_alive_timeout_before_connect_is_the_connect_timeout() -> None:
    client = Client(5, make_settings(connect_timeout_seconds=4.0))
    assert client.conn.keep_alive_timeout == 4.0
    effects = client.conn.keep_alive_expired()
    assert effects == [effects[0]] and isinstance(effects[0], Close)


@pytest.mark.parametrize("version", VERSIONS)
def test_keep_alive_timeout_is_one_and_a_half_keep_alive(version: int) -> None:
    client = Client(version)
    client.connect(keep_alive=20)
    assert client.conn.keep_alive_timeout == 30.0


@pytest.mark.parametrize("keep_alive", [1, 2])
@pytest.mark.parametrize("late", ["authentication", "session record", "both"])
def test_keep_alive_counts_from_the_connack_however_late_it_is(keep_alive: int, late: str) -> None:
    """MQTT 3.1.2.10: 1.5 times the granted Keep Alive after the CONNACK, not the connect
    timeout armed when the CONNECT arrived (the credentials checked, the session record
    stored, seconds later)."""
    client = Client(5, make_settings(connect_timeout_seconds=10.0), authenticate=None)
    client.clock = 100.0
    check = only(client.send(Connect(5, "quiet", True, keep_alive)), Authenticate)
    assert check.request.client_id == "quiet"
    assert client.conn.keep_alive_deadline == 110.0  # the connect timeout until CONNACK
    if late != "session record":
        client.clock += 7.0
    record = only(client.authenticated(Accepted(ANONYMOUS)), StoreSession)
    assert client.conn.keep_alive_deadline == 110.0  # still no CONNACK
    if late != "authentication":
        client.clock += 2.5
    client.conn.session_stored_at(SESSION_OFFSET)
    connacked_at = client.clock
    assert isinstance(client.packets(client.stored(record.token))[0], ConnAck)
    silence = 1.5 * keep_alive
    assert client.conn.keep_alive_deadline == connacked_at + silence
    client.clock = connacked_at + silence - 0.001
    assert client.conn.check_keep_alive() == []
    client.clock = connacked_at + silence
    expired = client.conn.check_keep_alive()
    [disconnect] = client.packets(expired)
    assert isinstance(disconnect, Disconnect)
    assert disconnect.reason_code == ReasonCode.KEEP_ALIVE_TIMEOUT
    assert closes(expired)


def test_bytes_from_the_client_move_the_keep_alive_deadline() -> None:
    client = Client(4)
    client.clock = 50.0
    client.connect(keep_alive=2)
    assert client.conn.keep_alive_deadline == 53.0
    client.clock = 52.0
    assert [type(p) for p in client.packets(client.send(PingReq()))] == [PingResp]
    client.clock = 53.0
    assert client.conn.check_keep_alive() == []  # heard at 52: gone at 55
    assert client.conn.keep_alive_deadline == 55.0
    client.clock = 54.0
    client.conn.heard()  # the shell paused reading: its silence is not the client's
    assert client.conn.keep_alive_deadline == 57.0


def test_no_connect_within_the_connect_timeout_closes() -> None:
    client = Client(5, make_settings(connect_timeout_seconds=4.0))
    client.clock = 10.0
    client.send_bytes(b"\x10")  # the first byte of a CONNECT, and then nothing
    assert client.conn.keep_alive_deadline == 14.0
    client.clock = 13.9
    assert client.conn.check_keep_alive() == []
    client.clock = 14.0
    assert closes(client.conn.check_keep_alive())


def test_v311_keep_alive_zero_disables_the_timeout() -> None:
    client = Client(4)
    client.connect(keep_alive=0)
    assert client.conn.keep_alive_timeout is None


def test_v5_server_keep_alive_setting_overrides_the_client() -> None:
    client = Client(5, make_settings(server_keep_alive=10))
    connack = client.connect(keep_alive=100)
    assert connack.properties.server_keep_alive == 10
    assert client.conn.keep_alive_timeout == 15.0


def test_v5_keep_alive_above_the_maximum_is_lowered() -> None:
    client = Client(5, make_settings(max_keep_alive=60))
    connack = client.connect(keep_alive=600)
    assert connack.properties.server_keep_alive == 60
    assert client.conn.keep_alive_timeout == 90.0


def test_v5_keep_alive_as_asked_is_not_echoed() -> None:
    connack = Client(5, make_settings(max_keep_alive=60)).connect(keep_alive=60)
    assert connack.properties.server_keep_alive is None


def test_v5_keep_alive_expiry_sends_disconnect_0x8d() -> None:
    client = Client(5)
    client.connect()
    effects = client.conn.keep_alive_expired()
    disconnect = only(client.packets(effects), Disconnect)
    assert disconnect.reason_code == ReasonCode.KEEP_ALIVE_TIMEOUT
    assert disconnect.properties.reason_string
    assert closes(effects)
    assert client.conn.closed


def test_v311_keep_alive_expiry_just_closes() -> None:
    client = Client(4)
    client.connect()
    effects = client.conn.keep_alive_expired()
    assert client.packets(effects) == []
    assert closes(effects)


def test_keep_alive_expiry_before_connack_sends_no_disconnect() -> None:
    client = Client(5)
    client.send(Connect(5, "c", True, 30))
    effects = client.conn.keep_alive_expired()
    assert client.packets(effects) == []
    assert closes(effects)


def test_no_reason_string_on_puback_when_the_client_asks_for_no_problem_information() -> None:
    # MQTT 5.0 3.1.2.11.7: no Reason String on packets other than PUBLISH/CONNACK/DISCONNECT.
    client = Client(5)
    client.connect(properties=Properties(request_problem_information=False))
    stored = only(client.send(Publish("t", b"", qos=1, packet_id=1)), StorePublish)
    assert client.packets(client.stored(stored.token)) == [PubAck(1)]
    failed = only(client.send(Publish("t", b"", qos=1, packet_id=2)), StorePublish)
    assert client.packets(client.store_failed(failed.token)) == [Disconnect(0x80)]


# ---------------------------------------------------------------------- sessions


@pytest.mark.parametrize(
    ("version", "clean_start", "expiry", "persistent"),
    [
        (4, True, None, False),
        (4, False, None, True),
        (5, True, None, False),
        (5, True, 60, True),
        (5, False, None, True),
        (5, False, 60, True),
    ],
)
def test_session_record_follows_the_persistence_rule(
    version: int, clean_start: bool, expiry: int | None, persistent: bool
) -> None:
    client = Client(version)
    props = Properties(session_expiry_interval=expiry)
    record = only(
        client.send(Connect(version, "c", clean_start, 30, properties=props)), StoreSession
    )
    assert record.record is not None
    assert record.record.persistent is persistent
    assert is_persistent(version, clean_start, expiry or 0) is persistent
    assert record.record.session_expiry_interval == (expiry or 0)
    assert record.record.clean_start is clean_start


@pytest.mark.parametrize("version", VERSIONS)
def test_persistent_session_is_resumed_with_its_subscriptions(version: int) -> None:
    previous = [Subscription("c1", "a/b", 1), Subscription("c1", "x/#", 0)]
    client = Client(version, previous=(_record(persistent=True), previous))
    effects = client.send(Connect(version, "c1", False, 30))
    assert of_type(effects, StoreSubscriptions) == []
    stored = only(effects, StoreSession)
    connack = only(client.packets(client.stored(stored.token)), ConnAck)
    assert connack.session_present is True
    assert client.conn.state.subscriptions == {s.topic_filter: s for s in previous}
    assert stored.record is not None
    assert stored.record.session_id == PREVIOUS_SESSION_ID  # the same session goes on
    # The resumed subscription is known: unsubscribing it stores the rest.
    store = only(client.send(Unsubscribe(5, ["a/b"])), StoreSubscriptions)
    assert store.subscriptions == [previous[1]]


@pytest.mark.parametrize("version", VERSIONS)
def test_clean_start_discards_the_previous_subscriptions(version: int) -> None:
    previous = [Subscription("c1", "a/b", 1)]
    client = Client(version, previous=(_record(persistent=True), previous))
    effects = client.send(Connect(version, "c1", True, 30))
    tombstone = only(effects, StoreSubscriptions)
    assert tombstone.subscriptions == []
    assert effects.index(tombstone) < effects.index(only(effects, StoreSession))
    stored = only(effects, StoreSession)
    connack = only(client.packets(client.stored(stored.token)), ConnAck)
    assert connack.session_present is False
    assert client.conn.state.subscriptions == {}
    assert client.stored(tombstone.token) == []
    assert stored.record is not None
    assert stored.record.session_id == CONNECTION_ID  # a new session


def test_non_persistent_previous_session_is_not_resumed() -> None:
    previous = [Subscription("c1", "a/b", 1)]
    client = Client(5, previous=(_record(persistent=False), previous))
    effects = client.send(Connect(5, "c1", False, 30))
    assert only(effects, StoreSubscriptions).subscriptions == []
    connack = only(client.packets(client.stored(only(effects, StoreSession).token)), ConnAck)
    assert connack.session_present is False


@pytest.mark.parametrize(
    ("expiry", "age_ms", "connected", "present"),
    [
        (60, 59_000, False, True),
        (60, 60_000, False, False),
        (60, 3_600_000, True, True),  # still connected elsewhere: taken over, not expired
        (0, 10**12, False, True),  # TBMQ rule: Clean Start 0 without expiry persists
        (0xFFFFFFFF, 10**12, False, True),  # never expires
    ],
)
def test_expired_session_is_not_resumed(
    expiry: int, age_ms: int, connected: bool, present: bool
) -> None:
    previous = [Subscription("c1", "a/b", 1)]
    record = _record(persistent=True, connected=connected, expiry=expiry, age_ms=age_ms)
    client = Client(5, previous=(record, previous))
    effects = client.send(Connect(5, "c1", False, 30))
    after = client.stored(only(effects, StoreSession).token)
    for sync in of_type(after, SyncState):  # still held by its connection: confirmed first
        after = client.stored(sync.token)
    connack = only(client.packets(after), ConnAck)
    assert connack.session_present is present
    assert (of_type(effects, StoreSubscriptions) == []) is present
    assert (client.conn.state.subscriptions != {}) is present


def test_no_previous_session_means_no_session_present() -> None:
    client = Client(4)
    connack = client.connect(clean_start=False)
    assert connack.session_present is False
    assert of_type(client.log, StoreSubscriptions) == []


# ---------------------------------------------------------------------- session end


@pytest.mark.parametrize("version", VERSIONS)
def test_disconnect_of_non_persistent_session_deletes_it(version: int) -> None:
    client = Client(version)
    client.connect()
    client.stored(
        only(client.send(Subscribe(1, [SubscriptionRequest("a", 0)])), StoreSubscriptions).token
    )
    effects = client.send(Disconnect())
    assert len(effects) == 2
    assert isinstance(effects[0], StoreSubscriptions) and effects[0].subscriptions == []
    assert isinstance(effects[1], StoreSession) and effects[1].record is None
    # The socket closes once the session's end is stored: a reconnect after it finds it.
    assert client.store_all(effects) == [Close("client sent DISCONNECT")]
    assert client.conn.closed
    assert client.lost() == []


def test_disconnect_without_subscriptions_writes_only_the_session_tombstone() -> None:
    client = Client(4)
    client.connect()
    effects = client.send(Disconnect())
    assert [type(e) for e in effects] == [StoreSession]
    assert only(effects, StoreSession).record is None
    assert closes(client.store_all(effects))


@pytest.mark.parametrize("version", VERSIONS)
def test_disconnect_of_persistent_session_marks_it_disconnected(version: int) -> None:
    client = Client(version)
    client.connect(clean_start=False)
    client.stored(
        only(client.send(Subscribe(1, [SubscriptionRequest("a", 0)])), StoreSubscriptions).token
    )
    client.now += 5000
    effects = client.send(Disconnect())
    assert [type(e) for e in effects] == [StoreSession]
    assert closes(client.store_failed(only(effects, StoreSession).token))  # stored or not
    record = only(effects, StoreSession).record
    assert record is not None
    assert record.connected is False
    assert record.persistent is True
    assert record.connected_at_ms == NOW_MS
    assert record.updated_at_ms == NOW_MS + 5000


def test_connection_lost_ends_the_session_once() -> None:
    client = Client(5)
    client.connect()
    first = client.lost()
    assert [type(e) for e in first] == [StoreSession]
    assert client.lost() == []
    assert client.conn.closed


def test_connection_lost_before_connect_writes_nothing() -> None:
    client = Client(5)
    assert client.lost() == []


def test_taken_over_sends_0x8e_and_writes_no_end_records() -> None:
    client = Client(5)
    client.connect()
    effects = client.conn.taken_over(new_clean_start=False)
    disconnect = only(client.packets(effects), Disconnect)
    assert disconnect.reason_code == ReasonCode.SESSION_TAKEN_OVER
    assert closes(effects)
    assert store_effects(effects) == []
    assert client.lost() == []
    assert client.send(PingReq()) == []
    assert client.conn.deliver(Publish("t", b"x")) == []


def test_v311_taken_over_just_closes() -> None:
    client = Client(4)
    client.connect()
    effects = client.conn.taken_over(new_clean_start=False)
    assert client.packets(effects) == []
    assert closes(effects)
    assert client.lost() == []


def test_v5_disconnect_cannot_set_an_expiry_after_zero() -> None:
    client = Client(5)
    client.connect()
    effects = client.send(Disconnect(0, Properties(session_expiry_interval=60)))
    disconnect = only(client.packets(effects), Disconnect)
    assert disconnect.reason_code == ReasonCode.PROTOCOL_ERROR
    assert closes(effects)
    # The session stays non-persistent: deleted when the socket goes.
    end = client.lost()
    assert [type(e) for e in end] == [StoreSession]
    assert only(end, StoreSession).record is None


def test_v5_disconnect_with_expiry_zero_ends_a_persistent_session() -> None:
    client = Client(5)
    client.connect(properties=Properties(session_expiry_interval=60))
    effects = client.send(Disconnect(0, Properties(session_expiry_interval=0)))
    assert only(effects, StoreSession).record is None


@pytest.mark.parametrize("expiry", [None, 60], ids=["clean-start-0-rule", "expiry-60"])
def test_v5_disconnect_with_expiry_zero_ends_a_session_resumed_with_clean_start_0(
    expiry: int | None,
) -> None:
    # Persistent by TBMQ's rule (Clean Start 0, no expiry) or by its expiry: a DISCONNECT
    # saying 0 ends it all the same (MQTT 5.0 3.1.2.11.2, 3.14.2.2.2).
    client = Client(5, previous=(_record(persistent=True), [Subscription("c1", "a", 1)]))
    client.connect("c1", clean_start=False, properties=Properties(session_expiry_interval=expiry))
    assert client.conn.state.persistent
    effects = client.send(Disconnect(0, Properties(session_expiry_interval=0)))
    assert only(effects, StoreSubscriptions).subscriptions == []
    assert only(effects, StoreSession).record is None
    assert closes(client.store_all(effects))


def test_v5_disconnect_may_change_a_nonzero_expiry() -> None:
    client = Client(5)
    client.connect(properties=Properties(session_expiry_interval=60))
    effects = client.send(Disconnect(0, Properties(session_expiry_interval=600)))
    record = only(effects, StoreSession).record
    assert record is not None and record.session_expiry_interval == 600
    assert record.persistent is True


def test_unsuback_round_trip_after_resume_in_v311_has_no_codes() -> None:
    client = Client(4, previous=(_record(persistent=True), [Subscription("c1", "a", 0)]))
    client.connect("c1", clean_start=False)
    store = only(client.send(Unsubscribe(3, ["a"])), StoreSubscriptions)
    assert client.packets(client.stored(store.token)) == [UnsubAck(3)]


# ------------------------------------------------------------ records of older connections


def test_the_previous_connection_is_remembered() -> None:
    client = Client(5, previous=(_record(persistent=False, connected=True), []))
    client.connect("c1")
    assert client.conn.state.previous_connection_id == bytes(16)
    assert Client(5).conn.state.previous_connection_id is None


def test_a_late_record_of_the_same_session_adds_its_unreleased_ids() -> None:
    # The older connection stored a QoS 2 message after this one read the session: its
    # resend must still be acknowledged without being published again (MQTT 4.3.3).
    previous = _record(persistent=True)
    previous.unreleased = (1,)
    client = Client(5, previous=(previous, []))
    client.connect("c1", clean_start=False)
    late = _record(persistent=True, connected=True)
    late.unreleased = (1, 2)
    effects = client.conn.session_record_seen(late, LATER)
    record = only(effects, StoreSession).record
    assert record is not None and record.connected
    assert record.connection_id == CONNECTION_ID and record.session_id == PREVIOUS_SESSION_ID
    assert record.unreleased == (1, 2)
    assert client.conn.state.unreleased_qos2 == {1, 2}


def test_a_late_record_adds_nothing_once_the_client_sent_qos2_packets() -> None:
    # The client may have released an id here that the older connection still lists.
    previous = _record(persistent=True)
    previous.unreleased = (1,)
    client = Client(5, previous=(previous, []))
    client.connect("c1", clean_start=False)
    client.store_all(client.send(PubRel(1)))
    late = _record(persistent=True, connected=True)
    late.unreleased = (1, 2)
    record = only(client.conn.session_record_seen(late, LATER), StoreSession).record
    assert record is not None and record.unreleased == ()
    assert client.conn.state.unreleased_qos2 == set()


@pytest.mark.parametrize("late", [None, "another-session"])
def test_a_late_record_of_another_session_or_a_tombstone_is_only_overwritten(
    late: str | None,
) -> None:
    client = Client(5, previous=(_record(persistent=True), []))
    client.connect("c1", clean_start=True)
    record = None
    if late is not None:
        record = _record(persistent=True, connected=True)
        record.unreleased = (9,)
    effects = client.conn.session_record_seen(record, LATER)
    stored = only(effects, StoreSession).record
    assert stored is not None and stored.connected and stored.unreleased == ()
    assert client.conn.state.unreleased_qos2 == set()


def test_a_closed_connection_does_not_restate_its_session() -> None:
    client = Client(5)
    client.connect()
    client.lost()
    assert client.conn.session_record_seen(None, LATER) == []


# ---------------------------------------------------------------------- session takeover


def _newer_connection(clean_start: bool = False) -> SessionRecord:
    """A connected record of a connection this one knows nothing of (another node's)."""
    record = _record(persistent=True, connected=True)
    record.connection_id = b"n" * 16
    record.clean_start = clean_start
    return record


@pytest.mark.parametrize("version", [4, 5])
def test_a_newer_connection_elsewhere_takes_the_session_over(version: int) -> None:
    client = Client(version)
    client.connect("c1")
    effects = client.conn.session_record_seen(_newer_connection(), LATER)
    # v5: DISCONNECT 0x8E Session taken over (MQTT 3.1.4-3); v3.1.1 has none: just a close.
    disconnects = of_type(client.packets(effects), Disconnect)
    assert [d.reason_code for d in disconnects] == ([0x8E] if version == 5 else [])
    assert closes(effects)
    assert store_effects(effects) == []  # the session is the new connection's: no end records
    assert client.lost() == []


def test_records_no_newer_than_the_connections_own_are_ignored() -> None:
    client = Client(5)
    client.connect("c1")
    assert client.conn.session_record_seen(_newer_connection(), SESSION_OFFSET) == []
    assert client.conn.session_record_seen(_newer_connection(), SESSION_OFFSET - 3) == []
    own = _record(persistent=False, connected=True)
    own.connection_id = CONNECTION_ID
    assert client.conn.session_record_seen(own, LATER) == []
    assert not client.conn.closed


def test_a_connection_whose_own_record_is_not_stored_yet_ignores_records() -> None:
    client = Client(5)
    store = only(client.send(Connect(5, "c1", True, 30)), StoreSession)
    assert client.conn.session_record_seen(_newer_connection(), LATER) == []
    client.conn.session_stored_at(SESSION_OFFSET)
    assert of_type(client.packets(client.stored(store.token)), ConnAck)


def test_the_connection_a_session_was_taken_from_does_not_take_it_back() -> None:
    # Its late "connected" record is older news: this connection's record is stored again.
    client = Client(5, previous=(_record(persistent=True, connected=True), []))
    client.connect("c1", clean_start=False)
    effects = client.conn.session_record_seen(_record(persistent=True, connected=True), LATER)
    assert only(effects, StoreSession).record.connection_id == CONNECTION_ID  # type: ignore[union-attr]
    assert not client.conn.closed


def test_a_late_tombstone_of_a_session_taken_over_restates_its_subscriptions() -> None:
    # The older connection ended the session (DISCONNECT, Session Expiry Interval 0) after
    # this one took it over: the client was told it has its subscriptions, so they stay.
    subs = [Subscription("c1", "a", 1)]
    client = Client(5, previous=(_record(persistent=True), subs))
    client.connect("c1", clean_start=False)
    effects = client.conn.session_record_seen(None, LATER)
    assert only(effects, StoreSubscriptions).subscriptions == subs
    record = only(effects, StoreSession).record
    assert record is not None and record.session_id == PREVIOUS_SESSION_ID


# ------------------------------------------- resuming a session another connection holds


def _held() -> Client:
    """A client resuming a persistent session its previous connection still holds."""
    previous = _record(persistent=True, connected=True)
    return Client(5, previous=(previous, [Subscription("c1", "a/b", 1)]))


def _connect_held(client: Client) -> tuple[StoreSession, SyncState]:
    """CONNECT, Clean Start 0, with the connect record stored at SESSION_OFFSET: returns the
    record and the state sync CONNACK then waits for."""
    props = Properties(session_expiry_interval=60)
    effects = client.send(Connect(5, "c1", False, 30, properties=props))
    assert only(effects, WatchSession) == WatchSession("c1")
    stored = only(effects, StoreSession)
    client.conn.session_stored_at(SESSION_OFFSET)
    after = client.stored(stored.token)
    assert client.packets(after) == []  # no CONNACK before the confirmation
    return stored, only(after, SyncState)


def test_a_session_whose_holder_ended_it_first_is_not_resumed() -> None:
    client = _held()
    first, sync = _connect_held(client)
    assert first.record is not None and first.record.session_id == PREVIOUS_SESSION_ID
    # The holder's DISCONNECT with Session Expiry Interval 0 landed before our record.
    assert client.conn.session_record_seen(None, SESSION_OFFSET - 1) == []
    restart = only(client.stored(sync.token), StoreSession)
    assert restart.record is not None and restart.record.session_id == CONNECTION_ID
    connack = only(client.packets(client.stored(restart.token)), ConnAck)
    assert connack.session_present is False
    assert client.conn.state.subscriptions == {}


@pytest.mark.parametrize(
    "seen",
    [None, "after-ours", "disconnected"],
    ids=["no-end", "end-after-ours", "persistent-disconnect"],
)
def test_a_session_whose_holder_did_not_end_it_first_is_resumed(seen: str | None) -> None:
    client = _held()
    _, sync = _connect_held(client)
    if seen == "after-ours":
        client.conn.session_record_seen(None, LATER)
    elif seen == "disconnected":
        client.conn.session_record_seen(_record(persistent=True), SESSION_OFFSET - 1)
    effects = client.stored(sync.token)
    connack = only(client.packets(effects), ConnAck)
    assert connack.session_present is True
    assert set(client.conn.state.subscriptions) == {"a/b"}
    # A tombstone after ours is an older connection's late word: ours, and the
    # subscriptions it deleted, are stored again (restate_session).
    restated = of_type(effects, StoreSession) + of_type(effects, StoreSubscriptions)
    assert len(restated) == (2 if seen == "after-ours" else 0)


def test_the_holders_end_record_landing_after_ours_is_answered_after_connack() -> None:
    # The holder's connection dropped: its "disconnected" record landed after this
    # connection's own while CONNECT was being confirmed. The latest record must name this
    # connection again, or every service would take the client for disconnected.
    client = _held()
    _, sync = _connect_held(client)
    client.conn.session_record_seen(_record(persistent=True), LATER)
    effects = client.stored(sync.token)
    assert only(client.packets(effects), ConnAck).session_present is True
    store = only(effects, StoreSession)
    assert store.record is not None and store.record.connected
    assert store.record.connection_id == CONNECTION_ID
    assert effects.index(store) > effects.index(only(effects, Connected))  # after CONNACK


def test_what_is_routed_before_connack_is_sent_after_it() -> None:
    # The session record is in Kafka before CONNACK: a store resends what was in flight,
    # and it may arrive first. It waits for CONNACK [MQTT-3.2.0-1, server sends nothing
    # before], then goes out in order.
    client = _held()
    _, sync = _connect_held(client)
    assert (
        client.conn.deliver_routed(fan_out("a/b", b"resent"), Target("c1", 1, False, (), 7, True))
        == []
    )
    assert client.conn.release(9) == []
    packets = client.packets(client.stored(sync.token))
    assert [type(p) for p in packets] == [ConnAck, Publish, PubRel]
    resent = packets[1]
    assert isinstance(resent, Publish) and (resent.packet_id, resent.dup) == (7, True)


def test_what_was_routed_for_a_session_that_ended_is_dropped() -> None:
    client = _held()
    _, sync = _connect_held(client)
    client.conn.deliver_routed(fan_out("a/b", b"old session"), Target("c1", 1, False, (), 7))
    client.conn.session_record_seen(None, SESSION_OFFSET - 1)
    restart = only(client.stored(sync.token), StoreSession)
    [connack] = client.packets(client.stored(restart.token))  # and nothing else
    assert isinstance(connack, ConnAck) and connack.session_present is False


def test_a_failed_state_sync_refuses_the_connect() -> None:
    client = _held()
    _, sync = _connect_held(client)
    effects = client.store_failed(sync.token)
    assert only(client.packets(effects), ConnAck).reason_code == ReasonCode.SERVER_UNAVAILABLE
    assert closes(effects)


# ---------------------------------------------------------------------- node restart


def test_an_orphaned_persistent_session_is_marked_disconnected() -> None:
    record = _record(persistent=True, connected=True)
    record.unreleased = (4,)
    end = orphaned_session_end(record, NOW_MS + 9)
    assert end is not None
    assert end == SessionRecord(
        node_id=record.node_id,
        connection_id=record.connection_id,
        connected=False,
        protocol_version=record.protocol_version,
        clean_start=record.clean_start,
        persistent=True,
        session_expiry_interval=record.session_expiry_interval,
        updated_at_ms=NOW_MS + 9,  # its Session Expiry Interval runs from now
        session_id=PREVIOUS_SESSION_ID,
        unreleased=(4,),
    )
    assert record.connected  # the input is left as it was


def test_an_orphaned_non_persistent_session_is_deleted() -> None:
    assert orphaned_session_end(_record(persistent=False, connected=True), NOW_MS) is None


# ---------------------------------------------------------------------- APPLICATION clients


def _app_settings() -> Settings:
    return make_settings(application_client_ids=["app-*", "analytics"])


@pytest.mark.parametrize("version", VERSIONS)
def test_a_persistent_application_client_gets_its_topic_before_its_session_record(
    version: int,
) -> None:
    client = Client(version, _app_settings())
    props = Properties(session_expiry_interval=60) if version == 5 else Properties()
    effects = client.send(Connect(version, "app-1", version == 5, 30, properties=props))
    # First the topic: no session record, no CONNACK yet.
    create = only(effects, CreateAppTopic)
    assert effects == [create] and create.client_id == "app-1"
    after = client.stored(create.token)
    record = only(after, StoreSession)
    assert after == [record]
    assert record.record is not None
    assert (record.record.kind, record.record.persistent) == (ClientKind.APPLICATION, True)
    connack = only(client.packets(client.stored(record.token)), ConnAck)
    assert connack.reason_code == 0


@pytest.mark.parametrize("version", VERSIONS)
def test_a_topic_that_cannot_be_made_refuses_the_connect_as_server_unavailable(
    version: int,
) -> None:
    client = Client(version, _app_settings())
    effects = client.send(Connect(version, "analytics", False, 30))
    after = client.store_failed(only(effects, CreateAppTopic).token)
    connack = only(client.packets(after), ConnAck)
    assert connack.reason_code == (ReasonCode.SERVER_UNAVAILABLE if version == 5 else 0x03)
    assert closes(after) and of_type(after, StoreSession) == []


def test_non_persistent_application_and_device_clients_need_no_topic() -> None:
    app = Client(5, _app_settings())
    record = only(app.send(Connect(5, "app-2", True, 30)), StoreSession).record
    assert record is not None and record.kind is ClientKind.APPLICATION
    device = Client(4, _app_settings())
    effects = device.send(Connect(4, "dev-app-1", False, 30))  # patterns match whole ids
    assert of_type(effects, CreateAppTopic) == []
    record = only(effects, StoreSession).record
    assert record is not None and (record.kind, record.persistent) == (ClientKind.DEVICE, True)


def test_client_kind_patterns() -> None:
    patterns = ["app-*", "analytics", "svc-[ab]?"]
    assert client_kind("app-", patterns) is ClientKind.APPLICATION
    assert client_kind("svc-a1", patterns) is ClientKind.APPLICATION
    assert client_kind("svc-c1", patterns) is ClientKind.DEVICE
    assert client_kind("App-1", patterns) is ClientKind.DEVICE  # case-sensitive
    assert client_kind("analytics2", patterns) is ClientKind.DEVICE
    assert client_kind("anything", []) is ClientKind.DEVICE
