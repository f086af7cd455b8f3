"""The chaos run's per-round accounting (bench.durability.Ledger.report over a window of
publication times) and the production rounds."""

from __future__ import annotations

from bench import chaos
from bench.durability import Ledger
from services.local import kafka, redis


def _ledger() -> Ledger:
    """Publisher 1 publishes seq 1..6 at t = 1..6; every one is acknowledged. Delivered: 1,
    2, 2 again (a duplicate), 5, 4 (after a newer one: reordered); 3 and 6 never."""
    ledger = Ledger()
    for seq in range(1, 7):
        ledger.published(1, seq, float(seq))
        ledger.acknowledged(1, seq, float(seq) + 0.1, ok=True)
    for at, seq in enumerate([1, 2, 2, 5, 4], start=10):
        ledger.delivered(1, seq, float(at))
    return ledger


def test_the_whole_run_counts_every_message() -> None:
    report = _ledger().report()
    assert (report.acknowledged, report.delivered) == (6, 4)
    assert (report.lost, report.duplicates, report.reordered) == (2, 1, 1)
    assert report.lost_examples == [(1, 3), (1, 6)]


def test_a_round_counts_the_messages_published_within_it_alone() -> None:
    ledger = _ledger()
    first = ledger.report(since=1.0, until=3.0)  # seq 1 and 2
    assert (first.acknowledged, first.lost, first.duplicates, first.reordered) == (2, 0, 1, 0)
    second = ledger.report(since=3.0, until=5.0)  # seq 3 and 4
    assert (second.acknowledged, second.lost, second.duplicates, second.reordered) == (2, 1, 0, 1)
    assert second.lost_examples == [(1, 3)]
    last = ledger.report(since=5.0)  # seq 5 and 6
    assert (last.acknowledged, last.lost, last.duplicates, last.reordered) == (2, 1, 0, 0)


def test_the_production_rounds_outlast_every_failover_threshold() -> None:
    """Each kill of the production rounds is a failover, not a restart quicker than the
    Sentinels or the Kafka controller notice: at least five Redis primary kills, then
    each broker, then a rolling restart of all three."""
    assert chaos.PRODUCTION_ROUNDS.count(chaos.REDIS_PRIMARY) >= 5
    assert set(chaos.PRODUCTION_ROUNDS) - {chaos.REDIS_PRIMARY} == {
        "kafka1",
        "kafka2",
        "kafka3",
        chaos.KAFKA_ROLLING,
    }
    assert chaos.PRODUCTION_DOWN * 1000 > redis.SENTINEL_DOWN_AFTER_MS
    assert chaos.PRODUCTION_DOWN * 1000 > kafka.BROKER_SESSION_TIMEOUT_MS
