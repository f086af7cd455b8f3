"""aiokafka against confluent-kafka (librdkafka) for the hot path, from asyncio (bench/NOTES.md,
"Lever 1"), measured before anything is switched.

Against the Kafka of the local cluster's settings (``cormorant up``; its topics are left
alone: the script makes ``<prefix>bench.kafka-clients``, 12 partitions), per client and
round, with the services' producer options (``acks=all``, idempotence, their linger):

- **produce, unpaced**: ``--records`` records of 64 B under 100 keys, at most 10,000
  awaiting Kafka's answer (as an ingest node: ``ingest_max_pending_records``); records/s
  from the first send to the last acknowledgement, and the CPU µs per record of the whole
  process (librdkafka's work is in its own threads) and of the event loop's thread;
- **consume**: the same records read back (assigned partitions, no group), records/s and
  CPU µs per record;
- **produce at ``--rate``**: for ``--seconds``; per record, the time from the send call to
  its acknowledgement as the event loop sees it, p50 / p99 ms;
- **transactions**: ``--transactions`` one-record transactions with the next offset of a
  consumer group, as the router commits a partition's batch (begin, produce,
  send offsets, commit), p50 / p99 ms each.

confluent-kafka's calls that block (``init_transactions``, ``send_offsets_to_transaction``,
``commit_transaction``, ``consume``) run in the loop's default thread pool; its delivery
reports are served by a thread of its own that hands each ``poll``'s reports to the loop
in one call. Rounds alternate the clients (A B A B …); every run is appended to
``--output`` with the machine, its load average and the command.

```
python bench/bench_kafka_clients.py --rounds 5
```
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

sys.path.insert(0, str(Path.cwd()))  # the checkout being run, not an installed copy

import confluent_kafka
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.producer import sender as aiokafka_sender
from aiokafka.structs import OffsetAndMetadata

from bench import results
from services.common.kafka.admin import TopicSpec, ensure_topics
from services.local.settings import LocalSettings

PAYLOAD = bytes(64)
KEYS = [f"client-{i}".encode() for i in range(100)]
PARTITIONS = 12
MAX_PENDING = 10_000


class Client(Protocol):
    """One Kafka client library behind the calls the benchmark makes."""

    name: str

    async def start(self) -> None: ...
    async def send(self, topic: str, value: bytes, key: bytes) -> asyncio.Future[object]:
        """Hand a record to the client; the future is its acknowledgement."""
        ...

    async def stop(self) -> None: ...
    async def consume(self, topic: str, start: dict[int, int], count: int) -> None: ...
    async def transactional(self, transactional_id: str) -> Transactional: ...


class Transactional(Protocol):
    """A started transactional producer."""

    async def one(self, topic: str, value: bytes, key: bytes, offsets: dict[int, int]) -> None:
        """One transaction: ``value`` and the group's next ``offsets`` (partition → offset
        of the bench topic)."""
        ...

    async def stop(self) -> None: ...


class AiokafkaClient:
    name = "aiokafka"
    #: Seconds aiokafka waits after CONCURRENT_TRANSACTIONS (its own default: 20 ms).
    txn_backoff = 0.02

    def __init__(self, bootstrap: str, linger_ms: int, group: str) -> None:
        self._bootstrap = bootstrap
        self._linger_ms = linger_ms
        self._group = group
        self._producer: AIOKafkaProducer | None = None

    async def start(self) -> None:
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self._bootstrap,
            acks="all",
            enable_idempotence=True,
            linger_ms=self._linger_ms,
        )
        await self._producer.start()

    async def send(self, topic: str, value: bytes, key: bytes) -> asyncio.Future[object]:
        assert self._producer is not None
        ack: asyncio.Future[object] = await self._producer.send(topic, value, key=key)
        return ack

    async def stop(self) -> None:
        assert self._producer is not None
        await self._producer.stop()

    async def consume(self, topic: str, start: dict[int, int], count: int) -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap,
            isolation_level="read_committed",
            enable_auto_commit=False,
            fetch_max_wait_ms=500,
        )
        await consumer.start()
        try:
            consumer.assign([TopicPartition(topic, p) for p in start])
            for p, offset in start.items():
                consumer.seek(TopicPartition(topic, p), offset)
            seen = 0
            while seen < count:
                batches = await consumer.getmany(timeout_ms=500, max_records=2000)
                seen += sum(len(b) for b in batches.values())
        finally:
            await consumer.stop()

    async def transactional(self, transactional_id: str) -> Transactional:
        aiokafka_sender.BACKOFF_OVERRIDE = self.txn_backoff
        producer = AIOKafkaProducer(
            bootstrap_servers=self._bootstrap,
            acks="all",
            linger_ms=self._linger_ms,
            transactional_id=transactional_id,
        )
        await producer.start()
        group = self._group

        class One:
            async def one(
                self, topic: str, value: bytes, key: bytes, offsets: dict[int, int]
            ) -> None:
                await producer.begin_transaction()
                await (await producer.send(topic, value, key=key))
                await producer.send_offsets_to_transaction(
                    {
                        TopicPartition(topic, p): OffsetAndMetadata(o, "")
                        for p, o in offsets.items()
                    },
                    group,
                )
                await producer.commit_transaction()

            async def stop(self) -> None:
                await producer.stop()

        return One()


class AiokafkaShortBackoffClient(AiokafkaClient):
    """aiokafka with its wait after ``CONCURRENT_TRANSACTIONS`` shortened from 20 to 2 ms.

    A transaction begun on a partition right after the previous one committed is refused
    with ``CONCURRENT_TRANSACTIONS`` until Kafka has written the commit markers; aiokafka
    0.14 then sleeps ``aiokafka.producer.sender.BACKOFF_OVERRIDE`` (20 ms) before asking
    again, which sets the floor of one-batch transactions.
    """

    name = "aiokafka-2ms"
    txn_backoff = 0.002


class _Reports:
    """Delivers librdkafka's delivery reports to asyncio futures: a thread polls the
    producer and hands each poll's reports to the loop in one call."""

    def __init__(self, producer: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._producer = producer
        self._loop = loop
        self._done: list[tuple[asyncio.Future[object], Any]] = []
        self._running = True
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def callback(self, future: asyncio.Future[object]) -> Callable[[Any, Any], None]:
        def report(err: Any, msg: Any) -> None:  # in the polling thread
            self._done.append((future, err))

        return report

    def _poll(self) -> None:
        while self._running:
            self._producer.poll(0.05)
            if self._done:
                done, self._done = self._done, []
                self._loop.call_soon_threadsafe(_resolve, done)

    def stop(self) -> None:
        self._running = False
        self._thread.join()


def _resolve(done: list[tuple[asyncio.Future[object], Any]]) -> None:
    for future, err in done:
        if future.done():
            continue
        if err is None:
            future.set_result(None)
        else:
            future.set_exception(confluent_kafka.KafkaException(err))


class ConfluentClient:
    name = "confluent-kafka"

    def __init__(self, bootstrap: str, linger_ms: int, group: str) -> None:
        self._bootstrap = bootstrap
        self._linger_ms = linger_ms
        self._group = group
        self._conf = {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": linger_ms,
        }
        self._producer: Any = None
        self._reports: _Reports | None = None

    async def start(self) -> None:
        self._producer = confluent_kafka.Producer(self._conf)
        self._reports = _Reports(self._producer, asyncio.get_running_loop())

    async def send(self, topic: str, value: bytes, key: bytes) -> asyncio.Future[object]:
        assert self._reports is not None
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._producer.produce(topic, value, key, on_delivery=self._reports.callback(future))
        return future

    async def stop(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self._producer.flush, 30)
        assert self._reports is not None
        self._reports.stop()

    async def consume(self, topic: str, start: dict[int, int], count: int) -> None:
        consumer = confluent_kafka.Consumer(
            {
                "bootstrap.servers": self._bootstrap,
                "group.id": f"bench-{uuid.uuid4().hex[:8]}",  # required; nothing committed
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            }
        )
        loop = asyncio.get_running_loop()
        try:
            consumer.assign([confluent_kafka.TopicPartition(topic, p, o) for p, o in start.items()])
            seen = 0
            while seen < count:
                seen += len(await loop.run_in_executor(None, consumer.consume, 2000, 0.5))
        finally:
            consumer.close()

    async def transactional(self, transactional_id: str) -> Transactional:
        loop = asyncio.get_running_loop()
        producer = confluent_kafka.Producer({**self._conf, "transactional.id": transactional_id})
        reports = _Reports(producer, loop)
        await loop.run_in_executor(None, producer.init_transactions, 30)
        # The group's metadata as aiokafka commits offsets: group id only (generation -1).
        probe = confluent_kafka.Consumer(
            {"bootstrap.servers": self._bootstrap, "group.id": self._group}
        )
        metadata = probe.consumer_group_metadata()
        probe.close()

        class One:
            async def one(
                self, topic: str, value: bytes, key: bytes, offsets: dict[int, int]
            ) -> None:
                producer.begin_transaction()
                future: asyncio.Future[object] = loop.create_future()
                producer.produce(topic, value, key, on_delivery=reports.callback(future))
                await future
                tps = [confluent_kafka.TopicPartition(topic, p, o) for p, o in offsets.items()]
                await loop.run_in_executor(
                    None, producer.send_offsets_to_transaction, tps, metadata, 30
                )
                await loop.run_in_executor(None, producer.commit_transaction, 30)

            async def stop(self) -> None:
                await loop.run_in_executor(None, producer.flush, 30)
                reports.stop()

        return One()


async def _ends(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        ends = await consumer.end_offsets([TopicPartition(topic, p) for p in range(PARTITIONS)])
    finally:
        await consumer.stop()
    return {tp.partition: offset for tp, offset in ends.items()}


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def run(
    client: Client, topic: str, bootstrap: str, args: argparse.Namespace
) -> dict[str, Any]:
    """One round of every measurement with ``client``."""
    figures: dict[str, Any] = {"client": client.name}
    await client.start()
    try:
        start = await _ends(bootstrap, topic)
        room = asyncio.Semaphore(MAX_PENDING)
        cpu, wall, loop_cpu = time.process_time(), time.perf_counter(), time.thread_time()
        acks = []
        for i in range(args.records):
            await room.acquire()
            ack = await client.send(topic, PAYLOAD, KEYS[i % len(KEYS)])
            ack.add_done_callback(lambda _: room.release())
            acks.append(ack)
        await asyncio.gather(*acks)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        loop_cpu = time.thread_time() - loop_cpu
        figures["produce_per_s"] = args.records / wall
        figures["produce_cpu_us"] = cpu / args.records * 1e6
        # The event loop's own thread: what a single-threaded service pays in its loop.
        figures["produce_loop_cpu_us"] = loop_cpu / args.records * 1e6

        cpu, wall = time.process_time(), time.perf_counter()
        await client.consume(topic, start, args.records)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        figures["consume_per_s"] = args.records / wall
        figures["consume_cpu_us"] = cpu / args.records * 1e6

        loop = asyncio.get_running_loop()
        latencies: list[float] = []

        def timed(sent: float) -> Callable[[Any], None]:
            return lambda _: latencies.append((loop.time() - sent) * 1000)

        began = loop.time()
        i = 0
        acks = []
        while (now := loop.time()) < began + args.seconds:
            due = began + i / args.rate
            if due > now:
                await asyncio.sleep(due - now)
            sent = loop.time()
            ack = await client.send(topic, PAYLOAD, KEYS[i % len(KEYS)])
            ack.add_done_callback(timed(sent))
            acks.append(ack)
            i += 1
        await asyncio.gather(*acks)
        figures["paced_p50_ms"] = _pct(latencies, 0.5)
        figures["paced_p99_ms"] = _pct(latencies, 0.99)
    finally:
        await client.stop()

    transactional = await client.transactional(f"bench-{client.name}-{uuid.uuid4().hex[:8]}")
    try:
        times: list[float] = []
        for i in range(args.transactions):
            t = time.perf_counter()
            await transactional.one(topic, PAYLOAD, KEYS[0], {i % PARTITIONS: i})
            times.append((time.perf_counter() - t) * 1000)
        figures["transaction_p50_ms"] = _pct(times, 0.5)
        figures["transaction_p99_ms"] = _pct(times, 0.99)
    finally:
        await transactional.stop()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--rate", type=float, default=2000.0, help="paced produce, records/s")
    parser.add_argument("--seconds", type=float, default=5.0, help="paced produce duration")
    parser.add_argument("--transactions", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path, default=results.RESULTS_DIR / "kafka_clients.jsonl")
    args = parser.parse_args()
    settings = LocalSettings()
    bootstrap = settings.kafka_bootstrap
    topic = f"{settings.topic_prefix}bench.kafka-clients"
    group = f"{settings.topic_prefix}bench.kafka-clients"
    asyncio.run(
        ensure_topics(bootstrap, [TopicSpec(topic, PARTITIONS)], settings.replication_factor)
    )
    linger_ms = int(settings.producer_linger_seconds * 1000)
    rows: dict[str, list[dict[str, Any]]] = {}
    for round_ in range(1, args.rounds + 1):
        for make in (AiokafkaClient, ConfluentClient, AiokafkaShortBackoffClient):
            figures = asyncio.run(run(make(bootstrap, linger_ms, group), topic, bootstrap, args))
            print(f"round {round_}: {figures}", flush=True)
            rows.setdefault(figures["client"], []).append(figures)
            results.append(
                args.output,
                {
                    "label": "kafka-clients",
                    "round": round_,
                    "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "command": " ".join(sys.argv),
                    "machine": results.machine(),
                    "versions": {
                        "aiokafka": __import__("aiokafka").__version__,
                        "confluent-kafka": confluent_kafka.version(),
                        "librdkafka": confluent_kafka.libversion()[0],
                    },
                    **figures,
                },
            )
    keys = [k for k in next(iter(rows.values()))[0] if k != "client"]
    for name, runs in rows.items():
        print(name, {k: round(statistics.median(r[k] for r in runs), 2) for k in keys})


if __name__ == "__main__":
    main()
