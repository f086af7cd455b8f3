"""``python -m bench chaos``: kill -9 each process of the local cluster in turn, under load.

The load is :class:`bench.durability.DurabilityLoad` (by default 20 QoS 1 publishers at 500
msg/s in all and a persistent subscriber, through HAProxy). After a warm-up, each named
process is killed with SIGKILL, left down for a moment, brought back by the launcher (what
``cormorant up`` does: it starts what is not running and waits until it serves), and the
load runs on until end-to-end delivery has resumed and a while longer; then the next one.
At the end publishing stops, every PUBACK is awaited, then each publisher's ordering marker
(its newest acknowledged message: :meth:`bench.durability.Ledger.drain`), and the run
reports acknowledged-and-lost, duplicates and reordering (MQTT 4.6, per publisher)
over the whole run, and per process:

- ``restart_s``: from the kill until the launcher has it serving again ("back");
- ``recovery_s``: from "back" until the first delivery of a message published at or after
  it (:func:`bench.resumption.resume_seconds`): how long the stack took to carry new traffic
  end to end once the process was there again;
- ``flowing_s``: from "back" until the first delivery of any message: how long the stage
  took to carry traffic again once it was there (the backlog of its down time first);
- ``outage_s``: from the kill until the first delivery of a message published after the
  kill: how long new traffic did not get through at all;
- ``publish_resumed_s``: from the kill until every publisher had a message published after
  the kill acknowledged.

``redis-primary`` names whichever Redis node is primary at the moment of the kill (a
cluster started with ``--production``).

Each round is held to its aim (:data:`FAILOVER_AIM` for a Kafka broker or a Redis node,
``outage_s``; :data:`STAGE_AIM` for a stage, ``flowing_s``), printed as met or missed, and
comes with the failover steps its processes logged (:mod:`bench.timeline`): where the
seconds went.

Each disruption is also a round of the durability accounting: the messages published from
its kill until the next kill (the last one: until publishing stops) are its share of lost,
duplicated and reordered (``round``). ``resumed_while_down`` says whether delivery came back
before the killed process did (a failover, not the restart, brought it back).

With ``--production``, the default rounds are :data:`PRODUCTION_ROUNDS`: five Redis
primary kills in a row (each one a Sentinel failover, the restarted node rejoining as a
replica), then a kill -9 and restart of each of the three Kafka brokers in turn, each down
:data:`PRODUCTION_DOWN` seconds: longer than Sentinel's down-after and Kafka's broker
session timeout, so every kill is a failover, not a quick restart; last, a rolling restart
of the three brokers as one round (:data:`KAFKA_ROLLING`: each stopped cleanly and started
again, back in sync before the next).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import resumption, timeline
from bench.durability import DurabilityLoad, Report
from services.local import cluster, kafka, layout, ports, processes, redis
from services.local.settings import LocalSettings

#: The alias of the Redis node that is primary when the kill comes.
REDIS_PRIMARY = "redis-primary"

#: The name of a round that restarts every Kafka broker cleanly, one after another, each
#: started again and back in the in-sync replicas of all its partitions before the next
#: stops (:func:`services.local.kafka.start`): a rolling restart, as MSK patches brokers.
KAFKA_ROLLING = "kafka-rolling"

#: The production layout's rounds: five Redis primary kills in a row, then the three Kafka
#: brokers killed one after another, then a rolling restart of the three.
PRODUCTION_ROUNDS = (*[REDIS_PRIMARY] * 5, "kafka1", "kafka2", "kafka3", KAFKA_ROLLING)

#: The single-instance stages (process name prefixes): held to :data:`STAGE_AIM`.
STAGES = ("router", "device-persist", "app-delivery", "ingest-node")

#: Seconds each process of :data:`PRODUCTION_ROUNDS` stays dead: beyond Sentinel's
#: down-after (:data:`services.local.redis.SENTINEL_DOWN_AFTER_MS`) and the brokers'
#: session timeout (:data:`services.local.kafka.BROKER_SESSION_TIMEOUT_MS`).
PRODUCTION_DOWN = 8.0

#: Seconds within which delivery must be back after a Kafka broker or a Redis primary is
#: killed (``outage_s``, the killed process still down: a failover, not its restart, brings
#: delivery back) and after a single-instance stage (router, device_persist, app_delivery,
#: an ingest node) is back (``recovery_s``): the aims of the production layout
#: (docs/guarantees/production-failover.md). The report prints each round against its aim.
FAILOVER_AIM = 12.0
STAGE_AIM = 3.0

#: Seconds new traffic may take at most to flow again after any disruption before the run
#: counts the round as not recovered: a liveness bound, not the aim. The longest measured
#: on the shared 2-core development machine: 58 s from a Kafka broker kill to the first new
#: delivery (load average 27-40) and 57 s from a device_persist kill, 30 s of which its
#: restart (load average 30); with half as much again for a machine loaded more than that
#: (docs/guarantees/production-failover.md, "Recovery time"). It was 120 s.
RESUME_BOUND = 90.0

#: Stored messages per persistent client in a cluster of the chaos run's own: the most the
#: store allows, so that the backlog an outage leaves at the subscriber (500 msg/s for tens of
#: seconds) is not cut by the cap (the default, 10,000, drops the oldest after 20 s at 500
#: msg/s: by design, and reported as lost).
OWN_CLUSTER_MAX_MESSAGES = 65_534

Log = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Timing:
    """Seconds of each phase: ``warmup`` before the first kill; ``down`` between a kill and
    the restart (``stage_down`` instead for a single-instance stage, :data:`STAGES`, when
    given: a run can hold a Redis node down past the Sentinels' threshold and restart a
    stage at once); ``settle`` of load after recovery before the next kill; at most
    ``recovery_timeout`` waiting for delivery to resume; at the end, at most ``drain`` for
    the last PUBACKs, then the ordering markers are awaited until nothing has been
    delivered for ``drain`` seconds (a backlog that still flows is waited for)."""

    warmup: float = 10.0
    down: float = 1.0
    settle: float = 10.0
    recovery_timeout: float = RESUME_BOUND
    drain: float = 120.0
    stage_down: float | None = None

    def down_for(self, process: str) -> float:
        """Seconds ``process`` (a process name, not an alias) stays dead after its kill."""
        if self.stage_down is not None and process.startswith(STAGES):
            return self.stage_down
        return self.down


@dataclass(slots=True)
class Disruption:
    """One kill and what followed (seconds; None: it did not happen within the deadline)."""

    process: str
    restart_s: float | None = None
    recovery_s: float | None = None
    flowing_s: float | None = None
    outage_s: float | None = None
    publish_resumed_s: float | None = None
    error: str | None = None
    resumed_while_down: bool | None = None
    round: Report | None = None
    logged: list[timeline.Event] = field(default_factory=list)
    killed_at: float = 0.0
    back_at: float | None = None
    killed_wall: float = 0.0

    def aim(self) -> tuple[str, float] | None:
        """Which figure this round is held to and its aim in seconds: ``outage_s`` for a
        Kafka broker or Redis node killed, ``recovery_s`` for a stage; None for what has
        no aim (a rolling restart, PostgreSQL, HAProxy, the admin service)."""
        if self.process.startswith(("kafka", "redis")) and self.process != KAFKA_ROLLING:
            return "outage_s", FAILOVER_AIM
        if self.process.startswith(STAGES):
            return "flowing_s", STAGE_AIM
        return None

    def within_aim(self) -> bool | None:
        """Whether the round's figure (:meth:`aim`) is within its aim (None: no aim, or
        delivery did not resume)."""
        aim = self.aim()
        if aim is None:
            return None
        value = getattr(self, aim[0])
        return None if value is None else value <= aim[1]


@dataclass(slots=True)
class ChaosResult:
    """A whole run: each disruption, the durability report, what was left at the end."""

    disruptions: list[Disruption] = field(default_factory=list)
    report: Report | None = None
    unacknowledged_at_end: int = 0
    undelivered_at_end: int = 0
    markers_not_delivered: int = 0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (the monotonic instants are left out)."""
        rows = []
        for d in self.disruptions:
            row = asdict(d)
            del row["killed_at"], row["back_at"], row["killed_wall"]
            del row["logged"]
            row["timeline"] = [
                {"seconds": round(e.seconds, 3), "process": e.process, "step": e.step}
                for e in timeline.first_per_step(d.logged)
            ]
            row["within_aim"] = d.within_aim()
            if row["round"] is not None:
                row["round"] = {k: v for k, v in row["round"].items() if "examples" not in k}
            rows.append(row)
        return {
            "disruptions": rows,
            "report": None if self.report is None else asdict(self.report),
            "unacknowledged_at_end": self.unacknowledged_at_end,
            "undelivered_at_end": self.undelivered_at_end,
            "markers_not_delivered": self.markers_not_delivered,
        }


def resolve(settings: LocalSettings, name: str) -> str:
    """The process to kill for ``name``: itself, or for ``redis-primary`` the node that is
    primary now. Raises ``KeyError`` for a name the cluster does not have."""
    if name == KAFKA_ROLLING:
        if settings.kafka_brokers < 2:
            raise KeyError(f"{KAFKA_ROLLING} needs several Kafka brokers (--production)")
        return name
    if name == REDIS_PRIMARY:
        node = redis.primary(settings)
        if node is None:
            raise KeyError("no Redis primary found")
        return redis.node_name(settings, node)
    known = [part.name for part in cluster.components(settings)]
    if name not in known:
        raise KeyError(f"no process named {name!r} (known: {', '.join(known)})")
    return name


def _disrupt(
    settings: LocalSettings, load: DurabilityLoad, name: str, timing: Timing, log: Log
) -> Disruption:
    """Kill ``name``, bring it back, wait for delivery to resume, let the load settle
    (:data:`KAFKA_ROLLING`: restart the brokers one by one instead, :func:`_roll`)."""
    victim = resolve(settings, name)
    disruption = Disruption(victim)
    disruption.killed_at = time.monotonic()
    disruption.killed_wall = time.time()
    try:
        if victim == KAFKA_ROLLING:
            _roll(settings, log)
        else:
            log(f"kill -9 {victim}")
            if not cluster.kill_component(settings, victim):
                disruption.error = "was not running"
            time.sleep(timing.down_for(victim))
        cluster.up(settings)
    except (processes.StartError, TimeoutError) as exc:
        disruption.error = f"not brought back: {exc}"
        log(disruption.error)
        return disruption
    disruption.back_at = time.monotonic()
    disruption.restart_s = disruption.back_at - disruption.killed_at
    log(f"{victim} back after {disruption.restart_s:.1f} s")
    deadline = disruption.back_at + timing.recovery_timeout
    while load.ledger.resumed_at(disruption.back_at) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(timing.settle)
    return disruption


def _roll(settings: LocalSettings, log: Log) -> None:
    """Stop each Kafka broker cleanly (a controlled shutdown: its leaderships move first)
    and start it again, waiting until it is back in the in-sync replicas of its partitions
    before the next. Raises what starting a broker raises."""
    for node in kafka.broker_ids(settings):
        broker = kafka.broker_name(settings, node)
        log(f"rolling restart: stop {broker}")
        cluster.stop_component(settings, broker)
        cluster.start_component(settings, broker)
        log(f"rolling restart: {broker} back in sync")


def _measure(result: ChaosResult, load: DurabilityLoad, log_dir: Path) -> None:
    """Fill in each disruption's recovery figures from the whole run's timelines, its
    round's share of the durability report, and the failover steps its processes logged
    (:func:`bench.timeline.timeline` over ``log_dir``, from its kill to the next)."""
    deliveries = load.ledger.delivery_timeline()
    arrivals = [(delivered, delivered) for _, delivered in deliveries]
    acks = list(load.ledger.ack_timelines().values())
    kills = [d.killed_at for d in result.disruptions]
    for d, until in zip(result.disruptions, [*kills[1:], None], strict=True):
        d.outage_s = resumption.resume_seconds(deliveries, d.killed_at)
        d.publish_resumed_s = resumption.all_resumed_seconds(acks, d.killed_at)
        if d.back_at is not None:
            d.recovery_s = resumption.resume_seconds(deliveries, d.back_at)
            d.flowing_s = resumption.resume_seconds(arrivals, d.back_at)
        if d.outage_s is not None and d.back_at is not None:
            d.resumed_while_down = d.killed_at + d.outage_s < d.back_at
        d.round = load.ledger.report(since=d.killed_at, until=until)
    walls = [d.killed_wall for d in result.disruptions]
    for d, next_kill in zip(result.disruptions, [*walls[1:], time.time()], strict=True):
        d.logged = timeline.timeline(log_dir, d.killed_wall, next_kill)


def run(
    settings: LocalSettings,
    names: Sequence[str],
    *,
    publishers: int = 20,
    rate: float = 500.0,
    version: int = 4,
    timing: Timing = Timing(),
    log: Log = print,
) -> ChaosResult:
    """Run the chaos over ``names`` (in that order) against the cluster of ``settings``
    (brought up first if a part is down); a process the launcher could not bring back
    ends the rounds there. Raises ``KeyError`` for an unknown process name,
    :class:`~services.local.processes.StartError` when the cluster cannot be brought up
    before the run, ``TimeoutError`` when the load cannot be set up."""
    for name in names:
        if name != REDIS_PRIMARY:
            resolve(settings, name)
    cluster.up(settings)
    result = ChaosResult()
    log(f"load: {publishers} QoS 1 publishers at {rate:g} msg/s, one persistent subscriber")
    with DurabilityLoad(
        "127.0.0.1", settings.listen_port, publishers=publishers, rate=rate, version=version
    ) as load:
        time.sleep(timing.warmup)
        for name in names:
            disruption = _disrupt(settings, load, name, timing, log)
            result.disruptions.append(disruption)
            if disruption.back_at is None:
                # The next kill would be a second failure at once (two of three Kafka
                # brokers down: nothing meets min.insync.replicas), not what a round tests.
                log(f"stopping: {disruption.process} was not brought back")
                break
        log("publishing stops; waiting for the last PUBACKs and each publisher's last message")
        result.unacknowledged_at_end = load.stop_publishing(timing.drain)
        result.undelivered_at_end = load.drain(timing.drain)
        result.markers_not_delivered = len(load.ledger.awaited_markers())
        result.report = load.report()
        _measure(result, load, processes.log_dir(settings.state_dir))
    return result


@contextlib.contextmanager
def own_cluster(
    production: bool, keep_logs: Path | None = None, **overrides: Any
) -> Iterator[LocalSettings]:
    """A cluster of its own in a temporary directory on free ports (the BENCH slot of a
    block: :mod:`services.local.ports`; the production layout when asked), brought down
    at the end; with ``keep_logs``, its processes' logs are copied there first (the
    directory is created; the timelines of :mod:`bench.timeline` are read from them).
    ``overrides``: more settings (field name → value, e.g.
    ``application_client_ids=["app-*"]``)."""
    with tempfile.TemporaryDirectory(prefix="cormorant-chaos-") as state_dir:
        chosen = layout.PRODUCTION if production else layout.Layout()
        slot = ports.BENCH
        own = LocalSettings(
            state_dir=Path(state_dir),
            persisted_max_messages=OWN_CLUSTER_MAX_MESSAGES,
            ingest_nodes=slot.ingest_nodes,
            **overrides,
        ).model_copy(update=slot.ports(ports.free_block((slot,))))  # as Slot.settings does
        settings = layout.apply(own, chosen)
        try:
            yield settings
        finally:
            cluster.down(settings)
            if keep_logs is not None:
                logs = processes.log_dir(settings.state_dir)
                shutil.copytree(logs, keep_logs, dirs_exist_ok=True)


def table(result: ChaosResult) -> str:
    """The run as Markdown: one row per disruption, then the totals."""

    def cell(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    def counts(r: Report | None) -> str:
        if r is None:
            return "- | - | - | -"
        return f"{r.acknowledged:,} | {r.lost:,} | {r.duplicates:,} | {r.reordered:,}"

    def against_aim(d: Disruption) -> str:
        aim = d.aim()
        if aim is None:
            return "-"
        verdict = {True: "met", False: "**missed**", None: "**not resumed**"}[d.within_aim()]
        return f"{aim[0].removesuffix('_s')} ≤ {aim[1]:g} s: {verdict}"

    lines = [
        "| process | restart s | flowing s | recovery s | outage s | while down "
        "| publishing resumed s | acknowledged | lost | duplicates | reordered | aim | note |",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for d in result.disruptions:
        down = "-" if d.resumed_while_down is None else ("yes" if d.resumed_while_down else "no")
        lines.append(
            f"| {d.process} | {cell(d.restart_s)} | {cell(d.flowing_s)} | {cell(d.recovery_s)} | "
            f"{cell(d.outage_s)} | {down} | {cell(d.publish_resumed_s)} | {counts(d.round)} "
            f"| {against_aim(d)} | {d.error or ''} |"
        )
    r = result.report
    if r is not None:
        lines += [
            "",
            f"published {r.published:,}, acknowledged {r.acknowledged:,}, refused "
            f"{r.refused:,}, delivered {r.delivered:,}; **acknowledged and lost {r.lost:,}**, "
            f"duplicates {r.duplicates:,}, reordered {r.reordered:,}; unacknowledged at the "
            f"end {result.unacknowledged_at_end:,}; not delivered when the drain ended "
            f"{result.undelivered_at_end:,} (lost: a later message of the same publisher "
            f"came without it, or nothing more came); publishers whose last acknowledged "
            f"message never came {result.markers_not_delivered:,}",
        ]
        if r.lost_examples:
            lines.append(f"lost (publisher, seq): {r.lost_examples}")
        if r.reordered_examples:
            lines.append(f"reordered (publisher, seq): {r.reordered_examples}")
    for d in result.disruptions:
        lines += ["", f"{d.process}, seconds after the kill:", "```", *steps(d), "```"]
    return "\n".join(lines)


def steps(d: Disruption) -> list[str]:
    """The round's timeline: the first line of each failover step its processes logged
    (:mod:`bench.timeline`), with the run's own instants (back, first new delivery)."""
    own = [
        timeline.Event(seconds, "chaos", what, "")
        for seconds, what in (
            (d.restart_s, "launcher: the process serves again"),
            (d.outage_s, "first delivery of a message published after the kill"),
        )
        if seconds is not None
    ]
    events = sorted([*timeline.first_per_step(d.logged), *own], key=lambda e: e.seconds)
    return timeline.render(events).splitlines()
