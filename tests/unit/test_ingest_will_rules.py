"""Will Messages of the sans-IO ingest core: when they are published, after what delay, and
what a session takeover or a new connection does to them.

MQTT 3.1.1 sections 3.1.2.5-3.1.2.7, 3.14; MQTT 5.0 sections 3.1.2.5, 3.1.3.2 (Will
Properties, 3.1.3.2.2 Will Delay Interval), 3.1.4, 3.14.2.1 (Reason Code 0x04), 3.14.4.
"""

from __future__ import annotations

import pytest
from test_ingest_support import CONNECTION_ID, NOW_MS, Client, closes, only, wills

from services.common.mqtt.codec import encode
from services.common.mqtt.packets import (
    Connect,
    Disconnect,
    PacketType,
    PingReq,
    Will,
)
from services.common.mqtt.properties import Properties, decode_properties
from services.common.mqtt.reason_codes import ReasonCode
from services.common.records import PublishMeta, SessionRecord, WillRecord, decode_meta
from services.ingest.effects import StorePublish, StoreRetained, StoreSession, StoreWill
from services.ingest.will_rules import (
    on_new_connection,
    on_session,
    published_after_delay,
    settled_by,
    waiting_record,
)

VERSIONS = [4, 5]


def _with_will(
    version: int = 5,
    will: Will | None = None,
    expiry: int | None = None,
    clean_start: bool = True,
) -> Client:
    """A client connected with a Will Message (and a Session Expiry Interval, v5)."""
    client = Client(version)
    props = Properties(session_expiry_interval=expiry)
    connect = Connect(
        version,
        "dev",
        clean_start,
        30,
        will=will or Will("status/dev", b"offline", 1, True),
        properties=props,
    )
    record = only(client.send(connect), StoreSession)
    client.stored(record.token)
    return client


def _delayed(delay: int) -> Will:
    return Will("status/dev", b"gone", 0, False, Properties(will_delay_interval=delay))


# ---------------------------------------------------------------------- when it is published


@pytest.mark.parametrize("version", VERSIONS)
def test_socket_loss_publishes_the_will_before_the_end_records(version: int) -> None:
    client = _with_will(version)
    client.now = NOW_MS + 700
    effects = client.lost()
    will = effects[0]
    assert isinstance(will, StorePublish)
    meta = PublishMeta("status/dev", 1, True, NOW_MS + 700, version, b"")
    assert will.meta == meta
    assert will.payload == b"offline"
    # Will Retain: it is also the topic's retained message [MQTT-3.1.2-17].
    assert effects[1] == StoreRetained(effects[1].token, meta, b"offline")  # type: ignore[union-attr]
    assert isinstance(effects[2], StoreSession)
    assert client.lost() == []  # published once (MQTT-3.1.2-10)


@pytest.mark.parametrize("version", VERSIONS)
def test_keep_alive_timeout_publishes_the_will(version: int) -> None:
    client = _with_will(version)
    assert wills(client.conn.keep_alive_expired()) == []  # at the close
    assert len(wills(client.lost())) == 1


@pytest.mark.parametrize("version", VERSIONS)
def test_a_protocol_error_publishes_the_will(version: int) -> None:
    client = _with_will(version)
    assert closes(client.send_bytes(b"\x00\x00"))  # reserved packet type: malformed
    assert len(wills(client.lost())) == 1


def test_server_shutdown_publishes_the_will() -> None:
    client = _with_will(5)
    effects = client.conn.disconnect_and_close(ReasonCode.SERVER_SHUTTING_DOWN, "shutdown")
    assert only(client.packets(effects), Disconnect).reason_code == 0x8B
    assert len(wills(client.lost())) == 1


@pytest.mark.parametrize(
    ("version", "reason"),
    [(4, 0x00), (5, ReasonCode.SUCCESS)],
    ids=["v311", "v5-normal"],
)
def test_a_normal_disconnect_discards_the_will(version: int, reason: int) -> None:
    client = _with_will(version)
    effects = client.send(Disconnect(reason))
    assert wills(effects) == []
    assert closes(client.store_all(effects))  # once the session's end is stored
    assert client.lost() == []


@pytest.mark.parametrize(
    "reason",
    [ReasonCode.DISCONNECT_WITH_WILL_MESSAGE, ReasonCode.UNSPECIFIED_ERROR],
    ids=["0x04", "0x80"],
)
def test_a_v5_disconnect_other_than_normal_keeps_the_will(reason: int) -> None:
    client = _with_will(5)
    effects = client.send(Disconnect(reason))
    assert closes(client.store_all(effects))
    assert len(wills(client.lost())) == 1


def test_no_will_before_connack() -> None:
    client = Client(5)
    client.send(Connect(5, "dev", True, 30, will=Will("w", b"")))
    assert wills(client.lost()) == []


def test_no_will_for_a_refused_connect() -> None:
    client = Client(5)
    record = only(client.send(Connect(5, "dev", True, 30, will=Will("w", b""))), StoreSession)
    assert closes(client.store_failed(record.token))
    assert client.lost() == []


def test_no_will_flag_no_will() -> None:
    client = Client(5)
    client.connect()
    assert wills(client.lost()) == []


# ---------------------------------------------------------------------- what it carries


def test_will_properties_are_forwarded_without_the_will_delay() -> None:
    props = Properties(
        will_delay_interval=5,
        payload_format_indicator=1,
        message_expiry_interval=60,
        content_type="text/plain",
        response_topic="r",
        correlation_data=b"\x01",
        user_properties=[("k", "v")],
    )
    client = _with_will(5, Will("w", b"bye", 2, False, props), expiry=0)
    will = only(wills(client.lost()), StoreWill)
    forwarded, _ = decode_properties(will.meta.properties, 0, PacketType.PUBLISH)
    assert forwarded == Properties(
        payload_format_indicator=1,
        message_expiry_interval=60,
        content_type="text/plain",
        response_topic="r",
        correlation_data=b"\x01",
        user_properties=[("k", "v")],
    )
    assert (will.meta.qos, will.meta.retain) == (2, False)


def test_a_will_delay_alone_forwards_no_properties() -> None:
    client = _with_will(5, _delayed(5), expiry=0)
    assert only(wills(client.lost()), StoreWill).meta.properties == b""


def test_v311_will_round_trips_through_the_codec() -> None:
    # The Will fields of a v3.1.1 CONNECT reach the published message unchanged.
    client = Client(4)
    raw = encode(Connect(4, "dev", True, 30, will=Will("a/b", b"\x00\xff", 2, True)), 4)
    client.stored(only(client.send_bytes(raw), StoreSession).token)
    will = only(wills(client.lost()), StoreWill)
    assert (will.meta.topic, will.payload, will.meta.qos, will.meta.retain) == (
        "a/b",
        b"\x00\xff",
        2,
        True,
    )


# ---------------------------------------------------------------------- Will Delay Interval


@pytest.mark.parametrize(
    ("delay", "expiry", "published_after"),
    [
        (30, 60, 30),
        (30, 10, 10),  # the session ends first
        (30, 0, 0),  # a session that ends at disconnect: at once
        (30, 0xFFFFFFFF, 30),
        (0, 60, 0),
    ],
)
def test_the_delay_is_the_least_of_will_delay_and_session_expiry(
    delay: int, expiry: int, published_after: int
) -> None:
    client = _with_will(5, _delayed(delay), expiry=expiry)
    assert only(wills(client.lost()), StoreWill).delay_seconds == published_after


def test_the_expiry_set_by_disconnect_bounds_the_delay() -> None:
    client = _with_will(5, _delayed(30), expiry=60)
    client.send(
        Disconnect(ReasonCode.DISCONNECT_WITH_WILL_MESSAGE, Properties(session_expiry_interval=5))
    )
    assert only(wills(client.lost()), StoreWill).delay_seconds == 5


def test_v311_has_no_will_delay() -> None:
    client = _with_will(4, clean_start=False)
    assert only(wills(client.lost()), StoreWill).delay_seconds == 0


# ------------------------------------------------------------ takeover and new connections


@pytest.mark.parametrize(
    ("delay", "new_clean_start", "published"),
    [(0, False, True), (0, True, True), (10, True, True), (10, False, False)],
)
def test_takeover_publishes_the_will_at_once_or_cancels_it(
    delay: int, new_clean_start: bool, published: bool
) -> None:
    client = _with_will(5, _delayed(delay), expiry=60, clean_start=False)
    effects = client.conn.taken_over(new_clean_start)
    published_wills = wills(effects)
    assert [w.delay_seconds for w in published_wills] == ([0] if published else [])
    assert only(client.packets(effects), Disconnect).reason_code == 0x8E
    assert closes(effects)
    assert client.lost() == []  # settled at the takeover


def test_v311_takeover_publishes_the_will() -> None:
    client = _with_will(4, clean_start=False)
    assert len(wills(client.conn.taken_over(new_clean_start=False))) == 1


@pytest.mark.parametrize(("clean_start", "published"), [(True, True), (False, False)])
def test_a_new_connection_settles_a_waiting_will(clean_start: bool, published: bool) -> None:
    client = _with_will(5, _delayed(10), expiry=60)
    waiting = waiting_record("dev", only(client.lost(), StoreWill))
    records = on_new_connection(waiting, clean_start, NOW_MS + 3000)
    assert bool(records) is published
    if published:
        [record] = records
        assert isinstance(record, StorePublish)
        assert (record.meta.received_at_ms, record.payload) == (NOW_MS + 3000, b"gone")


# ------------------------------------------------------------ a will waiting out its delay


def _stored(retain: bool = False) -> StoreWill:
    client = _with_will(
        5, Will("status/dev", b"gone", 1, retain, Properties(will_delay_interval=10)), expiry=60
    )
    client.conn.session_stored_at(10)
    return only(client.lost(), StoreWill)


def _waiting(retain: bool = False) -> WillRecord:
    return waiting_record("dev", _stored(retain))


def test_a_waiting_will_belongs_to_its_connection_and_session_record() -> None:
    stored = _stored()
    assert (stored.delay_seconds, stored.session_offset) == (10, 10)
    assert stored.connection_id == CONNECTION_ID


def test_a_waiting_will_is_due_its_delay_after_the_close() -> None:
    waiting = _waiting(retain=True)
    assert (waiting.client_id, waiting.connection_id) == ("dev", CONNECTION_ID)
    assert (waiting.due_at_ms, waiting.session_offset) == (NOW_MS + 10_000, 10)
    meta = decode_meta(waiting.meta_raw)
    assert (meta.topic, meta.qos, meta.retain, meta.received_at_ms) == (
        "status/dev",
        1,
        True,
        NOW_MS,
    )
    assert waiting.payload == b"gone"


def _record_of(
    connection_id: bytes, connected: bool = True, clean_start: bool = False
) -> SessionRecord:
    return SessionRecord("n2", connection_id, connected, 5, clean_start, True)


def test_only_a_newer_connection_settles_a_waiting_will() -> None:
    waiting = _waiting()
    other = bytes(range(1, 17))
    assert settled_by(waiting, _record_of(other), 11)
    assert not settled_by(waiting, _record_of(other), 10)  # not after the will's own record
    assert not settled_by(waiting, _record_of(CONNECTION_ID), 11)  # its own connection
    assert not settled_by(waiting, _record_of(other, connected=False), 11)
    assert not settled_by(waiting, None, 11)


@pytest.mark.parametrize("retain", [False, True])
def test_a_will_that_waited_is_stamped_when_published(retain: bool) -> None:
    waiting = _waiting(retain)
    records = published_after_delay(waiting, NOW_MS + 10_000)
    assert [type(r) for r in records] == [StorePublish, StoreRetained][: 1 + retain]
    for record in records:
        assert record.meta.received_at_ms == NOW_MS + 10_000  # its expiry runs from now
        assert (record.meta.topic, record.meta.retain, record.payload) == (
            "status/dev",
            retain,
            b"gone",
        )


def test_nothing_after_the_will_is_published_reaches_the_closed_connection() -> None:
    client = _with_will(5)
    client.lost()
    assert client.send(PingReq()) == []


def _session(
    connection_id: bytes, connected: bool, clean_start: bool, connected_at_ms: int
) -> SessionRecord:
    return SessionRecord(
        "n2", connection_id, connected, 5, clean_start, True, connected_at_ms=connected_at_ms
    )


def test_the_latest_session_record_decides_a_will_taken_over() -> None:
    waiting = _waiting()
    other = bytes(range(1, 17))
    later = NOW_MS + 1000
    # Its own connection's end: it still waits.
    assert (
        on_session(waiting, _session(CONNECTION_ID, False, False, NOW_MS - 5000), 12, later) is None
    )
    # An older connection's record (connected before the will's closed): it still waits.
    assert on_session(waiting, _session(other, False, False, NOW_MS - 9000), 12, later) is None
    # A newer connection, even one that has ended since: Clean Start 0 continues the session
    # (discarded), Clean Start 1 ends it (published at once).
    assert on_session(waiting, _session(other, False, False, later), 14, later) == []
    [published] = on_session(waiting, _session(other, False, True, later), 14, later) or []
    assert isinstance(published, StorePublish) and published.meta.received_at_ms == later
    # No session any more: the session ended, the will is published (MQTT-3.1.2-8).
    assert len(on_session(waiting, None, 20, later) or []) == 1
