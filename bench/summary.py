"""One table and one chart over every scenario: the latest comparison of each label.

``python -m bench summary`` reads ``bench/results/<label>.jsonl`` for the labels given (or
every comparison file there), keeps each file's latest comparison (the trailing records
made by the same command), and writes ``summary.md`` (headline medians, Cormorant /
Mosquitto ratio, the latencies' Kafka floor and Cormorant's ratio to it, the command of
each) and ``summary.png`` (delivered msg/s and end-to-end
p99 per scenario, both brokers). docs/performance.md shows both.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.loadgen.plan import KAFKA_FLOOR
from bench.loadgen.stats import ratio
from bench.results import MAX_PREFIX, is_latency, maxima, medians

BROKERS = ("cormorant", "mosquitto")

#: Headline rows of a traffic scenario: (flattened key, what it is, format).
TRAFFIC = (
    ("delivered_per_s", "delivered msg/s", "{:,.0f}"),
    ("latency_ms.p50", "end-to-end p50 ms", "{:,.1f}"),
    ("latency_ms.p99", "end-to-end p99 ms", "{:,.1f}"),
    # The broker's CPU: for Cormorant its whole stack (bench/README.md).
    ("delivered_per_cpu_s", "delivered msg per stack CPU-s", "{:,.0f}"),
)
CONNECTIONS = (
    ("connects_per_s", "connects/s", "{:,.0f}"),
    ("connect_ms.p99", "CONNECT→CONNACK p99 ms", "{:,.1f}"),
    # The maximum over rounds: only the run that grew the heap shows the cost (results.py).
    ("memory_per_connection_kib", MAX_PREFIX + "RSS per connection KiB", "{:,.2f}"),
)


def latest_comparison(path: Path) -> list[dict[str, Any]]:
    """The records of the latest comparison in the JSON lines file ``path``: the trailing
    records written by the same command ([] for an empty file, one without both brokers,
    such as single runs, or a comparison over other transports than plain TCP, which has
    its own table: ``results.transports_markdown``; [] too for the JSON lines of the other
    benchmarks, whose records have no ``report``, such as ``reconnect_storm.jsonl``)."""
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    if not records or any("report" not in rec for rec in records[-1:]):
        return []
    command = records[-1].get("command")
    latest: list[dict[str, Any]] = []
    last_round: int | None = None
    for rec in reversed(records):
        round_ = rec.get("round")
        # Read backwards, rounds only go down within one comparison: a higher one ends the
        # previous run of the same command.
        if rec.get("command") != command or (
            round_ is not None and last_round is not None and round_ > last_round
        ):
            break
        last_round = round_ if round_ is not None else last_round
        latest.append(rec)
    latest.reverse()
    # The Kafka floor's records (transport "kafka") belong to every comparison.
    if any(rec.get("transport", "tcp") != "tcp" for rec in latest if rec.get("broker") in BROKERS):
        return []
    return latest if {r.get("broker") for r in latest} >= set(BROKERS) else []


def _fmt(value: float | None, fmt: str) -> str:
    return "-" if value is None or value != value else fmt.format(value)


def _floor(floor: Mapping[str, float | None], first: Mapping[str, Any], key: str) -> float | None:
    """The Kafka floor's figure that the row ``key`` of a comparison (``first`` of its
    records) is divided by: its latency for a latency; for delivered msg/s of an unpaced
    scenario, what the floor carries through both hops unpaced with the scenario's
    in-flight window (``unpaced_records_per_s``); else none."""
    if is_latency(key):
        return floor.get(key)
    options = first.get("options")
    if key == "delivered_per_s" and options is not None and options.get("rate") is None:
        return floor.get("unpaced_records_per_s")
    return None


def table(comparisons: Sequence[Sequence[Mapping[str, Any]]]) -> str:
    """The Markdown summary of ``comparisons`` (each the records of one label): Cormorant,
    Mosquitto and their ratio; for the rows of a comparison that ran the Kafka floor
    (:mod:`bench.kafka_floor`) that have a floor (:func:`_floor`), the floor's median and
    Cormorant's ratio to it."""
    lines = [
        "| scenario | metric | Cormorant | Mosquitto | ratio | Kafka floor | Cormorant ÷ floor |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for records in comparisons:
        first = records[0]
        rows = CONNECTIONS if first["scenario"] == "connections" else TRAFFIC
        med = {b: medians(records, b) for b in (*BROKERS, KAFKA_FLOOR)}
        top = {b: maxima(records, b) for b in BROKERS}
        name = f"`{first['label']}`"
        for key, what, fmt in rows:
            source = top if what.startswith(MAX_PREFIX) else med
            a, b = source["cormorant"].get(key), source["mosquitto"].get(key)
            floor = _floor(med[KAFKA_FLOOR], first, key)
            lines.append(
                f"| {name} | {what} | {_fmt(a, fmt)} | {_fmt(b, fmt)} | "
                f"{_fmt(ratio(a, b), '{:.2f}')} | {_fmt(floor, fmt)} | "
                f"{_fmt(ratio(a, floor), '{:.2f}')} |"
            )
            name = ""
    lines += [
        "",
        "Commands (each: 3+ rounds, Cormorant and Mosquitto alternately), with the date of "
        "the first run, the commit and the range of the 1-minute load average over the runs:",
        "",
    ]
    lines += [f"- `{records[0]['command']}`: {_when(records)}" for records in comparisons]
    return "\n".join(lines) + "\n"


def _when(records: Sequence[Mapping[str, Any]]) -> str:
    """Date (UTC, to the minute), commit and load average range of a comparison's runs."""
    first = records[0]
    date = str(first.get("date", ""))[:16].replace("T", " ")
    loads = [
        load for rec in records if (load := rec.get("machine", {}).get("loadavg_1m")) is not None
    ]
    load = f"load {min(loads):.1f} to {max(loads):.1f}" if loads else "load not recorded"
    return f"{date}, {str(first.get('git_commit', ''))[:7]}, {load}"


def draw(comparisons: Sequence[Sequence[Mapping[str, Any]]], path: Path) -> Path:
    """The summary chart: delivered msg/s and end-to-end p99 (log scales) per traffic
    scenario, bars per broker. Raises ImportError without matplotlib (``.[bench]``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traffic = [c for c in comparisons if c[0]["scenario"] != "connections"]
    labels = [c[0]["label"] for c in traffic]
    fig, axes = plt.subplots(2, 1, figsize=(max(8.0, 0.9 * len(labels) + 3), 8))
    for axis, key, title in (
        (axes[0], "delivered_per_s", "delivered msg/s (median, log)"),
        (axes[1], "latency_ms.p99", "end-to-end p99 ms (median, log)"),
    ):
        for offset, broker in ((-0.2, "cormorant"), (0.2, "mosquitto")):
            values = [medians(c, broker).get(key) or 0.0 for c in traffic]
            axis.bar([i + offset for i in range(len(labels))], values, 0.4, label=broker)
        axis.set_yscale("log")
        axis.set_title(title)
        axis.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
        axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def summarize(results_dir: Path, labels: Sequence[str]) -> tuple[Path, Path]:
    """Write ``summary.md`` and ``summary.png`` in ``results_dir`` for ``labels`` (every
    ``*.jsonl`` holding a comparison when empty). Raises ``ValueError`` if none has one."""
    paths = [results_dir / f"{label}.jsonl" for label in labels] or sorted(
        results_dir.glob("*.jsonl")
    )
    comparisons = [c for c in (latest_comparison(p) for p in paths if p.exists()) if c]
    if not comparisons:
        raise ValueError(f"no comparison found in {results_dir}")
    md = results_dir / "summary.md"
    md.write_text(table(comparisons), encoding="utf-8")
    return md, draw(comparisons, results_dir / "summary.png")
