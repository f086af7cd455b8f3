"""Length-prefixed MQTT fields: UTF-8 Encoded String and Binary Data.

Both are a Two Byte Integer length (big-endian, 0..65,535) followed by that many bytes
(MQTT 5.0 sections 1.5.4 and 1.5.6; MQTT 3.1.1 section 1.5.3). Binary Data lives here too
because it shares the framing; only the string form carries character rules.

String rules enforced on decode (1.5.4): well-formed UTF-8 per RFC 3629, which excludes the
surrogate code points U+D800..U+DFFF ([MQTT-1.5.4-1]), and no U+0000 ([MQTT-1.5.4-2]).
Control characters and non-characters are only "SHOULD NOT" and are accepted. A leading
U+FEFF is kept as part of the string, never stripped ([MQTT-1.5.4-3]).
"""

from __future__ import annotations

from typing import Final

from services.common.mqtt.errors import MalformedPacket

MAX_FIELD_LENGTH: Final = 65_535
"""Largest byte length of a UTF-8 Encoded String or Binary Data field."""

Buffer = bytes | bytearray | memoryview


def decode_utf8(buf: Buffer, offset: int) -> tuple[str, int]:
    """Decode the UTF-8 Encoded String starting at ``buf[offset]`` (MQTT 5.0 1.5.4).

    Returns:
        ``(text, next_offset)``.

    Raises:
        MalformedPacket: the length prefix or the string data runs past the end of ``buf``,
            the bytes are not well-formed UTF-8 (surrogates included), or the string holds
            U+0000.
    """
    start = offset + 2
    if start > len(buf):
        raise MalformedPacket("truncated UTF-8 string length")
    end = start + ((buf[offset] << 8) | buf[offset + 1])
    if end > len(buf):
        raise MalformedPacket("truncated UTF-8 string")
    try:
        text = str(buf[start:end], "utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedPacket(f"invalid UTF-8 in string: {exc.reason}") from None
    if "\x00" in text:
        raise MalformedPacket("UTF-8 string contains U+0000")
    return text, end


def encode_utf8(text: str) -> bytes:
    """Encode ``text`` as a UTF-8 Encoded String: 2-byte length, then the UTF-8 bytes.

    Raises:
        ValueError: ``text`` holds a surrogate or U+0000, or encodes to more than 65,535
            bytes; such a string could never be decoded by a conforming receiver.
    """
    data = text.encode("utf-8")  # UnicodeEncodeError (a ValueError) on lone surrogates
    if len(data) > MAX_FIELD_LENGTH:
        raise ValueError(f"UTF-8 string too long: {len(data)} bytes")
    if b"\x00" in data:
        raise ValueError("UTF-8 string contains U+0000")
    return len(data).to_bytes(2, "big") + data


def decode_binary(buf: Buffer, offset: int) -> tuple[bytes, int]:
    """Decode the Binary Data field starting at ``buf[offset]`` (MQTT 5.0 1.5.6).

    Returns:
        ``(data, next_offset)``; ``data`` is a copy, independent of ``buf``.

    Raises:
        MalformedPacket: the length prefix or the data runs past the end of ``buf``.
    """
    start = offset + 2
    if start > len(buf):
        raise MalformedPacket("truncated Binary Data length")
    end = start + ((buf[offset] << 8) | buf[offset + 1])
    if end > len(buf):
        raise MalformedPacket("truncated Binary Data")
    return bytes(buf[start:end]), end


def encode_binary(data: bytes) -> bytes:
    """Encode ``data`` as Binary Data: 2-byte length, then the bytes (MQTT 5.0 1.5.6).

    Raises:
        ValueError: ``data`` is longer than 65,535 bytes.
    """
    if len(data) > MAX_FIELD_LENGTH:
        raise ValueError(f"Binary Data too long: {len(data)} bytes")
    return len(data).to_bytes(2, "big") + data
