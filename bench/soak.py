"""``python -m bench soak``: a long steady load, and whether the cluster's resources stay flat.

The load is the load generator's p2p shape (bench/README.md): ``clients`` / 2 publisher →
subscriber pairs, QoS 1, 64-byte payloads, ``rate`` msg/s in all, for ``minutes``; every
``persistent_every``-th pair is persistent (clean_session=false), so that device_persist,
Redis and the message store carry part of it. Meanwhile, every ``interval`` seconds, it
samples:

- ``rss_mib`` and ``fds`` of every process of the cluster (psutil: resident set size, open
  file descriptors), the Kafka brokers' JVMs, Redis, PostgreSQL and HAProxy included;
- ``lag`` of every consumer group of the services (``<prefix>cormorant-*``): the sum over
  its partitions of the log end offset minus the committed offset, in records;
- ``redis_used_mib`` of every Redis node (``INFO memory`` ``used_memory``).

It writes ``<out>/samples.csv`` (``elapsed_s,process,metric,value``), ``<out>/soak.png``
(one panel per metric over time) and ``<out>/summary.md`` (per process and metric: the
median of the first and of the last tenth of the measured window, the maximum, and the
change between the two medians: "flat" means the last tenth is within a few per cent of the
first), and appends the run to ``bench/results/soak.jsonl``. Not part of CI: the 30-minute
form takes 35 minutes and both cores.
"""

from __future__ import annotations

import asyncio
import csv
import statistics
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient

from bench import brokers
from bench.loadgen import runner
from bench.loadgen.plan import Options, Plan, Timing, build
from services.common.kafka.names import SERVICE_GROUP_PREFIX, TopicNames
from services.local import cluster, redis
from services.local.settings import LocalSettings

Log = Callable[[str], None]

#: Metrics, in the order of the chart's panels, with their titles.
METRICS = {
    "rss_mib": "resident memory, MiB",
    "fds": "open file descriptors",
    "lag": "consumer group lag, records",
    "redis_used_mib": "Redis used_memory, MiB",
}

#: Share of the measured window whose median is compared, at its start and at its end.
TENTH = 0.1


@dataclass(frozen=True, slots=True)
class Sample:
    """One value: seconds since the load started, process (or consumer group, or Redis
    node), metric name (:data:`METRICS`), value."""

    elapsed_s: float
    process: str
    metric: str
    value: float


@dataclass(slots=True)
class SoakResult:
    """The samples, the load generator's report, and the summary rows."""

    samples: list[Sample] = field(default_factory=list)
    report: dict[str, Any] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)


def plan(
    host: str, port: int, *, clients: int, rate: float, minutes: float, persistent_every: int
) -> Plan:
    """The soak's load (see the module docstring). Raises ``ValueError`` for fewer than 2
    clients."""
    if clients < 2:
        raise ValueError(f"a soak needs at least 2 clients (one pair), got {clients}")
    timing = Timing(warmup=10.0, duration=minutes * 60, drain=60.0, setup=300.0)
    options = Options(pairs=clients // 2, qos=1, rate=rate, host=host, port=port)
    base = build("p2p", options, timing)
    if persistent_every <= 0:
        return base
    subs = tuple(
        replace(s, clean=i % persistent_every != 0) for i, s in enumerate(base.subscribers)
    )
    pubs = tuple(replace(p, clean=i % persistent_every != 0) for i, p in enumerate(base.publishers))
    return replace(base, label=f"soak-{base.label}", subscribers=subs, publishers=pubs)


def target(settings: LocalSettings) -> brokers.Target:
    """The cluster of ``settings`` as a load generator target (its processes accounted).
    Raises :class:`~bench.brokers.BrokerUnavailable` if a part of it is down."""
    rows = cluster.status(settings)
    down = [f"{r.name}: {r.health}" for r in rows if not r.healthy]
    if down:
        raise brokers.BrokerUnavailable(f"the cluster is not healthy ({'; '.join(down)})")
    procs = {r.name: psutil.Process(r.pid) for r in rows if r.pid is not None}
    return brokers.Target("cormorant", "127.0.0.1", settings.listen_port, procs)


def process_samples(elapsed: float, procs: dict[str, psutil.Process]) -> list[Sample]:
    """RSS (MiB) and open file descriptors of each process still running."""
    out = []
    for name, proc in procs.items():
        try:
            with proc.oneshot():
                rss, fds = proc.memory_info().rss, proc.num_fds()
        except psutil.Error:
            continue
        out += [Sample(elapsed, name, "rss_mib", rss / 2**20), Sample(elapsed, name, "fds", fds)]
    return out


async def consumer_lag(settings: LocalSettings) -> dict[str, int]:
    """Records behind, per consumer group of the services (committed offsets against the
    log end offsets). Raises ``aiokafka.errors.KafkaError`` when Kafka cannot be asked."""
    bootstrap = cluster.local_settings(settings).kafka_bootstrap
    prefix = TopicNames.from_settings(settings).prefix + SERVICE_GROUP_PREFIX
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    ends = AIOKafkaConsumer(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    await admin.start()
    await ends.start()
    try:
        groups = [g[0] for g in await admin.list_consumer_groups() if g[0].startswith(prefix)]
        lag: dict[str, int] = {}
        for group in sorted(groups):
            committed = await admin.list_consumer_group_offsets(group)
            end = await ends.end_offsets(list(committed)) if committed else {}
            lag[group.removeprefix(prefix)] = sum(
                max(0, end[tp] - meta.offset) for tp, meta in committed.items() if meta.offset >= 0
            )
        return lag
    finally:
        await ends.stop()
        await admin.close()


def redis_samples(elapsed: float, settings: LocalSettings) -> list[Sample]:
    """``used_memory`` (MiB) of each Redis node that answers."""
    out = []
    for node in redis.node_ids(settings):
        used = redis.used_memory(settings, node)
        if used is not None:
            out.append(
                Sample(elapsed, redis.node_name(settings, node), "redis_used_mib", used / 2**20)
            )
    return out


def run(
    settings: LocalSettings,
    load: Plan,
    *,
    interval: float = 10.0,
    workers: int = 2,
    log: Log = print,
) -> SoakResult:
    """Run ``load`` against the cluster of ``settings`` and sample it every ``interval``
    seconds until the load generator is done. Raises what the load generator raises
    (:class:`~bench.loadgen.runner.RunError`, :class:`~bench.brokers.BrokerUnavailable`)."""
    result = SoakResult()
    goal = target(settings)
    procs = dict(goal.processes)
    failure: list[BaseException] = []

    def generate() -> None:
        try:
            result.report = runner.run(load, goal, workers, log)
        except BaseException as exc:  # reported by the main thread
            failure.append(exc)

    started = time.monotonic()
    thread = threading.Thread(target=generate, name="soak-load", daemon=True)
    thread.start()
    while thread.is_alive():
        elapsed = time.monotonic() - started
        result.samples += process_samples(elapsed, procs)
        result.samples += redis_samples(elapsed, settings)
        try:
            lag = asyncio.run(consumer_lag(settings))
        except Exception as exc:  # Kafka busy: this sample has no lag
            log(f"no lag sample at {elapsed:.0f} s: {exc!r}")
        else:
            result.samples += [Sample(elapsed, g, "lag", n) for g, n in lag.items()]
        thread.join(max(0.0, interval - (time.monotonic() - started - elapsed)))
    if failure:
        raise failure[0]
    timing = load.timing
    window = (timing.warmup, timing.warmup + timing.duration)
    result.rows = summarize(result.samples, window)
    return result


def summarize(samples: Iterable[Sample], window: tuple[float, float]) -> list[dict[str, Any]]:
    """Per (process, metric): the medians of the first and last :data:`TENTH` of
    ``window`` (seconds since the load started), the maximum over the window, and the
    change from first to last in per cent (None when the first is 0)."""
    start, end = window
    edge = (end - start) * TENTH
    series: dict[tuple[str, str], list[Sample]] = {}
    for s in samples:
        if start <= s.elapsed_s <= end:
            series.setdefault((s.process, s.metric), []).append(s)
    rows = []
    for (process, metric), values in sorted(series.items()):
        first = [s.value for s in values if s.elapsed_s <= start + edge]
        last = [s.value for s in values if s.elapsed_s >= end - edge]
        if not first or not last:
            continue
        a, b = statistics.median(first), statistics.median(last)
        rows.append(
            {
                "process": process,
                "metric": metric,
                "first": a,
                "last": b,
                "max": max(s.value for s in values),
                "change_pct": None if a == 0 else (b - a) / a * 100,
            }
        )
    return rows


def write_csv(samples: Iterable[Sample], path: Path) -> Path:
    """``elapsed_s,process,metric,value`` rows, in sampling order."""
    with path.open("w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(["elapsed_s", "process", "metric", "value"])
        for s in samples:
            writer.writerow([f"{s.elapsed_s:.1f}", s.process, s.metric, f"{s.value:.3f}"])
    return path


def chart(samples: Iterable[Sample], path: Path, title: str) -> Path:
    """One panel per metric of :data:`METRICS`, one line per process, over minutes.
    Raises ``ImportError`` without matplotlib (``pip install -e '.[bench]'``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, dict[str, list[tuple[float, float]]]] = {m: {} for m in METRICS}
    for s in samples:
        series[s.metric].setdefault(s.process, []).append((s.elapsed_s / 60, s.value))
    fig, axes = plt.subplots(len(METRICS), 1, figsize=(10, 3.2 * len(METRICS)), sharex=True)
    for ax, (metric, heading) in zip(axes, METRICS.items(), strict=True):
        for process, points in sorted(series[metric].items()):
            ax.plot([p[0] for p in points], [p[1] for p in points], label=process, lw=1)
        ax.set_title(heading, fontsize=10)
        ax.grid(alpha=0.3)
        if series[metric]:
            ax.legend(fontsize=7, ncol=4, loc="upper left")
    axes[-1].set_xlabel("minutes since the load started")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def markdown(result: SoakResult) -> str:
    """The summary rows and the load's delivery figures as Markdown."""

    def cell(value: float | None, fmt: str = ",.1f") -> str:
        return "-" if value is None else format(value, fmt)

    lines = [
        "| process | metric | first tenth | last tenth | max | change % |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in result.rows:
        lines.append(
            f"| {r['process']} | {r['metric']} | {cell(r['first'])} | {cell(r['last'])} | "
            f"{cell(r['max'])} | {cell(r['change_pct'], '+.1f')} |"
        )
    rep = result.report
    if rep:
        lines += [
            "",
            f"published {cell(rep.get('published_per_s'))} msg/s, delivered "
            f"{cell(rep.get('delivered_per_s'))} msg/s; end-to-end p50 "
            f"{cell(rep.get('latency_ms', {}).get('p50'))} ms, p99 "
            f"{cell(rep.get('latency_ms', {}).get('p99'))} ms; not received by drain end "
            f"{rep.get('lost', '-')}, duplicates {rep.get('duplicates', '-')}, reordered "
            f"{rep.get('reordered', '-')}",
        ]
    return "\n".join(lines)
