"""The PROXY protocol header, versions 1 and 2 (HAProxy's specification), sans-IO.

A load balancer in TCP mode (HAProxy ``send-proxy-v2``, an AWS NLB target group with
``proxy_protocol_v2``) opens each connection to a node with one header naming the client's
real address and port, before any byte of the client's own (before the TLS handshake too).
:func:`parse` reads it from the bytes received so far; :func:`wanted` says how many more may
be read from the socket without reading past it, so the bytes that follow the header (a TLS
ClientHello) stay in the socket for the TLS layer.

Version 1 is one text line (``PROXY TCP4 <src> <dst> <sport> <dport>\\r\\n``, at most 107
bytes); version 2 is binary: a 12-byte signature, version and command, address family and
transport, a 2-byte length, the addresses, then TLVs (read past, not used). A ``LOCAL``
(v2) or ``UNKNOWN`` (v1) header is the balancer's own connection (a health check): it names
no client, and the socket's peer is the client. Chosen over the ``proxy-protocol`` package
(PyPI): that one reads from asyncio streams, while a listener here must read the header
off the socket exactly and hand the rest to TLS; its last release was in April 2024.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
"""The 12 bytes every version 2 header starts with."""

V1_PREFIX = b"PROXY "
V1_MAX_LENGTH = 107
"""The longest version 1 line, CRLF included (the specification's section 2.1)."""

V2_MAX_LENGTH = 16 + 2048
"""The longest version 2 header accepted: the 16 fixed bytes and 2 KiB of addresses and TLVs
(an NLB's TLVs are tens of bytes; the format allows 64 KiB, which nobody needs)."""

_V2_FIXED = 16
_INET = struct.Struct("!4s4sHH")
_INET6 = struct.Struct("!16s16sHH")


class ProxyProtocolError(ValueError):
    """The bytes are not a valid PROXY protocol header (the connection must be closed)."""


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    """A parsed header.

    ``version`` is 1 or 2; ``source`` and ``destination`` are ``(host, port)`` of the client
    and of the address it connected to, or None for a ``LOCAL``/``UNKNOWN`` header (the
    socket's own peer is then the client); ``length`` is how many bytes the header took.
    """

    version: int
    source: tuple[str, int] | None
    destination: tuple[str, int] | None
    length: int


def wanted(data: bytes) -> int:
    """How many bytes may be read next without reading past the header that ``data`` (the
    bytes received so far) starts; 0 once the header is complete.

    Raises :class:`ProxyProtocolError` as soon as ``data`` cannot start a header.
    """
    _check_start(data)
    if len(data) < len(V1_PREFIX):
        # Both versions are longer than this (v1 "PROXY UNKNOWN\r\n" is the shortest: 15).
        return len(V1_PREFIX) - len(data)
    if data.startswith(V1_PREFIX):
        end = data.find(b"\r\n")
        if end >= 0:
            return 0
        if len(data) >= V1_MAX_LENGTH:
            raise ProxyProtocolError("PROXY v1 line longer than 107 bytes")
        # The line ends with CRLF: two more bytes are always safe, one after a CR.
        return 1 if data.endswith(b"\r") else 2
    if len(data) < _V2_FIXED:
        return _V2_FIXED - len(data)
    total = _V2_FIXED + int.from_bytes(data[14:16], "big")
    if total > V2_MAX_LENGTH:
        raise ProxyProtocolError(f"PROXY v2 header of {total} bytes is too long")
    return max(total - len(data), 0)


def parse(data: bytes) -> ProxyHeader | None:
    """The header at the start of ``data``, or None if more bytes are needed.

    Raises :class:`ProxyProtocolError` for anything that is not a valid version 1 or 2
    header (no header at all included: a listener that requires one closes the connection).
    """
    if wanted(data):
        return None
    if data.startswith(V1_PREFIX):
        return _parse_v1(data)
    return _parse_v2(data)


def _check_start(data: bytes) -> None:
    head = data[: len(V2_SIGNATURE)]
    if not (V2_SIGNATURE.startswith(head) or V1_PREFIX.startswith(data[: len(V1_PREFIX)])):
        raise ProxyProtocolError("no PROXY protocol header")


def _parse_v1(data: bytes) -> ProxyHeader:
    end = data.index(b"\r\n") + 2
    try:
        line = data[: end - 2].decode("ascii")
    except UnicodeDecodeError:
        raise ProxyProtocolError("PROXY v1 line is not ASCII") from None
    fields = line.split(" ")
    if len(fields) >= 2 and fields[1] == "UNKNOWN":
        return ProxyHeader(1, None, None, end)
    if len(fields) != 6 or fields[1] not in ("TCP4", "TCP6"):
        raise ProxyProtocolError(f"malformed PROXY v1 line {line[:V1_MAX_LENGTH]!r}")
    version = 4 if fields[1] == "TCP4" else 6
    source = (_address(fields[2], version), _port(fields[4]))
    destination = (_address(fields[3], version), _port(fields[5]))
    return ProxyHeader(1, source, destination, end)


def _address(text: str, version: int) -> str:
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        raise ProxyProtocolError(f"PROXY v1: {text!r} is not an IP address") from None
    if address.version != version or str(address) != text.lower():
        raise ProxyProtocolError(f"PROXY v1: {text!r} is not a canonical IPv{version} address")
    return str(address)


def _port(text: str) -> int:
    if not text.isdigit() or (len(text) > 1 and text[0] == "0") or int(text) > 65535:
        raise ProxyProtocolError(f"PROXY v1: {text!r} is not a port")
    return int(text)


def _parse_v2(data: bytes) -> ProxyHeader:
    if not data.startswith(V2_SIGNATURE):
        raise ProxyProtocolError("no PROXY protocol header")
    version, command = data[12] >> 4, data[12] & 0x0F
    if version != 2:
        raise ProxyProtocolError(f"PROXY v2: unsupported version {version}")
    length = _V2_FIXED + int.from_bytes(data[14:16], "big")
    if command == 0x0:  # LOCAL: the balancer's own connection; the addresses are ignored
        return ProxyHeader(2, None, None, length)
    if command != 0x1:
        raise ProxyProtocolError(f"PROXY v2: unknown command {command}")
    family, transport = data[13] >> 4, data[13] & 0x0F
    body = data[_V2_FIXED:length]
    if family == 0x0:  # UNSPEC: the sender does not know the addresses
        return ProxyHeader(2, None, None, length)
    if transport not in (0x1, 0x2):
        raise ProxyProtocolError(f"PROXY v2: unknown transport {transport}")
    if family == 0x1:
        layout = _INET
    elif family == 0x2:
        layout = _INET6
    elif family == 0x3:  # AF_UNIX: no network address to report
        return ProxyHeader(2, None, None, length)
    else:
        raise ProxyProtocolError(f"PROXY v2: unknown address family {family}")
    if len(body) < layout.size:
        raise ProxyProtocolError("PROXY v2: address block shorter than its family needs")
    src, dst, sport, dport = layout.unpack_from(body)
    return ProxyHeader(
        2,
        (str(ipaddress.ip_address(src)), sport),
        (str(ipaddress.ip_address(dst)), dport),
        length,
    )


def encode_v2(source: tuple[str, int] | None, destination: tuple[str, int] | None) -> bytes:
    """A version 2 header (PROXY command, TCP) for ``source`` → ``destination``, or a LOCAL
    one when either is None. For tests and tools that stand in for a load balancer."""
    if source is None or destination is None:
        return V2_SIGNATURE + bytes([0x20, 0x00, 0x00, 0x00])
    src, dst = ipaddress.ip_address(source[0]), ipaddress.ip_address(destination[0])
    if src.version != dst.version:
        raise ValueError("source and destination must be of one IP version")
    family, layout = (0x11, _INET) if src.version == 4 else (0x21, _INET6)
    body = layout.pack(src.packed, dst.packed, source[1], destination[1])
    return V2_SIGNATURE + bytes([0x21, family]) + len(body).to_bytes(2, "big") + body
