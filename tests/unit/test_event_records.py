"""The ``client.events`` record format (services/common/records.py): round trips, and
garbage that must raise RecordError rather than decode."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common.records import (
    ClientKind,
    DisconnectCause,
    EventKind,
    EventRecord,
    RecordError,
    SessionRecord,
    decode_event,
    encode_event,
    session_expired_event,
)

events = st.builds(
    EventRecord,
    kind=st.sampled_from(EventKind),
    at_ms=st.integers(0, 2**64 - 1),
    node_id=st.text(max_size=20),
    client_address=st.text(max_size=40),
    connection_id=st.binary(min_size=16, max_size=16),
    protocol_version=st.integers(0, 5),
    reason_code=st.integers(0, 255),
    cause=st.sampled_from(DisconnectCause),
    persistent=st.booleans(),
    clean_start=st.booleans(),
    session_expiry_interval=st.integers(0, 2**32 - 1),
    topic_filters=st.lists(st.tuples(st.text(max_size=30), st.integers(0, 2)), max_size=4).map(
        tuple
    ),
)


@given(events)
def test_every_event_round_trips(event: EventRecord) -> None:
    assert decode_event(encode_event(event)) == event


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x02" + bytes(40),  # unknown version
        encode_event(EventRecord(EventKind.CONNECTED, 1, "n"))[:-1],  # truncated
        encode_event(EventRecord(EventKind.CONNECTED, 1, "n")) + b"x",  # trailing bytes
        b"\x01\x09" + encode_event(EventRecord(EventKind.CONNECTED, 1, "n"))[2:],  # kind 9
    ],
)
def test_garbage_raises_record_error(data: bytes) -> None:
    with pytest.raises(RecordError):
        decode_event(data)


def test_a_connection_id_must_be_16_bytes() -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        encode_event(EventRecord(EventKind.CONNECTED, 1, "n", connection_id=b"short"))


def test_session_expired_event_names_the_last_connection() -> None:
    session = SessionRecord(
        node_id="node2",
        connection_id=bytes(range(16)),
        connected=False,
        protocol_version=5,
        clean_start=False,
        persistent=True,
        kind=ClientKind.DEVICE,
        session_expiry_interval=60,
    )
    event = session_expired_event(session, 123)
    assert (event.kind, event.at_ms, event.node_id, event.connection_id) == (
        EventKind.SESSION_EXPIRED,
        123,
        "node2",
        bytes(range(16)),
    )
    assert (event.protocol_version, event.session_expiry_interval) == (5, 60)
