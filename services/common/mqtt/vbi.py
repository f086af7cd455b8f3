"""MQTT Variable Byte Integer (MQTT 5.0 section 1.5.5, MQTT 3.1.1 section 2.2.3).

Seven value bits per byte, least significant group first; bit 7 is the continuation bit.
At most four bytes, so the largest value is 268,435,455. The same encoding carries the
Remaining Length (both versions), the Property Length, property identifiers and the
Subscription Identifier (5.0).
"""

from __future__ import annotations

from typing import Final

from services.common.mqtt.errors import MalformedPacket

VBI_MAX: Final = 268_435_455
"""Largest value a Variable Byte Integer can carry (four bytes of seven bits)."""

# Precomputed one-byte encodings: most Remaining Lengths and every property identifier fit.
_ONE_BYTE: Final = tuple(bytes((i,)) for i in range(128))


def encode_vbi(value: int) -> bytes:
    """Encode ``value`` as a Variable Byte Integer of 1 to 4 bytes (MQTT 5.0 1.5.5).

    Uses the minimum number of bytes, as [MQTT-1.5.5-1] requires.

    Raises:
        ValueError: ``value`` is negative or larger than ``VBI_MAX`` (268,435,455).
    """
    if 0 <= value < 128:
        return _ONE_BYTE[value]
    if value < 0 or value > VBI_MAX:
        raise ValueError(f"Variable Byte Integer out of range: {value}")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def decode_vbi(buf: bytes | bytearray | memoryview, offset: int) -> tuple[int, int]:
    """Decode the Variable Byte Integer starting at ``buf[offset]`` (MQTT 5.0 1.5.5).

    Returns:
        ``(value, next_offset)``: the integer and the offset of the byte after it.

    Raises:
        MalformedPacket: the integer runs past the end of ``buf`` (truncated field), uses
            more than four bytes, or is not in its shortest form ([MQTT-1.5.5-1]).
    """
    value = 0
    shift = 0
    end = len(buf)
    pos = offset
    for _ in range(4):
        if pos >= end:
            raise MalformedPacket("truncated Variable Byte Integer")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            # A trailing zero group after a continuation means a longer-than-needed form.
            if byte == 0 and pos - offset > 1:
                raise MalformedPacket("Variable Byte Integer not in its shortest form")
            return value, pos
        shift += 7
    raise MalformedPacket("Variable Byte Integer longer than four bytes")
