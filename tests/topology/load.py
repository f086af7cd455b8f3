"""The load every production-topology test runs under, and the checks after it.

:class:`bench.durability.DurabilityLoad` (paho-mqtt QoS 1 publishers and a persistent
subscriber, through HAProxy), lighter than the chaos run's default: the tests are about
what is lost and in which order, not about throughput.
"""

from __future__ import annotations

import time

from bench import chaos, resumption
from bench.durability import DurabilityLoad, Report
from tests.e2e.clients import HOST
from tests.servers import LocalCluster
from tests.waiting import wait_until

#: Publishers and their total rate (msg/s) in these tests.
PUBLISHERS = 10
RATE = 200.0

#: Seconds new traffic may take to flow again after a disruption: the chaos run's liveness
#: bound (its reasons there; the aims, 12 s after a failover and 3 s after a stage is back,
#: are what the chaos report holds each round to, docs/guarantees/production-failover.md).
RESUME_BOUND = chaos.RESUME_BOUND

#: At the end of a test: seconds the last PUBACKs may take, then seconds without any
#: delivery before the wait for each publisher's last acknowledged message (its ordering
#: marker, :meth:`bench.durability.Ledger.drain`) gives up.
DRAIN = 120.0


def load(cluster: LocalCluster, rate: float = RATE) -> DurabilityLoad:
    """The test load against ``cluster``'s HAProxy, ``rate`` msg/s in all (not started: use
    it as a context)."""
    return DurabilityLoad(HOST, cluster.mqtt_port, publishers=PUBLISHERS, rate=rate)


def wait_for_traffic(running: DurabilityLoad, messages: int = 400) -> None:
    """Wait until ``messages`` messages were delivered: the load is in full flow."""
    wait_until(lambda: running.ledger.report().delivered >= messages, "traffic", RESUME_BOUND)


def wait_for_delivery_since(running: DurabilityLoad, since: float) -> float:
    """Wait until a message published at or after ``since`` (monotonic seconds) was
    delivered; return how long after ``since`` that was."""
    wait_until(
        lambda: running.ledger.resumed_at(since) is not None,
        "a delivery of a message published after the disruption",
        RESUME_BOUND,
    )
    resumed = running.ledger.resumed_at(since)
    assert resumed is not None
    return resumed - since


def wait_for_publishing_since(running: DurabilityLoad, since: float) -> float:
    """Wait until every publisher had a message published at or after ``since``
    acknowledged; return how long after ``since`` the last of them was."""

    def resumed() -> float | None:
        running.report()  # matches the PUBACKs that came to their messages
        return resumption.all_resumed_seconds(list(running.ledger.ack_timelines().values()), since)

    wait_until(lambda: resumed() is not None, "every publisher acknowledged again", RESUME_BOUND)
    seconds = resumed()
    assert seconds is not None
    return seconds


def finish(running: DurabilityLoad) -> Report:
    """Stop publishing, wait for every PUBACK, then for each publisher's ordering marker
    (lost: what a later message of its publisher overtook, or what never came while
    deliveries had stopped); the report."""
    assert running.stop_publishing(DRAIN) == 0, "PUBLISHes never acknowledged"
    running.drain(DRAIN)
    return running.report()


def note(what: str, seconds: float) -> None:
    """Print a measured figure (shown with ``pytest -rA`` / ``-s``)."""
    print(f"{what}: {seconds:.1f} s ({time.strftime('%H:%M:%S')})")
