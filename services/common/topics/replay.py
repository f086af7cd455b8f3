"""Replay subscriptions: ``$replay/<since>/<topic filter>`` (a Cormorant extension).

A client subscribing to ``$replay/<since>/<filter>`` subscribes to ``<filter>`` and first
gets every message published to matching topics since ``<since>``, read from ``msg.all``
(which keeps every accepted message for ``msg_retention_seconds``), then the live ones
(docs/concepts/replay.md). The prefix is a ``$`` topic, which MQTT leaves to the server
(MQTT 5.0 4.7.2): no client publishes to it.

``<since>`` is either a duration back from now, a positive whole number followed by ``s``,
``m``, ``h`` or ``d`` (``15m``, ``6h``, ``2d``), or an RFC 3339 date-time with its offset
(``2026-11-27T05:00:00Z``, ``2026-11-27T00:00:00-05:00``; a ``+hh:mm`` offset cannot be
sent: ``+`` is a wildcard in a Topic Filter, MQTT 4.7.1.3, and such a filter is refused as
invalid before it is parsed here).

This module only parses: who may replay what, and over how long, is decided by the ingest
node's core (:mod:`services.ingest.handle_subscribe`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from services.common.mqtt.errors import TopicFilterInvalid
from services.common.topics.validation import SHARE_PREFIX, validate_topic_filter

REPLAY_PREFIX = "$replay/"
"""Prefix of a replay subscription's Topic Filter; case-sensitive, like ``$share/``."""

_DURATION = re.compile(r"([1-9][0-9]{0,9})([smhd])")
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
# RFC 3339 section 5.6: full-date "T" full-time, the offset mandatory ("Z" or +hh:mm).
_RFC3339 = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})"
)


@dataclass(frozen=True, slots=True)
class ReplayFilter:
    """The parts of a ``$replay/<since>/<filter>`` Topic Filter.

    Attributes:
        since: ``<since>`` as sent (a duration or an RFC 3339 date-time, unchecked here:
            :func:`since_ms` checks it against a clock).
        topic_filter: the Topic Filter the client subscribes to, a valid non-shared one.
    """

    since: str
    topic_filter: str


def parse_replay(topic_filter: str) -> ReplayFilter | None:
    """Split ``$replay/<since>/<filter>``.

    Returns None when ``topic_filter`` does not start with ``$replay/`` (not a replay).

    Raises:
        TopicFilterInvalid (0x8F): nothing after ``<since>``, an inner filter that is not a
            valid Topic Filter (MQTT 4.7), or a Shared Subscription inside a replay
            (``$replay/1h/$share/g/t``: a replay is one subscriber's history, MQTT 4.8.2's
            groups share live load). The caller checks ``<since>`` with :func:`since_ms`.
    """
    if not topic_filter.startswith(REPLAY_PREFIX):
        return None
    since, slash, inner = topic_filter[len(REPLAY_PREFIX) :].partition("/")
    if not slash or not inner:
        raise TopicFilterInvalid(f"no Topic Filter after $replay/<since>/: {topic_filter!r}")
    if inner.startswith(SHARE_PREFIX):
        raise TopicFilterInvalid(f"a replay cannot be a Shared Subscription: {topic_filter!r}")
    validate_topic_filter(inner)
    return ReplayFilter(since, inner)


def since_ms(since: str, now_ms: int) -> int:
    """When a replay starts: ``since`` (a duration back from ``now_ms`` or an RFC 3339
    date-time) as Unix milliseconds.

    Raises:
        TopicFilterInvalid (0x8F): ``since`` is neither a positive duration (``15m``) nor
            an RFC 3339 date-time with an offset, or it lies after ``now_ms``.
    """
    duration = _DURATION.fullmatch(since)
    if duration is not None:
        return now_ms - int(duration.group(1)) * _UNIT_MS[duration.group(2)]
    if _RFC3339.fullmatch(since) is None:
        raise TopicFilterInvalid(
            f"$replay: {since!r} is neither a duration (15m, 6h, 2d) nor an RFC 3339 time"
        )
    try:
        at = datetime.fromisoformat(since.upper().replace("Z", "+00:00"))
    except ValueError as exc:  # 2026-13-40T...: the shape is right, the date is not
        raise TopicFilterInvalid(f"$replay: {since!r} is not a valid date-time") from exc
    start = int(at.timestamp() * 1000)
    if start > now_ms:
        raise TopicFilterInvalid(f"$replay: {since!r} is in the future")
    return start
