"""The chaos run's per-round accounting (bench.durability.Ledger.report over a window of
publication times), the production rounds, each round's aim and the failover steps read
from the logs (bench.timeline)."""

from __future__ import annotations

import datetime
from pathlib import Path

from bench import chaos, timeline
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


def test_a_stage_may_stay_down_less_long_than_a_failover_needs() -> None:
    timing = chaos.Timing(down=chaos.PRODUCTION_DOWN, stage_down=0.5)
    assert [timing.down_for(p) for p in ("ingest-node1", "device-persist", "redis2", "kafka3")] == [
        0.5,
        0.5,
        chaos.PRODUCTION_DOWN,
        chaos.PRODUCTION_DOWN,
    ]
    assert chaos.Timing(down=2.0).down_for("router") == 2.0


def test_each_round_is_held_to_its_aim() -> None:
    """A Kafka broker or Redis node kill is held to its outage (failover while it is down),
    a stage to how soon traffic flows once it is back; a rolling restart to neither."""
    broker = chaos.Disruption("kafka2", outage_s=chaos.FAILOVER_AIM + 0.1)
    assert (broker.aim(), broker.within_aim()) == (("outage_s", chaos.FAILOVER_AIM), False)
    node = chaos.Disruption("redis3", outage_s=chaos.FAILOVER_AIM)
    assert node.within_aim() is True
    stage = chaos.Disruption("device-persist", flowing_s=2.0, recovery_s=30.0)
    assert (stage.aim(), stage.within_aim()) == (("flowing_s", chaos.STAGE_AIM), True)
    assert chaos.Disruption("router").within_aim() is None  # delivery never resumed
    assert chaos.Disruption(chaos.KAFKA_ROLLING, outage_s=99.0).aim() is None
    table = chaos.table(chaos.ChaosResult([broker, stage]))
    assert "outage ≤ 12 s: **missed**" in table and "flowing ≤ 3 s: met" in table


def test_the_timeline_of_a_round_is_read_from_the_logs(tmp_path: Path) -> None:
    """The first line of each failover step after the kill, per process, in seconds after
    it; lines before the kill or after the round, and unknown lines, are left out."""
    kill = datetime.datetime(2026, 11, 27, 1, 49, 53).timestamp()
    (tmp_path / "redis-sentinel1.log").write_text(
        "16589:X 27 Nov 2026 01:49:50.000 # +sdown master cormorant 127.0.0.1 16417\n"
        "16589:X 27 Nov 2026 01:49:58.728 # +sdown master cormorant 127.0.0.1 16417\n"
        "16589:X 27 Nov 2026 01:49:59.964 # +switch-master cormorant 127.0.0.1 16417 x 16419\n"
        "16589:X 27 Nov 2026 01:50:30.000 # +switch-master cormorant 127.0.0.1 16419 x 16417\n"
    )
    (tmp_path / "kafka2.log").write_text(
        "[2026-11-27 01:49:57,648] INFO [QuorumController id=2] Fencing broker 1 because its "
        "session has timed out. (org.apache.kafka.controller.ReplicationControlManager)\n"
        "[2026-11-27 01:49:57,700] INFO something else\n"
    )
    (tmp_path / "device-persist.log").write_text(
        "[2026-11-27 01:50:07,866] [17755] [INFO] msg.persisted partitions [0] applied on "
        "the primary with replication id 1024\n"
    )
    events = timeline.timeline(tmp_path, kill, kill + 30)
    assert [(round(e.seconds, 3), e.process, e.step) for e in events] == [
        (4.648, "kafka2", "Kafka: dead broker fenced"),
        (5.728, "redis-sentinel1", "Sentinel: primary down (own view)"),
        (6.964, "redis-sentinel1", "Sentinel: switched to a replica"),
        (14.866, "device-persist", "store failover re-applied"),
    ]
    assert timeline.render(events[:1]) == "+  4.6 s  Kafka: dead broker fenced (kafka2)"
