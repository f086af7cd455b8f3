"""Variable Byte Integer (MQTT 5.0 1.5.5): spec vectors, bounds, malformed forms."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common.mqtt.errors import MalformedPacket
from services.common.mqtt.reason_codes import ReasonCode
from services.common.mqtt.vbi import VBI_MAX, decode_vbi, encode_vbi

# The boundaries of each encoded size, from MQTT 5.0 table 1-1 (and 3.1.1 table 2.4).
SPEC_VECTORS = [
    (0, "00"),
    (127, "7f"),
    (128, "8001"),
    (16_383, "ff7f"),
    (16_384, "808001"),
    (2_097_151, "ffff7f"),
    (2_097_152, "80808001"),
    (268_435_455, "ffffff7f"),
]


@pytest.mark.parametrize(("value", "hex_bytes"), SPEC_VECTORS)
def test_spec_vectors_encode(value: int, hex_bytes: str) -> None:
    assert encode_vbi(value) == bytes.fromhex(hex_bytes)


@pytest.mark.parametrize(("value", "hex_bytes"), SPEC_VECTORS)
def test_spec_vectors_decode(value: int, hex_bytes: str) -> None:
    data = bytes.fromhex(hex_bytes)
    assert decode_vbi(data, 0) == (value, len(data))


def test_decode_at_offset_in_memoryview() -> None:
    buf = memoryview(b"\xaa\xbb" + bytes.fromhex("808001") + b"\xcc")
    assert decode_vbi(buf, 2) == (16_384, 5)


def test_max_constant() -> None:
    assert VBI_MAX == 268_435_455


@pytest.mark.parametrize("value", [-1, VBI_MAX + 1, 2**40])
def test_encode_out_of_range(value: int) -> None:
    with pytest.raises(ValueError):
        encode_vbi(value)


@pytest.mark.parametrize(
    "hex_bytes",
    [
        "",  # nothing at all
        "80",  # continuation bit with no next byte
        "ffff",
        "ffffff",
        "ffffffff",  # four bytes, fourth still continues
        "ffffffff7f",  # five bytes
        "8000",  # 0 in two bytes: not the shortest form
        "ff8000",  # 127 padded to three bytes
        "80808000",
    ],
)
def test_decode_malformed(hex_bytes: str) -> None:
    with pytest.raises(MalformedPacket) as info:
        decode_vbi(bytes.fromhex(hex_bytes), 0)
    assert info.value.reason_code == ReasonCode.MALFORMED_PACKET


@given(st.integers(min_value=0, max_value=VBI_MAX))
def test_roundtrip(value: int) -> None:
    data = encode_vbi(value)
    assert 1 <= len(data) <= 4
    assert decode_vbi(data + b"\x00trailing", 0) == (value, len(data))


@given(st.integers(min_value=0, max_value=VBI_MAX))
def test_shortest_form(value: int) -> None:
    expected = 1 if value < 128 else 2 if value < 16_384 else 3 if value < 2_097_152 else 4
    assert len(encode_vbi(value)) == expected
