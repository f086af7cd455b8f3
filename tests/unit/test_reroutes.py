"""Readers drop what a crashed router routed again (services/common/kafka/reroutes.py), by
the origin every routed record carries (services/common/records.py, ``with_origins``)."""

from __future__ import annotations

import pytest
from aiokafka.structs import ConsumerRecord

from services.common.kafka.consumer import Record
from services.common.kafka.reroutes import RerouteFilter
from services.common.records import (
    HEADER_ORIGIN,
    KafkaRecord,
    Origin,
    RecordError,
    encode_origin,
    origin_of,
    with_origins,
)


def _read(offset: int, key: bytes, origin: tuple[int, int, int] | None) -> Record:
    """A record read at ``offset`` of partition 0 of ``msg.persisted``, routed from
    ``origin`` (msg.all partition, offset, index), or not routed (None)."""
    headers = [("m", b"meta")]
    if origin is not None:
        headers.append((HEADER_ORIGIN, encode_origin(Origin(*origin))))
    return ConsumerRecord("msg.persisted", 0, offset, 0, 0, key, b"v", None, 0, 0, headers)


def test_origins_count_the_outputs_of_one_record_per_topic_and_key() -> None:
    out = with_origins(
        [
            KafkaRecord("down", b"pub", b"1"),
            KafkaRecord("persisted", b"sub-a", b"1"),
            KafkaRecord("persisted", b"sub-b", b"1"),
            KafkaRecord("persisted", b"sub-a", b"2"),  # a second retained message for sub-a
        ],
        3,
        41,
    )
    assert [origin_of(r.headers) for r in out] == [
        Origin(3, 41, 0),
        Origin(3, 41, 0),
        Origin(3, 41, 0),
        Origin(3, 41, 1),
    ]


def test_a_copy_routed_again_after_its_original_is_dropped() -> None:
    reroutes = RerouteFilter()
    # The first routing of msg.all partition 2, offsets 10 and 11, for two subscribers.
    first = [_read(0, b"a", (2, 10, 0)), _read(1, b"b", (2, 10, 0)), _read(2, b"a", (2, 11, 0))]
    assert [reroutes.first(r, r.key) for r in first] == [True, True, True]
    # The router crashed before committing 10: it routes 10, 11 and then 12 again.
    again = [
        _read(3, b"a", (2, 10, 0)),
        _read(4, b"b", (2, 10, 0)),
        _read(5, b"a", (2, 11, 0)),
        _read(6, b"a", (2, 12, 0)),
        _read(7, b"b", (2, 11, 0)),  # b had no message 11 the first time: new to it
    ]
    assert [reroutes.first(r, r.key) for r in again] == [False, False, False, True, True]
    assert reroutes.dropped == 3


def test_each_msg_all_partition_and_each_index_is_its_own_sequence() -> None:
    reroutes = RerouteFilter()
    assert reroutes.first(_read(0, b"a", (1, 50, 0)), b"a")
    assert reroutes.first(_read(1, b"a", (2, 7, 0)), b"a")  # another partition's offsets
    # Two retained messages answering one request: indexes 0 and 1 of one origin.
    assert reroutes.first(_read(2, b"a", (2, 8, 0)), b"a")
    assert reroutes.first(_read(3, b"a", (2, 8, 1)), b"a")
    assert not reroutes.first(_read(4, b"a", (2, 8, 1)), b"a")


def test_a_partition_read_again_after_a_failure_passes_again() -> None:
    reroutes = RerouteFilter()
    batch = [_read(0, b"a", (0, 1, 0)), _read(1, b"a", (0, 2, 0)), _read(2, b"a", (0, 2, 0))]
    assert [reroutes.first(r, r.key) for r in batch] == [True, True, False]
    # The store failed: the batch is read again from offset 0. The originals pass (the
    # store skips what it has, by their offsets); the copy stays dropped.
    assert [reroutes.first(r, r.key) for r in batch] == [True, True, False]


def test_records_without_an_origin_pass_and_a_malformed_one_is_an_error() -> None:
    reroutes = RerouteFilter()
    assert reroutes.first(_read(0, b"a", None)) and reroutes.first(_read(0, b"a", None))
    bad = ConsumerRecord("t", 0, 1, 0, 0, b"a", b"", None, 0, 0, [(HEADER_ORIGIN, b"\x01\x00")])
    with pytest.raises(RecordError):
        reroutes.first(bad)
