"""Pure accounting: percentiles, per-publisher sequence tracking, medians.

No I/O here; everything is unit-tested in ``tests/unit/test_bench_stats.py``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


def percentile(sorted_values: Sequence[float], pct: float) -> float | None:
    """Nearest-rank percentile ``pct`` (0 < pct <= 100) of ascending ``sorted_values``.

    Returns None for an empty sequence. Units are those of the values.

    Raises:
        ValueError: ``pct`` outside (0, 100].
    """
    if not 0 < pct <= 100:
        raise ValueError(f"percentile must be in (0, 100], got {pct}")
    if not sorted_values:
        return None
    rank = math.ceil(pct / 100 * len(sorted_values))
    return sorted_values[max(rank, 1) - 1]


def latency_summary_ms(samples_ns: Iterable[int]) -> dict[str, float | None]:
    """p50, p95, p99 and max of latencies given in nanoseconds, in milliseconds.

    Every key is present; the values are None when there are no samples.
    """
    ordered = sorted(samples_ns)
    out: dict[str, float | None] = {}
    for name, pct in (("p50", 50.0), ("p95", 95.0), ("p99", 99.0), ("max", 100.0)):
        value = percentile(ordered, pct)
        out[name] = None if value is None else value / 1e6
    return out


def median(values: Iterable[float | None]) -> float | None:
    """Median of the values that are not None (mean of the middle two); None if none are."""
    ordered = sorted(v for v in values if v is not None)
    if not ordered:
        return None
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2


@dataclass(slots=True)
class _Stream:
    """What one subscriber received from one publisher."""

    seen: bytearray = field(default_factory=bytearray)  # bit per sequence number
    distinct: int = 0
    duplicates: int = 0
    reordered: int = 0
    last: int = 0


class SeqTracker:
    """Per-publisher sequence accounting of one subscriber.

    ``add`` records one received message. A duplicate is a sequence number received
    before; a reordering is a new sequence number lower than one already received from the
    same publisher (MQTT keeps per-publisher order for one subscription, 4.6).
    """

    __slots__ = ("_streams",)

    def __init__(self) -> None:
        """Start with nothing received."""
        self._streams: dict[int, _Stream] = {}

    def add(self, publisher_id: int, seq: int) -> bool:
        """Record ``seq`` (>= 1) from ``publisher_id``; True if it is new, False if a duplicate."""
        stream = self._streams.get(publisher_id)
        if stream is None:
            stream = self._streams[publisher_id] = _Stream()
        byte, bit = divmod(seq, 8)
        seen = stream.seen
        if byte >= len(seen):
            seen.extend(bytes(max(byte + 1 - len(seen), len(seen))))
        mask = 1 << bit
        if seen[byte] & mask:
            stream.duplicates += 1
            return False
        seen[byte] |= mask
        stream.distinct += 1
        if seq < stream.last:
            stream.reordered += 1
        else:
            stream.last = seq
        return True

    def distinct(self) -> dict[int, int]:
        """Publisher id → number of distinct sequence numbers received."""
        return {pid: s.distinct for pid, s in self._streams.items()}

    @property
    def duplicates(self) -> int:
        """Messages received again, over all publishers."""
        return sum(s.duplicates for s in self._streams.values())

    @property
    def reordered(self) -> int:
        """Messages received after a higher sequence number of the same publisher."""
        return sum(s.reordered for s in self._streams.values())


def lost(sent: dict[int, int], expected: Iterable[int], distinct: dict[int, int]) -> int:
    """Messages one subscriber should have had but did not receive.

    ``sent``: publisher id → messages it sent (numbered 1..n); ``expected``: the publisher
    ids whose messages match the subscriber; ``distinct``: publisher id → distinct messages
    the subscriber received (``SeqTracker.distinct``).
    """
    return sum(max(sent.get(pid, 0) - distinct.get(pid, 0), 0) for pid in expected)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator``, or None when either is missing or the denominator is 0."""
    if numerator is None or not denominator:
        return None
    return numerator / denominator
