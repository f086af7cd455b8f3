"""The router's hop alone: a ``msg.all`` record produced until its downlink record can be
read, against the local cluster's Kafka and router, without MQTT or ingest nodes.

The script plays an ingest node: it stores one connected subscriber of
``bench/hop/<run>/+`` located on a made-up node (its ``client.sessions`` and
``client.subscriptions`` records), then writes PUBLISH records to ``msg.all`` from 12
publishers (one per partition of a 12-partition ``msg.all``, roughly) with an idempotent
``acks=all`` producer, as an ingest node does, and reads the made-up node's downlink topic
with ``read_committed``. Per run: paced at ``--rate`` msg/s, the latency of every record
from the ``send`` call to its downlink record's arrival (produce, route, transaction commit,
consume), p50 / p99 in ms; with ``--rate 0``, as fast as the router goes (at most
``--window`` records awaiting their downlink record), routed records/s. Both: the router's
CPU µs per record routed in the measured window (the process ``router``).

With two ``--tree NAME=DIR``, every router of the cluster is restarted from each tree in
turn before its run (:mod:`bench.router_trees`), A B A B … for ``--rounds`` rounds; without,
the running routers are measured ``--rounds`` times. Every run is appended to
``--output`` (JSON lines, with the machine, load average, date and command).

```
python bench/bench_router_hop.py --rate 500 --rounds 5 --tree a=/tmp/a --tree b=/tmp/b
python bench/bench_router_hop.py --rate 0 --rounds 5 --tree a=/tmp/a --tree b=/tmp/b
```
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import struct
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path.cwd()))  # the checkout being run, not an installed copy

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from bench import results
from bench.router_trees import parse_tree, restart_from
from services.common.kafka.admin import downlink_topic_spec, ensure_topics
from services.common.kafka.names import TopicNames
from services.common.records import (
    HEADER_META,
    PublishMeta,
    SessionRecord,
    encode_meta,
    encode_session,
    encode_subscriptions,
)
from services.common.subscription import Subscription
from services.local import processes
from services.local.settings import LocalSettings

PUBLISHERS = 12
PAYLOAD = 64


async def _prepare(settings: LocalSettings, run: str) -> tuple[str, str]:
    """Store the subscriber; returns (its downlink topic, the topic prefix to publish to)."""
    names = TopicNames.from_settings(settings)
    node = f"hop{run}"
    spec = downlink_topic_spec(settings, node)
    await ensure_topics(settings.kafka_bootstrap, [spec], settings.replication_factor)
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all")
    await producer.start()
    try:
        client = f"hop-sub-{run}"
        prefix = f"bench/hop/{run}"
        session = SessionRecord(
            node_id=node,
            connection_id=uuid.uuid4().bytes,
            connected=True,
            protocol_version=5,
            clean_start=True,
            persistent=False,
            connected_at_ms=int(time.time() * 1000),
        )
        await producer.send_and_wait(
            names.client_sessions, encode_session(session), key=client.encode()
        )
        subs = [Subscription(client_id=client, topic_filter=f"{prefix}/+", qos=1)]
        await producer.send_and_wait(
            names.client_subscriptions, encode_subscriptions(subs), key=client.encode()
        )
    finally:
        await producer.stop()
    return spec.name, prefix


async def measure(
    settings: LocalSettings, rate: float, warmup: float, duration: float, window: int
) -> dict[str, Any]:
    """One run (see the module); returns its figures."""
    run = uuid.uuid4().hex[:8]
    downlink, prefix = await _prepare(settings, run)
    names = TopicNames.from_settings(settings)
    consumer = AIOKafkaConsumer(
        downlink,
        bootstrap_servers=settings.kafka_bootstrap,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        fetch_max_wait_ms=500,
    )
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap, acks="all", enable_idempotence=True
    )
    await consumer.start()
    await producer.start()
    sent: dict[int, float] = {}
    latencies: list[float] = []
    received = 0
    measuring = [False]
    room = asyncio.Semaphore(window)
    started = time.perf_counter()

    async def read() -> None:
        nonlocal received
        while True:
            batches = await consumer.getmany(timeout_ms=500)
            now = time.perf_counter()
            for records in batches.values():
                for record in records:
                    (seq,) = struct.unpack_from(">Q", record.value or b"")
                    at = sent.pop(seq, None)
                    if at is None:
                        continue
                    room.release()
                    if measuring[0]:
                        received += 1
                        latencies.append((now - at) * 1000)

    reader = asyncio.create_task(read())
    router = processes.find(settings.state_dir, "router")
    router_cpu = 0.0
    try:
        meta = [
            encode_meta(PublishMeta(f"{prefix}/{p}", 1, False, int(time.time() * 1000), 5))
            for p in range(PUBLISHERS)
        ]
        seq = 0
        start = time.perf_counter()
        window_start = start + warmup
        end = window_start + duration
        while (now := time.perf_counter()) < end:
            if not measuring[0] and now >= window_start:
                measuring[0] = True
                if router is not None:
                    router_cpu = sum(router.cpu_times()[:2])
            if rate:
                due = start + seq / rate
                if due > now:
                    await asyncio.sleep(due - now)
            else:
                await asyncio.wait_for(room.acquire(), 15)
            p = seq % PUBLISHERS
            sent[seq] = time.perf_counter()
            value = struct.pack(">Q", seq) + bytes(PAYLOAD - 8)
            await producer.send(
                names.msg_all, value, key=f"hop-pub-{p}".encode(), headers=[(HEADER_META, meta[p])]
            )
            seq += 1
        measuring[0] = False
        if router is not None:
            router_cpu = sum(router.cpu_times()[:2]) - router_cpu
        # Stragglers of the window: awaited (up to 15 s) so the latencies include them.
        deadline = time.perf_counter() + 15
        while sent and time.perf_counter() < deadline:
            await asyncio.sleep(0.05)
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        await producer.stop()
        await consumer.stop()
    latencies.sort()

    def pct(q: float) -> float | None:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] if latencies else None

    return {
        "rate": rate,
        "routed_per_s": received / duration,
        "latency_p50_ms": pct(0.50),
        "latency_p99_ms": pct(0.99),
        "missing": len(sent),
        # The router's CPU per record routed in the window (µs; one router instance).
        "router_cpu_us": router_cpu / received * 1e6 if received and router else None,
        "seconds": time.perf_counter() - started,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=500.0, help="msg/s (0: unpaced)")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds not measured")
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds")
    parser.add_argument("--window", type=int, default=2000, help="unpaced: records in flight")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tree", type=parse_tree, action="append", default=[])
    parser.add_argument("--output", type=Path, default=results.RESULTS_DIR / "router_hop.jsonl")
    args = parser.parse_args()
    settings = LocalSettings()
    trees = dict(args.tree)
    restart = restart_from(trees) if trees else None
    rows: dict[str, list[dict[str, Any]]] = {}
    for round_ in range(1, args.rounds + 1):
        for name in trees or ["running"]:
            if restart is not None:
                restart(name)
            figures = asyncio.run(
                measure(settings, args.rate, args.warmup, args.duration, args.window)
            )
            rows.setdefault(name, []).append(figures)
            print(f"round {round_} {name}: {figures}", flush=True)
            results.append(
                args.output,
                {
                    "label": f"router-hop-{'unpaced' if not args.rate else f'rate{args.rate:g}'}",
                    "tree": name,
                    "round": round_,
                    "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "command": " ".join(sys.argv),
                    "machine": results.machine(),
                    **figures,
                },
            )
    if restart is not None:
        restart(next(iter(trees)))
    for name, runs in rows.items():
        summary = {
            key: statistics.median(run[key] for run in runs if run[key] is not None)
            for key in ("routed_per_s", "latency_p50_ms", "latency_p99_ms", "router_cpu_us")
        }
        print(f"{name}: medians of {len(runs)} runs {summary}")


if __name__ == "__main__":
    main()
