"""device_persist's own cost per message: its batch handling on a real store, Kafka aside.

What it measures: :meth:`DevicePersister.handle_batch` in steady state, as device_persist
runs it for persistent DEVICE sessions (docs/design.md): every batch holds ``--batch`` new
``msg.persisted`` records spread over ``--clients`` connected clients, and the
``client.acks`` records of what the previous batch delivered (one record per client, as
an ingest node writes one per read of the socket). Kafka is left out: ``send`` keeps the
downlink records and answers at once, so the figures are the persister's and the store's
alone. Reported per round (medians over rounds printed at the end):

- ``persister_cpu_us_per_msg``: this process's CPU (user + system, ``time.process_time``)
  per message stored, delivered and acknowledged;
- ``store_cpu_us_per_msg``: the Redis server's CPU (``INFO cpu``, used_cpu_user +
  used_cpu_sys, its main thread and its I/O) likewise (PostgreSQL: not measured);
- ``store_round_trips_per_batch``: requests written to the store's connections per batch
  (a pipeline is one; redis-py's SCRIPT EXISTS before a pipeline of scripts is another);
- ``batch_ms`` p50/p99: wall time of one ``handle_batch`` and its produced records'
  acknowledgements, the latency the stage adds per Kafka fetch on a quiet machine;
- ``messages_per_s``: messages per wall-clock second through the loop (one core at most).

Two source trees compare by running this script with each on ``PYTHONPATH`` (the script
uses only the persister's and stores' public calls), alternately:

```
git archive <base> | tar -x -C /tmp/base
for tree in /tmp/base . /tmp/base .; do
  PYTHONPATH=$tree python bench/bench_persist_path.py --redis-url redis://127.0.0.1:6379/0
done
```

Each run appends its record (with ``tree``) to ``--output``
(default ``bench/results/persist_path.jsonl``).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from aiokafka.structs import ConsumerRecord
from redis.asyncio.connection import AbstractConnection

from services.common.kafka.names import TopicNames
from services.common.kafka.partitioner import partition_of
from services.common.records import (
    HEADER_META,
    HEADER_TARGETS,
    AckKind,
    AckRecord,
    PublishMeta,
    SessionRecord,
    Target,
    encode_ack,
    encode_meta,
    encode_session,
    encode_targets,
    parse_downlink,
)
from services.common.settings import Settings
from services.common.stores import open_store
from services.device_persist.persister import DevicePersister

#: Partitions of the state topics in this run (every one owned by the persister).
PARTITIONS = 12

#: Payload of every message (bytes): the p2p scenarios' 64 B.
PAYLOAD = b"x" * 64


class Counter:
    """Requests written to Redis connections (round trips: each is answered before the
    pipeline's caller goes on)."""

    def __init__(self) -> None:
        self.writes = 0
        original = AbstractConnection.send_packed_command

        async def counted(conn: AbstractConnection, *args: Any, **kwargs: Any) -> None:
            self.writes += 1
            await original(conn, *args, **kwargs)

        # Patched on the class: the pool's connections are made later, on demand.
        setattr(AbstractConnection, "send_packed_command", counted)  # noqa: B010


async def redis_cpu(url: str) -> float:
    """The Redis server's CPU seconds so far (user + system)."""
    client = aioredis.Redis.from_url(url)
    try:
        info = await client.info("cpu")
    finally:
        await client.aclose()
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def run_round(args: argparse.Namespace, counter: Counter) -> dict[str, Any]:
    """One round on a fresh key prefix: warm-up batches, then the measured ones."""
    settings = Settings(
        topic_prefix=f"b{uuid.uuid4().hex[:6]}.",
        state_topic_partitions=PARTITIONS,
        store_backend=args.backend,
        redis_url=args.redis_url,
        redis_key_prefix=f"bench-{uuid.uuid4().hex[:8]}:",
        postgres_dsn=args.postgres_dsn,
    )
    names = TopicNames.from_settings(settings)
    store = open_store(settings)
    sent: list[tuple[bytes, int]] = []  # (client key, Packet Identifier) of each downlink

    async def send(
        topic: str, key: bytes, value: bytes | None, headers: Sequence[tuple[str, bytes]] | None
    ) -> Awaitable[object]:
        if topic != names.client_events:
            parsed = parse_downlink(value, list(headers or ()))
            # A window is one bundle record since 2026-11-27 and one record per message in
            # older trees (this script runs on both): each message's target either way.
            for downlink in getattr(parsed, "messages", [parsed]):
                for target in downlink.targets:
                    sent.append((key, target.packet_id))
        done: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    persister = DevicePersister(settings, store, send)
    persister.go_live()
    persister.assign(range(PARTITIONS))
    state = await store.failover_state(range(PARTITIONS))
    if state is not None:
        await store.adopt(range(PARTITIONS), state.replication_id)
    clients = [f"bench-{uuid.uuid4().hex[:10]}-{i}" for i in range(args.clients)]
    session_id = b"session-00000001"
    for client in clients:
        session = SessionRecord(
            node_id="n1",
            connection_id=b"conn-0000000000a",
            connected=True,
            protocol_version=4,
            clean_start=False,
            persistent=True,
            session_expiry_interval=3600,
            session_id=session_id,
            updated_at_ms=int(time.time() * 1000),
        )
        persister.apply_session(client.encode(), encode_session(session))
    offsets = itertools.count()
    meta = encode_meta(PublishMeta("bench/t", 1, False, int(time.time() * 1000), 4))
    targets = {c: encode_targets([Target(c, 1)]) for c in clients}

    def record(topic: str, client: str, value: bytes, headers: list[Any]) -> ConsumerRecord:
        partition = partition_of(client, PARTITIONS)
        return ConsumerRecord(
            topic, partition, next(offsets), 0, 0, client.encode(), value, None, 0, 0, headers
        )  # fmt: skip

    def batch_records() -> list[ConsumerRecord]:
        by_client: dict[bytes, list[tuple[AckKind, int]]] = {}
        for key, packet_id in sent:
            by_client.setdefault(key, []).append((AckKind.PUBACK, packet_id))
        sent.clear()
        out = [
            record(names.client_acks, key.decode(), encode_ack(AckRecord(session_id, acks)), [])
            for key, acks in by_client.items()
        ]
        for i in range(args.batch):
            client = clients[i % len(clients)]
            headers = [(HEADER_META, meta), (HEADER_TARGETS, targets[client])]
            out.append(record(names.msg_persisted, client, PAYLOAD, headers))
        return out

    async def one_batch() -> float:
        records = batch_records()
        started = time.perf_counter()
        now = int(time.time() * 1000)
        acks = await persister.handle_batch(records, now)
        await asyncio.gather(*acks)
        return (time.perf_counter() - started) * 1000

    try:
        for _ in range(args.warmup):
            await one_batch()
        cpu0, store0, writes0 = time.process_time(), await redis_cpu(args.redis_url), counter.writes
        wall0 = time.perf_counter()
        durations = [await one_batch() for _ in range(args.batches)]
        wall = time.perf_counter() - wall0
        cpu, writes = time.process_time() - cpu0, counter.writes - writes0
        store_cpu = await redis_cpu(args.redis_url) - store0
        for client in clients:
            await store.clear(client)
    finally:
        await store.close()
    messages = args.batch * args.batches
    durations.sort()
    return {
        "persister_cpu_us_per_msg": cpu / messages * 1e6,
        "store_cpu_us_per_msg": store_cpu / messages * 1e6 if args.backend == "redis" else None,
        "store_round_trips_per_batch": writes / args.batches,
        "batch_ms_p50": durations[len(durations) // 2],
        "batch_ms_p99": durations[min(len(durations) - 1, int(len(durations) * 0.99))],
        "messages_per_s": messages / wall,
    }


def main() -> None:
    """Run the rounds, print each and the medians, append the record to ``--output``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--postgres-dsn", default="postgresql://127.0.0.1:5432/cormorant")
    parser.add_argument("--backend", choices=["redis", "postgres"], default="redis")
    parser.add_argument("--clients", type=int, default=20, help="connected persistent clients")
    parser.add_argument("--batch", type=int, default=200, help="new messages per batch")
    parser.add_argument("--batches", type=int, default=100, help="measured batches per round")
    parser.add_argument("--warmup", type=int, default=10, help="unmeasured batches per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tree", default=os.environ.get("PYTHONPATH", "."), help="label")
    parser.add_argument(
        "--output", type=Path, default=Path(__file__).parent / "results" / "persist_path.jsonl"
    )
    args = parser.parse_args()
    counter = Counter()
    rounds = []
    for index in range(args.rounds):
        load = os.getloadavg()[0]
        result = asyncio.run(run_round(args, counter)) | {"load": load}
        rounds.append(result)
        print(f"round {index + 1}: " + ", ".join(f"{k} {v:.1f}" for k, v in result.items()
                                                 if v is not None), flush=True)  # fmt: skip
    medians = {
        key: statistics.median(r[key] for r in rounds)
        for key in rounds[0]
        if rounds[0][key] is not None
    }
    print("median: " + ", ".join(f"{k} {v:.1f}" for k, v in medians.items()))
    entry = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{platform.platform()}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}",
        "tree": args.tree,
        "options": {k: v for k, v in vars(args).items() if k not in {"output", "postgres_dsn"}},
        "rounds": rounds,
        "medians": medians,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with args.output.open("a", encoding="utf-8") as out:
        out.write(json.dumps(entry, default=str) + "\n")


if __name__ == "__main__":
    main()
