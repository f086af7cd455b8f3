"""Result records: one JSON line per run, medians over rounds, the Markdown table.

A record is ``{"label", "scenario", "broker", "transport", "round", "date", "machine",
"git_commit", "command", "options", "report"}``; ``report`` is what
``bench.loadgen.runner.run`` returned; ``transport`` is ``tcp``, ``tls``, ``ws`` or ``wss``
(records from before transports existed have none: ``tcp``). Report keys are flattened with
dots (``latency_ms.p99``) for the tables.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.loadgen.plan import KAFKA_FLOOR
from bench.loadgen.stats import median, ratio

#: Where results go by default: ``bench/results`` beside this file.
RESULTS_DIR = Path(__file__).resolve().parent / "results"

#: Rows of the traffic table: (flattened report key, label, format).
TRAFFIC_ROWS: tuple[tuple[str, str, str], ...] = (
    ("published_per_s", "published msg/s", "{:,.0f}"),
    ("delivered_per_s", "delivered msg/s", "{:,.0f}"),
    ("latency_ms.p50", "end-to-end p50 ms", "{:.2f}"),
    ("latency_ms.p95", "end-to-end p95 ms", "{:.2f}"),
    ("latency_ms.p99", "end-to-end p99 ms", "{:.2f}"),
    ("latency_ms.max", "end-to-end max ms", "{:.2f}"),
    ("puback_ms.p50", "PUBACK p50 ms", "{:.2f}"),
    ("puback_ms.p99", "PUBACK p99 ms", "{:.2f}"),
    ("lost", "not received by drain end", "{:,.0f}"),
    ("duplicates", "duplicates", "{:,.0f}"),
    ("reordered", "reordered", "{:,.0f}"),
    ("unacked", "unacknowledged at drain end", "{:,.0f}"),
    ("broker_cpu_total_s", "broker CPU s (whole stack)", "{:.2f}"),
    ("delivered_per_cpu_s", "delivered msg per broker CPU-s", "{:,.0f}"),
    ("generator_cpu_s", "generator CPU s", "{:.2f}"),
)

#: Rows added to TRAFFIC_ROWS in a transports comparison: where a transport's cost shows.
TRANSPORT_ROWS: tuple[tuple[str, str, str], ...] = (
    ("socket_holders_cpu_s", "CPU s of the socket holders (ingest nodes / Mosquitto)", "{:.2f}"),
    ("socket_holders_us_per_delivered", "socket holders' CPU µs per delivered msg", "{:.1f}"),
)

#: Rows of a comparison that ran the Kafka floor too (:mod:`bench.kafka_floor`): its
#: throughput, which only it has.
FLOOR_ROWS: tuple[tuple[str, str, str], ...] = (
    ("unpaced_records_per_s", "Kafka floor: unpaced records/s through both hops", "{:,.0f}"),
)


def is_latency(key: str) -> bool:
    """Whether the flattened report ``key`` is a latency (end-to-end or PUBACK): the rows
    shown as a ratio to the Kafka floor too."""
    return key.startswith(("latency_ms.", "puback_ms."))


#: Row-name prefix of a row that shows the maximum over rounds instead of the median: a
#: long-lived process reuses the heap a previous run freed, so only the run that grew it
#: shows the real cost per connection (the first after ``cormorant up``).
MAX_PREFIX = "max over rounds: "

#: Rows of the connections table.
CONNECTION_ROWS: tuple[tuple[str, str, str], ...] = (
    ("connections", "connections open", "{:,.0f}"),
    ("failed", "failed connects", "{:,.0f}"),
    ("connects_per_s", "connects/s", "{:,.0f}"),
    ("connect_ms.p50", "CONNECT→CONNACK p50 ms", "{:.2f}"),
    ("connect_ms.p99", "CONNECT→CONNACK p99 ms", "{:.2f}"),
    ("memory_per_connection_kib", "RSS per connection KiB (socket holders)", "{:.2f}"),
    ("memory_per_connection_kib", MAX_PREFIX + "RSS per connection KiB", "{:.2f}"),
    ("broker_cpu_total_s", "broker CPU s while connecting", "{:.2f}"),
    ("generator_cpu_s", "generator CPU s while connecting", "{:.2f}"),
)


def machine() -> dict[str, Any]:
    """Platform, CPU count, Python version and load average of this machine."""
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "loadavg_1m": os.getloadavg()[0],
    }


def git_commit(root: Path) -> str:
    """``HEAD``'s commit id, with ``+dirty`` when the work tree has changes; "" outside git."""
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return head + ("+dirty" if dirty else "")


def record(
    *,
    label: str,
    scenario: str,
    broker: str,
    round_: int,
    options: Mapping[str, Any],
    report: Mapping[str, Any],
    transport: str = "tcp",
) -> dict[str, Any]:
    """One JSON-ready result record (see the module docstring)."""
    return {
        "label": label,
        "scenario": scenario,
        "broker": broker,
        "transport": transport,
        "round": round_,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "git_commit": git_commit(RESULTS_DIR.parent.parent),
        "command": " ".join([Path(sys.orig_argv[0]).name, *sys.orig_argv[1:]]),
        "options": dict(options),
        "report": dict(report),
    }


def append(path: Path, rec: Mapping[str, Any]) -> None:
    """Append ``rec`` to the JSON lines file ``path`` (created with its directory)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as out:
        out.write(json.dumps(rec, sort_keys=True, default=str) + "\n")


def flatten(report: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts to one level, keys joined with dots."""
    flat: dict[str, Any] = {}
    for key, value in report.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def medians(records: Iterable[Mapping[str, Any]], broker: str) -> dict[str, float | None]:
    """Median of every numeric report key over the records of ``broker``."""
    values: dict[str, list[float | None]] = {}
    for rec in records:
        if rec["broker"] != broker:
            continue
        for key, value in flatten(rec["report"]).items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                values.setdefault(key, []).append(float(value))
            elif value is None:
                values.setdefault(key, []).append(None)
    return {key: median(vals) for key, vals in values.items()}


def maxima(records: Iterable[Mapping[str, Any]], broker: str) -> dict[str, float]:
    """Maximum of every numeric report key over the records of ``broker``."""
    out: dict[str, float] = {}
    for rec in records:
        if rec["broker"] != broker:
            continue
        for key, value in flatten(rec["report"]).items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                out[key] = max(out.get(key, float(value)), float(value))
    return out


def _fmt(value: float | None, fmt: str) -> str:
    return "-" if value is None or value != value else fmt.format(value)


def _cpu_line(name: str, med: Mapping[str, float | None]) -> str:
    """``- <name>: <process> <CPU-s> (<µs per delivered msg>), …`` from the
    ``broker_cpu_s.*`` and ``broker_cpu_us_per_delivered.*`` medians (runs from before the
    latter existed show the seconds alone)."""
    parts = sorted(
        (k.removeprefix("broker_cpu_s."), v)
        for k, v in med.items()
        if k.startswith("broker_cpu_s.") and v is not None
    )
    texts = []
    for proc, value in parts:
        per_message = med.get(f"broker_cpu_us_per_delivered.{proc}")
        texts.append(
            f"{proc} {value:.2f}"
            if per_message is None
            else f"{proc} {value:.2f} ({per_message:,.1f} µs/msg)"
        )
    return f"- {name}: {', '.join(texts) or 'not measured'}"


def markdown(
    records: Sequence[Mapping[str, Any]], a: str = "cormorant", b: str = "mosquitto"
) -> str:
    """The Markdown report of one comparison: medians of ``a`` and ``b`` and ``a/b``; when
    ``records`` include Kafka floor runs (:mod:`bench.kafka_floor`), its medians too, and
    every latency row as a ratio to the floor's (``a/floor``, ``b/floor``)."""
    first = records[0]
    label = first["label"]
    rounds = max(r["round"] for r in records)
    floor = any(r["broker"] == KAFKA_FLOOR for r in records)
    rows = CONNECTION_ROWS if first["scenario"] == "connections" else TRAFFIC_ROWS
    med_a, med_b = medians(records, a), medians(records, b)
    max_a, max_b = maxima(records, a), maxima(records, b)
    med_f = medians(records, KAFKA_FLOOR)
    mach = first["machine"]
    runs = f"{a} / {b}" + (f" / {KAFKA_FLOOR}" if floor else "")
    header = f"| metric | {a} | {b} | {a}/{b} |"
    if floor:
        header += f" {KAFKA_FLOOR} | {a}/floor | {b}/floor |"
    lines = [
        f"# {label}: {a} vs {b}",
        "",
        f"- date: {first['date']} ({rounds} rounds, alternating {runs}; medians below)",
        f"- machine: {mach['platform']}, {mach['cpu_count']} CPUs, Python {mach['python']} "
        f"(shared, noisy VM: compare ratios, not absolutes)",
        f"- commit: {first['git_commit'] or 'unknown'}",
        f"- command: `{first['command']}`",
        "",
        header,
        "|---|" + "---:|" * (6 if floor else 3),
    ]
    for key, name, fmt in rows + (FLOOR_ROWS if floor else ()):
        va, vb = med_a.get(key), med_b.get(key)
        if name.startswith(MAX_PREFIX):
            va, vb = max_a.get(key), max_b.get(key)
        line = f"| {name} | {_fmt(va, fmt)} | {_fmt(vb, fmt)} | {_fmt(ratio(va, vb), '{:.2f}')} |"
        if floor:
            vf = med_f.get(key)
            ra, rb = (ratio(va, vf), ratio(vb, vf)) if is_latency(key) else (None, None)
            line += f" {_fmt(vf, fmt)} | {_fmt(ra, '{:.2f}')} | {_fmt(rb, '{:.2f}')} |"
        lines.append(line)
    lines += [
        "",
        "CPU seconds per process during the measure window (medians; children excluded), and "
        "in brackets its CPU µs per delivered message:",
        "",
    ]
    shown = ((a, med_a), (b, med_b)) + (((KAFKA_FLOOR, med_f),) if floor else ())
    lines += [_cpu_line(broker, med) for broker, med in shown]
    if first["scenario"] == "connections":
        lines += ["", "RSS growth per connection, KiB, per process (medians):", ""]
        for broker, med in ((a, med_a), (b, med_b)):
            parts = sorted(
                (k.removeprefix("rss_per_connection_kib."), v)
                for k, v in med.items()
                if k.startswith("rss_per_connection_kib.") and v is not None
            )
            lines.append(f"- {broker}: " + ", ".join(f"{n} {v:.2f}" for n, v in parts))
    return "\n".join(lines) + "\n"


#: Rows of the ratio table of a transports comparison: (flattened key, label).
RATIO_ROWS: tuple[tuple[str, str], ...] = (
    ("delivered_per_s", "delivered msg/s"),
    ("latency_ms.p50", "end-to-end p50"),
    ("latency_ms.p99", "end-to-end p99"),
    ("puback_ms.p50", "PUBACK p50"),
    ("delivered_per_cpu_s", "delivered msg per broker CPU-s"),
    ("socket_holders_us_per_delivered", "socket holders' CPU µs per delivered msg"),
)

#: The references of a transports comparison: (broker, transport).
REFERENCES: tuple[tuple[str, str], ...] = (("cormorant", "tcp"), ("mosquitto", "tls"))


def series(rec: Mapping[str, Any]) -> str:
    """The series of a record in a transports comparison: ``"<broker> <transport>"``, or
    ``kafka-floor`` (no MQTT transport)."""
    if rec["broker"] == KAFKA_FLOOR:
        return KAFKA_FLOOR
    return f"{rec['broker']} {rec.get('transport', 'tcp')}"


def transports_markdown(records: Sequence[Mapping[str, Any]]) -> str:
    """The Markdown report of a comparison over several transports: the medians of every
    broker and transport, then their ratios to Cormorant over plain TCP and to Mosquitto
    over TLS (a reference missing from ``records`` is left out)."""
    first = records[0]
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for rec in records:
        groups.setdefault(series(rec), []).append(rec)
    med = {name: medians(recs, recs[0]["broker"]) for name, recs in groups.items()}
    names = list(groups)
    tls = {
        name: next((r["report"].get("tls") for r in recs if r["report"].get("tls")), "")
        for name, recs in groups.items()
    }
    mach = first["machine"]
    rounds = max(r["round"] for r in records)
    lines = [
        f"# {first['label']}: Cormorant and Mosquitto over each transport",
        "",
        f"- date: {first['date']} ({rounds} rounds; in each, Cormorant then Mosquitto per "
        "transport; medians below)",
        f"- machine: {mach['platform']}, {mach['cpu_count']} CPUs, Python {mach['python']} "
        "(shared, noisy VM: compare ratios, not absolutes)",
        f"- commit: {first['git_commit'] or 'unknown'}",
        f"- command: `{first['command']}`",
        "- TLS negotiated: "
        + (", ".join(f"{name}: {text}" for name, text in tls.items() if text) or "none"),
        "",
        "| metric | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    extra = FLOOR_ROWS if KAFKA_FLOOR in med else ()
    for key, name, fmt in TRAFFIC_ROWS + TRANSPORT_ROWS + extra:
        cells = [_fmt(med[n].get(key), fmt) for n in names]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    refs = [f"{b} {t}" for b, t in REFERENCES if f"{b} {t}" in med]
    refs += [KAFKA_FLOOR] if KAFKA_FLOOR in med else []
    lines += ["", "Ratios of the medians (each column ÷ the reference):", ""]
    lines += ["| ratio | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for ref in refs:
        for key, name in RATIO_ROWS:
            if ref == KAFKA_FLOOR and not is_latency(key):
                continue  # the floor is a latency reference
            cells = [_fmt(ratio(med[n].get(key), med[ref].get(key)), "{:.2f}") for n in names]
            lines.append(f"| {name} ÷ {ref} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "CPU seconds per process during the measure window (medians; children excluded), and "
        "in brackets its CPU µs per delivered message:",
        "",
    ]
    lines += [_cpu_line(name, med[name]) for name in names]
    return "\n".join(lines) + "\n"
