"""The load generator's accounting (bench/loadgen/stats, runner.summarize, results)."""

from __future__ import annotations

import json
from array import array
from pathlib import Path

import pytest

from bench import results, summary
from bench.loadgen import runner, stats
from bench.loadgen.plan import Options, Timing, build
from bench.loadgen.worker import SubscriberResult, WorkerResult


def test_percentile_nearest_rank() -> None:
    values = list(range(1, 101))
    assert stats.percentile(values, 50) == 50
    assert stats.percentile(values, 99) == 99
    assert stats.percentile(values, 100) == 100
    assert stats.percentile([5], 1) == 5
    assert stats.percentile([], 50) is None
    with pytest.raises(ValueError):
        stats.percentile(values, 0)


def test_latency_summary_converts_ns_to_ms() -> None:
    summary = stats.latency_summary_ms([3_000_000, 1_000_000, 2_000_000, 4_000_000])
    assert summary == {"p50": 2.0, "p95": 4.0, "p99": 4.0, "max": 4.0}
    assert stats.latency_summary_ms([]) == {"p50": None, "p95": None, "p99": None, "max": None}


def test_median_skips_missing_values() -> None:
    assert stats.median([3.0, None, 1.0, 2.0]) == 2.0
    assert stats.median([4.0, 1.0]) == 2.5
    assert stats.median([None]) is None


def test_seq_tracker_counts_duplicates_and_reordering() -> None:
    tracker = stats.SeqTracker()
    assert [tracker.add(1, s) for s in (1, 2, 3, 2, 5, 4, 4)] == [
        True, True, True, False, True, True, False,
    ]  # fmt: skip
    assert tracker.add(2, 10_000)  # the bitmap grows on demand
    assert tracker.distinct() == {1: 5, 2: 1}
    assert tracker.duplicates == 2
    assert tracker.reordered == 1  # 4 after 5


def test_lost_counts_only_expected_publishers() -> None:
    sent = {0: 10, 1: 5, 2: 7}
    assert stats.lost(sent, (0, 1), {0: 10, 1: 3, 2: 0}) == 2
    assert stats.lost(sent, (2,), {}) == 7
    assert stats.lost({0: 1}, (0,), {0: 1}) == 0


def test_ratio() -> None:
    assert stats.ratio(6.0, 3.0) == 2.0
    assert stats.ratio(None, 3.0) is None
    assert stats.ratio(1.0, 0.0) is None


def test_summarize_combines_workers() -> None:
    plan = build("fan-in", Options(publishers=2), Timing(duration=2.0))
    sent = {0: 100, 1: 100}
    sub = SubscriberResult(
        expected=(0, 1), distinct={0: 100, 1: 98}, duplicates=3, reordered=0, received=201
    )
    parts = [
        WorkerResult(50, 0, array("q"), array("q", [1_000_000]), {0: 100}, 0, 0),
        WorkerResult(
            50, 180, array("q", [2_000_000, 4_000_000]), array("q"), {1: 100}, 1, 0, [sub]
        ),
    ]
    report = runner.summarize(
        plan, parts, sent, broker_cpu={"a": 1.0, "b": 1.0}, generator_cpu=0.5,
        generator_cpu_total=1.0, route_seconds=0.1,
    )  # fmt: skip
    assert report["published_per_s"] == 50.0
    assert report["delivered_per_s"] == 90.0
    assert report["lost"] == 2
    assert report["duplicates"] == 3
    assert report["expected_deliveries"] == 200
    assert report["unacked"] == 1
    assert report["latency_ms"]["p50"] == 2.0
    assert report["puback_ms"]["p99"] == 1.0
    assert report["delivered_per_cpu_s"] == 90.0
    # 1 CPU-s of process a over the 180 deliveries of the window.
    assert report["broker_cpu_us_per_delivered"] == {"a": 1e6 / 180, "b": 1e6 / 180}


def test_plans_of_every_scenario() -> None:
    timing = Timing()
    p2p = build("p2p", Options(pairs=3, rate=300), timing)
    assert p2p.label == "p2p-rate300"
    assert [p.rate for p in p2p.publishers] == [100.0] * 3
    assert [s.expected for s in p2p.subscribers] == [(0,), (1,), (2,)]
    # The bounded in-flight scenario: 50 pairs, at most 500 messages in flight in all.
    bounded = build("p2p", Options(pairs=50, inflight=10), timing)
    assert (bounded.label, bounded.inflight, len(bounded.publishers)) == ("p2p-inflight500", 10, 50)
    assert build("fan-in", Options(qos=0), timing).label == "fan-in-qos0"
    app = build("fan-in-app", Options(publishers=100), timing)
    assert app.label == "fan-in-app-qos1" and len(app.publishers) == 100
    # One persistent subscriber whose id the broker's application_client_ids ("app-*") match.
    [subscriber] = app.subscribers
    assert subscriber.client_id.startswith("app-") and not subscriber.clean
    tbmq = build("fan-out-tbmq", Options(), timing)
    assert (len(tbmq.publishers), tbmq.publishers[0].rate, tbmq.publishers[0].size) == (
        100, 10.0, 66,
    )  # fmt: skip
    assert all(s.topic_filter == "#" and s.qos == 0 for s in tbmq.subscribers)
    persistent = build("persistent-p2p", Options(), timing)
    assert not any(c.clean for c in (*persistent.publishers, *persistent.subscribers))
    conns = build("connections", Options(connections=10), timing)
    assert [conns.share(i, 3).connections for i in range(3)] == [4, 3, 3]
    with pytest.raises(ValueError):
        build("nope", Options(), timing)


def test_markdown_table_has_ratio() -> None:
    def rec(broker: str, delivered: float) -> dict[str, object]:
        return {
            "label": "p2p", "scenario": "p2p", "broker": broker, "round": 1, "date": "d",
            "machine": {"platform": "p", "cpu_count": 2, "python": "3.11"},
            "git_commit": "c", "command": "python -m bench compare p2p",
            "report": {"delivered_per_s": delivered, "latency_ms": {"p50": None},
                       "broker_cpu_s": {"kafka": 1.0},
                       "broker_cpu_us_per_delivered": {"kafka": 1e6 / delivered}},
        }  # fmt: skip

    text = results.markdown([rec("cormorant", 100.0), rec("mosquitto", 400.0)])
    assert "| delivered msg/s | 100 | 400 | 0.25 |" in text
    assert "| end-to-end p50 ms | - | - | - |" in text
    assert "- cormorant: kafka 1.00 (10,000.0 µs/msg)" in text


def _rec(label: str, broker: str, command: str, delivered: float) -> dict[str, object]:
    return {
        "label": label,
        "scenario": label,
        "broker": broker,
        "command": command,
        "report": {"delivered_per_s": delivered, "latency_ms": {"p50": 1.0, "p99": 2.0}},
    }


def test_summary_keeps_the_latest_comparison_of_each_file(tmp_path: Path) -> None:
    lines = [
        _rec("p2p", "cormorant", "old", 1.0),
        _rec("p2p", "mosquitto", "old", 1.0),
        _rec("p2p", "cormorant", "new", 100.0),
        _rec("p2p", "mosquitto", "new", 400.0),
        _rec("p2p", "cormorant", "new", 300.0),
        _rec("p2p", "mosquitto", "new", 600.0),
    ]
    (tmp_path / "p2p.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    (tmp_path / "single.jsonl").write_text(json.dumps(_rec("x", "cormorant", "run", 5)) + "\n")
    latest = summary.latest_comparison(tmp_path / "p2p.jsonl")
    assert [r["command"] for r in latest] == ["new"] * 4
    assert summary.latest_comparison(tmp_path / "single.jsonl") == []  # one broker only
    text = summary.table([latest])
    assert "| `p2p` | delivered msg/s | 200 | 500 | 0.40 |" in text
    assert "- `new`" in text


def test_summary_leaves_out_the_records_of_other_benchmarks(tmp_path: Path) -> None:
    # bench_reconnect_storm.py's records name both brokers and rounds but have no report.
    storm = [
        {"broker": broker, "scenario": "anonymous", "round": 0, "command": "storm"}
        for broker in ("cormorant", "mosquitto")
    ]
    path = tmp_path / "reconnect_storm.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in storm) + "\n")
    assert summary.latest_comparison(path) == []


def test_summary_shows_the_largest_memory_growth_of_the_connection_rounds() -> None:
    def conn(broker: str, kib: float) -> dict[str, object]:
        report = {"connects_per_s": 1000.0, "memory_per_connection_kib": kib}
        return {
            "label": "connections",
            "scenario": "connections",
            "broker": broker,
            "command": "c",
            "report": report,
        }

    records = [
        conn("cormorant", 3.5),
        conn("mosquitto", 0.7),
        conn("cormorant", 0.0),
        conn("mosquitto", 0.0),
        conn("cormorant", 0.0),
        conn("mosquitto", 0.1),
    ]
    text = summary.table([records])
    assert "| max over rounds: RSS per connection KiB | 3.50 | 0.70 | 5.00 |" in text
