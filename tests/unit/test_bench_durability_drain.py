"""The durability harness's drain (bench.durability: the chaos run's and the topology
tests' end): an acknowledged message is lost once a later message of the same publisher
arrived without it (MQTT 4.6: nothing comes after a newer one), or when nothing at all has
arrived for the drain's quiet time while a publisher's newest acknowledged message (its
ordering marker) was still due; never merely because a fixed deadline passed while the
backlog still flowed.

The load is built but never started: no client connects, the ledger is fed by hand (a
thread stands in for the subscriber's network thread)."""

from __future__ import annotations

import threading
import time

from bench.durability import DurabilityLoad, Ledger

#: Publisher 0 sends seq 1..20 and each is acknowledged.
SENT = 20


def _load() -> DurabilityLoad:
    load = DurabilityLoad("127.0.0.1", 9, publishers=1, rate=1.0)
    for seq in range(1, SENT + 1):
        load.ledger.published(0, seq, float(seq))
        load.ledger.acknowledged(0, seq, float(seq), ok=True)
    return load


def test_the_markers_are_each_publishers_newest_acknowledged_message() -> None:
    ledger = Ledger()
    for publisher, newest in ((1, 3), (2, 2)):
        for seq in range(1, newest + 1):
            ledger.published(publisher, seq, 0.0)
            ledger.acknowledged(publisher, seq, 0.0, ok=True)
    ledger.published(1, 4, 0.0)
    ledger.acknowledged(1, 4, 0.0, ok=False)  # refused: not a marker
    ledger.delivered(2, 2, 0.0)
    assert ledger.awaited_markers() == {1: 3}
    ledger.delivered(1, 3, 0.0)
    assert ledger.awaited_markers() == {}


def test_a_message_overtaken_by_a_later_one_is_lost_at_once() -> None:
    """Seq 3 never comes, the marker (seq 20) did: lost, decided without waiting out the
    quiet time (the test would hit pytest's timeout if the drain waited for seq 3)."""
    load = _load()
    for seq in range(1, SENT + 1):
        if seq != 3:
            load.ledger.delivered(0, seq, 0.0)
    assert load.drain(3600.0) == 1
    assert load.report().lost_examples == [(0, 3)]


def test_a_backlog_that_still_flows_is_waited_for_past_the_quiet_time() -> None:
    """The backlog arrives one message every 0.1 s over 2 s, twice the 1 s quiet time: a
    slow pass, not a false loss (the drain before this one ended at its fixed deadline with
    half of it 'lost')."""
    load = _load()

    def subscriber() -> None:
        for seq in range(1, SENT + 1):
            time.sleep(0.1)  # the pace of the stand-in subscriber, not a synchronisation
            load.ledger.delivered(0, seq, time.monotonic())

    thread = threading.Thread(target=subscriber)
    thread.start()
    try:
        assert load.drain(1.0) == 0
    finally:
        thread.join()
    assert load.report().lost == 0


def test_a_marker_that_never_comes_ends_the_drain_after_the_quiet_time() -> None:
    load = _load()
    for seq in range(1, 11):
        load.ledger.delivered(0, seq, 0.0)
    assert load.drain(0.2) == SENT - 10
    assert load.ledger.awaited_markers() == {0: SENT}
