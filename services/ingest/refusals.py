"""What an ingest node refused, counted in one place, and logged once per client per minute.

Every refusal (:class:`~services.ingest.limits.Refusal`: a limit or a failed handshake)
adds one to the node's counter of its kind, whatever the client; the log gets at most one
line per kind and client (its client id, or its IP address before CONNECT) per
:data:`LOG_INTERVAL` seconds, saying how many more there were since, so a client hammering
a limit cannot flood the log. The counters are ``cormorant_mqtt_refusals_total{limit}``
(:func:`services.common.metrics.mqtt_families`).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable

from services.ingest.limits import Refusal

log = logging.getLogger(__name__)

LOG_INTERVAL = 60.0
"""Seconds between two log lines about one kind of refusal of one client."""

MAX_REMEMBERED = 10_000
"""(kind, client) pairs remembered for the log before the stale ones are dropped."""


class Refusals:
    """The node's refusal counters (:attr:`counts`, by kind) and their throttled log.

    ``clock`` returns seconds (monotonic); tests pass their own.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        # Every kind from 0: a limit that never refused anything shows as 0, not as no data.
        self.counts: Counter[Refusal] = Counter(dict.fromkeys(Refusal, 0))
        self._clock = clock
        # (kind, client) → (when it was last logged, refusals since then not logged)
        self._logged: dict[tuple[Refusal, str], tuple[float, int]] = {}

    def note(self, refusal: Refusal, who: str, detail: str) -> None:
        """Count one ``refusal`` of client ``who`` (client id, or IP address); log it unless
        this client's refusals of this kind were logged less than a minute ago."""
        self.counts[refusal] += 1
        now = self._clock()
        key = (refusal, who)
        last = self._logged.get(key)
        if last is not None and now - last[0] < LOG_INTERVAL:
            self._logged[key] = (last[0], last[1] + 1)
            return
        if last is None and len(self._logged) >= MAX_REMEMBERED:
            self._forget(now)
        more = f" ({last[1]} more in the last minute)" if last is not None and last[1] else ""
        log.warning("refused %s: %s: %s%s", who or "?", refusal.value, detail, more)
        self._logged[key] = (now, 0)

    def _forget(self, now: float) -> None:
        for key in [k for k, (t, _) in self._logged.items() if now - t >= LOG_INTERVAL]:
            del self._logged[key]
