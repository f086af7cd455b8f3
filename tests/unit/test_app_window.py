"""app_delivery's in-flight window (services/app_delivery/window.py): Packet Identifiers from
offsets, Receive Maximum, DUP resends after a new connection or a restart, QoS 2 releases,
commit points, shared partitions moving between members.

MQTT 3.3.1.1 (DUP), 4.3.2-4.3.3 (QoS 1/2 flows), 4.4 (resend on reconnect), 5.0 4.9 (Receive
Maximum), 5.0 3.3.2.3.3 (Message Expiry).
"""

from __future__ import annotations

import pytest
from aiokafka import TopicPartition

from services.app_delivery.window import (
    METADATA_MAX,
    OWN_PACKET_IDS,
    SHARED_PACKET_IDS,
    ClientWindow,
    CommitPoint,
    Entry,
    decode_mark,
    encode_mark,
    packet_id_of,
    span_of,
)
from services.common.records import AckKind, Target

OWN = TopicPartition("msg.app.c", 0)
SHARED = TopicPartition("msg.app-shared.g", 3)
NOW = 1_800_000_000_000


def _entry(qos: int = 1, expires_at_ms: int | None = None, payload: bytes = b"") -> Entry:
    return Entry(Target("c", qos), b"meta", payload, b"pub", expires_at_ms)


def _window(limit: int = 3, low: int = 0, sent_upto: int = 0, partitions: int = 1) -> ClientWindow:
    window = ClientWindow(limit)
    window.add_source(OWN, low, sent_upto, partitions)
    return window


def _fill(window: ClientWindow, tp: TopicPartition, offsets: range, qos: int = 1) -> None:
    for offset in offsets:
        window.add(tp, offset, _entry(qos, payload=f"m{offset}".encode()))


def _sent(window: ClientWindow) -> list[tuple[int, int, bool]]:
    """(offset, Packet Identifier, DUP) of what is sendable now."""
    return [(d.offset, d.packet_id, d.dup) for d in window.sendable(NOW).publishes]


# ---------------------------------------------------------------------- Packet Identifiers


def test_packet_ids_derive_from_offsets_one_span_per_partition() -> None:
    assert packet_id_of(0, 0, 1) == 1
    assert packet_id_of(0, OWN_PACKET_IDS - 1, 1) == OWN_PACKET_IDS
    assert packet_id_of(0, OWN_PACKET_IDS, 1) == 1  # wraps
    span = span_of(4)
    ids = {packet_id_of(p, o, 4) for p in range(4) for o in range(1000, 1000 + span)}
    assert len(ids) == 4 * span  # every offset of a span in every partition: all distinct
    assert min(ids) >= 1 and max(ids) <= OWN_PACKET_IDS < SHARED_PACKET_IDS.start


def test_commit_metadata_round_trip() -> None:
    point = CommitPoint(100, 130, (100, 117))
    assert decode_mark(encode_mark(point), 100) == (130, (100, 117))
    assert decode_mark(encode_mark(CommitPoint(5, 9)), 5) == (9, ())
    for garbage in (None, "", "other", "sent:x", "sent:3;rel:a"):
        assert decode_mark(garbage, 0) == (0, ())
    crowded = CommitPoint(0, 100_000, tuple(range(0, 100_000, 7)))
    text = encode_mark(crowded)
    assert len(text) <= METADATA_MAX
    sent_upto, released = decode_mark(text, 0)
    assert sent_upto == 100_000 and released == crowded.released[: len(released)]


# ---------------------------------------------------------------------- the window


def test_deliveries_flow_in_order_within_the_window() -> None:
    window = _window(limit=3)
    _fill(window, OWN, range(5))
    out = window.sendable(NOW)
    assert [(d.offset, d.packet_id, d.dup) for d in out.publishes] == [
        (0, 1, False),
        (1, 2, False),
        (2, 3, False),
    ]
    assert out.marks == {OWN: 3}  # committed before they are sent
    assert _sent(window) == []  # full
    assert window.acknowledge(AckKind.PUBACK, 2)
    assert window.commit_points() == {OWN: CommitPoint(0, 3)}  # offset 0 still unacknowledged
    assert _sent(window) == [(3, 4, False)]
    assert window.acknowledge(AckKind.PUBACK, 1)
    assert window.commit_points() == {OWN: CommitPoint(2, 4)}
    assert _sent(window) == [(4, 5, False)]


def test_a_partitions_span_bounds_what_is_in_flight_behind_an_unacknowledged_offset() -> None:
    partitions = 64
    span = span_of(partitions)
    window = _window(limit=10_000, partitions=partitions)
    _fill(window, OWN, range(span + 5))
    first = _sent(window)
    assert len(first) == span  # offset 0 unacknowledged: offset `span` would reuse its id
    for offset in range(1, span):
        window.acknowledge(AckKind.PUBACK, packet_id_of(0, offset, partitions))
    assert _sent(window) == []
    window.acknowledge(AckKind.PUBACK, packet_id_of(0, 0, partitions))
    assert [o for o, _, _ in _sent(window)] == list(range(span, span + 5))


def test_a_new_connection_gets_the_unacknowledged_again_with_dup_and_pubrel() -> None:
    window = _window(limit=10)
    _fill(window, OWN, range(3), qos=2)
    assert len(_sent(window)) == 3
    window.acknowledge(AckKind.PUBREC, 1)  # offset 0 released
    window.acknowledge(AckKind.PUBREC, 2)
    window.acknowledge(AckKind.PUBCOMP, 2)  # offset 1 complete
    window.new_connection()
    out = window.sendable(NOW)
    assert [d.packet_id for d in out.releases] == [1]
    assert [(d.offset, d.packet_id, d.dup) for d in out.publishes] == [(2, 3, True)]
    assert out.marks == {}
    assert window.in_flight == 2
    window.acknowledge(AckKind.PUBCOMP, 1)
    window.acknowledge(AckKind.PUBREC, 3)
    window.acknowledge(AckKind.PUBCOMP, 3)
    assert window.commit_points() == {OWN: CommitPoint(3, 3)} and window.in_flight == 0


def test_after_a_restart_what_was_sent_goes_with_dup_and_early_acks_count() -> None:
    # Committed offset 10, metadata: 10..12 were sent before the restart.
    window = _window(limit=10, low=10, sent_upto=13)
    # The client's PUBACK of 11 is read before 11 is fetched again.
    assert window.acknowledge(AckKind.PUBACK, packet_id_of(0, 11, 1))
    assert not window.acknowledge(AckKind.PUBACK, packet_id_of(0, 20, 1))  # never sent
    _fill(window, OWN, range(10, 15))
    assert _sent(window) == [(10, 11, True), (12, 13, True), (13, 14, False), (14, 15, False)]


def test_qos2_releases_survive_a_restart_in_the_commit_metadata() -> None:
    window = _window(limit=10)
    _fill(window, OWN, range(3), qos=2)
    _sent(window)
    window.acknowledge(AckKind.PUBREC, 2)  # offset 1 released
    point = window.commit_points()[OWN]
    assert point == CommitPoint(0, 3, (1,))
    restarted = ClientWindow(10)
    restarted.add_source(OWN, 0, *decode_mark(encode_mark(point), 0)[:1], 1, (1,))
    _fill(restarted, OWN, range(3), qos=2)
    out = restarted.sendable(NOW)
    assert [(d.offset, d.dup) for d in out.publishes] == [(0, True), (2, True)]
    assert [(d.offset, d.packet_id) for d in out.releases] == [(1, 2)]


def test_qos0_is_sent_once_outside_the_window_and_never_again() -> None:
    window = _window(limit=1)
    _fill(window, OWN, range(2), qos=1)
    _fill(window, OWN, range(2, 4), qos=0)
    assert _sent(window) == [(0, 1, False)]  # QoS 0 waits behind the full window (order)
    window.acknowledge(AckKind.PUBACK, 1)
    # QoS 0 does not count against Receive Maximum: it follows at once, and is complete.
    assert _sent(window) == [(1, 2, False), (2, 0, False), (3, 0, False)]
    assert window.commit_points() == {OWN: CommitPoint(1, 4)}
    window.acknowledge(AckKind.PUBACK, 2)
    assert window.commit_points() == {OWN: CommitPoint(4, 4)}
    restarted = _window(limit=5, low=2, sent_upto=4)
    _fill(restarted, OWN, range(2, 4), qos=0)
    assert _sent(restarted) == []  # at most once
    assert restarted.commit_points() == {OWN: CommitPoint(4, 4)}


def test_expired_messages_are_skipped_unless_they_were_sent_before() -> None:
    window = _window(limit=5, low=0, sent_upto=1)
    window.add(OWN, 0, _entry(1, expires_at_ms=NOW))
    window.add(OWN, 1, _entry(1, expires_at_ms=NOW))
    window.add(OWN, 2, _entry(1, expires_at_ms=NOW + 1))
    assert _sent(window) == [(0, 1, True), (2, 3, False)]


def test_records_for_no_one_and_gaps_are_complete() -> None:
    window = _window()
    window.add(OWN, 0, None)  # another session's record
    window.add(OWN, 5, _entry())  # 1..4 deleted by retention before they were read
    assert window.commit_points() == {OWN: CommitPoint(5, 5)}
    assert _sent(window) == [(5, 6, False)]


def test_wrong_or_unknown_acknowledgements_change_nothing() -> None:
    window = _window()
    _fill(window, OWN, range(2), qos=1)
    _sent(window)
    assert not window.acknowledge(AckKind.PUBREC, 1)  # a QoS 1 delivery
    assert not window.acknowledge(AckKind.PUBACK, 60_000)
    assert window.in_flight == 2


def test_a_failed_downlink_write_sends_again_on_the_same_connection() -> None:
    window = _window()
    _fill(window, OWN, range(2))
    out = window.sendable(NOW)
    window.unsend(out.publishes[1:])
    assert _sent(window) == [(1, 2, True)]


# ---------------------------------------------------------------------- shared partitions


def test_shared_deliveries_take_identifiers_of_their_own_range() -> None:
    window = _window(limit=10)
    window.add_source(SHARED, 100, 0, None)
    _fill(window, OWN, range(2))
    _fill(window, SHARED, range(100, 103))
    sent = _sent(window)
    own = [pid for offset, pid, _ in sent if offset < 100]
    shared = [pid for offset, pid, _ in sent if offset >= 100]
    assert own == [1, 2]
    assert len(set(shared)) == 3 and all(pid in SHARED_PACKET_IDS for pid in shared)
    # Round robin between the partitions.
    assert [offset for offset, _, _ in sent][:4] == [0, 100, 1, 101]
    assert window.acknowledge(AckKind.PUBACK, shared[0])
    assert window.commit_points()[SHARED] == CommitPoint(101, 103)


def test_a_moved_shared_partition_keeps_its_deliveries_in_flight_until_acknowledged() -> None:
    window = _window(limit=2)
    window.add_source(SHARED, 0, 0, None)
    _fill(window, SHARED, range(3))
    first = _sent(window)
    assert len(first) == 2
    window.remove_source(SHARED)  # Kafka gave the partition to another member
    assert window.in_flight == 2 and _sent(window) == []
    _fill(window, OWN, range(1))
    assert window.acknowledge(AckKind.PUBACK, first[0][1])
    assert _sent(window) == [(0, 1, False)]
    window.new_connection()  # the last orphan's identifier is free again
    assert window.in_flight == 0


@pytest.mark.parametrize("limit", [1, 7])
def test_the_window_never_exceeds_its_limit(limit: int) -> None:
    window = _window(limit=limit)
    window.add_source(SHARED, 0, 0, None)
    _fill(window, OWN, range(20))
    _fill(window, SHARED, range(20))
    for _ in range(10):
        sent = _sent(window)
        assert window.in_flight <= limit
        for offset, pid, _ in sent[:1]:
            window.acknowledge(AckKind.PUBACK, pid)
            assert offset >= 0
