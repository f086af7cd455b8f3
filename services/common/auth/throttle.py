"""Counting failed logins per key (a source address, a user name) in a sliding window, and
the bounded thread pool where passwords are hashed: the defences of the admin login
(:mod:`services.admin.login_throttle`) and of MQTT authentication (:mod:`.authenticate`)
against guessing and against storms of wrong passwords.

Both are sans-IO but for the pool's threads: time is a parameter (seconds of a monotonic
clock), so tests drive them without waiting.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from services.common.settings import Settings

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


@dataclass(frozen=True, slots=True)
class Verdict:
    """What :meth:`AuthThrottle.verdict` says of a CONNECT: refuse it at once with the MQTT 5
    Reason Code ``refuse`` (None: go on), after ``delay`` seconds (0: none); ``reason`` is
    for the log and client.events."""

    refuse: int | None = None
    delay: float = 0.0
    reason: str = ""


class AuthThrottle:
    """Authentication failures of MQTT clients, per source address and per User Name, in a
    sliding window of ``window`` seconds, and what they cost the next CONNECT:

    - from ``delay_after`` failures (of its address or its User Name, whichever has more) a
      delay before anything is checked: ``delay`` seconds, doubled per further failure, at
      most ``max_delay``;
    - from ``limit`` failures: refused at once with 0x9F Connection rate exceeded (MQTT 5.0
      3.2.2.2; v3.1.1: return code 0x03 Server unavailable), nothing checked; such refused
      attempts count against the address as failures;
    - from ``ban_after`` failures of an address: it is banned for ``ban_seconds``, every
      CONNECT refused with 0x8A Banned (v3.1.1: 0x05 Not authorized).

    A User Name that authenticates has its failures forgotten; an address keeps them (one
    valid credential must not launder another's guesses). ``max_keys`` bounds the addresses
    and names remembered (see :class:`FailureWindow`). Addresses in the ``exempt``
    networks are neither counted nor throttled (their User Names are). Raises
    ``ValueError`` for bounds below 1 or a network that is not one. Times are seconds of a
    monotonic clock.
    """

    def __init__(
        self,
        *,
        window: float,
        delay_after: int,
        delay: float,
        max_delay: float,
        limit: int,
        ban_after: int,
        ban_seconds: float,
        max_keys: int = 100_000,
        exempt: Sequence[str] = (),
    ) -> None:
        self.exempt = [ipaddress.ip_network(network) for network in exempt]
        self.failures = FailureWindow(window, max(limit, ban_after, delay_after, 1), max_keys)
        self.delay_after = delay_after
        self.delay = delay
        self.max_delay = max_delay
        self.limit = limit
        self.ban_after = ban_after
        self.ban_seconds = ban_seconds
        self.max_keys = max_keys
        self._banned: OrderedDict[str, float] = OrderedDict()

    @classmethod
    def from_settings(cls, settings: Settings) -> AuthThrottle:
        """The throttle the ``auth_failure_*`` settings describe: the one every place that
        checks MQTT credentials uses (ingest nodes, the HTTP publish API)."""
        return cls(
            window=settings.auth_failure_window_seconds,
            delay_after=settings.auth_failure_delay_after,
            delay=settings.auth_failure_delay_seconds,
            max_delay=settings.auth_failure_max_delay_seconds,
            limit=settings.auth_failure_limit,
            ban_after=settings.auth_failure_ban_after,
            ban_seconds=settings.auth_failure_ban_seconds,
            exempt=settings.auth_failure_exempt_networks,
        )

    def verdict(self, address: str | None, username: str | None, now: float) -> Verdict:
        """What to do with a CONNECT from ``address`` presenting ``username`` (either may
        be None: not known, not presented)."""
        address = self._counted(address)
        if address is not None:
            until = self._banned.get(address)
            if until is not None:
                if until > now:
                    return Verdict(0x8A, reason=f"address banned for {until - now:.0f} s more")
                del self._banned[address]
        by_address = 0 if address is None else self.failures.count(("address", address), now)
        by_user = 0 if username is None else self.failures.count(("user", username), now)
        if by_address >= self.limit or by_user >= self.limit:
            if address is not None:
                self._failed_address(address, now)
            which = "address" if by_address >= self.limit else "user name"
            return Verdict(0x9F, reason=f"too many authentication failures of this {which}")
        worst = max(by_address, by_user)
        if worst < self.delay_after or worst == 0:
            return Verdict()
        delay = min(self.max_delay, self.delay * 2.0 ** (worst - self.delay_after))
        return Verdict(delay=delay, reason=f"{worst} recent authentication failures")

    def failed(self, address: str | None, username: str | None, now: float) -> None:
        """Count an authentication failure of ``address`` and ``username``."""
        address = self._counted(address)
        if username is not None:
            self.failures.failed(("user", username), now)
        if address is not None:
            self._failed_address(address, now)

    def _counted(self, address: str | None) -> str | None:
        """``address``, or None if it is exempt (or not an IP address)."""
        if address is None or not self.exempt:
            return address
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return address
        return None if any(ip in network for network in self.exempt) else address

    def _failed_address(self, address: str, now: float) -> None:
        if self.failures.failed(("address", address), now) >= self.ban_after:
            self._banned[address] = now + self.ban_seconds
            self._banned.move_to_end(address)
            while len(self._banned) > self.max_keys:
                self._banned.popitem(last=False)
            self.failures.forget(("address", address))

    def succeeded(self, username: str | None) -> None:
        """``username`` authenticated: its failures are forgotten."""
        if username is not None:
            self.failures.forget(("user", username))
