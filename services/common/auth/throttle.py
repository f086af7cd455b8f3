"""Counting failed logins per key (a source address, a user name) in a sliding window, and
the bounded thread pool where passwords are hashed: the defences of the admin login
(:mod:`services.admin.login_throttle`) and of MQTT authentication (:mod:`.authenticate`)
against guessing and against storms of wrong passwords.

Both are sans-IO but for the pool's threads: time is a parameter (seconds of a monotonic
clock), so tests drive them without waiting.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class FailureWindow:
    """Failures per key within the last ``window`` seconds.

    Keeps at most ``cap`` failure times per key (counting past ``cap`` tells nothing more:
    every policy of the callers decides at or below it) and at most ``max_keys`` keys, the
    least recently failed dropped first, so memory stays bounded whatever the number of
    addresses or names an attacker uses (dropping a key forgets its failures: the cost of
    that bound). Raises ``ValueError`` for a ``window``, ``cap`` or ``max_keys`` below 1.
    """

    def __init__(self, window: float, cap: int, max_keys: int = 100_000) -> None:
        if window <= 0 or cap < 1 or max_keys < 1:
            raise ValueError("window, cap and max_keys must be positive")
        self.window = window
        self.cap = cap
        self.max_keys = max_keys
        self._failures: OrderedDict[Hashable, deque[float]] = OrderedDict()

    def _recent(self, key: Hashable, now: float) -> deque[float] | None:
        times = self._failures.get(key)
        if times is None:
            return None
        while times and times[0] <= now - self.window:
            times.popleft()
        if not times:
            del self._failures[key]
            return None
        return times

    def count(self, key: Hashable, now: float) -> int:
        """Failures of ``key`` in ``(now - window, now]`` (at most ``cap``)."""
        times = self._recent(key, now)
        return 0 if times is None else len(times)

    def retry_after(self, key: Hashable, limit: int, now: float) -> float:
        """Seconds until ``key`` has fewer than ``limit`` failures in the window (0.0 if it
        has already). ``limit`` is at most ``cap``."""
        times = self._recent(key, now)
        if times is None or len(times) < limit:
            return 0.0
        # The failure that must leave the window: the limit-th newest.
        return max(0.0, times[len(times) - limit] + self.window - now)

    def failed(self, key: Hashable, now: float) -> int:
        """Count one failure of ``key`` at ``now``; its failures in the window after it."""
        times = self._recent(key, now)
        if times is None:
            times = self._failures[key] = deque(maxlen=self.cap)
            while len(self._failures) > self.max_keys:
                self._failures.popitem(last=False)
        else:
            self._failures.move_to_end(key)
        times.append(now)
        return len(times)

    def forget(self, key: Hashable) -> None:
        """Drop ``key``'s failures (a user name that just proved its password)."""
        self._failures.pop(key, None)

    def __len__(self) -> int:
        """Keys with failures kept (some may have expired since)."""
        return len(self._failures)


class PoolBusy(Exception):
    """The hashing pool has ``max_pending`` checks already: refuse this one (MQTT 0x89
    Server busy, HTTP 503)."""


class SourceBusy(Exception):
    """The source address has its whole share of the hashing pool already: refuse this one
    (MQTT 0x9F Connection rate exceeded, HTTP 429)."""


class HashingPool:
    """Threads that hash or verify passwords (argon2id: tens of ms of a core each; argon2-cffi
    releases the GIL meanwhile), off the event loop.

    ``workers`` threads; at most ``max_pending`` checks queued or running in all, and at
    most ``max_pending_per_source`` of them for one source (a client's IP address), so one
    address sending wrong passwords as fast as it can holds a bounded share of the queue
    and the others' checks are still taken. :attr:`pending` counts the checks in the pool.
    """

    def __init__(
        self, workers: int, max_pending: int, max_pending_per_source: int, name: str
    ) -> None:
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix=name)
        self.max_pending = max_pending
        self.max_pending_per_source = max_pending_per_source
        self.pending = 0
        self._by_source: dict[str, int] = {}

    def admits(self, source: str | None) -> None:
        """Raise :class:`PoolBusy` or :class:`SourceBusy` if a check for ``source`` would
        be refused now."""
        if self.pending >= self.max_pending:
            raise PoolBusy()
        if source is not None and self._by_source.get(source, 0) >= self.max_pending_per_source:
            raise SourceBusy()

    async def run(self, source: str | None, check: Callable[[], T]) -> T:
        """``check()``'s result, computed in a pool thread for ``source`` (None: counted in
        the pool only). Raises :class:`PoolBusy` or :class:`SourceBusy` (see
        :meth:`admits`) without running it, or what ``check`` raises."""
        self.admits(source)
        self.pending += 1
        if source is not None:
            self._by_source[source] = self._by_source.get(source, 0) + 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, check)
        finally:
            self.pending -= 1
            if source is not None:
                left = self._by_source[source] - 1
                if left:
                    self._by_source[source] = left
                else:
                    del self._by_source[source]

    def close(self) -> None:
        """Stop the threads (waiting for none; queued checks are cancelled)."""
        self._executor.shutdown(wait=False, cancel_futures=True)
