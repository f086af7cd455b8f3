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
    """``- <name>: <process> <CPU-s>, …`` from the ``broker_cpu_s.*`` medians."""
    parts = sorted(
        (k.removeprefix("broker_cpu_s."), v)
        for k, v in med.items()
        if k.startswith("broker_cpu_s.") and v is not None
    )
    text = ", ".join(f"{proc} {value:.2f}" for proc, value in parts) or "not measured"
    return f"- {name}: {text}"


def markdown(
    records: Sequence[Mapping[str, Any]], a: str = "cormorant", b: str = "mosquitto"
) -> str:
    """The Markdown report of one comparison: medians of ``a`` and ``b`` and ``a/b``."""
    first = records[0]
    label = first["label"]
    rounds = max(r["round"] for r in records)
    rows = CONNECTION_ROWS if first["scenario"] == "connections" else TRAFFIC_ROWS
    med_a, med_b = medians(records, a), medians(records, b)
    max_a, max_b = maxima(records, a), maxima(records, b)
    mach = first["machine"]
    lines = [
        f"# {label}: {a} vs {b}",
        "",
        f"- date: {first['date']} ({rounds} rounds, alternating {a} / {b}; medians below)",
        f"- machine: {mach['platform']}, {mach['cpu_count']} CPUs, Python {mach['python']} "
        f"(shared, noisy VM: compare ratios, not absolutes)",
        f"- commit: {first['git_commit'] or 'unknown'}",
        f"- command: `{first['command']}`",
        "",
        f"| metric | {a} | {b} | {a}/{b} |",
        "|---|---:|---:|---:|",
    ]
    for key, name, fmt in rows:
        va, vb = med_a.get(key), med_b.get(key)
        if name.startswith(MAX_PREFIX):
            va, vb = max_a.get(key), max_b.get(key)
        rat = ratio(va, vb)
        lines.append(f"| {name} | {_fmt(va, fmt)} | {_fmt(vb, fmt)} | {_fmt(rat, '{:.2f}')} |")
    lines += [
        "",
        "CPU seconds per process during the measure window (medians; children excluded):",
        "",
    ]
    lines += [_cpu_line(broker, med) for broker, med in ((a, med_a), (b, med_b))]
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
    """The series of a record in a transports comparison: ``"<broker> <transport>"``."""
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
    for key, name, fmt in TRAFFIC_ROWS + TRANSPORT_ROWS:
        cells = [_fmt(med[n].get(key), fmt) for n in names]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    refs = [f"{b} {t}" for b, t in REFERENCES if f"{b} {t}" in med]
    lines += ["", "Ratios of the medians (each column ÷ the reference):", ""]
    lines += ["| ratio | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for ref in refs:
        for key, name in RATIO_ROWS:
            cells = [_fmt(ratio(med[n].get(key), med[ref].get(key)), "{:.2f}") for n in names]
            lines.append(f"| {name} ÷ {ref} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "CPU seconds per process during the measure window (medians; children excluded):",
        "",
    ]
    lines += [_cpu_line(name, med[name]) for name in names]
    return "\n".join(lines) + "\n"
