"""``python -m bench chaos``: kill -9 each process of the local cluster in turn, under load.

The load is :class:`bench.durability.DurabilityLoad` (by default 20 QoS 1 publishers at 500
msg/s in all and a persistent subscriber, through HAProxy). After a warm-up, each named
process is killed with SIGKILL, left down for a moment, brought back by the launcher (what
``cormorant up`` does: it starts what is not running and waits until it serves), and the
load runs on until end-to-end delivery has resumed and a while longer; then the next one.
At the end publishing stops, every PUBACK and every acknowledged message is awaited, and
the run reports acknowledged-and-lost, duplicates and reordering (MQTT 4.6, per publisher)
over the whole run, and per process:

- ``restart_s``: from the kill until the launcher has it serving again ("back");
- ``recovery_s``: from "back" until the first delivery of a message published at or after
  it (:func:`bench.resumption.resume_seconds`): how long the stack took to carry new traffic
  end to end once the process was there again;
- ``outage_s``: from the kill until the first delivery of a message published after the
  kill: how long new traffic did not get through at all;
- ``publish_resumed_s``: from the kill until every publisher had a message published after
  the kill acknowledged.

``redis-primary`` names whichever Redis node is primary at the moment of the kill (a
cluster started with ``--production``).

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
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import resumption
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

#: Seconds each process of :data:`PRODUCTION_ROUNDS` stays dead: beyond Sentinel's
#: down-after (:data:`services.local.redis.SENTINEL_DOWN_AFTER_MS`) and the brokers'
#: session timeout (:data:`services.local.kafka.BROKER_SESSION_TIMEOUT_MS`).
PRODUCTION_DOWN = 8.0

#: Stored messages per persistent client in a cluster of the chaos run's own: the most the
#: store allows, so that the backlog an outage leaves at the subscriber (500 msg/s for tens of
#: seconds) is not cut by the cap (the default, 10,000, drops the oldest after 20 s at 500
#: msg/s: by design, and reported as lost).
OWN_CLUSTER_MAX_MESSAGES = 65_534

Log = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Timing:
    """Seconds of each phase: ``warmup`` before the first kill; ``down`` between a kill and
    the restart; ``settle`` of load after recovery before the next kill; at most
    ``recovery_timeout`` waiting for delivery to resume; at most ``drain`` for the last
    PUBACKs and deliveries at the end."""

    warmup: float = 10.0
    down: float = 1.0
    settle: float = 10.0
    recovery_timeout: float = 120.0
    drain: float = 120.0


@dataclass(slots=True)
class Disruption:
    """One kill and what followed (seconds; None: it did not happen within the deadline)."""

    process: str
    restart_s: float | None = None
    recovery_s: float | None = None
    outage_s: float | None = None
    publish_resumed_s: float | None = None
    error: str | None = None
    resumed_while_down: bool | None = None
    round: Report | None = None
    killed_at: float = 0.0
    back_at: float | None = None


@dataclass(slots=True)
class ChaosResult:
    """A whole run: each disruption, the durability report, what was left at the end."""

    disruptions: list[Disruption] = field(default_factory=list)
    report: Report | None = None
    unacknowledged_at_end: int = 0
    undelivered_at_end: int = 0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (the monotonic instants are left out)."""
        rows = []
        for d in self.disruptions:
            row = asdict(d)
            del row["killed_at"], row["back_at"]
            if row["round"] is not None:
                row["round"] = {k: v for k, v in row["round"].items() if "examples" not in k}
            rows.append(row)
        return {
            "disruptions": rows,
            "report": None if self.report is None else asdict(self.report),
            "unacknowledged_at_end": self.unacknowledged_at_end,
            "undelivered_at_end": self.undelivered_at_end,
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
    try:
        if victim == KAFKA_ROLLING:
            _roll(settings, log)
        else:
            log(f"kill -9 {victim}")
            if not cluster.kill_component(settings, victim):
                disruption.error = "was not running"
            time.sleep(timing.down)
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


def _measure(result: ChaosResult, load: DurabilityLoad) -> None:
    """Fill in each disruption's recovery figures from the whole run's timelines, and its
    round's share of the durability report."""
    deliveries = load.ledger.delivery_timeline()
    acks = list(load.ledger.ack_timelines().values())
    kills = [d.killed_at for d in result.disruptions]
    for d, until in zip(result.disruptions, [*kills[1:], None], strict=True):
        d.outage_s = resumption.resume_seconds(deliveries, d.killed_at)
        d.publish_resumed_s = resumption.all_resumed_seconds(acks, d.killed_at)
        if d.back_at is not None:
            d.recovery_s = resumption.resume_seconds(deliveries, d.back_at)
        if d.outage_s is not None and d.back_at is not None:
            d.resumed_while_down = d.killed_at + d.outage_s < d.back_at
        d.round = load.ledger.report(since=d.killed_at, until=until)


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
        log("publishing stops; waiting for the last PUBACKs and deliveries")
        result.unacknowledged_at_end = load.stop_publishing(timing.drain)
        result.undelivered_at_end = load.drain(timing.drain)
        result.report = load.report()
        _measure(result, load)
    return result


@contextlib.contextmanager
def own_cluster(production: bool, **overrides: Any) -> Iterator[LocalSettings]:
    """A cluster of its own in a temporary directory on free ports (the BENCH slot of a
    block: :mod:`services.local.ports`; the production layout when asked), brought down
    at the end. ``overrides``: more settings (field name → value, e.g.
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


def table(result: ChaosResult) -> str:
    """The run as Markdown: one row per disruption, then the totals."""

    def cell(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    def counts(r: Report | None) -> str:
        if r is None:
            return "- | - | - | -"
        return f"{r.acknowledged:,} | {r.lost:,} | {r.duplicates:,} | {r.reordered:,}"

    lines = [
        "| process | restart s | recovery s | outage s | while down | publishing resumed s "
        "| acknowledged | lost | duplicates | reordered | note |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for d in result.disruptions:
        down = "-" if d.resumed_while_down is None else ("yes" if d.resumed_while_down else "no")
        lines.append(
            f"| {d.process} | {cell(d.restart_s)} | {cell(d.recovery_s)} | "
            f"{cell(d.outage_s)} | {down} | {cell(d.publish_resumed_s)} | {counts(d.round)} "
            f"| {d.error or ''} |"
        )
    r = result.report
    if r is not None:
        lines += [
            "",
            f"published {r.published:,}, acknowledged {r.acknowledged:,}, refused "
            f"{r.refused:,}, delivered {r.delivered:,}; **acknowledged and lost {r.lost:,}**, "
            f"duplicates {r.duplicates:,}, reordered {r.reordered:,}; unacknowledged at the "
            f"end {result.unacknowledged_at_end:,}",
        ]
        if r.lost_examples:
            lines.append(f"lost (publisher, seq): {r.lost_examples}")
        if r.reordered_examples:
            lines.append(f"reordered (publisher, seq): {r.reordered_examples}")
    return "\n".join(lines)
