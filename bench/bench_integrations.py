"""The integrations stage's sinks: messages/s and CPU µs per message (issue 27).

Starts a Kafka of its own (one broker, ``services.local.kafka.start``, in a temporary state
dir on free ports), and per round and case fills ``msg.all`` (12 partitions) with
``--messages`` PUBLISH records (64 B payloads, each different, 100 publishers, QoS 1,
MQTT 5 with one User Property), then runs the stage's
:class:`~services.integrations.stage.IntegrationRunner` in this process for one
integration that matches them all, into the case's sink:

- ``kafka`` (``json``, ``raw``): a sink topic of the same broker, one partition per
  ``msg.all`` partition, in transactions with the source offsets (the sink's transactions,
  offsets and fencing are what they are against another cluster; a second broker would only
  add a JVM to the same two cores);
- ``webhook`` (``json``, batch 1 and batch 100 with a 0.1 s linger; 4 requests in flight,
  the default): POSTs to an HTTP endpoint answering 200 (aiohttp) in a process of its own
  (:mod:`bench.integration_sinks`), through the at-least-once runner;
- ``mqtt`` (``raw``, the sink's QoS 1 and QoS 0): the MQTT bridge's forward direction into
  a Mosquitto the benchmark starts (:func:`bench.brokers.mosquitto`), read by an MQTT 5
  subscriber in a process of its own.

Per case and round: messages/s and this process's CPU µs per message (all its threads:
paho's network thread too) from the first message the runner counted as sent (committed,
answered 2xx, acknowledged) to the last (its group join and its producers' or connection's
start are left out), read from the integration's own counters; the receiving processes'
CPU µs per message over the same window; for the webhook and the bridge, how many of the
round's messages the receiving end got (distinct payloads, and twice-received ones). The
load average is printed with each round. Rounds alternate the cases; medians are printed.

```
python bench/bench_integrations.py --messages 10000 --rounds 3 --sinks kafka,webhook,mqtt
```
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))  # the checkout being run, not an installed copy

import psutil
from aiokafka import AIOKafkaProducer

from bench import brokers
from bench.integration_sinks import READY
from services.common.integrations.model import (
    Integration,
    IntegrationKind,
    KafkaSink,
    MqttSink,
    PayloadFormat,
    SinkSecrets,
    WebhookSink,
    check_integration,
)
from services.common.kafka.admin import TopicSpec, ensure_topics
from services.common.kafka.names import TopicNames
from services.common.mqtt.packets import PacketType
from services.common.mqtt.properties import Properties, encode_properties
from services.common.records import PublishMeta, publish_record
from services.common.settings import Settings
from services.integrations.stage import IntegrationRunner
from services.local import cluster, kafka, processes
from services.local.settings import LocalSettings

PAYLOAD_BYTES = 64
PUBLISHERS = 100
TOPIC_FILTER = "plant/+/temp"
SINKS = ("kafka", "webhook", "mqtt")

#: Seconds the runner may go without sending a message before the round is given up.
STALL_SECONDS = 120.0

#: Seconds the receiving end's tally may stay unchanged, short of every message, before
#: the round's arrivals are taken as final (QoS 0 may lose messages).
SETTLE_SECONDS = 5.0

#: Seconds a receiving process may take to say it is ready, or to answer.
SINK_PROCESS_SECONDS = 30.0


def bench_payload(nonce: str, index: int) -> bytes:
    """The ``index``-th payload of the round ``nonce`` names: :data:`PAYLOAD_BYTES` ASCII
    bytes, ``<nonce>-<index, zero-padded>``, each different within a round. Raises
    ``ValueError`` when they do not fit."""
    digits = PAYLOAD_BYTES - len(nonce) - 1
    if len(str(index)) > digits:
        raise ValueError(f"index {index} does not fit {digits} digits")
    return f"{nonce}-{index:0{digits}d}".encode("ascii")


@dataclass(frozen=True, slots=True)
class Round:
    """One case's round: ``rate`` messages/s and ``cpu_us`` this process's CPU µs per
    message; ``others_us``: the receiving processes' CPU µs per message by name;
    ``distinct``/``twice``: messages of the round the receiving end got (None: not
    counted) and those it got more than once; ``strays``: messages of earlier rounds it got
    meanwhile; ``load``: the 1-minute load average at the round's end."""

    rate: float
    cpu_us: float
    others_us: dict[str, float] = field(default_factory=dict)
    distinct: int | None = None
    twice: int = 0
    strays: int = 0
    load: float = 0.0

    def figures(self, expected: int) -> str:
        """One line: the rate, the CPU per message, the others', the arrivals of
        ``expected`` messages, the load."""
        text = f"{self.rate:,.0f} msg/s, {self.cpu_us:.0f} µs CPU/msg"
        if self.others_us:
            text += " (" + ", ".join(f"{n} {us:.0f} µs" for n, us in self.others_us.items()) + ")"
        if self.distinct is not None:
            missing = expected - self.distinct
            text += f"; arrived {self.distinct:,} of {expected:,}, {self.twice} twice"
            text += f", {missing} MISSING" if missing else ""
            text += f", {self.strays} of earlier rounds" if self.strays else ""
        return text + f"; load {self.load:.1f}"


def medians(rounds: Sequence[Round]) -> Round:
    """The median of each figure over ``rounds`` (the fewest arrivals, the most received
    twice or from earlier rounds; the highest load). Raises ``ValueError`` when ``rounds``
    is empty."""
    if not rounds:
        raise ValueError("no rounds")
    counted = [r.distinct for r in rounds if r.distinct is not None]
    return Round(
        statistics.median(r.rate for r in rounds),
        statistics.median(r.cpu_us for r in rounds),
        {
            name: statistics.median(r.others_us[name] for r in rounds)
            for name in rounds[0].others_us
        },
        min(counted) if counted else None,
        max(r.twice for r in rounds),
        max(r.strays for r in rounds),
        max(r.load for r in rounds),
    )


class SinkProcess:
    """A receiving end of :mod:`bench.integration_sinks` run as ``python -m
    bench.integration_sinks <args>``, started and ready. Raises ``RuntimeError`` when it
    does not say it is ready or stops answering."""

    def __init__(self, args: Sequence[str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.integration_sinks", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.cpu = psutil.Process(self.process.pid)
        self._line(READY)

    def _line(self, expected: str | None = None) -> str:
        assert self.process.stdout is not None
        line = self.process.stdout.readline().strip()
        if not line or (expected is not None and line != expected):
            self.close()
            raise RuntimeError(f"{self.process.args!r}: answered {line!r}, exited")
        return line

    def ask(self, command: str) -> dict[str, int]:
        """Send ``command`` (``tally``, ``reset``); its answer."""
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        answer: dict[str, int] = json.loads(self._line())
        return answer

    def close(self) -> None:
        """End its input and wait for it to exit (else kill it)."""
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        try:
            self.process.wait(SINK_PROCESS_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


@dataclass(frozen=True, slots=True)
class Case:
    """What one run measures: ``integration(settings, since)`` builds the integration (and
    what its sink needs); ``receiver`` counts what arrived (None: not counted); ``watched``:
    other processes whose CPU per message is reported, by name."""

    name: str
    integration: Callable[[Settings, datetime], Awaitable[Integration]]
    receiver: SinkProcess | None = None
    watched: dict[str, psutil.Process] = field(default_factory=dict)


async def fill(settings: Settings, count: int, nonce: str) -> datetime:
    """Write ``count`` msg.all records (payloads :func:`bench_payload`); returns a time
    just before the first."""
    names = TopicNames.from_settings(settings)
    props = encode_properties(Properties(user_properties=[("site", "north")]), PacketType.PUBLISH)
    started = datetime.now(UTC)
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all")
    await producer.start()
    try:
        pending = []
        for i in range(count):
            client = f"sensor-{i % PUBLISHERS}"
            meta = PublishMeta(f"plant/{client}/temp", 1, False, int(time.time() * 1000), 5, props)
            payload = bench_payload(nonce, i)
            topic, key, value, headers = publish_record(names, client, meta, payload)
            pending.append(await producer.send(topic, value, key=key, headers=list(headers)))
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return started


async def drain(settings: Settings, integration: Integration, count: int, case: Case) -> Round:
    """Run ``integration`` until its counters say ``count`` messages were sent; the
    figures from the first sent to the last (the CPU of ``case.watched`` over the same
    window); then, with a ``case.receiver``, keep it running until every message arrived
    (at least once: a message sent twice counts twice in the runner's counters), or
    arrivals stopped (:func:`arrivals`). Raises ``RuntimeError`` when it sends nothing for
    :data:`STALL_SECONDS`."""
    runner = IntegrationRunner(settings, integration, f"bench-{uuid.uuid4().hex[:8]}")
    task = asyncio.create_task(runner.run())

    async def until(done: Callable[[], bool]) -> None:
        progress, last = time.monotonic(), runner.counters.sent
        while not done():
            await asyncio.sleep(0.01)
            if runner.counters.sent != last:
                progress, last = time.monotonic(), runner.counters.sent
            elif time.monotonic() - progress > STALL_SECONDS:
                raise RuntimeError(
                    f"{integration.name}: {last} of {count} sent, stalled: "
                    f"{runner.counters.last_error}"
                )

    try:
        await until(lambda: runner.counters.sent > 0)
        first, first_cpu, sent = time.monotonic(), time.process_time(), runner.counters.sent
        others = brokers.cpu_seconds(case.watched)
        await until(lambda: runner.counters.sent >= count)
        elapsed, cpu = time.monotonic() - first, time.process_time() - first_cpu
        others_after = brokers.cpu_seconds(case.watched)
        tally = None if case.receiver is None else await arrivals(case.receiver, count)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    done = count - sent
    if done == 0:
        raise RuntimeError(f"{integration.name}: all {count} sent at once; give more --messages")
    return Round(
        done / elapsed,
        cpu / done * 1e6,
        {name: (others_after[name] - others[name]) / done * 1e6 for name in case.watched},
        None if tally is None else tally["distinct"],
        0 if tally is None else tally["messages"] - tally["distinct"],
        0 if tally is None else tally["strays"],
        os.getloadavg()[0],
    )


async def arrivals(receiver: SinkProcess, count: int) -> dict[str, int]:
    """``receiver``'s tally once it holds ``count`` distinct messages, or once it stayed
    the same for :data:`SETTLE_SECONDS`."""
    tally = receiver.ask("tally")
    changed = time.monotonic()
    while tally["distinct"] < count and time.monotonic() - changed < SETTLE_SECONDS:
        await asyncio.sleep(0.1)
        now = receiver.ask("tally")
        if now != tally:
            tally, changed = now, time.monotonic()
    return tally


async def one_round(settings: Settings, case: Case, count: int) -> Round:
    """Fill ``msg.all`` with ``count`` messages and drain them through ``case``."""
    nonce = uuid.uuid4().hex[:8]
    if case.receiver is not None:
        case.receiver.ask(f"reset {nonce}")
    since = await fill(settings, count, nonce)
    integration = check_integration(await case.integration(settings, since))
    return await drain(settings, integration, count, case)


def _integration(
    kind: IntegrationKind,
    sink: KafkaSink | WebhookSink | MqttSink,
    payload_format: PayloadFormat,
    since: datetime,
    secrets: SinkSecrets | None = None,
) -> Integration:
    return Integration(
        uuid.uuid4(),
        f"bench-{kind.value}",
        kind,
        (TOPIC_FILTER,),
        sink,
        payload_format,
        secrets=secrets or SinkSecrets(),
        updated_at=since,
    )


def kafka_cases() -> list[Case]:
    """The Kafka sink, per payload format: a new sink topic each round."""

    def make(payload_format: PayloadFormat) -> Case:
        async def integration(settings: Settings, since: datetime) -> Integration:
            topic = f"bench.sink.{uuid.uuid4().hex[:8]}"
            await ensure_topics(
                settings.kafka_bootstrap, [TopicSpec(topic, settings.msg_all_partitions)]
            )
            sink = KafkaSink(settings.kafka_bootstrap, topic)
            return _integration(IntegrationKind.KAFKA, sink, payload_format, since)

        return Case(f"kafka {payload_format.value}", integration)

    return [make(PayloadFormat.JSON), make(PayloadFormat.RAW)]


def webhook_cases(stack: contextlib.ExitStack) -> list[Case]:
    """The webhook into an HTTP endpoint of its own process: one message per POST, and
    batches of 100 (0.1 s linger)."""
    port = cluster.free_port()
    server = SinkProcess(["http", "--port", str(port)])
    stack.callback(server.close)
    secrets = SinkSecrets(signing_secret="bench-signing-secret-" + "0" * 32)

    def make(batch_size: int, linger_seconds: float) -> Case:
        async def integration(settings: Settings, since: datetime) -> Integration:
            sink = WebhookSink(
                f"http://127.0.0.1:{port}/hook",
                batch_size=batch_size,
                linger_seconds=linger_seconds,
            )
            return _integration(IntegrationKind.WEBHOOK, sink, PayloadFormat.JSON, since, secrets)

        return Case(
            f"webhook json batch {batch_size}", integration, server, {"HTTP server": server.cpu}
        )

    return [make(1, 0.0), make(100, 0.1)]


def mqtt_cases(stack: contextlib.ExitStack) -> list[Case]:
    """The MQTT bridge's forward direction, raw payloads, the sink's QoS 1 and QoS 0, into
    a Mosquitto read by a subscriber of its own process."""
    target = stack.enter_context(brokers.mosquitto(cluster.free_port(), cluster.free_port()))
    subscriber = SinkProcess(
        ["mqtt", "--port", str(target.port), "--topic-filter", "plant/#", "--qos", "1"]
    )
    stack.callback(subscriber.close)
    watched = {"Mosquitto": target.processes["mosquitto"], "subscriber": subscriber.cpu}

    def make(qos: int) -> Case:
        async def integration(settings: Settings, since: datetime) -> Integration:
            sink = MqttSink("127.0.0.1", target.port, qos=qos)
            return _integration(IntegrationKind.MQTT, sink, PayloadFormat.RAW, since)

        return Case(f"mqtt raw QoS {qos}", integration, subscriber, watched)

    return [make(1), make(0)]


def parse_sinks(text: str) -> list[str]:
    """The ``--sinks`` option: names of :data:`SINKS`, comma-separated, in the order given.
    Raises ``argparse.ArgumentTypeError`` on another name or none."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in SINKS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"sinks: some of {','.join(SINKS)}, not {text!r}")
    return list(dict.fromkeys(names))


@contextlib.contextmanager
def local_kafka() -> Iterator[Settings]:
    """A Kafka of its own (temporary state dir, free ports); its runtime settings."""
    state = Path(tempfile.mkdtemp(prefix="bench-integrations-"))
    local = LocalSettings().model_copy(
        update={
            "state_dir": state,
            "kafka_port": cluster.free_port(),
            "kafka_controller_port": cluster.free_port(),
            "kafka_brokers": 1,
            "topic_prefix": "bench.",
        }
    )
    local = local.model_copy(update={"kafka_bootstrap": kafka.bootstrap(local)})
    kafka.start(local)
    try:
        yield cluster.runtime_settings(local)
    finally:
        processes.stop(state, kafka.NAME, timeout=kafka.STOP_TIMEOUT)


def main() -> None:
    """Run the benchmark (see the module)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sinks", type=parse_sinks, default=list(SINKS), help=",".join(SINKS))
    args = parser.parse_args()
    print(f"load average at the start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    with contextlib.ExitStack() as stack:
        settings = stack.enter_context(local_kafka())
        makers: dict[str, Callable[[], list[Case]]] = {
            "kafka": kafka_cases,
            "webhook": lambda: webhook_cases(stack),
            "mqtt": lambda: mqtt_cases(stack),
        }
        cases = [case for sink in args.sinks for case in makers[sink]()]
        results: dict[str, list[Round]] = {case.name: [] for case in cases}
        for round_ in range(1, args.rounds + 1):
            for case in cases:
                result = asyncio.run(one_round(settings, case, args.messages))
                results[case.name].append(result)
                print(f"round {round_} {case.name}: {result.figures(args.messages)}", flush=True)
    for name, rounds in results.items():
        print(f"median {name}: {medians(rounds).figures(args.messages)} (of {len(rounds)} rounds)")
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
