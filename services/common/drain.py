"""An ingest node's drain: how fast it sends its clients away, and how long that takes.

One source for the node (:mod:`services.ingest.shutdown`), the local cluster (how long
``cormorant down`` waits for an ingest node) and the deployment (``infra/``: ECS's
``stopTimeout`` of the ingest task, the NLB's deregistration delay and health check).

A drain (SIGTERM, or ``cormorant drain``): the node's ``/ready`` fails and its listeners
close at once; after ``drain_notice_seconds`` (the load balancer has taken the node out
of rotation by then, so reconnects go to the other nodes) it disconnects its clients at
``drain_rate`` per second, or faster if that would take longer than ``drain_seconds``;
then (SIGTERM) it stores the last records, for at most :data:`SHUTDOWN_FLUSH_SECONDS`,
and exits. docs/operations/drain.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from services.common.settings import Settings

#: Seconds a node's shutdown waits for its last records (end records, wills) to be stored.
SHUTDOWN_FLUSH_SECONDS = 10.0

#: Seconds between two batches of disconnects: ten batches a second keep the reconnect
#: rate even without a wake-up per client.
BATCH_INTERVAL_SECONDS = 0.1

#: Seconds allowed on top of the drain's own for the process to start stopping and exit
#: (Faust's worker stopping its other services after the drain).
EXIT_MARGIN_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class DrainPace:
    """The pace of one drain of ``clients`` connections: ``rate`` per second at least
    (> 0), all of them within ``window`` seconds (0: all at once)."""

    clients: int
    rate: float
    window: float

    @property
    def effective_rate(self) -> float:
        """Disconnects per second: ``rate``, or ``clients / window`` if that is more
        (the window is what the runtime waits before it kills the process)."""
        if self.window <= 0:
            return math.inf
        return max(self.rate, self.clients / self.window)

    @property
    def seconds(self) -> float:
        """How long the drain takes at :attr:`effective_rate` (at most ``window``)."""
        rate = self.effective_rate
        return 0.0 if math.isinf(rate) else self.clients / rate

    def due(self, elapsed: float) -> int:
        """How many clients should have been disconnected ``elapsed`` seconds into the
        drain: one at once, then :attr:`effective_rate` per second; all from ``window``
        on."""
        if elapsed >= self.window or math.isinf(self.effective_rate):
            return self.clients
        return min(self.clients, 1 + math.floor(self.effective_rate * max(0.0, elapsed)))


@dataclass(frozen=True, slots=True)
class DrainTiming:
    """A drain's time budget, in seconds: ``notice`` (``drain_notice_seconds``),
    ``window`` (``drain_seconds``)."""

    notice: float
    window: float

    @classmethod
    def of(cls, settings: Settings) -> DrainTiming:
        """The timing ``settings`` give an ingest node."""
        return cls(settings.drain_notice_seconds, settings.drain_seconds)

    @property
    def stop_seconds(self) -> int:
        """The longest a node takes from SIGTERM to exit (notice, window, the last
        records' flush, :data:`EXIT_MARGIN_SECONDS`), rounded up: what whoever sends the
        SIGTERM must wait before a SIGKILL (ECS's ``stopTimeout``, ``cormorant down``)."""
        return math.ceil(self.notice + self.window + SHUTDOWN_FLUSH_SECONDS + EXIT_MARGIN_SECONDS)


DEFAULT_TIMING = DrainTiming(
    Settings.model_fields["drain_notice_seconds"].default,
    Settings.model_fields["drain_seconds"].default,
)
"""The timing of the settings' defaults (what a deployment runs unless it sets them)."""
