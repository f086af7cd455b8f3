"""``python -m bench sizing-plan``: from the figures ``python -m bench sizing`` measured to
task counts, MSK brokers and partitions, an ElastiCache node and a monthly cost for a
number of connections and a message rate (docs/operations/sizing.md).

Everything here is arithmetic on measured figures and on the stated assumptions
(:class:`Assumptions`, :data:`PRICES`); nothing is measured at these scales. The rules:

- a stage's vCPU = delivered msg/s x its CPU µs per delivered message (the workload's mix
  of paths, :class:`Workload`) / 10⁶ / the target utilization (the infra's autoscaling
  target, 60 %); tasks of a Python stage have one vCPU (one event loop: a bigger task
  would not use more);
- every ingest, router and device_persist task holds every session and subscription of
  the deployment (each replays the whole compacted topics: measured bytes per stored
  session); an ingest task also holds its own connections (measured bytes per persistent
  connection with its subscriptions); the smallest Fargate memory size that fits at 75 %
  is chosen, and "does not fit" said when none does (30 GiB is the largest the infra's
  task sizes allow);
- Kafka: the local broker's CPU per delivered message x ``replication_cost`` (replicas
  fetch and store each record again) on ``kafka.m7g.xlarge`` brokers (4 vCPU) at 60 %,
  and at least one broker per ``kafka_records_per_broker`` records written by clients per
  second (an assumption, not measured: the local broker's CPU per record at these low
  rates is mostly per-batch and idle cost, below what subtracting the idle use resolves);
  at least 3, a multiple of 3 (zones); partitions: ``msg.all`` twice the router tasks
  (at least 12), each client-keyed topic as many as device_persist or app_delivery tasks
  (at least 12), 4 per ingest task's downlink topic; storage: ``msg.all`` kept
  ``retention_days`` with ``record_bytes`` per record, times 3 replicas;
- Redis (one shard: the infra's replication group has no cluster mode): persistent
  sessions x measured ``used_memory`` per session, at 75 % of the node's memory; its
  CPU per persistent message against one core at 60 % says how many shards the load
  would need (more than one: beyond what the store supports today);
- NLB: one hour charge and NLCUs for the active TCP flows (100,000 per NLCU).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import sizing

#: Hours in a month, as AWS prices count them.
HOURS_PER_MONTH = 730

#: On-demand prices, us-east-1, USD, approximate (as published on AWS' price pages and
#: quoted by cost blogs in 2026; see docs/operations/sizing.md for the date and caveats).
PRICES: dict[str, float] = {
    "fargate_vcpu_hour": 0.04048,
    "fargate_gb_hour": 0.004445,
    "msk_kafka.m7g.xlarge_hour": 0.408,
    "msk_storage_gb_month": 0.10,
    "nlb_hour": 0.0225,
    "nlb_nlcu_hour": 0.006,
}

#: ElastiCache for Redis node types (memory GiB, USD per hour on demand, us-east-1, approx).
REDIS_NODES: tuple[tuple[str, float, float], ...] = (
    ("cache.r7g.large", 13.07, 0.219),
    ("cache.r7g.xlarge", 26.32, 0.437),
    ("cache.r7g.2xlarge", 52.82, 0.873),
    ("cache.r7g.4xlarge", 105.81, 1.745),
    ("cache.r7g.8xlarge", 209.55, 3.490),
    ("cache.r7g.16xlarge", 419.09, 6.981),
)

#: Fargate memory sizes (MiB) allowed with one vCPU, then the largest the infra allows.
FARGATE_1VCPU_MIB = (2048, 3072, 4096, 5120, 6144, 7168, 8192)
FARGATE_MAX_MIB = 30720

#: Stages that run as ECS tasks, in report order.
TASK_STAGES = ("ingest", "router", "device_persist", "app_delivery")


@dataclass(frozen=True, slots=True)
class Workload:
    """What a deployment carries: ``connections`` devices connected at once, each a
    persistent DEVICE session (``subscriptions`` each); ``msg_per_s`` delivered messages
    per second, in the shares of ``mix`` (load generator scenario → share, summing to 1):
    ``p2p`` clean sessions, ``persistent-p2p`` to persistent DEVICE sessions (device_persist
    and Redis), ``fan-in-app`` to APPLICATION clients (app_delivery)."""

    connections: int
    msg_per_s: float
    subscriptions: int = 2
    mix: Mapping[str, float] = field(
        default_factory=lambda: {"p2p": 0.25, "persistent-p2p": 0.25, "fan-in-app": 0.5}
    )


@dataclass(frozen=True, slots=True)
class Assumptions:
    """The assumptions beside the measurements (see the module docstring)."""

    cpu_target: float = 0.6
    memory_target: float = 0.75
    replication_cost: float = 3.0
    kafka_broker_vcpu: int = 4
    kafka_records_per_broker: float = 50_000.0
    retention_days: float = 7.0
    record_bytes: int = 200
    flows_per_nlcu: int = 100_000
    redis_replicas: int = 2


@dataclass(frozen=True, slots=True)
class Measured:
    """The figures of one ``python -m bench sizing`` run, per stage (bytes, µs)."""

    connection_bytes: Mapping[str, float]
    subscription_bytes: Mapping[str, float]
    persistent_session_bytes: Mapping[str, float]
    measured_subscriptions: int
    redis_bytes_per_session: float
    cpu_us: Mapping[str, Mapping[str, float]]
    stored_session_bytes: Mapping[str, float]
    base_rss_bytes: Mapping[str, float]


@dataclass(slots=True)
class Plan:
    """The sizing of one workload: tasks and memory (MiB, or None: does not fit) per
    stage, Kafka brokers, partitions and storage, the Redis node and shards, the monthly
    cost per item (USD) and notes on what does not fit."""

    workload: Workload
    tasks: dict[str, int] = field(default_factory=dict)
    memory_mib: dict[str, int | None] = field(default_factory=dict)
    kafka_brokers: int = 3
    partitions: int = 0
    kafka_storage_gb: float = 0.0
    redis_node: str | None = None
    redis_shards: int = 1
    cost: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def monthly(self) -> float:
        """The total monthly cost, USD."""
        return sum(self.cost.values())


def _stage(values: Mapping[str, float], stage: str) -> float:
    return max(0.0, values.get(stage, 0.0))


def cpu_us(measured: Measured, workload: Workload, stage: str) -> float:
    """µs of ``stage`` per delivered message, weighted by the workload's mix. Raises
    ``KeyError`` for a scenario of the mix that was not measured."""
    return sum(share * _stage(measured.cpu_us[s], stage) for s, share in workload.mix.items())


def fargate_memory(needed_bytes: float, target: float) -> int | None:
    """The smallest 1-vCPU Fargate memory size (MiB) holding ``needed_bytes`` at
    ``target`` use; the infra's largest (:data:`FARGATE_MAX_MIB`, a bigger task) if only
    that fits; None if nothing does."""
    for mib in (*FARGATE_1VCPU_MIB, FARGATE_MAX_MIB):
        if needed_bytes <= mib * 2**20 * target:
            return mib
    return None


def plan(measured: Measured, workload: Workload, a: Assumptions = Assumptions()) -> Plan:
    """Size ``workload`` from ``measured`` (the rules of the module docstring)."""
    out = Plan(workload)
    sessions = workload.connections
    for stage in TASK_STAGES:
        vcpu = workload.msg_per_s * cpu_us(measured, workload, stage) / 1e6
        out.tasks[stage] = max(2, math.ceil(vcpu / a.cpu_target))
    # Memory: every task of these stages holds all sessions and subscriptions.
    for stage in ("ingest", "router", "device_persist"):
        held = _stage(measured.base_rss_bytes, stage) + sessions * _stage(
            measured.stored_session_bytes, stage
        )
        if stage == "ingest":
            per_conn = _stage(measured.persistent_session_bytes, stage) + (
                workload.subscriptions - measured.measured_subscriptions
            ) * _stage(measured.subscription_bytes, stage)
            room = FARGATE_1VCPU_MIB[-1] * 2**20 * a.memory_target - held
            if room <= per_conn:
                out.notes.append(
                    f"an ingest task's copy of {sessions:,} sessions alone "
                    f"({held / 2**30:.1f} GiB) leaves no room for connections in 8 GiB"
                )
                room = FARGATE_MAX_MIB * 2**20 * a.memory_target - held
            if room > per_conn:
                per_task = int(room // per_conn)
                tasks = math.ceil(workload.connections / per_task)
                out.tasks[stage] = max(out.tasks[stage], tasks)
                held += math.ceil(workload.connections / out.tasks[stage]) * per_conn
            else:  # not even one connection fits: memory says "does not fit" below
                held += per_conn
        out.memory_mib[stage] = fargate_memory(held, a.memory_target)
        if out.memory_mib[stage] is None:
            out.notes.append(
                f"{stage}: {held / 2**30:.1f} GiB per task (every task holds every session) "
                "does not fit a Fargate task"
            )
    out.memory_mib["app_delivery"] = 2048
    # Kafka.
    kafka_vcpu = workload.msg_per_s * cpu_us(measured, workload, "kafka") / 1e6
    brokers = math.ceil(kafka_vcpu * a.replication_cost / (a.kafka_broker_vcpu * a.cpu_target))
    # Records clients write per delivered message: msg.all, then the downlink, msg.persisted
    # or msg.app record; a persistent delivery's client.acks record too.
    records = workload.msg_per_s * (2 + workload.mix.get("persistent-p2p", 0.0))
    brokers = max(brokers, math.ceil(records / a.kafka_records_per_broker))
    out.kafka_brokers = max(3, 3 * math.ceil(brokers / 3))
    state = max(12, out.tasks["device_persist"], out.tasks["app_delivery"])
    out.partitions = 3 * (
        max(12, 2 * out.tasks["router"]) + 6 * state + 4 * out.tasks["ingest"]
    )  # fmt: skip
    if out.partitions > 2000 * out.kafka_brokers:  # MSK's advice for m7g.xlarge: 1,000-2,000
        out.kafka_brokers = 3 * math.ceil(out.partitions / 2000 / 3)
    out.kafka_storage_gb = workload.msg_per_s * a.record_bytes * a.retention_days * 86_400 * 3 / 1e9
    # Redis: one shard holds every persistent session.
    redis_need = sessions * measured.redis_bytes_per_session / a.memory_target
    node = next((n for n in REDIS_NODES if n[1] * 2**30 >= redis_need), None)
    persistent_rate = workload.msg_per_s * workload.mix.get("persistent-p2p", 0.0)
    redis_cores = persistent_rate * _stage(measured.cpu_us["persistent-p2p"], "redis") / 1e6
    out.redis_shards = max(1, math.ceil(redis_cores / a.cpu_target))
    if node is None:
        node = REDIS_NODES[-1]
        out.notes.append(f"Redis: {redis_need / 2**30:.0f} GiB is more than one node holds")
    if out.redis_shards > 1:
        out.notes.append(
            f"Redis: {redis_cores:.1f} cores of commands need {out.redis_shards} shards "
            "(the store supports one)"
        )
    out.redis_node = node[0]
    # Cost.
    p = PRICES
    for stage in TASK_STAGES:
        mib = out.memory_mib[stage] or FARGATE_MAX_MIB
        vcpu = 1 if mib <= FARGATE_1VCPU_MIB[-1] else 4
        hourly = vcpu * p["fargate_vcpu_hour"] + mib / 1024 * p["fargate_gb_hour"]
        out.cost[stage] = out.tasks[stage] * hourly * HOURS_PER_MONTH
    out.cost["msk"] = out.kafka_brokers * p["msk_kafka.m7g.xlarge_hour"] * HOURS_PER_MONTH
    out.cost["msk_storage"] = out.kafka_storage_gb * p["msk_storage_gb_month"]
    out.cost["redis"] = (
        node[2] * (1 + a.redis_replicas) * out.redis_shards * HOURS_PER_MONTH
    )  # fmt: skip
    nlcu = max(1.0, workload.connections / a.flows_per_nlcu)
    out.cost["nlb"] = (p["nlb_hour"] + nlcu * p["nlb_nlcu_hour"]) * HOURS_PER_MONTH
    return out


def _latest(lines: Sequence[dict[str, Any]], scenario: str) -> dict[str, Any]:
    found = [r for r in lines if r.get("scenario") == scenario]
    if not found:
        raise KeyError(f"no {scenario} record: run `python -m bench sizing` first")
    report: dict[str, Any] = found[-1]["report"]
    return report


def measured_from(path: Path) -> Measured:
    """The latest ``memory``, ``cpu`` and ``bootstrap`` records of ``path`` (the JSON lines
    ``python -m bench sizing`` appends), as :class:`Measured` (CPU: medians over the
    unpaced runs of any record when there are some, as a task at its target utilization is
    busy and batches as they do; else over the latest record's paced runs, beyond the idle
    use when measured).
    Raises ``KeyError`` when a phase has no record, ``OSError`` when ``path`` is missing."""
    lines = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    memory = _latest(lines, "sizing-memory")
    memory.update(
        sizing.memory_figures(
            memory["rss_bytes"], memory["connections"], memory["subscriptions_per_connection"]
        )
    )  # computed again from the raw samples: the figures' rules may have been corrected
    runs = _latest(lines, "sizing-cpu")["runs"]
    # Unpaced runs of any record: a cpu run may have measured the paced rates only.
    unpaced = [
        r for x in lines if x.get("scenario") == "sizing-cpu" for r in x["report"]["runs"]
        if r.get("rate") == 0
    ]  # fmt: skip
    boot = _latest(lines, "sizing-bootstrap")
    cpu: dict[str, dict[str, float]] = {}
    for scenario in dict.fromkeys(r["scenario"] for r in runs):
        of_scenario = [r for r in runs if r["scenario"] == scenario]
        busy = [r for r in unpaced if r["scenario"] == scenario]
        mine = [
            r.get("marginal_us_per_delivered", r["us_per_delivered"]) for r in (busy or of_scenario)
        ]
        stages = dict.fromkeys(s for r in mine for s in r)
        cpu[scenario] = {s: statistics.median(r.get(s, 0.0) for r in mine) for s in stages}
    stored: dict[str, float] = {}
    base: dict[str, float] = {}
    for name, fit in boot["fits"].items():
        stage = name.split("-node")[0].replace("-", "_")
        stored[stage] = fit["rss_bytes_per_session"]
        base[stage] = fit["rss_bytes_at_0"]
    return Measured(
        connection_bytes=memory["bytes_per_connection"],
        subscription_bytes=memory["bytes_per_subscription"],
        persistent_session_bytes=memory["bytes_per_persistent_session"],
        measured_subscriptions=memory["subscriptions_per_connection"],
        redis_bytes_per_session=max(0.0, memory["redis_used_bytes_per_persistent_session"]),
        cpu_us=cpu,
        stored_session_bytes=stored,
        base_rss_bytes=base,
    )


def markdown(plans: Sequence[Plan]) -> str:
    """One row per plan: tasks per stage (memory), MSK, Redis, monthly cost; then notes."""
    rows = [
        "| connections | msg/s | ingest | router | device_persist | app_delivery | MSK brokers "
        "(partitions, storage) | Redis | USD / month |",
        "|---:|---:|---|---|---|---|---|---|---:|",
    ]

    def tasks(p: Plan, stage: str) -> str:
        mib = p.memory_mib.get(stage)
        size = "does not fit" if mib is None else f"{mib / 1024:g} GiB"
        return f"{p.tasks[stage]:,} x {size}"

    notes: list[str] = []
    for p in plans:
        w = p.workload
        redis = f"{p.redis_node} x {1 + Assumptions().redis_replicas}" + (
            f" x {p.redis_shards} shards" if p.redis_shards > 1 else ""
        )
        rows.append(
            f"| {w.connections:,} | {w.msg_per_s:,.0f} | "
            + " | ".join(tasks(p, s) for s in TASK_STAGES)
            + f" | {p.kafka_brokers} ({p.partitions:,}, {p.kafka_storage_gb / 1000:,.1f} TB) "
            f"| {redis} | {p.monthly:,.0f} |"
        )
        notes += [f"- {w.connections:,} / {w.msg_per_s:,.0f} msg/s: {n}" for n in p.notes]
    return "\n".join(rows + (["", *notes] if notes else [])) + "\n"


#: The grid of the sizing page: connections x delivered msg/s.
GRID_CONNECTIONS = (100_000, 1_000_000, 10_000_000)
GRID_RATES = (10_000.0, 100_000.0, 1_000_000.0)


def grid(measured: Measured, a: Assumptions = Assumptions()) -> list[Plan]:
    """:func:`plan` for every pair of :data:`GRID_CONNECTIONS` x :data:`GRID_RATES`."""
    return [plan(measured, Workload(c, r), a) for c in GRID_CONNECTIONS for r in GRID_RATES]
