"""The Kafka floor's plan, report and place in the comparison tables (bench/kafka_floor.py,
bench/results.py, bench/summary.py, bench/cli.py); the real run is
tests/integration/test_bench_kafka_floor.py."""

from __future__ import annotations

import json
from array import array
from pathlib import Path
from typing import Any

import pytest

from bench import cli, kafka_floor, results, summary
from bench.loadgen.plan import KAFKA_FLOOR, Options, Timing
from services.common.settings import Settings

TIMING = Timing(warmup=1.0, duration=2.0, drain=5.0, setup=10.0)


def test_the_floor_follows_the_scenario_options() -> None:
    settings = Settings(topic_prefix="t.", msg_all_partitions=12, downlink_partitions=4)
    plan = kafka_floor.floor_plan(Options(), TIMING, settings)
    assert (len(plan.keys), plan.size, plan.rate, plan.window) == (10, 64, 500.0, 640)
    assert plan.topic_in.startswith("t.bench.floor.") and plan.topic_in.endswith(".in")
    assert plan.topic_out == plan.topic_in.removesuffix(".in") + ".out"
    assert len(set(plan.keys)) == 10
    fan_in = kafka_floor.floor_plan(Options(publishers=20, rate=2000, size=100), TIMING, settings)
    assert (len(fan_in.keys), fan_in.size, fan_in.rate) == (20, 100, 2000.0)
    other = kafka_floor.floor_plan(Options(pairs=4, inflight=8), TIMING, settings)
    assert (len(other.keys), other.window) == (4, 32)
    assert other.topic_in != plan.topic_in  # a fresh pair of topics per run
    for bad in (Options(size=10), Options(pairs=0), Options(rate=0.0)):
        with pytest.raises(ValueError):
            kafka_floor.floor_plan(bad, TIMING, settings)
    assert kafka_floor.label(Options()) == "kafka-floor"
    assert kafka_floor.label(Options(rate=2000)) == "kafka-floor-rate2000"


def _phase(
    in_window: int, e2e_ms: list[float], ack_ms: list[float], cpu: float, lost: int = 0
) -> dict[str, Any]:
    return {
        "sent": {0: in_window, 1: in_window},
        "acks": array("q", [int(v * 1e6) for v in ack_ms]),
        "cpu": {"kafka": cpu, "floor-relay": cpu},
        "e2e": array("q", [int(v * 1e6) for v in e2e_ms]),
        "in_window": in_window,
        "received": in_window,
        "lost": lost,
        "duplicates": 0,
        "reordered": 1,
    }


def test_the_report_has_the_traffic_keys_for_the_paced_phase() -> None:
    plan = kafka_floor.floor_plan(Options(pairs=2), TIMING, Settings())
    paced = _phase(1000, [float(v) for v in range(1, 101)], [0.5] * 990, 1.0)
    unpaced = _phase(40_000, [500.0], [1.0] * 60_000, 3.0, lost=7)
    report = kafka_floor.summarize(plan, paced, unpaced)
    assert report["delivered_per_s"] == 500.0  # 1,000 in the 2 s window
    assert report["published_per_s"] == 495.0
    assert report["latency_ms"] == {"p50": 50.0, "p95": 95.0, "p99": 99.0, "max": 100.0}
    assert report["puback_ms"] == {"p50": 0.5, "p99": 0.5}
    assert (report["sent"], report["lost"], report["reordered"]) == (2000, 0, 2)
    assert report["broker_cpu_total_s"] == 2.0
    assert report["delivered_per_cpu_s"] == 500.0
    assert report["unpaced_records_per_s"] == 20_000.0
    assert report["unpaced_published_per_s"] == 30_000.0
    assert (report["unpaced_not_received"], report["unpaced_cpu_total_s"]) == (7, 6.0)
    assert "unpaced 20,000 records/s" in kafka_floor.summary_line(report)


def _record(broker: str, report: dict[str, Any], transport: str = "tcp") -> dict[str, Any]:
    return {
        "label": "p2p-rate500", "scenario": "p2p", "broker": broker, "round": 1,
        "transport": transport, "date": "d", "git_commit": "c",
        "machine": {"platform": "p", "cpu_count": 2, "python": "3.11"},
        "command": "python -m bench compare p2p --rate 500", "report": report,
    }  # fmt: skip


def _traffic(p50: float, p99: float, delivered: float = 500.0) -> dict[str, Any]:
    return {
        "delivered_per_s": delivered,
        "latency_ms": {"p50": p50, "p99": p99},
        "puback_ms": {"p50": p50 / 2, "p99": None},
        "broker_cpu_s": {"kafka": 1.0},
    }


FLOOR_REPORT = {**_traffic(2.0, 5.0), "unpaced_records_per_s": 30_000.0}


def test_every_latency_row_is_also_a_ratio_to_the_floor() -> None:
    records = [
        _record("cormorant", _traffic(9.0, 30.0)),
        _record("mosquitto", _traffic(0.2, 1.0)),
        _record(KAFKA_FLOOR, FLOOR_REPORT, "kafka"),
    ]
    text = results.markdown(records)
    assert "| metric | cormorant | mosquitto | cormorant/mosquitto | kafka-floor |" in text
    assert "| end-to-end p50 ms | 9.00 | 0.20 | 45.00 | 2.00 | 4.50 | 0.10 |" in text
    assert "| end-to-end p99 ms | 30.00 | 1.00 | 30.00 | 5.00 | 6.00 | 0.20 |" in text
    assert "| PUBACK p50 ms | 4.50 | 0.10 | 45.00 | 1.00 | 4.50 | 0.10 |" in text
    # throughput is not divided by the floor's paced rate; the floor's own row is there
    assert "| delivered msg/s | 500 | 500 | 1.00 | 500 | - | - |" in text
    assert "| Kafka floor: unpaced records/s through both hops | - | - | - | 30,000 |" in text
    assert "- kafka-floor: kafka 1.00" in text
    # without floor records the table keeps its three columns
    plain = results.markdown(records[:2])
    assert "kafka-floor" not in plain
    assert "| end-to-end p50 ms | 9.00 | 0.20 | 45.00 |\n" in plain


def test_the_transports_table_divides_latencies_by_the_floor() -> None:
    records = [
        _record("cormorant", _traffic(9.0, 30.0)),
        _record("cormorant", _traffic(12.0, 40.0), "tls"),
        _record("mosquitto", _traffic(0.4, 2.0), "tls"),
        _record(KAFKA_FLOOR, FLOOR_REPORT, "kafka"),
    ]
    text = results.transports_markdown(records)
    assert "| metric | cormorant tcp | cormorant tls | mosquitto tls | kafka-floor |" in text
    assert "| end-to-end p50 ÷ kafka-floor | 4.50 | 6.00 | 0.20 | 1.00 |" in text
    assert "| end-to-end p99 ÷ kafka-floor | 6.00 | 8.00 | 0.40 | 1.00 |" in text
    assert "delivered msg/s ÷ kafka-floor" not in text
    assert "| delivered msg/s ÷ cormorant tcp |" in text


def test_the_summary_shows_the_floor_of_latency_rows() -> None:
    records = [
        _record("cormorant", _traffic(9.0, 30.0)),
        _record("mosquitto", _traffic(0.2, 1.0)),
        _record(KAFKA_FLOOR, FLOOR_REPORT, "kafka"),
    ]
    text = summary.table([records])
    assert "| Kafka floor | Cormorant ÷ floor |" in text
    assert "| end-to-end p99 ms | 30.0 | 1.0 | 30.00 | 5.0 | 6.00 |" in text
    assert "| delivered msg/s | 500 | 500 | 1.00 | - | - |" in text


def test_the_summary_divides_unpaced_throughput_by_the_floors() -> None:
    unpaced = {"options": {"rate": None, "pairs": 50, "inflight": 10}}
    records = [
        {**_record("cormorant", _traffic(900.0, 3000.0, 6000.0)), **unpaced},
        {**_record("mosquitto", _traffic(9.0, 20.0, 60000.0)), **unpaced},
        {**_record(KAFKA_FLOOR, FLOOR_REPORT, "kafka"), **unpaced},
    ]
    text = summary.table([records])
    # The floor carried 30,000 records/s through both hops with the same window.
    assert "| delivered msg/s | 6,000 | 60,000 | 0.10 | 30,000 | 0.20 |" in text


def test_a_comparison_with_its_floor_is_in_the_summary(tmp_path: Path) -> None:
    records = [
        {**_record("cormorant", _traffic(9.0, 30.0)), "command": "compare p2p"},
        {**_record("mosquitto", _traffic(0.2, 1.0)), "command": "compare p2p"},
        {**_record(KAFKA_FLOOR, FLOOR_REPORT, "kafka"), "command": "compare p2p"},
    ]
    path = tmp_path / "p2p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert summary.latest_comparison(path) == records


def test_the_command_line_offers_the_floor_to_run_and_to_leave_out_of_compare() -> None:
    parser = cli.argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    cli.run_parser(sub.add_parser("run"))
    cli.compare_parser(sub.add_parser("compare"))
    args = parser.parse_args(["run", "kafka-floor", "--rate", "1000", "--pairs", "4"])
    assert (args.scenario, args.rate, args.pairs) == (KAFKA_FLOOR, 1000.0, 4)
    assert parser.parse_args(["compare", "p2p"]).kafka_floor is True
    assert parser.parse_args(["compare", "p2p", "--no-kafka-floor"]).kafka_floor is False
    with pytest.raises(SystemExit):
        parser.parse_args(["compare", "kafka-floor"])  # no MQTT broker to compare with
    with pytest.raises(SystemExit, match="local cluster's Kafka only"):
        cli.main(["run", "kafka-floor", "--broker", "mosquitto"])


def test_only_the_last_run_of_a_repeated_command_is_summarized(tmp_path: Path) -> None:
    def run(p50: float) -> list[dict[str, Any]]:
        return [
            {**_record(broker, _traffic(p50, 30.0)), "command": "compare p2p", "round": n}
            for n in (1, 2)
            for broker in ("cormorant", "mosquitto")
        ]

    earlier, later = run(90.0), run(9.0)
    path = tmp_path / "p2p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [*earlier, *later]))
    assert summary.latest_comparison(path) == later
