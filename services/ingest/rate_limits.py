"""The ingest node's rate limits, pure: token buckets for connections and for each client's
inbound traffic. Times are seconds on a monotonic clock the caller passes in.

Connections (:class:`Admission`): a node refuses a new connection beyond
``max_connections`` open, ``max_connection_rate`` per second, or
``max_connection_rate_per_address`` per second from one IP address; the MQTT reaction is a
CONNACK with the Reason Code (the core's ``handle_connect``).

Inbound traffic (:class:`ClientRate`): a client's PUBLISH packets and bytes per second.
Beyond them the node stops reading from the client until its buckets refill, as TBMQ does,
rather than disconnecting it (v5 DISCONNECT 0x96 Message rate too high): nothing is lost or
refused, v3.1.1 clients (which have no such Reason Code) are treated the same, a burst of a
well-behaved client is only slowed, and the client's own TCP window tells it to wait. The
time paused does not count against its keep alive (``services/ingest/server.py``).
"""

from __future__ import annotations

from services.ingest.limits import Refusal

PRUNE_AT = 10_000
"""Per-address buckets kept before the full (idle) ones are dropped."""


class TokenBucket:
    """``rate`` tokens per second, holding at most ``capacity``; starts full at ``now``.

    :meth:`take` may run into debt (the bytes are already read) and says how long until the
    debt is paid; :meth:`try_take` only takes what is there.
    """

    __slots__ = ("capacity", "rate", "stamp", "tokens")

    def __init__(self, rate: float, capacity: float, now: float) -> None:
        if rate <= 0 or capacity <= 0:
            raise ValueError("a token bucket needs a positive rate and capacity")
        self.rate = rate
        self.capacity = capacity
        self.tokens = capacity
        self.stamp = now

    def _refill(self, now: float) -> None:
        if now > self.stamp:
            self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now

    def take(self, amount: float, now: float) -> float:
        """Take ``amount`` tokens, into debt if need be; the seconds until the bucket is out
        of debt again (0.0 if it is not in debt)."""
        self._refill(now)
        self.tokens -= amount
        return -self.tokens / self.rate if self.tokens < 0 else 0.0

    def try_take(self, amount: float, now: float) -> bool:
        """Take ``amount`` tokens if the bucket holds them; whether it did."""
        self._refill(now)
        if self.tokens < amount:
            return False
        self.tokens -= amount
        return True

    def full(self, now: float) -> bool:
        """Whether the bucket has refilled to its capacity (it then remembers nothing)."""
        self._refill(now)
        return self.tokens >= self.capacity


def _bucket(rate: float, now: float) -> TokenBucket | None:
    """A bucket of ``rate`` per second holding one second's worth (at least 1); None for
    rate 0 (no limit)."""
    return TokenBucket(rate, max(rate, 1.0), now) if rate > 0 else None


class Admission:
    """Which new connections a node accepts, and how many it has open.

    ``max_connections`` open at once; ``rate`` new connections per second per node and
    ``rate_per_address`` per IP address (0: no limit), each a bucket of one second's worth.
    """

    def __init__(self, max_connections: int, rate: float, rate_per_address: float) -> None:
        self.max_connections = max_connections
        self.rate = rate
        self.rate_per_address = rate_per_address
        self.open = 0
        self._node: TokenBucket | None = None
        self._addresses: dict[str, TokenBucket] = {}

    def admit(self, host: str, now: float) -> Refusal | None:
        """Whether a new connection from IP address ``host`` may proceed: None, or the
        limit that refuses it. Counts it against the rates either way; :meth:`opened` and
        :meth:`closed` count the open ones."""
        if self.open >= self.max_connections:
            return Refusal.CONNECTIONS
        if self.rate_per_address > 0:
            bucket = self._addresses.get(host)
            if bucket is None:
                if len(self._addresses) >= PRUNE_AT:
                    self._prune(now)
                bucket = self._addresses[host] = TokenBucket(
                    self.rate_per_address, max(self.rate_per_address, 1.0), now
                )
            if not bucket.try_take(1, now):
                return Refusal.ADDRESS_CONNECTION_RATE
        if self.rate > 0:
            if self._node is None:
                self._node = _bucket(self.rate, now)
            if self._node is not None and not self._node.try_take(1, now):
                return Refusal.CONNECTION_RATE
        return None

    def _prune(self, now: float) -> None:
        """Forget the addresses whose bucket is full again: they have been quiet."""
        for host in [h for h, b in self._addresses.items() if b.full(now)]:
            del self._addresses[host]

    def opened(self) -> None:
        """A connection was opened (refused ones too, until they close)."""
        self.open += 1

    def closed(self) -> None:
        """A connection closed."""
        self.open -= 1


class ClientRate:
    """One client's inbound PUBLISH packets and bytes per second (0: no limit)."""

    __slots__ = ("_bytes", "_messages")

    def __init__(self, messages_per_second: float, bytes_per_second: float, now: float) -> None:
        self._messages = _bucket(messages_per_second, now)
        self._bytes = _bucket(bytes_per_second, now)

    @property
    def limited(self) -> bool:
        """Whether any limit applies."""
        return self._messages is not None or self._bytes is not None

    def take(self, messages: int, nbytes: int, now: float) -> tuple[float, Refusal | None]:
        """Count ``messages`` PUBLISH packets and ``nbytes`` bytes just read: how many
        seconds reading must pause (0.0: none), and the limit that asks for the longer
        pause (None when neither does)."""
        pause, which = 0.0, None
        if self._messages is not None and messages:
            wait = self._messages.take(messages, now)
            if wait > pause:
                pause, which = wait, Refusal.MESSAGE_RATE
        if self._bytes is not None and nbytes:
            wait = self._bytes.take(nbytes, now)
            if wait > pause:
                pause, which = wait, Refusal.BYTE_RATE
        return pause, which
