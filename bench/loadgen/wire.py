"""MQTT bytes for the load generator: pre-encoded packets and a framing reader.

Control packets (CONNECT, SUBSCRIBE, DISCONNECT) are built with Cormorant's own codec;
the hot ones (PUBLISH out, PUBACK both ways, PUBLISH in) are hand-rolled here so that a
message costs a few bytes operations, not a dataclass and a codec call.
"""

from __future__ import annotations

import struct
from typing import Final

from bench.loadgen import payload
from services.common.mqtt.codec import encode
from services.common.mqtt.packets import (
    Connect,
    Disconnect,
    Subscribe,
    SubscriptionRequest,
)
from services.common.mqtt.properties import Properties
from services.common.mqtt.vbi import encode_vbi

PUBLISH: Final = 3
CONNACK: Final = 2
PUBACK: Final = 4
SUBACK: Final = 9
PINGRESP: Final = 13
DISCONNECT: Final = 14

_H: Final = struct.Struct("!H")


def connect(
    client_id: str,
    version: int,
    *,
    clean: bool = True,
    keep_alive: int = 60,
    session_expiry: int | None = None,
    username: str | None = None,
    password: str | None = None,
) -> bytes:
    """A CONNECT packet; ``keep_alive`` and ``session_expiry`` (5.0 only) in seconds; a User
    Name and Password when given."""
    props = Properties(session_expiry_interval=session_expiry) if version == 5 else Properties()
    return encode(
        Connect(
            protocol_version=version,
            client_id=client_id,
            clean_start=clean,
            keep_alive=keep_alive,
            username=username,
            password=None if password is None else password.encode(),
            properties=props,
        ),
        version,
    )


def subscribe(packet_id: int, topic_filter: str, qos: int, version: int) -> bytes:
    """A SUBSCRIBE of one filter at ``qos``."""
    return encode(
        Subscribe(packet_id=packet_id, subscriptions=[SubscriptionRequest(topic_filter, qos)]),
        version,
    )


def disconnect(version: int) -> bytes:
    """A normal DISCONNECT."""
    return encode(Disconnect(), version)


def puback(packet_id: int) -> bytes:
    """A PUBACK with Reason Code 0 (the same bytes in 3.1.1 and 5.0)."""
    return b"\x40\x02" + _H.pack(packet_id)


class PublishTemplate:
    """Pre-encoded PUBLISH packets of one topic, QoS and payload size.

    ``packet`` fills in the Packet Identifier and the payload header; everything else is
    computed once.
    """

    __slots__ = ("_head", "_pad", "_props", "qos")

    def __init__(self, topic: str, qos: int, size: int, version: int) -> None:
        """Prepare PUBLISHes to ``topic``; ``size`` is the payload size in bytes.

        Raises:
            ValueError: ``qos`` is not 0 or 1, or ``size`` is below ``payload.MIN_SIZE``.
        """
        if qos not in (0, 1):
            raise ValueError(f"the generator publishes at QoS 0 or 1, got {qos}")
        self.qos = qos
        topic_bytes = topic.encode()
        self._props = b"\x00" if version == 5 else b""
        self._pad = payload.padding(size)
        remaining = 2 + len(topic_bytes) + (2 if qos else 0) + len(self._props) + size
        first = bytes((0x30 | (qos << 1),))
        self._head = first + encode_vbi(remaining) + _H.pack(len(topic_bytes)) + topic_bytes

    def packet(self, packet_id: int, publisher_id: int, seq: int, sent_ns: int) -> bytes:
        """One PUBLISH; ``packet_id`` is ignored at QoS 0; ``sent_ns`` since the epoch."""
        header = payload.HEADER.pack(publisher_id, seq, sent_ns)
        if self.qos:
            return b"".join((self._head, _H.pack(packet_id), self._props, header, self._pad))
        return b"".join((self._head, self._props, header, self._pad))


class FrameReader:
    """Splits one byte stream into ``(first_byte, body)`` frames."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        """Start with an empty buffer."""
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """Append ``data``; return every complete frame, keeping a partial one buffered.

        Raises:
            ValueError: a Remaining Length longer than four bytes.
        """
        buf = self._buf
        buf += data
        frames: list[tuple[int, bytes]] = []
        pos = 0
        end = len(buf)
        while end - pos >= 2:
            value = 0
            shift = 0
            cursor = pos + 1
            while True:
                if cursor >= end:
                    value = -1
                    break
                byte = buf[cursor]
                cursor += 1
                value |= (byte & 0x7F) << shift
                if not byte & 0x80:
                    break
                shift += 7
                if shift > 21:
                    raise ValueError("Remaining Length longer than four bytes")
            if value < 0 or cursor + value > end:
                break
            frames.append((buf[pos], bytes(buf[cursor : cursor + value])))
            pos = cursor + value
        if pos:
            del buf[:pos]
        return frames


def publish_fields(first_byte: int, body: bytes, version: int) -> tuple[int, int]:
    """``(packet_id, payload_offset)`` of a PUBLISH body; packet_id is 0 at QoS 0.

    Raises:
        IndexError: a body too short for its own fields.
    """
    pos = 2 + ((body[0] << 8) | body[1])
    packet_id = 0
    if first_byte & 0x06:
        packet_id = (body[pos] << 8) | body[pos + 1]
        pos += 2
    if version == 5:
        length = 0
        shift = 0
        while True:
            byte = body[pos]
            pos += 1
            length |= (byte & 0x7F) << shift
            if not byte & 0x80:
                break
            shift += 7
        pos += length
    return packet_id, pos
