"""The PROXY protocol parser (HAProxy's proxy-protocol.txt, versions 1 and 2), byte by byte.

The version 2 headers are written out by hand here (not with ``encode_v2``), as the
specification lays them out, so the parser is checked against the format rather than
against its own encoder; ``encode_v2`` is then checked against the parser.
"""

from __future__ import annotations

import pytest

from services.ingest.proxy_protocol import (
    V2_SIGNATURE,
    ProxyHeader,
    ProxyProtocolError,
    encode_v2,
    parse,
    wanted,
)

# version 2, PROXY command; TCP over IPv4; 12 bytes: 192.0.2.10:50000 → 10.0.0.5:1883
V2_TCP4 = (
    b"\x0d\x0a\x0d\x0a\x00\x0d\x0a\x51\x55\x49\x54\x0a"
    b"\x21\x11\x00\x0c"
    b"\xc0\x00\x02\x0a" b"\x0a\x00\x00\x05" b"\xc3\x50" b"\x07\x5b"
)  # fmt: skip

# TCP over IPv6, 2001:db8::1:40000 → 2001:db8::2:8883, then a TLV (type 0x04 NOOP, 3 bytes)
V2_TCP6_TLV = (
    V2_SIGNATURE + b"\x21\x21\x00\x2a"
    + bytes.fromhex("20010db8000000000000000000000001")
    + bytes.fromhex("20010db8000000000000000000000002")
    + b"\x9c\x40" + b"\x22\xb3"
    + b"\x04\x00\x03abc"
)  # fmt: skip

V2_LOCAL = V2_SIGNATURE + b"\x20\x00\x00\x00"


def _read(stream: bytes) -> tuple[ProxyHeader, bytes]:
    """Read ``stream`` as a listener does: only what :func:`wanted` allows each time."""
    data = b""
    while need := wanted(data):
        data += stream[len(data) : len(data) + need]
    header = parse(data)
    assert header is not None
    return header, stream[len(data) :]


def test_v2_tcp4() -> None:
    header = parse(V2_TCP4)
    assert header == ProxyHeader(2, ("192.0.2.10", 50000), ("10.0.0.5", 1883), 28)


def test_v2_tcp6_with_a_tlv_skipped() -> None:
    header = parse(V2_TCP6_TLV)
    assert header == ProxyHeader(2, ("2001:db8::1", 40000), ("2001:db8::2", 8883), 58)


def test_v2_local_names_no_client() -> None:
    assert parse(V2_LOCAL) == ProxyHeader(2, None, None, 16)


def test_v2_unspec_and_unix_name_no_client() -> None:
    assert parse(V2_SIGNATURE + b"\x21\x00\x00\x00") == ProxyHeader(2, None, None, 16)
    unix = V2_SIGNATURE + b"\x21\x31\x00\xd8" + bytes(216)
    assert parse(unix) == ProxyHeader(2, None, None, 232)


@pytest.mark.parametrize(
    ("line", "source", "destination"),
    [
        (
            b"PROXY TCP4 192.0.2.10 10.0.0.5 50000 1883\r\n",
            ("192.0.2.10", 50000),
            ("10.0.0.5", 1883),
        ),
        (
            b"PROXY TCP6 2001:db8::1 2001:db8::2 40000 8883\r\n",
            ("2001:db8::1", 40000),
            ("2001:db8::2", 8883),
        ),
    ],
)
def test_v1(line: bytes, source: tuple[str, int], destination: tuple[str, int]) -> None:
    assert parse(line) == ProxyHeader(1, source, destination, len(line))


def test_v1_unknown_names_no_client() -> None:
    assert parse(b"PROXY UNKNOWN\r\n") == ProxyHeader(1, None, None, 15)
    line = b"PROXY UNKNOWN ffff::1 ffff::2 1 2\r\n"
    assert parse(line) == ProxyHeader(1, None, None, len(line))


@pytest.mark.parametrize(
    "stream",
    [V2_TCP4, V2_TCP6_TLV, V2_LOCAL, b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\n", b"PROXY UNKNOWN\r\n"],
)
def test_reading_as_wanted_stops_exactly_at_the_end_of_the_header(stream: bytes) -> None:
    client_hello = b"\x16\x03\x01\x00\xa5\x01"  # what follows: a TLS record, not to be read
    header, rest = _read(stream + client_hello)
    assert header.length == len(stream)
    assert rest == client_hello


def test_incomplete_headers_ask_for_more() -> None:
    for size in range(len(V2_TCP4)):
        assert parse(V2_TCP4[:size]) is None
        assert wanted(V2_TCP4[:size]) > 0
    line = b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\n"
    for size in range(len(line)):
        assert parse(line[:size]) is None


@pytest.mark.parametrize(
    "data",
    [
        b"\x10\x0c\x00\x04MQTT\x05\x02\x00\x3c",  # a plain MQTT CONNECT: no header at all
        b"\x16\x03\x01\x00",  # a TLS ClientHello
        b"GET /mqtt HTTP/1.1\r\n",  # a WebSocket upgrade
        V2_SIGNATURE[:5] + b"X",  # a broken signature
    ],
)
def test_bytes_that_start_no_header_are_refused_at_once(data: bytes) -> None:
    with pytest.raises(ProxyProtocolError):
        wanted(data)


@pytest.mark.parametrize(
    "data",
    [
        V2_SIGNATURE + b"\x11\x11\x00\x0c" + bytes(12),  # version 1 in the binary format
        V2_SIGNATURE + b"\x22\x11\x00\x0c" + bytes(12),  # command 2
        V2_SIGNATURE + b"\x21\x41\x00\x0c" + bytes(12),  # family 4
        V2_SIGNATURE + b"\x21\x13\x00\x0c" + bytes(12),  # transport 3
        V2_SIGNATURE + b"\x21\x11\x00\x04" + bytes(4),  # IPv4 addresses cut short
        V2_SIGNATURE + b"\x21\x21\x00\x0c" + bytes(12),  # IPv6 addresses cut short
        b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n",  # a field missing
        b"PROXY TCP4 ::1 5.6.7.8 1 2\r\n",  # IPv6 in TCP4
        b"PROXY TCP4 1.2.3.4 5.6.7.8 1 65536\r\n",  # port out of range
        b"PROXY TCP4 1.2.3.4 5.6.7.8 01 2\r\n",  # leading zero
        b"PROXY TCP4 1.2.3.999 5.6.7.8 1 2\r\n",  # not an address
        b"PROXY UDP4 1.2.3.4 5.6.7.8 1 2\r\n",  # not a stream protocol
        b"PROXY TCP4 1.2.3.4 5.6.7.8 1 \xff\r\n",  # not ASCII
    ],
)
def test_malformed_headers_are_refused(data: bytes) -> None:
    with pytest.raises(ProxyProtocolError):
        parse(data)


def test_overlong_headers_are_refused_before_they_are_read() -> None:
    with pytest.raises(ProxyProtocolError, match="107"):
        wanted(b"PROXY TCP4 " + b"1" * 100)
    with pytest.raises(ProxyProtocolError, match="too long"):
        wanted(V2_SIGNATURE + b"\x21\x11\xff\xff")


def test_encode_v2_is_what_the_parser_reads() -> None:
    assert encode_v2(("192.0.2.10", 50000), ("10.0.0.5", 1883)) == V2_TCP4
    header = parse(encode_v2(("2001:db8::1", 1), ("2001:db8::2", 2)))
    assert header is not None and header.source == ("2001:db8::1", 1)
    assert encode_v2(None, None) == V2_LOCAL
    with pytest.raises(ValueError):
        encode_v2(("1.2.3.4", 1), ("::1", 2))
