"""The load generator's payload and packet bytes (bench/loadgen): pure, server-free."""

from __future__ import annotations

import struct

import pytest

from bench.loadgen import payload, wire
from services.common.mqtt.codec import StreamDecoder
from services.common.mqtt.packets import Publish


def test_payload_layout_and_decode_at_offset() -> None:
    data = b"xyz" + payload.HEADER.pack(7, 123_456, 1_700_000_000_123_456_789)
    data += payload.padding(64)
    assert len(data) == 3 + 64
    assert payload.decode(data, 3) == (7, 123_456, 1_700_000_000_123_456_789)
    assert data[3 + payload.MIN_SIZE :] == bytes(64 - payload.MIN_SIZE)


def test_payload_too_small() -> None:
    with pytest.raises(ValueError):
        payload.padding(payload.MIN_SIZE - 1)
    with pytest.raises(struct.error):
        payload.decode(b"\x00" * (payload.MIN_SIZE - 1))


@pytest.mark.parametrize("version", [4, 5])
@pytest.mark.parametrize("qos", [0, 1])
def test_publish_template_is_a_valid_publish(version: int, qos: int) -> None:
    template = wire.PublishTemplate("bench/a/p2p/3", qos, 66, version)
    packet = template.packet(513, 3, 9, 42)
    decoded = StreamDecoder(protocol_version=version).feed(packet)
    assert len(decoded) == 1
    pub = decoded[0]
    assert isinstance(pub, Publish)
    assert (pub.topic, pub.qos, len(pub.payload)) == ("bench/a/p2p/3", qos, 66)
    assert pub.packet_id == (513 if qos else None)
    assert payload.decode(pub.payload) == (3, 9, 42)


@pytest.mark.parametrize("version", [4, 5])
def test_frame_reader_and_publish_fields_across_split_reads(version: int) -> None:
    template = wire.PublishTemplate("t/" + "x" * 200, 1, 100, version)  # 2-byte length
    stream = b"".join(template.packet(i, 5, i, i * 10) for i in range(1, 4)) + wire.puback(77)
    reader = wire.FrameReader()
    frames = []
    for i in range(len(stream)):  # one byte at a time: every split point
        frames += reader.feed(stream[i : i + 1])
    assert [first >> 4 for first, _ in frames] == [wire.PUBLISH] * 3 + [wire.PUBACK]
    for seq, (first, body) in enumerate(frames[:3], start=1):
        packet_id, offset = wire.publish_fields(first, body, version)
        assert packet_id == seq
        assert payload.decode(body, offset) == (5, seq, seq * 10)
    assert frames[3][1] == b"\x00\x4d"


def test_frame_reader_rejects_overlong_remaining_length() -> None:
    with pytest.raises(ValueError):
        wire.FrameReader().feed(b"\x30\xff\xff\xff\xff\x01")
