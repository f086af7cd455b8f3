"""When traffic resumed after a disruption, measured over event timelines.

Every function takes times in seconds on one clock (``time.monotonic()`` of the process that
recorded them). A timeline is a sequence of ``(started_at, completed_at)`` pairs: a message's
publication and its delivery, or a PUBLISH and its PUBACK. "Resumed" means the first
completion of something *started* at or after the moment that matters: a message that was
waiting in Kafka during an outage and arrives later says nothing about new traffic flowing.

Used by the chaos run (``python -m bench chaos``) and the topology tests; shareable with any
benchmark that measures a disruption.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

Timeline = Iterable[tuple[float, float]]
"""``(started_at, completed_at)`` pairs, seconds on one clock, in any order."""


def first_completion(timeline: Timeline, since: float) -> float | None:
    """The earliest ``completed_at`` of the pairs started at or after ``since`` (None: none)."""
    times = [done for started, done in timeline if started >= since]
    return min(times) if times else None


def resume_seconds(timeline: Timeline, since: float) -> float | None:
    """Seconds from ``since`` to the first completion of something started at or after it:
    how long after ``since`` new traffic got through (None: it never did)."""
    first = first_completion(timeline, since)
    return None if first is None else first - since


def all_resumed_seconds(timelines: Sequence[Timeline], since: float) -> float | None:
    """Seconds from ``since`` until every one of ``timelines`` (one per client, say) has
    completed something started at or after ``since``; None if one never did."""
    times = [first_completion(timeline, since) for timeline in timelines]
    if not times or any(t is None for t in times):
        return None
    return max(t for t in times if t is not None) - since


def longest_gap(times: Iterable[float], start: float, end: float) -> float:
    """The longest interval within ``[start, end]`` without any of ``times`` (seconds)."""
    inside = sorted(t for t in times if start <= t <= end)
    edges = [start, *inside, end]
    return max((b - a for a, b in itertools.pairwise(edges)), default=0.0)
