"""``python -m bench sizing``: what one connection, one subscription, one delivered message
and one stored session cost each stage, measured on a cluster of one machine, as the
grounds of the sizing page (docs/operations/sizing.md, where :mod:`bench.sizing_model`
turns them into task counts and costs).

Three phases, each recorded with the machine's load average (``os.getloadavg``: the
machine is shared):

- ``memory``: the resident set size (RSS, psutil: ``/proc/<pid>/statm``) of every process
  of the cluster, summed per stage (:func:`stage_of`), before and after ``connections``
  idle MQTT 3.1.1 connections with Clean Session = 1 (keep alive 600 s) are opened through
  HAProxy; after each of them subscribed to ``subscriptions`` distinct Topic Filters (QoS 1,
  one SUBSCRIBE each, every SUBACK awaited); after as many persistent connections (Clean
  Session = 0, persistent DEVICE sessions) with as many subscriptions each. Each sample is
  the per-process median of 3 samples a second apart, after ``settle`` seconds. Redis'
  ``used_memory`` is sampled beside its RSS. Growth divided by the units added is the
  figure: bytes per connection, per subscription, per persistent session.
- ``cpu``: paced runs of the load generator (bench/loadgen) at ``rate`` msg/s, QoS 1:
  ``p2p`` (clean sessions: ingest → router → ingest), ``persistent-p2p`` (persistent
  DEVICE subscribers: device_persist and Redis in the path) and ``fan-in-app``
  (an APPLICATION subscriber: app_delivery in the path). The CPU each process used in the
  measured window (psutil ``cpu_times``: user + system from ``/proc/<pid>/stat``) summed
  per stage, in µs per delivered message.
- ``bootstrap``: ``sessions`` persistent, disconnected sessions with ``session_subscriptions``
  subscriptions each are written straight into the compacted ``client.sessions`` and
  ``client.subscriptions`` topics (the records' own builders, :mod:`services.common.records`),
  step by step; at each step every component named is stopped cleanly and started again,
  and the seconds from the start command to its ready file (written once its state reader
  has replayed the compacted topics and it serves) are measured, with its RSS once ready.

The run appends one record per phase to ``bench/results/sizing.jsonl`` and prints a
Markdown summary (:func:`markdown`). Not part of CI: a full run takes 20 to 40 minutes here.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import secrets
import statistics
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import psutil
from aiokafka import AIOKafkaProducer

from bench import brokers, soak
from bench.loadgen import runner, wire
from bench.loadgen.plan import Options, Timing, build
from services.common.kafka.names import TopicNames
from services.common.records import (
    SessionRecord,
    client_session_record,
    client_subscriptions_record,
)
from services.common.subscription import Subscription
from services.local import cluster, redis
from services.local.settings import LocalSettings

Log = Callable[[str], None]
T = TypeVar("T")
R = TypeVar("R")

#: Stages in report order; every process of the cluster belongs to one (:func:`stage_of`).
STAGES = (
    "ingest",
    "router",
    "device_persist",
    "app_delivery",
    "haproxy",
    "redis",
    "kafka",
    "postgres",
    "admin",
)

#: Process name prefix → stage. Longest prefixes are not needed: no prefix is another's.
_PREFIXES = (
    ("ingest", "ingest"),
    ("router", "router"),
    ("device-persist", "device_persist"),
    ("app-delivery", "app_delivery"),
    ("haproxy", "haproxy"),
    ("redis", "redis"),
    ("sentinel", "redis"),
    ("kafka", "kafka"),
    ("postgres", "postgres"),
    ("admin", "admin"),
)

#: The load generator scenarios of the ``cpu`` phase, and the stage each one exercises.
CPU_SCENARIOS = ("p2p", "persistent-p2p", "fan-in-app")

#: The key of Redis' ``used_memory`` among a sample's RSS figures (not a process: no stage).
REDIS_USED = "used_memory of redis"

#: How many CONNECTs (and SUBSCRIBEs) the ``memory`` phase has in flight at once.
CONCURRENCY = 100

#: Seconds one connection may take to get its CONNACK or a SUBACK.
REPLY_TIMEOUT = 60.0


def stage_of(process: str) -> str:
    """The stage (one of :data:`STAGES`, else ``"other"``) process ``process`` of the
    cluster belongs to: ``ingest-node2`` → ``ingest``, ``kafka3`` → ``kafka``..."""
    for prefix, stage in _PREFIXES:
        if process.startswith(prefix):
            return stage
    return "other"


def by_stage(values: Mapping[str, float]) -> dict[str, float]:
    """``values`` (process name → number) summed per stage, in :data:`STAGES` order
    (``other`` last), stages without a process left out."""
    sums: dict[str, float] = {}
    for name, value in values.items():
        stage = stage_of(name)
        sums[stage] = sums.get(stage, 0.0) + value
    order = (*STAGES, "other")
    return {s: sums[s] for s in order if s in sums}


def per_unit(
    before: Mapping[str, float], after: Mapping[str, float], units: int
) -> dict[str, float]:
    """Growth per unit and stage: ``(after - before) / units`` of every process in both,
    summed per stage (bytes per connection, µs per message...). Raises ``ValueError`` when
    ``units`` < 1. :data:`REDIS_USED` is left out (it is not a process's)."""
    if units < 1:
        raise ValueError(f"growth per unit needs at least one unit, got {units}")
    growth = {n: after[n] - before[n] for n in after if n in before and n != REDIS_USED}
    return {stage: value / units for stage, value in by_stage(growth).items()}


def fit_line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Least squares line through ``points`` ((x, y) pairs): ``(intercept, slope)``.
    Raises ``ValueError`` with fewer than two distinct x."""
    xs = [x for x, _ in points]
    if len(set(xs)) < 2:
        raise ValueError("a line needs points at two different x at least")
    mean_x = statistics.fmean(xs)
    mean_y = statistics.fmean(y for _, y in points)
    sxx = sum((x - mean_x) ** 2 for x in xs)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
    slope = sxy / sxx
    return mean_y - slope * mean_x, slope


def load_average() -> list[float]:
    """The machine's 1, 5 and 15 minute load averages, rounded to 2 decimals."""
    return [round(v, 2) for v in os.getloadavg()]


# --- memory ------------------------------------------------------------------------------


def rss(procs: Mapping[str, psutil.Process]) -> dict[str, float]:
    """RSS in bytes of each process still running."""
    out: dict[str, float] = {}
    for name, proc in procs.items():
        try:
            out[name] = float(proc.memory_info().rss)
        except psutil.Error:
            continue
    return out


def redis_used(settings: LocalSettings) -> float:
    """Redis ``used_memory`` (bytes) summed over the nodes that answer."""
    return float(sum(redis.used_memory(settings, n) or 0 for n in redis.node_ids(settings)))


async def settled(
    procs: Mapping[str, psutil.Process], settings: LocalSettings, settle: float
) -> dict[str, float]:
    """After ``settle`` seconds, the per-process median of 3 RSS samples a second apart,
    and :data:`REDIS_USED` (the median of Redis' ``used_memory`` over the samples)."""
    await asyncio.sleep(settle)
    samples: list[dict[str, float]] = []
    for i in range(3):
        if i:
            await asyncio.sleep(1.0)
        one = rss(procs)
        one[REDIS_USED] = redis_used(settings)
        samples.append(one)
    names = set.intersection(*(set(s) for s in samples))
    return {n: statistics.median(s[n] for s in samples) for n in sorted(names)}


@dataclass(slots=True)
class Client:
    """One idle MQTT connection of the ``memory`` phase."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    client_id: str


async def _expect(reader: asyncio.StreamReader, kind: int, size: int, what: str) -> bytes:
    data = await asyncio.wait_for(reader.readexactly(size), REPLY_TIMEOUT)
    if data[0] >> 4 != kind:
        raise RuntimeError(f"{what}: expected packet type {kind}, got {data[0] >> 4}")
    return data


async def open_client(host: str, port: int, client_id: str, clean: bool) -> Client:
    """Connect ``client_id`` (MQTT 3.1.1, keep alive 600 s) and await its CONNACK.
    Raises ``RuntimeError`` if it is refused, ``OSError`` / ``TimeoutError`` otherwise."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(wire.connect(client_id, 4, clean=clean, keep_alive=600))
    connack = await _expect(reader, wire.CONNACK, 4, f"CONNECT of {client_id}")
    if connack[3] != 0:
        writer.close()
        raise RuntimeError(f"CONNECT of {client_id} refused: return code {connack[3]}")
    return Client(reader, writer, client_id)


async def subscribe(client: Client, filters: Sequence[str]) -> None:
    """One SUBSCRIBE (QoS 1) per filter, each SUBACK awaited; raises ``RuntimeError`` for a
    refused one."""
    for packet_id, topic_filter in enumerate(filters, 1):
        client.writer.write(wire.subscribe(packet_id, topic_filter, 1, 4))
        suback = await _expect(client.reader, wire.SUBACK, 5, f"SUBSCRIBE of {client.client_id}")
        if suback[4] == 0x80:
            raise RuntimeError(f"SUBSCRIBE {topic_filter!r} of {client.client_id} refused")


async def _bounded(fn: Callable[[T], Awaitable[R]], items: Sequence[T]) -> list[R]:
    """``fn(item)`` for every item, at most :data:`CONCURRENCY` at once; results in order."""
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(item: T) -> R:
        async with gate:
            return await fn(item)

    return list(await asyncio.gather(*(one(item) for item in items)))


def filters_of(run: str, client_id: str, count: int) -> list[str]:
    """The ``count`` distinct Topic Filters of one client (no client shares one)."""
    return [f"sizing/{run}/{client_id}/{j}" for j in range(count)]


async def _memory(
    settings: LocalSettings, connections: int, subscriptions: int, settle: float, log: Log
) -> dict[str, Any]:
    procs = soak.target(settings).processes
    host, port = "127.0.0.1", settings.listen_port
    run = secrets.token_hex(3)
    samples: dict[str, dict[str, float]] = {}
    loads: dict[str, list[float]] = {}

    async def sample(name: str) -> None:
        samples[name] = await settled(procs, settings, settle)
        loads[name] = load_average()
        log(f"memory: sampled {name!r} (load {loads[name]})")

    await sample("baseline")

    def clean_client(cid: str) -> Awaitable[Client]:
        return open_client(host, port, cid, True)

    def subscribed(client: Client) -> Awaitable[None]:
        return subscribe(client, filters_of(run, client.client_id, subscriptions))

    async def persistent(cid: str) -> Client:
        client = await open_client(host, port, cid, False)
        await subscribe(client, filters_of(run, cid, subscriptions))
        return client

    clean = await _bounded(clean_client, [f"sz{run}-c{i}" for i in range(connections)])
    await sample("idle")
    await _bounded(subscribed, clean)
    await sample("subscribed")
    kept = await _bounded(persistent, [f"sz{run}-p{i}" for i in range(connections)])
    await sample("persistent")
    for client in (*clean, *kept):
        client.writer.close()
    return {
        "connections": connections,
        "subscriptions_per_connection": subscriptions,
        "load_average": loads,
        "rss_bytes": samples,
        **memory_figures(samples, connections, subscriptions),
    }


def memory_figures(
    samples: Mapping[str, Mapping[str, float]], connections: int, subscriptions: int
) -> dict[str, Any]:
    """The ``memory`` phase's figures from its samples (sample name → process →
    bytes: ``baseline``, ``idle``, ``subscribed``, ``persistent``; :data:`REDIS_USED`
    among them): bytes per connection, per subscription and per persistent session per
    stage, and Redis' ``used_memory`` per persistent session."""
    used = {name: sample.get(REDIS_USED, 0.0) for name, sample in samples.items()}
    return {
        "bytes_per_connection": per_unit(samples["baseline"], samples["idle"], connections),
        "bytes_per_subscription": per_unit(
            samples["idle"], samples["subscribed"], connections * subscriptions
        ),
        "bytes_per_persistent_session": per_unit(
            samples["subscribed"], samples["persistent"], connections
        ),
        "redis_used_bytes_per_persistent_session": (used["persistent"] - used["subscribed"])
        / connections,
    }


def memory_phase(
    settings: LocalSettings, connections: int, subscriptions: int, settle: float, log: Log
) -> dict[str, Any]:
    """The ``memory`` phase (module docstring); its report. Raises ``RuntimeError`` when a
    CONNECT or SUBSCRIBE is refused, ``OSError`` when the cluster cannot be reached."""
    return asyncio.run(_memory(settings, connections, subscriptions, settle, log))


# --- cpu ---------------------------------------------------------------------------------


def idle_cpu(procs: Mapping[str, psutil.Process], seconds: float) -> dict[str, float]:
    """CPU seconds per second each process uses with no traffic, over ``seconds``
    (polls, timers, metrics: what a paced run's figures carry beside the messages)."""
    before = brokers.cpu_seconds(dict(procs))
    time.sleep(seconds)
    after = brokers.cpu_seconds(dict(procs))
    return {n: (after[n] - before[n]) / seconds for n in after if n in before}


def marginal_us(
    cpu_s: Mapping[str, float], idle: Mapping[str, float], duration: float, delivered: int
) -> dict[str, float]:
    """µs per delivered message and stage beyond the idle use: ``(cpu - idle x duration) /
    delivered``, each process at least 0. Raises ``ValueError`` when ``delivered`` < 1."""
    beyond = {n: max(0.0, v - idle.get(n, 0.0) * duration) * 1e6 for n, v in cpu_s.items()}
    return per_unit({n: 0.0 for n in beyond}, beyond, delivered)


def cpu_phase(
    settings: LocalSettings,
    *,
    rates: Sequence[float],
    duration: float,
    rounds: int,
    workers: int,
    log: Log,
) -> list[dict[str, Any]]:
    """The ``cpu`` phase: the idle use of every process over ``duration`` s, then each of
    :data:`CPU_SCENARIOS` at each of ``rates`` (msg/s; 0: unpaced, as fast as QoS 1 windows
    of 64 allow: the cost per message of a busy stage, whose batches are larger)
    ``rounds`` times, alternating, for ``duration`` s; one report each, with the CPU per
    delivered message in all (``us_per_delivered``) and beyond the idle use
    (``marginal_us_per_delivered``). Raises what the load generator raises
    (:class:`~bench.loadgen.runner.RunError`, :class:`~bench.brokers.BrokerUnavailable`)."""
    target = soak.target(settings)
    idle = idle_cpu(target.processes, duration)
    log(f"cpu: idle use, CPU s/s: { {n: round(v, 3) for n, v in idle.items()} }")
    out: list[dict[str, Any]] = []
    timing = Timing(warmup=5.0, duration=duration, drain=30.0, setup=60.0)
    for round_ in range(1, rounds + 1):
        for rate, scenario in itertools.product(rates, CPU_SCENARIOS):
            options = Options(qos=1, rate=rate or None, host="127.0.0.1", port=settings.listen_port)
            plan = build(scenario, options, timing)
            before = load_average()
            report = runner.run(plan, target, workers, log)
            delivered = max(1, round(report["delivered_per_s"] * duration))
            cpu: dict[str, float] = report["broker_cpu_s"]
            out.append(
                {
                    "scenario": scenario,
                    "round": round_,
                    "rate": rate,
                    "load_average": before,
                    "delivered_per_s": report["delivered_per_s"],
                    "lost": report["lost"],
                    "latency_ms": report["latency_ms"],
                    "cpu_s": cpu,
                    "idle_cpu_s_per_s": idle,
                    "us_per_delivered": marginal_us(cpu, {}, duration, delivered),
                    "marginal_us_per_delivered": marginal_us(cpu, idle, duration, delivered),
                }
            )
            figures = out[-1]["marginal_us_per_delivered"]
            log(f"cpu: {scenario} at {rate:g} round {round_}: {figures}")
    return out


# --- bootstrap ---------------------------------------------------------------------------


def session_records(
    names: TopicNames, start: int, stop: int, subscriptions: int
) -> Iterable[tuple[str, bytes, bytes | None]]:
    """The ``client.sessions`` and ``client.subscriptions`` records of sessions
    ``start`` .. ``stop - 1``: persistent, disconnected MQTT 3.1.1 DEVICE sessions (they
    never expire) with ``subscriptions`` QoS 1 subscriptions each; (topic, key, value)."""
    for i in range(start, stop):
        client_id = f"sizing-boot-{i}"
        ident = i.to_bytes(16, "big")
        session = SessionRecord(
            node_id="sizing",
            connection_id=ident,
            connected=False,
            protocol_version=4,
            clean_start=False,
            persistent=True,
            session_id=ident,
            owner="anonymous",
        )
        subs = [Subscription(client_id, f"sizing/boot/{i}/{j}", 1) for j in range(subscriptions)]
        for rec in (
            client_session_record(names, client_id, session),
            client_subscriptions_record(names, client_id, subs),
        ):
            yield rec.topic, rec.key, rec.value


async def write_sessions(
    settings: LocalSettings, start: int, stop: int, subscriptions: int
) -> None:
    """Write :func:`session_records` into the cluster's Kafka (``acks=all``), all
    acknowledged on return. Raises ``aiokafka.errors.KafkaError``."""
    bootstrap = cluster.local_settings(settings).kafka_bootstrap
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20)
    await producer.start()
    try:
        pending: list[asyncio.Future[Any]] = []
        names = TopicNames.from_settings(settings)
        for topic, key, value in session_records(names, start, stop, subscriptions):
            pending.append(await producer.send(topic, value, key=key))
            if len(pending) >= 5000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await producer.stop()


def restart(settings: LocalSettings, name: str) -> tuple[float, float]:
    """Stop component ``name`` cleanly, start it again; (seconds from the start command
    until it is ready, its RSS in bytes then). Raises
    :class:`~services.local.processes.StartError` when it does not become ready."""
    cluster.stop_component(settings, name)
    started = time.monotonic()
    pid = cluster.start_component(settings, name)
    seconds = time.monotonic() - started
    return seconds, float(psutil.Process(pid).memory_info().rss)


def bootstrap_phase(
    settings: LocalSettings,
    *,
    steps: Sequence[int],
    subscriptions: int,
    components: Sequence[str],
    rounds: int,
    log: Log,
) -> dict[str, Any]:
    """The ``bootstrap`` phase: for each total in ``steps`` (ascending), write sessions up
    to it, then restart each of ``components`` ``rounds`` times. Its report: per component
    and step the median seconds to ready and RSS, and a line fitted through them (seconds
    and bytes per 100,000 sessions)."""
    points: list[dict[str, Any]] = []
    written = 0
    for total in steps:
        if total > written:
            began = time.monotonic()
            asyncio.run(write_sessions(settings, written, total, subscriptions))
            log(f"bootstrap: wrote sessions {written}..{total} in {time.monotonic() - began:.1f} s")
            written = total
        for name in components:
            runs = [restart(settings, name) for _ in range(rounds)]
            point = {
                "component": name,
                "sessions": total,
                "subscriptions": total * subscriptions,
                "load_average": load_average(),
                "ready_s": [r[0] for r in runs],
                "ready_s_median": statistics.median(r[0] for r in runs),
                "rss_bytes_median": statistics.median(r[1] for r in runs),
            }
            points.append(point)
            log(f"bootstrap: {name} with {total} sessions ready in {point['ready_s']} s")
    fits: dict[str, dict[str, float]] = {}
    for name in components:
        mine = [p for p in points if p["component"] == name]
        if len({p["sessions"] for p in mine}) < 2:
            continue
        base_s, per_s = fit_line([(p["sessions"], p["ready_s_median"]) for p in mine])
        base_b, per_b = fit_line([(p["sessions"], p["rss_bytes_median"]) for p in mine])
        fits[name] = {
            "ready_s_at_0": base_s,
            "ready_s_per_100k_sessions": per_s * 100_000,
            "rss_bytes_at_0": base_b,
            "rss_bytes_per_session": per_b,
        }
    return {"subscriptions_per_session": subscriptions, "points": points, "fits": fits}


# --- report ------------------------------------------------------------------------------


def _mib(value: float) -> str:
    return f"{value / 2**20:,.1f}"


def _cpu_table(cpu: Sequence[Mapping[str, Any]], key: str, what: str) -> list[str]:
    stages = [s for s in (*STAGES, "other") if any(s in r[key] for r in cpu)]
    out = [
        f"CPU µs per delivered message, {what} (median over rounds):",
        "",
        "| scenario | delivered msg/s | load average | " + " | ".join(stages) + " |",
        "|---|---:|---|" + "---:|" * len(stages),
    ]
    for scenario, rate in dict.fromkeys((r["scenario"], r["rate"]) for r in cpu):
        mine = [r for r in cpu if (r["scenario"], r["rate"]) == (scenario, rate)]
        cells = [f"{statistics.median(r[key].get(s, 0.0) for r in mine):,.0f}" for s in stages]
        got = statistics.median(r["delivered_per_s"] for r in mine)
        name = f"{scenario} at {rate:,.0f} msg/s" if rate else f"{scenario}, unpaced"
        loads = ", ".join(str(r["load_average"][0]) for r in mine)
        out.append(f"| {name} | {got:,.0f} | {loads} | " + " | ".join(cells) + " |")
    return [*out, "", ""]


def markdown(memory: Mapping[str, Any] | None, cpu: Sequence[Mapping[str, Any]],
             bootstrap: Mapping[str, Any] | None) -> str:  # fmt: skip
    """The phases' reports as Markdown tables (any of them may be missing)."""
    out: list[str] = []
    if memory:
        out += [
            f"Memory ({memory['connections']:,} connections, "
            f"{memory['subscriptions_per_connection']} subscriptions each; "
            f"load average {memory['load_average']['persistent']}):",
            "",
            "| stage | bytes / idle connection | bytes / subscription | bytes / persistent "
            "session (its connection and subscriptions included) |",
            "|---|---:|---:|---:|",
        ]
        conn, sub, pers = (
            memory["bytes_per_connection"],
            memory["bytes_per_subscription"],
            memory["bytes_per_persistent_session"],
        )
        for stage in conn:
            out.append(
                f"| {stage} | {conn[stage]:,.0f} | {sub.get(stage, 0.0):,.0f} "
                f"| {pers.get(stage, 0.0):,.0f} |"
            )
        out += ["", ""]
    for key, what in (
        ("us_per_delivered", "in all"),
        ("marginal_us_per_delivered", "beyond each process's idle use"),
    ):
        runs = [r for r in cpu if key in r]
        if runs:
            out += _cpu_table(runs, key, what)
    if bootstrap:
        out += [
            f"Bootstrap ({bootstrap['subscriptions_per_session']} subscriptions per session):",
            "",
            "| component | sessions | ready s (runs) | RSS MiB | load average |",
            "|---|---:|---|---:|---|",
        ]
        for p in bootstrap["points"]:
            times = ", ".join(f"{s:.1f}" for s in p["ready_s"])
            out.append(
                f"| {p['component']} | {p['sessions']:,} | {times} | "
                f"{_mib(p['rss_bytes_median'])} | {p['load_average']} |"
            )
        out += ["", "| component | ready s at 0 | + s per 100k sessions | bytes per session |",
                "|---|---:|---:|---:|"]  # fmt: skip
        for name, fit in bootstrap["fits"].items():
            out.append(
                f"| {name} | {fit['ready_s_at_0']:.1f} | {fit['ready_s_per_100k_sessions']:.1f} "
                f"| {fit['rss_bytes_per_session']:,.0f} |"
            )
    return "\n".join(out).rstrip() + "\n"
