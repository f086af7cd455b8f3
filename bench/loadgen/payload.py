"""The benchmark payload: publisher id, sequence number and send time, zero-padded.

Layout (network byte order): publisher id (uint32), sequence number (uint64), send time
(uint64, nanoseconds since the Unix epoch from ``time.time_ns()``: a wall clock, so that a
sender and a receiver in different processes agree), then zero bytes up to the size.
Sequence number 0 marks a route probe (sent before the measured traffic); measured messages
are numbered from 1 per publisher.
"""

from __future__ import annotations

import struct
from typing import Final

HEADER: Final = struct.Struct("!IQQ")

#: Smallest payload, in bytes: the header alone.
MIN_SIZE: Final = HEADER.size

#: Sequence number of a route probe.
PROBE_SEQ: Final = 0


def padding(size: int) -> bytes:
    """The zero bytes that follow the header in a payload of ``size`` bytes.

    Raises:
        ValueError: ``size`` is below ``MIN_SIZE``.
    """
    if size < MIN_SIZE:
        raise ValueError(f"payload size must be at least {MIN_SIZE} bytes, got {size}")
    return bytes(size - MIN_SIZE)


def decode(buf: bytes | bytearray | memoryview, offset: int = 0) -> tuple[int, int, int]:
    """``(publisher_id, seq, sent_ns)`` of the payload starting at ``buf[offset]``.

    Raises:
        struct.error: fewer than ``MIN_SIZE`` bytes from ``offset``.
    """
    publisher_id, seq, sent_ns = HEADER.unpack_from(buf, offset)
    return publisher_id, seq, sent_ns
