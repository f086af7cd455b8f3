"""The Kafka floor: the two produce → consume hops of a QoS 1 p2p message in Cormorant,
without MQTT (``python -m bench run kafka-floor``; every ``compare`` adds it to each round).

In Cormorant a p2p message crosses Kafka twice: the publisher's ingest node produces it to
``msg.all``, the router consumes it and produces it to the subscriber node's downlink
topic, and that node consumes it. The floor does the same with nothing else:

    source ──produce──▶ topic A ──consume──▶ relay ──produce──▶ topic B ──consume──▶ sink

with the Kafka client library and settings Cormorant's services use: aiokafka producers
with :func:`services.common.faust_app.producer_options` (``acks=all``, Cormorant's key
partitioner, its linger and request timeout) and idempotence (as
:class:`~services.common.faust_app.IdempotentProducer`), consumers from
:func:`services.common.kafka.consumer.make_consumer` (``read_committed``, a fetch answered
as soon as one record is there), the relay reading batches of up to 2,000 records with up
to 4 awaiting their acknowledgements (as ``consume_batches``). Topic A has
``msg_all_partitions`` partitions and topic B ``downlink_partitions``; records are keyed by
``--pairs`` publisher-like keys. Each of the three roles is its own process (as the ingest
nodes and the router are), on uvloop when installed. What the floor leaves out: MQTT,
offset commits and the router's Kafka transactions (their cost is measured by
``python -m bench transactions``).

A run has two phases on the same topics, each ``--warmup`` + ``--duration`` seconds then
at most ``--drain``. **Paced** at ``--rate`` msg/s in total (default 500): its end-to-end
latency (the sink's receive time minus the source's send time, wall clocks, of records
sent in the measure window) and produce acknowledgement latency (the analogue of PUBACK)
are what the MQTT scenarios' latencies are divided by. **Unpaced**, the source keeping at
most ``--pairs`` times ``--inflight`` records unacknowledged (as the p2p publishers'
in-flight windows): its records/s through both hops (received in the measure window) is
the throughput floor. Payloads are the load generator's (:mod:`bench.loadgen.payload`),
64 B by default.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
import traceback
from array import array
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection as Pipe
from pathlib import Path
from typing import Any

from bench import results
from bench.brokers import Target, assert_alive, cpu_seconds
from bench.loadgen import payload, stats
from bench.loadgen.plan import KAFKA_FLOOR, Options, Timing
from bench.loadgen.runner import START_LEAD, Workers
from bench.loadgen.worker import Aborted, Control, run_process
from services.common.settings import Settings

#: Paced rate of the floor when the options give none, msg/s in total.
DEFAULT_RATE = 500.0

#: Defaults of the keys (publishers) and the payload size, as the p2p scenario's.
DEFAULT_PAIRS = 10
DEFAULT_SIZE = 64

#: The two phases; a record's publisher id is ``phase << 16 | key index``.
PACED, UNPACED = 0, 1

#: The relay's batches, as ``consume_batches``: records per fetch, batches awaiting acks.
RELAY_MAX_RECORDS = 2000
RELAY_IN_FLIGHT = 4

#: Seconds a role waits for its next instruction (the parent going away ends it at once).
IDLE_TIMEOUT = 3600.0

#: The roles' processes, in the order of the pool.
SOURCE, RELAY, SINK = 0, 1, 2
ROLES = ("source", "relay", "sink")


@dataclass(frozen=True, slots=True)
class FloorPlan:
    """Everything the three processes need (picklable): the services' ``settings`` (Kafka
    address, security, producer options), the two topics, the record keys, the payload
    size (bytes), the paced rate (msg/s in total) and the unpaced window (records)."""

    settings: Settings
    topic_in: str
    topic_out: str
    keys: tuple[bytes, ...]
    size: int
    rate: float
    window: int
    timing: Timing


def label(options: Options) -> str:
    """The results label of a floor run on its own: ``kafka-floor`` (``-rate<R>``)."""
    return KAFKA_FLOOR + ("" if options.rate is None else f"-rate{options.rate:g}")


def floor_plan(options: Options, timing: Timing, settings: Settings) -> FloorPlan:
    """The floor of the MQTT scenario ``options`` describe: its pairs (or publishers) as
    the record keys, its payload size, rate (default :data:`DEFAULT_RATE`) and in-flight
    window; topics named after a fresh run id.

    Raises:
        ValueError: a count, size or rate out of range.
    """
    given = (options.pairs, options.publishers)
    pairs = next((n for n in given if n is not None), DEFAULT_PAIRS)
    size = options.size or DEFAULT_SIZE
    rate = DEFAULT_RATE if options.rate is None else options.rate
    if pairs < 1 or rate <= 0 or options.inflight < 1:
        raise ValueError("the Kafka floor needs at least one pair, a positive rate and window")
    payload.padding(size)  # raises ValueError below the header's size
    run_id = secrets.token_hex(3)
    prefix = f"{settings.topic_prefix}bench.floor.{run_id}"
    return FloorPlan(
        settings=settings,
        topic_in=f"{prefix}.in",
        topic_out=f"{prefix}.out",
        keys=tuple(f"cb-{run_id}-p{i}".encode() for i in range(pairs)),
        size=size,
        rate=rate,
        window=pairs * options.inflight,
        timing=timing,
    )


# ------------------------------------------------------------------------ the processes


def _producer(settings: Settings) -> Any:
    from aiokafka import AIOKafkaProducer

    from services.common.faust_app import producer_options

    return AIOKafkaProducer(**producer_options(settings), enable_idempotence=True)


async def _consumer(settings: Settings, topic: str, timeout: float) -> Any:
    """A started consumer of every partition of ``topic``, positioned at its end."""
    from services.common.kafka.consumer import assign_whole_topics, make_consumer

    consumer = make_consumer(settings, group_id=None)
    await consumer.start()
    async with asyncio.timeout(timeout):
        await assign_whole_topics(consumer, [topic], from_end=True)
    return consumer


def _role(pipe: Pipe, plan: FloorPlan, role: int) -> None:
    """Process entry point of one role (:data:`SOURCE`, :data:`RELAY`, :data:`SINK`)."""
    run_process(pipe, lambda: _guarded(pipe, role, plan))


async def _guarded(pipe: Pipe, role: int, plan: FloorPlan) -> None:
    control = Control(pipe)
    body: Callable[[Control, FloorPlan], Coroutine[Any, Any, None]] = (
        _source,
        _relay,
        _sink,
    )[role]
    try:
        await body(control, plan)
    except Aborted:
        pass
    except Exception as exc:
        where = traceback.extract_tb(exc.__traceback__)[-1]
        detail = "".join(traceback.format_exception_only(exc)).strip()
        with contextlib.suppress(OSError):
            control.send(
                "error",
                f"kafka-floor {ROLES[role]}: {detail} (at {Path(where.filename).name}:"
                f"{where.lineno})",
            )


async def _instructions(control: Control) -> AsyncIterator[tuple[str, Any]]:
    """Tell the parent this role is ready, then its instructions ``(kind, data)`` until
    ``stop``."""
    control.send("ready")
    while True:
        kind, data = await control.receive(IDLE_TIMEOUT, "instructions")
        if kind == "stop":
            return
        yield kind, data


async def _source(control: Control, plan: FloorPlan) -> None:
    """Produce to topic A: a probe per key, then each phase the parent starts."""
    producer = _producer(plan.settings)
    await producer.start()
    try:
        async for kind, data in _instructions(control):
            if kind == "probe":
                # Once the relay and the sink are positioned: one record per key, which
                # the sink must see before anything is measured.
                for index, key in enumerate(plan.keys):
                    probe = payload.HEADER.pack(index, payload.PROBE_SEQ, time.time_ns())
                    await (await producer.send(plan.topic_in, probe, key=key))
                control.send("probed")
                continue
            phase, start, window_start, window_end = data
            sender = _Sender(producer, plan, phase, window_start, window_end)
            await sender.run(start, window_end, plan.rate if phase == PACED else 0.0)
            control.send("sent", (sender.sent, sender.acks))
    finally:
        await producer.stop()


class _Sender:
    """One phase of the source: numbered records per key, round robin, paced or within a
    window of unacknowledged records; produce acknowledgement latencies of the records
    sent in the measure window."""

    def __init__(
        self, producer: Any, plan: FloorPlan, phase: int, window_start: int, window_end: int
    ) -> None:
        self.producer = producer
        self.plan = plan
        self.pids = [phase << 16 | i for i in range(len(plan.keys))]
        self.sent: dict[int, int] = dict.fromkeys(self.pids, 0)
        self.acks = array("q")
        self.total = 0
        self.window = (window_start, window_end)
        self.unacked = 0
        self.room = asyncio.Event()
        self.padding = payload.padding(plan.size)

    async def _send_one(self) -> None:
        index = self.total % len(self.pids)
        pid = self.pids[index]
        seq = self.sent[pid] = self.sent[pid] + 1
        self.total += 1
        now = time.time_ns()
        value = payload.HEADER.pack(pid, seq, now) + self.padding
        acknowledged = await self.producer.send(
            self.plan.topic_in, value, key=self.plan.keys[index]
        )
        self.unacked += 1
        acknowledged.add_done_callback(lambda done: self._acked(done, now))

    def _acked(self, done: asyncio.Future[Any], sent_ns: int) -> None:
        self.unacked -= 1
        self.room.set()
        if done.cancelled() or done.exception() is not None:
            return  # counted as not received by the sink
        if self.window[0] <= sent_ns < self.window[1]:
            self.acks.append(time.time_ns() - sent_ns)

    async def run(self, start: int, end: int, rate: float) -> None:
        """Send from ``start`` to ``end`` (epoch ns) at ``rate`` msg/s (0: unpaced, within
        :attr:`FloorPlan.window`); return once every record is acknowledged."""
        await asyncio.sleep(max(start - time.time_ns(), 0) / 1e9)
        while (now := time.time_ns()) < end:
            if rate:
                for _ in range(int((now - start) * rate / 1e9) + 1 - self.total):
                    await self._send_one()
                next_due = start + int(self.total * 1e9 / rate)
                await asyncio.sleep(max(next_due - time.time_ns(), 0) / 1e9)
            elif self.unacked < self.plan.window:
                for _ in range(self.plan.window - self.unacked):
                    await self._send_one()
            else:
                self.room.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.room.wait(), max(end - now, 0) / 1e9)
        await self.producer.flush()


async def _relay(control: Control, plan: FloorPlan) -> None:
    """Consume topic A and produce every record to topic B (the router's hop)."""
    producer = _producer(plan.settings)
    await producer.start()
    consumer = await _consumer(plan.settings, plan.topic_in, plan.timing.setup)
    in_flight: deque[asyncio.Future[Any]] = deque()
    try:
        control.send("ready")
        stop = asyncio.ensure_future(control.receive(IDLE_TIMEOUT, "stop"))
        while not stop.done():
            batches = await consumer.getmany(timeout_ms=500, max_records=RELAY_MAX_RECORDS)
            acks: list[Awaitable[Any]] = []
            for records in batches.values():
                for record in records:
                    acks.append(await producer.send(plan.topic_out, record.value, key=record.key))
            if acks:
                in_flight.append(asyncio.gather(*acks))
            while len(in_flight) >= RELAY_IN_FLIGHT or (in_flight and in_flight[0].done()):
                await in_flight.popleft()
        await stop
    finally:
        await consumer.stop()
        await producer.stop()


@dataclass(slots=True)
class _Phase:
    """What the sink received of one phase: ``window`` (epoch ns) of the measurement."""

    window: tuple[int, int]
    tracker: stats.SeqTracker = field(default_factory=stats.SeqTracker)
    e2e: array[int] = field(default_factory=lambda: array("q"))
    in_window: int = 0
    received: int = 0


async def _sink(control: Control, plan: FloorPlan) -> None:
    """Consume topic B (the subscriber's node): latencies and counts per phase."""
    consumer = await _consumer(plan.settings, plan.topic_out, plan.timing.setup)
    phases: dict[int, _Phase] = {}
    probes: set[int] = set()
    reading = asyncio.ensure_future(_read(consumer, phases, probes))
    try:
        async for kind, data in _instructions(control):
            if kind == "probed":
                await _until(lambda: len(probes) >= len(plan.keys), plan.timing.setup, reading)
                if len(probes) < len(plan.keys):
                    raise RuntimeError(
                        f"{len(probes)} of {len(plan.keys)} probe records came through both "
                        f"hops within {plan.timing.setup:g}s"
                    )
                control.send("routed")
            elif kind == "window":
                phase, start, end = data
                phases[phase] = _Phase((start, end))
            elif kind == "expect":
                phase, sent = data
                got = phases[phase]
                await _until(_has_all(got, sent), plan.timing.drain, reading)
                control.send("received", _result(got, sent))
    finally:
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reading
        await consumer.stop()


async def _read(consumer: Any, phases: dict[int, _Phase], probes: set[int]) -> None:
    while True:
        batches = await consumer.getmany(timeout_ms=500)
        now = time.time_ns()
        for records in batches.values():
            for record in records:
                pid, seq, sent_ns = payload.decode(record.value)
                if seq == payload.PROBE_SEQ:
                    probes.add(pid)
                    continue
                got = phases.get(pid >> 16)
                if got is None:
                    continue
                got.received += 1
                if got.tracker.add(pid, seq):
                    start, end = got.window
                    if start <= now < end:
                        got.in_window += 1
                    if start <= sent_ns < end:
                        got.e2e.append(now - sent_ns)


async def _until(
    condition: Callable[[], bool], timeout: float, reading: asyncio.Future[None]
) -> None:
    """Return once ``condition()`` holds or ``timeout`` seconds passed (the caller reports
    what arrived either way); raise the error of the ``reading`` task if it failed."""
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        if reading.done():
            reading.result()
        await asyncio.sleep(0.05)  # the reader task fills the counts meanwhile


def _has_all(got: _Phase, sent: dict[int, int]) -> Callable[[], bool]:
    """Whether the sink has every record ``sent`` (publisher id → count) of a phase."""
    return lambda: all(got.tracker.distinct().get(p, 0) >= n for p, n in sent.items())


def _result(got: _Phase, sent: dict[int, int]) -> dict[str, Any]:
    return {
        "e2e": got.e2e,
        "in_window": got.in_window,
        "received": got.received,
        "lost": stats.lost(sent, sent, got.tracker.distinct()),
        "duplicates": got.tracker.duplicates,
        "reordered": got.tracker.reordered,
    }


# ----------------------------------------------------------------------------- the parent


def run(
    options: Options,
    timing: Timing,
    settings: Settings,
    target: Target,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Run the floor of the scenario ``options`` describe (:func:`floor_plan`) on the Kafka
    of ``settings``, CPU accounted for ``target``'s ``kafka`` process (if it has one) and
    the floor's own three; returns the report (:func:`summarize`). The topics are created
    for the run and deleted after it.

    Raises:
        RunError: a process failed, or a phase did not complete in time.
        ValueError: an option out of range.
    """
    from services.common.kafka.admin import TopicSpec, delete_topics_and_groups, ensure_topics
    from services.common.kafka.security import client_security

    plan = floor_plan(options, timing, settings)
    security = client_security(settings)
    specs = [
        TopicSpec(plan.topic_in, settings.msg_all_partitions),
        TopicSpec(plan.topic_out, settings.downlink_partitions),
    ]
    asyncio.run(
        ensure_topics(
            settings.kafka_bootstrap, specs, settings.replication_factor, security=security
        )
    )
    try:
        pool = Workers([(f"bench-floor-{name}", _role, (plan, i)) for i, name in enumerate(ROLES)])
        ok = False
        try:
            report = _phases(plan, target, pool, log)
            ok = True
        finally:
            if ok:
                pool.broadcast("stop")
            pool.stop(abort=not ok)
    finally:
        asyncio.run(
            delete_topics_and_groups(
                settings.kafka_bootstrap, [s.name for s in specs], [], security=security
            )
        )
    return report


def run_recorded(
    options: Options,
    timing: Timing,
    settings: Settings,
    target: Target,
    log: Callable[[str], None],
    *,
    label: str,
    scenario: str,
    round_: int,
    recorded_options: Mapping[str, Any],
) -> dict[str, Any]:
    """:func:`run`, its headline logged, as a result record (:func:`bench.results.record`)
    of broker ``kafka-floor`` with ``label``, ``scenario``, ``round_`` and
    ``recorded_options``. Raises as :func:`run`."""
    report = run(options, timing, settings, target, log)
    log(summary_line(report))
    return results.record(
        label=label,
        scenario=scenario,
        broker=KAFKA_FLOOR,
        round_=round_,
        options=recorded_options,
        report=report,
        transport="kafka",
    )


def _phases(
    plan: FloorPlan, target: Target, pool: Workers, log: Callable[[str], None]
) -> dict[str, Any]:
    timing = plan.timing
    kafka = {n: p for n, p in target.processes.items() if n == "kafka"}
    pool.gather("ready", timing.setup * 2)
    pool.send(SOURCE, "probe")
    pool.gather("probed", timing.setup, only=[SOURCE])
    pool.send(SINK, "probed")
    pool.gather("routed", timing.setup * 2, only=[SINK])
    measured: dict[int, dict[str, Any]] = {}
    for phase in (PACED, UNPACED):
        start = time.time_ns() + int(START_LEAD * 1e9)
        window_start = start + int(timing.warmup * 1e9)
        window_end = window_start + int(timing.duration * 1e9)
        pool.send(SINK, "window", (phase, window_start, window_end))
        pool.send(SOURCE, "phase", (phase, start, window_start, window_end))
        what = f"paced at {plan.rate:g} msg/s" if phase == PACED else "unpaced"
        log(f"kafka-floor: {what}, warm-up {timing.warmup:g}s, measuring {timing.duration:g}s")
        time.sleep(max(window_start - time.time_ns(), 0) / 1e9)
        kafka_before, roles_before = cpu_seconds(kafka), pool.cpu_each()
        time.sleep(max(window_end - time.time_ns(), 0) / 1e9)
        kafka_after, roles_after = cpu_seconds(kafka), pool.cpu_each()
        assert_alive(target)
        [(sent, acks)] = pool.gather("sent", timing.drain + timing.setup, only=[SOURCE])
        pool.send(SINK, "expect", (phase, sent))
        [got] = pool.gather("received", timing.drain + timing.setup, only=[SINK])
        cpu = {n: kafka_after[n] - kafka_before[n] for n in kafka_after}
        cpu.update(
            {f"floor-{ROLES[i]}": roles_after[i] - roles_before[i] for i in range(len(ROLES))}
        )
        measured[phase] = {"sent": sent, "acks": acks, "cpu": cpu, **got}
    return summarize(plan, measured[PACED], measured[UNPACED])


def summarize(plan: FloorPlan, paced: dict[str, Any], unpaced: dict[str, Any]) -> dict[str, Any]:
    """The report of a floor run from what each phase measured (pure).

    ``paced`` and ``unpaced`` each hold ``sent`` (publisher id → records sent), ``acks``
    (produce acknowledgement latencies, ns, of the records sent in the measure window),
    ``cpu`` (process name → CPU seconds in the measure window), and the sink's ``e2e``
    (end-to-end latencies, ns), ``in_window`` (records received in the window),
    ``received``, ``lost``, ``duplicates`` and ``reordered``.

    The keys are those of a traffic run's report (``bench.loadgen.runner.summarize``) for
    the paced phase, so the comparison tables line them up: ``published_per_s``,
    ``delivered_per_s`` (msg/s), ``latency_ms`` (p50/p95/p99/max), ``puback_ms`` (the
    produce acknowledgement of topic A, p50/p99), ``broker_cpu_s`` (Kafka and the three
    processes: the whole floor), ``delivered_per_cpu_s``; and the unpaced phase's
    ``unpaced_records_per_s``, ``unpaced_published_per_s`` and ``unpaced_cpu_total_s``.
    """
    duration = plan.timing.duration
    acks = stats.latency_summary_ms(paced["acks"])
    sent = sum(paced["sent"].values())
    paced_cpu = sum(paced["cpu"].values())
    unpaced_cpu = sum(unpaced["cpu"].values())
    return {
        "transport": "kafka",
        "tls": "",
        "rate": plan.rate,
        "size": plan.size,
        "keys": len(plan.keys),
        "published_per_s": len(paced["acks"]) / duration,
        "delivered_per_s": paced["in_window"] / duration,
        "latency_ms": stats.latency_summary_ms(paced["e2e"]),
        "puback_ms": {"p50": acks["p50"], "p99": acks["p99"]},
        "latency_samples": len(paced["e2e"]),
        "sent": sent,
        "expected_deliveries": sent,
        "received": paced["received"],
        "lost": paced["lost"],
        "duplicates": paced["duplicates"] + unpaced["duplicates"],
        "reordered": paced["reordered"] + unpaced["reordered"],
        "broker_cpu_s": paced["cpu"],
        "broker_cpu_total_s": paced_cpu,
        "delivered_per_cpu_s": stats.ratio(paced["in_window"], paced_cpu),
        "unpaced_published_per_s": len(unpaced["acks"]) / duration,
        "unpaced_records_per_s": unpaced["in_window"] / duration,
        "unpaced_sent": sum(unpaced["sent"].values()),
        "unpaced_not_received": unpaced["lost"],
        "unpaced_cpu_s": unpaced["cpu"],
        "unpaced_cpu_total_s": unpaced_cpu,
    }


def summary_line(report: dict[str, Any]) -> str:
    """One line of a floor report's headline figures (for the console)."""

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    lat = report["latency_ms"]
    return (
        f"  kafka-floor at {report['rate']:g} msg/s: e2e p50/p99/max {ms(lat['p50'])}/"
        f"{ms(lat['p99'])}/{ms(lat['max'])} ms, produce ack p50/p99 "
        f"{ms(report['puback_ms']['p50'])}/{ms(report['puback_ms']['p99'])} ms, lost "
        f"{report['lost']}, dup {report['duplicates']}; unpaced "
        f"{report['unpaced_records_per_s']:,.0f} records/s"
    )
