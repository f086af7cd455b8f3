"""Kafka record formats (services/common/records.py): round trips and garbage.

Every format must decode back to what was encoded, and anything else must raise
RecordError (never another exception): consumers skip such records instead of crashing.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common.kafka.names import TopicNames
from services.common.kafka.partitioner import partition_of
from services.common.mqtt.packets import PacketType
from services.common.mqtt.properties import Properties, encode_properties
from services.common.records import (
    HEADER_DELETES,
    AckKind,
    AckRecord,
    AdminDrain,
    AppMessage,
    Bundle,
    ClientKind,
    DelayedCancel,
    DelayedOutcome,
    DelayedRecord,
    Downlink,
    EventKind,
    EventRecord,
    Headers,
    Message,
    Origin,
    Persisted,
    Published,
    PublishMeta,
    RecordError,
    Releases,
    RetainedRequest,
    SessionRecord,
    StoredRecord,
    Target,
    admin_drain_record,
    app_record,
    app_shared_record,
    client_acks_record,
    client_event_record,
    client_session_record,
    client_subscriptions_record,
    decode_ack,
    decode_bundle,
    decode_event,
    decode_meta,
    decode_releases,
    decode_session,
    decode_stored,
    decode_subscriptions,
    decode_targets,
    delayed_cancel_record,
    delayed_outcome,
    delayed_record,
    delayed_tombstone,
    downlink_bundle_record,
    downlink_record,
    encode_ack,
    encode_event,
    encode_meta,
    encode_origin,
    encode_releases,
    encode_session,
    encode_stored,
    encode_subscriptions,
    encode_targets,
    expires_at_ms,
    parse_app,
    parse_app_shared,
    parse_client_acks,
    parse_client_event,
    parse_client_session,
    parse_client_subscriptions,
    parse_delayed,
    parse_downlink,
    parse_msg_all,
    parse_persisted,
    parse_retained,
    persisted_record,
    publish_record,
    release_record,
    retained_record,
    retained_request_record,
    session_expired_event,
    session_expired_records,
    split_bundle,
    stale_delete,
    with_origins,
)
from services.common.subscription import LiveFrom, ReplayProgress, Subscription

U8 = st.integers(0, 255)
U32 = st.integers(0, 2**32 - 1)
U64 = st.integers(0, 2**64 - 1)
QOS = st.integers(0, 2)
# Short strings keep the examples fast; st.text never yields lone surrogates.
TEXT = st.text(max_size=40)
SUB_ID = st.integers(1, 268_435_455)

metas = st.builds(
    PublishMeta,
    topic=TEXT,
    qos=QOS,
    retain=st.booleans(),
    received_at_ms=U64,
    protocol_version=st.sampled_from([3, 4, 5]),
    properties=st.binary(max_size=40),
)
targets = st.builds(
    Target,
    client_id=TEXT,
    qos=QOS,
    retain_as_published=st.booleans(),
    subscription_identifiers=st.lists(SUB_ID, max_size=5).map(tuple),
    packet_id=st.integers(0, 65535),
    dup=st.booleans(),
)
PACKET_ID = st.integers(1, 65535)
releases = st.lists(st.tuples(TEXT, PACKET_ID), max_size=6)
acks = st.builds(
    AckRecord,
    session_id=st.binary(min_size=16, max_size=16),
    acks=st.lists(st.tuples(st.sampled_from(AckKind), PACKET_ID), max_size=6),
)
sessions = st.builds(
    SessionRecord,
    node_id=TEXT,
    connection_id=st.binary(min_size=16, max_size=16),
    connected=st.booleans(),
    protocol_version=st.sampled_from([3, 4, 5]),
    clean_start=st.booleans(),
    persistent=st.booleans(),
    kind=st.sampled_from(ClientKind),
    session_expiry_interval=U32,
    connected_at_ms=U64,
    updated_at_ms=U64,
    session_id=st.binary(min_size=16, max_size=16),
    receive_maximum=st.integers(1, 65535),
    unreleased=st.lists(PACKET_ID, max_size=5).map(tuple),
    owner=st.none() | st.just("anonymous") | st.uuids().map(str),
)


def subscriptions(client_id: str) -> st.SearchStrategy[Subscription]:
    return st.builds(
        Subscription,
        client_id=st.just(client_id),
        topic_filter=TEXT,
        qos=QOS,
        no_local=st.booleans(),
        retain_as_published=st.booleans(),
        retain_handling=QOS,
        subscription_identifier=st.none() | SUB_ID,
    )


def _session() -> SessionRecord:
    return SessionRecord("node-1", bytes(range(16)), True, 5, False, True)


# ---------------------------------------------------------------------- round trips


@given(metas)
def test_meta_round_trip(meta: PublishMeta) -> None:
    assert decode_meta(encode_meta(meta)) == meta


@given(st.lists(targets, max_size=6))
def test_targets_round_trip(value: list[Target]) -> None:
    assert decode_targets(encode_targets(value)) == value


@given(releases)
def test_releases_round_trip(value: list[tuple[str, int]]) -> None:
    assert decode_releases(encode_releases(value)) == value


@given(st.binary(min_size=16, max_size=16), st.binary(max_size=20), targets, st.binary())
def test_stored_round_trip(session_id: bytes, meta: bytes, target: Target, payload: bytes) -> None:
    record = StoredRecord(session_id, meta, target, payload)
    assert decode_stored(encode_stored(record)) == record


@given(acks)
def test_ack_round_trip(record: AckRecord) -> None:
    assert decode_ack(encode_ack(record)) == record


@given(st.lists(subscriptions("client-1"), max_size=6))
def test_subscriptions_round_trip(value: list[Subscription]) -> None:
    assert decode_subscriptions("client-1", encode_subscriptions(value)) == value


@given(sessions)
def test_session_round_trip(record: SessionRecord) -> None:
    assert decode_session(encode_session(record)) == record


def test_subscription_identifier_zero_means_none() -> None:
    [sub] = decode_subscriptions("c", encode_subscriptions([Subscription("c", "t", 1)]))
    assert sub.subscription_identifier is None


def test_a_session_record_of_an_older_version_reads_without_an_owner() -> None:
    # The bytes an older node wrote (no owner after the unreleased Packet Identifiers): the
    # session is read as owned by nobody yet, and a record with an owner keeps it.
    old = bytes.fromhex(
        "01050500000000000000000000000000000000000000000000"
        "000102030405060708090a0b0c0d0e0f"
        "00066e6f64652d31"
        "00000000000000000000000000000000ffff0001002a"
    )
    record = decode_session(old)
    assert (record.node_id, record.unreleased, record.owner) == ("node-1", (42,), None)
    record.owner = "anonymous"
    encoded = encode_session(record)
    assert encoded.startswith(old) and decode_session(encoded).owner == "anonymous"


def test_session_connection_id_must_be_16_bytes() -> None:
    # A shorter id would silently come back padded with zeros, so the node would no longer
    # recognise its own connection in the record.
    record = _session()
    record.connection_id = b"short"
    with pytest.raises(ValueError):
        encode_session(record)


def test_many_subscription_identifiers_do_not_break_the_targets_record() -> None:
    ids = tuple(range(1, 301))
    [target] = decode_targets(encode_targets([Target("c", 1, False, ids)]))
    assert target.client_id == "c" and target.qos == 1
    assert 0 < len(target.subscription_identifiers) <= 255
    assert target.subscription_identifiers == ids[: len(target.subscription_identifiers)]


# ---------------------------------------------------------------------- garbage

ENCODED: dict[str, tuple[bytes, Callable[[bytes], Any]]] = {
    "meta": (encode_meta(PublishMeta("a/b", 1, True, 5, 5, b"")), decode_meta),
    "targets": (
        encode_targets([Target("c1", 1, True, (3, 4)), Target("c2", 0)]),
        decode_targets,
    ),
    "subscriptions": (
        encode_subscriptions([Subscription("c", "a/#", 1, subscription_identifier=9)]),
        lambda data: decode_subscriptions("c", data),
    ),
    "session": (encode_session(_session()), decode_session),
    "store-target": (encode_targets([Target("c1", 2, False, (), 65535, True)]), decode_targets),
    "releases": (encode_releases([("c1", 7), ("c2", 65535)]), decode_releases),
    "ack": (encode_ack(AckRecord(bytes(16), [(AckKind.PUBREC, 9)])), decode_ack),
    "stored": (
        encode_stored(StoredRecord(bytes(16), b"meta", Target("c", 1), b"")),
        decode_stored,
    ),
    "event": (
        encode_event(
            EventRecord(EventKind.SUBSCRIBED, 5, "n", "1.2.3.4:5", topic_filters=(("a", 1),))
        ),
        decode_event,
    ),
}
FORMATS = sorted(ENCODED)


@pytest.mark.parametrize("name", FORMATS)
def test_every_truncation_is_a_record_error(name: str) -> None:
    data, decode = ENCODED[name]
    decode(data)  # the full record is fine
    for end in range(len(data)):
        with pytest.raises(RecordError):
            decode(data[:end])


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("version", [0, 2, 255])
def test_unknown_version_is_a_record_error(name: str, version: int) -> None:
    data, decode = ENCODED[name]
    with pytest.raises(RecordError):
        decode(bytes([version]) + data[1:])


@pytest.mark.parametrize(
    "name", ["targets", "subscriptions", "session", "releases", "ack", "event"]
)
def test_trailing_bytes_are_a_record_error(name: str) -> None:
    data, decode = ENCODED[name]
    with pytest.raises(RecordError):
        decode(data + b"\x00")


def test_meta_trailing_bytes_are_its_properties() -> None:
    data = encode_meta(PublishMeta("t", 0, False, 1, 5, b""))
    assert decode_meta(data + b"\x00").properties == b"\x00"


def _with_bad_utf8(data: bytes, text: bytes) -> bytes:
    index = data.index(text)
    return data[:index] + b"\xff" + data[index + 1 :]


def test_bad_utf8_is_a_record_error() -> None:
    with pytest.raises(RecordError):
        decode_meta(_with_bad_utf8(encode_meta(PublishMeta("topic", 0, False, 1)), b"topic"))
    with pytest.raises(RecordError):
        decode_targets(_with_bad_utf8(encode_targets([Target("client", 0)]), b"client"))
    with pytest.raises(RecordError):
        decode_subscriptions(
            "c", _with_bad_utf8(encode_subscriptions([Subscription("c", "filt", 0)]), b"filt")
        )
    with pytest.raises(RecordError):
        decode_session(_with_bad_utf8(encode_session(_session()), b"node-1"))


def test_meta_qos_3_is_a_record_error() -> None:
    data = bytearray(encode_meta(PublishMeta("t", 0, False, 1)))
    data[1] |= 0x03
    with pytest.raises(RecordError):
        decode_meta(bytes(data))


def test_a_replay_progress_keeps_its_block_of_packet_ids() -> None:
    progress = ReplayProgress((5, 6), (3, 6), (4, 6), packet_ids=7)
    sub = Subscription("c", "t/#", 1, live_from=LiveFrom((5, 6), True), replay=progress)
    data = encode_subscriptions([sub])
    [back] = decode_subscriptions("c", data)
    assert back.replay == progress and back.subscription_identifier is None
    # written before the block was kept (bit 30 clear, no 16-bit block): block 0
    ident = data.index(struct.pack(">I", 0xC000_0000))
    older = data[:ident] + struct.pack(">I", 0x8000_0000) + data[ident + 4 : -2]
    [back] = decode_subscriptions("c", older)
    assert back.replay == ReplayProgress((5, 6), (3, 6), (4, 6))
    # the block's bit without a progress is no record
    bare = struct.pack(">BI", 1, 1) + b"\x00\x01t" + struct.pack(">BI", 1, 0x4000_0000)
    with pytest.raises(RecordError):
        decode_subscriptions("c", bare)


def test_target_qos_3_is_a_record_error() -> None:
    data = struct.pack(">BI", 1, 1) + b"\x00\x01c" + bytes([0x03, 0])
    with pytest.raises(RecordError):
        decode_targets(data)


@pytest.mark.parametrize("options", [0x03, 0x30])
def test_invalid_subscription_options_are_a_record_error(options: int) -> None:
    data = struct.pack(">BI", 1, 1) + b"\x00\x01t" + struct.pack(">BI", options, 0)
    with pytest.raises(RecordError):
        decode_subscriptions("c", data)


def test_unknown_client_kind_is_a_record_error() -> None:
    data = bytearray(encode_session(_session()))
    data[3] = 7
    with pytest.raises(RecordError):
        decode_session(bytes(data))


def test_a_target_flagged_with_packet_identifier_0_is_a_record_error() -> None:
    data = bytearray(encode_targets([Target("c", 1, False, (), 5)]))
    data[-2:] = b"\x00\x00"
    with pytest.raises(RecordError):
        decode_targets(bytes(data))


@pytest.mark.parametrize("kind", [0, 6, 255])
def test_an_unknown_ack_kind_is_a_record_error(kind: int) -> None:
    data = bytearray(encode_ack(AckRecord(bytes(16), [(AckKind.PUBACK, 1)])))
    data[-3] = kind
    with pytest.raises(RecordError):
        decode_ack(bytes(data))


def test_huge_target_count_is_a_record_error() -> None:
    with pytest.raises(RecordError):
        decode_targets(struct.pack(">BI", 1, 2**32 - 1))


def _decode_any(data: bytes) -> None:
    for decode in (
        decode_meta,
        decode_targets,
        decode_session,
        decode_releases,
        decode_ack,
        decode_stored,
        decode_event,
        lambda d: decode_subscriptions("c", d),
    ):
        with contextlib.suppress(RecordError):
            decode(data)


@given(st.binary(max_size=64))
def test_random_bytes_never_raise_anything_but_record_error(data: bytes) -> None:
    _decode_any(data)


@given(st.binary(max_size=64))
def test_random_bodies_after_a_valid_version_never_raise_anything_else(body: bytes) -> None:
    _decode_any(b"\x01" + body)


# ---------------------------------------------------------------------- Kafka records

NAMES = TopicNames("p.")
META = PublishMeta("a/b", 1, False, 5, 5)
META_RAW = encode_meta(META)
MESSAGE = Message(META, META_RAW, b"payload")
SESSION_ID = bytes(range(16, 32))


def test_each_record_kind_builds_and_parses_back() -> None:
    sub = Subscription("c", "a/#", 1)
    published = publish_record(NAMES, "pub", META, b"payload")
    assert published.topic == NAMES.msg_all
    assert parse_msg_all(published.key, published.value, published.headers) == Published(
        "pub", MESSAGE
    )
    request = retained_request_record(NAMES, "c", [sub])
    assert parse_msg_all(request.key, request.value, request.headers) == RetainedRequest("c", [sub])
    retained = retained_record(NAMES, META, b"payload")
    assert (retained.topic, retained.key) == (NAMES.msg_retained, b"a/b")
    assert parse_retained(retained.key, retained.value, retained.headers) == ("a/b", MESSAGE)
    downlink = downlink_record(NAMES, "n1", b"pub", META_RAW, b"payload", [Target("c", 1)])
    assert (downlink.topic, downlink.key) == (NAMES.downlink("n1"), b"pub")
    assert parse_downlink(downlink.value, downlink.headers) == Downlink(
        META, b"payload", [Target("c", 1)]
    )
    [routed] = with_origins([downlink], 3, 41)  # as the router writes it: with its origin
    assert parse_downlink(routed.value, routed.headers) == Downlink(
        META, b"payload", [Target("c", 1)], Origin(3, 41, 0)
    )
    window = [(META_RAW, b"one", Target("c", 1, packet_id=3)), (META_RAW, b"", Target("c", 2))]
    bundle = downlink_bundle_record(NAMES, "n1", "c", window)
    assert (bundle.topic, bundle.key) == (NAMES.downlink("n1"), b"c")
    assert parse_downlink(bundle.value, bundle.headers) == Bundle(
        [Downlink(META, payload, [target]) for _, payload, target in window]
    )
    release = release_record(NAMES, "n1", "c", [("c", 7)])
    assert parse_downlink(release.value, release.headers) == Releases([("c", 7)])
    drain = admin_drain_record(NAMES, "n1", AdminDrain(90_000))
    assert (drain.topic, drain.key) == (NAMES.downlink("n1"), b"n1")
    assert parse_downlink(drain.value, drain.headers) == AdminDrain(90_000)
    persisted = persisted_record(NAMES, MESSAGE, Target("c", 2))
    assert (persisted.topic, persisted.key) == (NAMES.msg_persisted, b"c")
    assert parse_persisted(persisted.key, persisted.value, persisted.headers) == Persisted(
        "c", MESSAGE, Target("c", 2)
    )
    app = app_record(NAMES, b"pub", MESSAGE, Target("app", 1), SESSION_ID)
    assert (app.topic, app.key) == (NAMES.app("app"), b"pub")
    assert parse_app(app.value, app.headers) == AppMessage(MESSAGE, Target("app", 1), SESSION_ID)
    shared = app_shared_record(NAMES, "g", "t/+", b"pub", MESSAGE)
    assert shared.topic == NAMES.app_shared("g", "t/+")
    assert parse_app_shared(shared.value, shared.headers) == MESSAGE
    session = client_session_record(NAMES, "c", _session())
    assert parse_client_session(session.key, session.value) == ("c", _session())
    subscriptions = client_subscriptions_record(NAMES, "c", [sub])
    assert parse_client_subscriptions(subscriptions.key, subscriptions.value) == ("c", [sub])
    ack = AckRecord(SESSION_ID, [(AckKind.PUBACK, 3)])
    acked = client_acks_record(NAMES, "c", ack)
    assert (acked.topic, parse_client_acks(acked.key, acked.value)) == (
        NAMES.client_acks,
        ("c", ack),
    )
    event = EventRecord(EventKind.CONNECTED, 5, "n1", "1.2.3.4:5", bytes(range(16)), 5)
    recorded = client_event_record(NAMES, "c", event)
    assert (recorded.topic, parse_client_event(recorded.key, recorded.value)) == (
        NAMES.client_events,
        ("c", event),
    )


def test_an_expired_session_ends_with_tombstones_and_its_event() -> None:
    subscriptions, session, event = session_expired_records(NAMES, "c", _session(), 9_000)
    assert [r.topic for r in (subscriptions, session, event)] == [
        NAMES.client_subscriptions,
        NAMES.client_sessions,
        NAMES.client_events,
    ]
    assert parse_client_subscriptions(subscriptions.key, subscriptions.value) == ("c", [])
    assert parse_client_session(session.key, session.value) == ("c", None)
    assert parse_client_event(event.key, event.value) == (
        "c",
        session_expired_event(_session(), 9_000),
    )


def test_tombstones() -> None:
    assert retained_record(NAMES, META, b"").value is None  # deletes the retained message
    assert parse_retained(b"a/b", None, []) == ("a/b", None)
    assert client_session_record(NAMES, "c", None).value is None
    assert parse_client_session(b"c", None) == ("c", None)
    assert client_subscriptions_record(NAMES, "c", []).value is None
    assert parse_client_subscriptions(b"c", None) == ("c", [])


GOOD_META = [("m", META_RAW)]
GOOD_TARGET = [("t", encode_targets([Target("c", 1)]))]
DELAYED_KEY = b"c\x00" + b"d" * 24
"""A ``msg.delayed`` key: client ``c``, a 24-byte id."""


def test_a_delayed_message_round_trips_and_its_tombstone_names_it() -> None:
    names = TopicNames("t.")
    meta = encode_meta(PublishMeta("a/b", 1, True, 1_000, 5))
    waiting = DelayedRecord("c", b"d" * 24, 16_000, meta, b"later")
    record = delayed_record(names, waiting)
    assert (record.topic, record.key) == ("t.msg.delayed", DELAYED_KEY)
    assert parse_delayed(record.key, record.value) == ("c", b"d" * 24, waiting)
    gone = delayed_tombstone(names, "c", b"d" * 24, DelayedOutcome.CANCELLED)
    assert (gone.key, gone.value) == (DELAYED_KEY, None)
    assert parse_delayed(gone.key, gone.value) == ("c", b"d" * 24, None)
    assert delayed_outcome(gone.headers) is DelayedOutcome.CANCELLED
    assert delayed_outcome([("o", b"later")]) is None  # an outcome this version does not know
    assert delayed_outcome([]) is None
    assert partition_of(record.key, 12) == partition_of("c", 12)  # the publisher's partition
    with pytest.raises(ValueError, match="24 bytes"):
        delayed_tombstone(names, "c", b"short", DelayedOutcome.GONE)
    # A cancel request: under the message's own key (its partition), told from a message.
    cancel = delayed_cancel_record(names, "c", b"d" * 24)
    assert (cancel.topic, cancel.key) == ("t.msg.delayed", DELAYED_KEY)
    assert parse_delayed(cancel.key, cancel.value) == (
        "c",
        b"d" * 24,
        DelayedCancel("c", b"d" * 24),
    )


def test_a_bundle_record_is_laid_out_byte_by_byte_as_documented() -> None:
    window = [(META_RAW, b"one", Target("c", 1, packet_id=3)), (META_RAW, b"", Target("c", 2))]
    origin = Origin(5, 1234, 0)
    record = downlink_bundle_record(NAMES, "n1", "c", window, [origin, None])
    targets = [encode_targets([target]) for _, _, target in window]
    encoded = encode_origin(origin)
    # Header b: version 1, count 2, then per message its m, t, payload and origin lengths.
    assert record.headers == [
        (
            "b",
            b"\x01\x00\x00\x00\x02"
            + struct.pack(">IIII", len(META_RAW), len(targets[0]), 3, len(encoded))
            + struct.pack(">IIII", len(META_RAW), len(targets[1]), 0, 0),
        )
    ]
    assert record.value == META_RAW + targets[0] + b"one" + encoded + META_RAW + targets[1]
    assert split_bundle(record.headers[0][1], record.value) == [
        (META_RAW, targets[0], b"one", encoded),
        (META_RAW, targets[1], b"", b""),
    ]
    # The origins go to the node's Downlinks: a replay's switch reads them.
    assert [m.origin for m in decode_bundle(record.headers[0][1], record.value).messages] == [
        origin,
        None,
    ]
    without = downlink_bundle_record(NAMES, "n1", "c", window)
    assert [m.origin for m in decode_bundle(without.headers[0][1], without.value).messages] == [
        None,
        None,
    ]
    with pytest.raises(ValueError, match="1 origins for 2 messages"):
        downlink_bundle_record(NAMES, "n1", "c", window, [origin])
    empty = downlink_bundle_record(NAMES, "n1", "c", [])
    assert (empty.headers, empty.value) == ([("b", b"\x01\x00\x00\x00\x00")], b"")
    assert split_bundle(b"\x01\x00\x00\x00\x00", b"") == []
    with pytest.raises(RecordError, match="version 2"):
        split_bundle(b"\x02\x00\x00\x00\x00", b"")
    # A garbage origin refuses the whole record.
    bad = struct.pack(">IIII", len(META_RAW), len(targets[1]), 0, 3)
    with pytest.raises(RecordError, match="origin"):
        decode_bundle(b"\x01\x00\x00\x00\x01" + bad, META_RAW + targets[1] + b"xyz")


#: A bundle header's version and count of one message.
BUNDLE_HEAD = struct.pack(">BI", 1, 1)

PARSERS: dict[str, tuple[Callable[[bytes | None, bytes | None, Headers], object], list[Any]]] = {
    "msg.all": (
        parse_msg_all,
        [
            (None, b"x", GOOD_META),
            (b"\xff", b"x", GOOD_META),
            (b"k", b"x", []),
            (b"k", b"x", [("m", b"\x07")]),
            (b"k", b"", [("q", b"\x01\x00")]),
        ],
    ),
    "msg.retained": (
        parse_retained,
        [(None, b"x", GOOD_META), (b"t", b"x", []), (b"t", b"x", [("m", b"")])],
    ),
    "downlink": (
        lambda _key, value, headers: parse_downlink(value, headers),
        [
            (b"k", b"x", GOOD_META),
            (b"k", b"x", GOOD_TARGET),
            (b"k", b"", [("r", b"\x01")]),
            (b"k", b"x", [*GOOD_META, ("t", b"\x01\x00")]),
            (b"n", b"", [("c", b"\x01\x02\x00\x00")]),  # a truncated drain command
            (b"c", b"", [("b", b"\x01\x00\x00\x00\x02")]),  # a count without its lengths
            (b"c", b"xy", [("b", BUNDLE_HEAD + struct.pack(">IIII", 0, 0, 1, 0))]),  # trailing
            (b"c", b"x", [("b", BUNDLE_HEAD + struct.pack(">IIII", 0, 0, 2, 0))]),  # truncated
            (b"c", b"x", [("b", BUNDLE_HEAD + struct.pack(">IIII", 1, 0, 0, 0))]),  # bad meta
        ],
    ),
    "msg.persisted": (
        parse_persisted,
        [
            (None, b"x", GOOD_META + GOOD_TARGET),
            (b"c", b"x", GOOD_META),
            (b"c", b"x", GOOD_TARGET),
            (b"c", b"x", [*GOOD_META, ("t", encode_targets([]))]),
        ],
    ),
    "msg.app": (
        lambda _key, value, headers: parse_app(value, headers),
        [(b"k", b"x", GOOD_META + GOOD_TARGET), (b"k", b"x", [*GOOD_TARGET, ("s", SESSION_ID)])],
    ),
    "msg.app-shared": (
        lambda _key, value, headers: parse_app_shared(value, headers),
        [(b"k", b"x", []), (b"k", b"x", [("m", b"\x01")])],
    ),
    "client.sessions": (
        lambda key, value, _headers: parse_client_session(key, value),
        [(None, None, []), (b"\xff", None, []), (b"c", b"\x01", [])],
    ),
    "client.subscriptions": (
        lambda key, value, _headers: parse_client_subscriptions(key, value),
        [(None, None, []), (b"c", b"\x02", [])],
    ),
    "client.acks": (
        lambda key, value, _headers: parse_client_acks(key, value),
        [(None, b"", []), (b"c", None, []), (b"c", b"\x01", [])],
    ),
    "client.events": (
        lambda key, value, _headers: parse_client_event(key, value),
        [(None, b"", []), (b"c", None, []), (b"c", b"\x01", [])],
    ),
    "msg.delayed": (
        lambda key, value, _headers: parse_delayed(key, value),
        [
            (None, None, []),
            (b"c", None, []),  # no separator and id
            (b"c\x00" + b"i" * 16, None, []),  # a will's key: the id is too short
            (DELAYED_KEY, b"\x01", []),
            (DELAYED_KEY, struct.pack(">BQI", 1, 5, 99) + b"x", []),  # meta beyond the value
            (DELAYED_KEY, struct.pack(">BQI", 1, 5, 1) + b"\x07", []),  # undecodable meta
        ],
    ),
}


@pytest.mark.parametrize("kind", sorted(PARSERS))
def test_every_parser_raises_only_record_error_on_garbage(kind: str) -> None:
    parse, garbage = PARSERS[kind]
    for key, value, headers in garbage:
        with pytest.raises(RecordError):
            parse(key, value, headers)


@given(
    st.binary(max_size=12) | st.none(),
    st.binary(max_size=12) | st.none(),
    st.lists(st.tuples(st.sampled_from("mtqrsb"), st.binary(max_size=24)), max_size=3),
)
def test_random_records_never_make_a_parser_raise_anything_but_record_error(
    key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]]
) -> None:
    for parse, _ in PARSERS.values():
        with contextlib.suppress(RecordError):
            parse(key, value, headers)


def test_expiry_of_garbage_properties_is_a_record_error() -> None:
    lasting = encode_properties(Properties(message_expiry_interval=7), PacketType.PUBLISH)
    assert expires_at_ms(PublishMeta("t", 0, False, 1_000, 5, lasting)) == 8_000
    with pytest.raises(RecordError):
        expires_at_ms(PublishMeta("t", 0, False, 1_000, 5, b"\x05\x02"))


def test_a_delete_naming_another_session_than_the_latest_is_stale() -> None:
    """Issue 22.1's rule, shared by every reader of client.sessions / client.subscriptions:
    a tombstone that names the session it deletes applies only to that session."""
    names = TopicNames("t.")
    newer = SessionRecord("n2", b"n" * 16, False, 5, False, True, session_id=b"n" * 16)
    late = client_session_record(names, "c", None, deletes=b"o" * 16)
    own = client_session_record(names, "c", None, deletes=newer.session_id)
    legacy = client_session_record(names, "c", None)
    assert late.headers == ((HEADER_DELETES, b"o" * 16),)
    assert stale_delete(newer, late.value, late.headers)
    assert not stale_delete(newer, own.value, own.headers)
    assert not stale_delete(newer, legacy.value, legacy.headers)  # deletes whatever is there
    assert not stale_delete(None, late.value, late.headers)
    record = client_session_record(names, "c", newer, deletes=b"o" * 16)
    assert record.headers == () and not stale_delete(newer, record.value, record.headers)
    subs = client_subscriptions_record(names, "c", [], deletes=b"o" * 16)
    assert stale_delete(newer, subs.value, subs.headers)
