"""The integrations stage's Kafka sink: messages/s and CPU µs per message (issue 27).

Starts a Kafka of its own (one broker, ``services.local.kafka.start``, in a temporary state
dir on free ports), fills ``msg.all`` (12 partitions) with ``--messages`` PUBLISH records
(64 B payloads, 100 publishers, QoS 1, MQTT 5 with one User Property), then runs the
stage's :class:`~services.integrations.stage.IntegrationRunner` in this process for one
integration that matches them all, writing into a one-partition-per-``msg.all``-partition
sink topic of the same broker (the sink's transactions, offsets and fencing are what they
are against another cluster; a second broker would only add a JVM to the same two cores).
Per format (``json``, ``raw``) and round: messages/s and the process's CPU µs per message
from the first message committed to the last (the runner's group join and its 12
producers' start are left out), read from the integration's own counters. Rounds alternate
the formats; medians are printed.

```
python bench/bench_integrations.py --messages 20000 --rounds 3
```
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))  # the checkout being run, not an installed copy

from aiokafka import AIOKafkaProducer

from services.common.integrations.model import (
    Integration,
    IntegrationKind,
    KafkaSink,
    PayloadFormat,
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

PAYLOAD = bytes(64)
PUBLISHERS = 100


async def fill(settings: Settings, count: int) -> datetime:
    """Write ``count`` msg.all records; returns a time just before the first."""
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
            topic, key, value, headers = publish_record(names, client, meta, PAYLOAD)
            pending.append(await producer.send(topic, value, key=key, headers=list(headers)))
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return started


async def one_round(
    settings: Settings, payload_format: PayloadFormat, count: int
) -> tuple[float, float]:
    """(messages/s, CPU µs per message) of one runner draining ``count`` messages."""
    sink_topic = f"bench.sink.{uuid.uuid4().hex[:8]}"
    await ensure_topics(
        settings.kafka_bootstrap, [TopicSpec(sink_topic, settings.msg_all_partitions)]
    )
    since = await fill(settings, count)
    integration = Integration(
        uuid.uuid4(),
        "bench",
        IntegrationKind.KAFKA,
        ("plant/+/temp",),
        KafkaSink(settings.kafka_bootstrap, sink_topic),
        payload_format,
        updated_at=since,
    )
    runner = IntegrationRunner(settings, integration, f"bench-{uuid.uuid4().hex[:8]}")
    task = asyncio.create_task(runner.run())
    try:
        while runner.counters.sent == 0:
            await asyncio.sleep(0.01)
        first, first_cpu, sent = time.monotonic(), time.process_time(), runner.counters.sent
        while runner.counters.sent < count:
            await asyncio.sleep(0.01)
        elapsed, cpu = time.monotonic() - first, time.process_time() - first_cpu
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    done = count - sent
    return done / elapsed, cpu / done * 1e6


def main() -> None:
    """Run the benchmark (see the module)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
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
    settings = cluster.runtime_settings(local)
    results: dict[PayloadFormat, list[tuple[float, float]]] = {f: [] for f in PayloadFormat}
    try:
        for round_ in range(1, args.rounds + 1):
            for payload_format in (PayloadFormat.JSON, PayloadFormat.RAW):
                rate, cpu = asyncio.run(one_round(settings, payload_format, args.messages))
                results[payload_format].append((rate, cpu))
                figures = f"{rate:,.0f} msg/s, {cpu:.0f} µs CPU/msg"
                print(f"round {round_} {payload_format.value}: {figures}")
    finally:
        processes.stop(state, kafka.NAME, timeout=kafka.STOP_TIMEOUT)
    for payload_format, runs in results.items():
        rates, cpus = [r for r, _ in runs], [c for _, c in runs]
        print(
            f"median {payload_format.value}: {statistics.median(rates):,.0f} msg/s, "
            f"{statistics.median(cpus):.0f} µs CPU/msg (of {len(runs)} rounds)"
        )


if __name__ == "__main__":
    main()
