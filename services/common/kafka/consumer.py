"""Hot-path Kafka consumption: batches straight from aiokafka, in the service's own event loop.

Every service is a Faust app, but the topics a message crosses (``msg.all``, the downlink
topics, ``msg.persisted``) are read here rather than by Faust agents. Measured reason
(bench/NOTES.md, 2026-11-23): Faust's stream hands every fetch across its consumer thread
and wraps every record in an event; the router on a Faust agent routed about 765 msg/s
while 17,000 msg/s were being stored, at 10 % of a core, with a 230 ms median end-to-end
latency at 500 msg/s. A plain ``getmany`` loop has neither cost.

:func:`consume_batches` is the consume → produce → commit loop of every stage (the router's
``msg.all``, device_persist's ``msg.persisted`` and ``client.acks``, app_delivery's
ownership topics, the ingest node's downlink topic): each batch's records are handed to the
service, which returns the acknowledgements of the records it produced for them; the batch's
offsets are committed only once all of those are in Kafka (at-least-once: a crash re-reads
at most the unacknowledged batches). Several batches are in flight at once so routing
overlaps Kafka's round trips; the producer keeps their order per partition.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata
from prometheus_client.core import GaugeMetricFamily, Metric

from services.common import metrics
from services.common.kafka.security import client_security
from services.common.settings import Settings

log = logging.getLogger(__name__)

Record: TypeAlias = "ConsumerRecord[bytes, bytes]"

BatchHandler = Callable[[list[Record]], Awaitable[Sequence[Awaitable[object]]]]
"""Handles one batch (records of several partitions, each partition's in offset order) and
returns the acknowledgements to wait for before the batch counts as done (``[]`` when it
is done already). Raising fails the batch like a failed acknowledgement."""

PartitionsHook = Callable[[set[TopicPartition]], Awaitable[None]]
"""Told the partitions a rebalance gave (all of them) or takes away from this consumer."""

#: Seconds to wait before re-reading a failed batch (Kafka or a store is down).
RETRY_BACKOFF_SECONDS = 1.0


def log_undecodable(logger: logging.Logger, record: Record, exc: BaseException) -> None:
    """Log that ``record`` (topic, partition, offset) is skipped because it could not be
    decoded: garbage on a topic is never a reason to stop a service or to lose the rest."""
    logger.warning(
        "skipping undecodable record %s[%d]@%d: %r",
        record.topic,
        record.partition,
        record.offset,
        exc,
    )


def make_consumer(
    settings: Settings, *topics: str, group_id: str | None, **overrides: object
) -> AIOKafkaConsumer:
    """An aiokafka consumer of ``topics`` tuned for the hot path (not started).

    ``group_id`` None means no consumer group (the caller assigns partitions). Offsets are
    committed by :func:`consume_batches`, never automatically. A fetch returns as soon as
    one record is there; when none is, it waits ``fetch_max_wait_ms`` at the broker, which
    costs no latency and keeps idle consumers from spinning.
    """
    options: dict[str, object] = {
        "bootstrap_servers": settings.kafka_bootstrap,
        "group_id": group_id,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "fetch_max_wait_ms": 500,
        "max_partition_fetch_bytes": max(settings.max_packet_size * 2, 1024 * 1024),
        "request_timeout_ms": max(int(settings.kafka_request_timeout_seconds * 1000), 15000),
        **client_security(settings),
    }
    options.update(overrides)
    return AIOKafkaConsumer(*topics, **options)


async def assign_whole_topics(
    consumer: AIOKafkaConsumer, topics: Sequence[str], *, from_end: bool
) -> list[TopicPartition]:
    """Give the started ``consumer`` (no consumer group) every partition of ``topics``.

    Positions start at the beginning, or with ``from_end`` at the current end (resolved
    before returning, so nothing written after the call is missed). Returns the partitions.
    Raises ``RuntimeError`` naming the topics that do not exist; bound it with a timeout.
    """
    # Checked first: subscribing to a missing topic would wait for it for the whole
    # request timeout and then fail without naming it.
    missing = set(topics) - await consumer.topics()
    if missing:
        raise RuntimeError(f"Kafka topics {sorted(missing)} do not exist")
    consumer.subscribe(list(topics))  # without a group: all partitions, once metadata has them
    while {tp.topic for tp in consumer.assignment()} != set(topics):
        await asyncio.sleep(0.05)  # assignment follows the next metadata answer
    partitions = sorted(consumer.assignment())
    if from_end:
        await consumer.seek_to_end(*partitions)
    else:
        await consumer.seek_to_beginning(*partitions)
    for tp in partitions:
        await consumer.position(tp)
    return partitions


@dataclass
class _Batch:
    offsets: dict[TopicPartition, int]  # next offset to read, per partition
    acks: Sequence[Awaitable[object]]
    error: BaseException | None = None


class _Committer(ConsumerRebalanceListener):  # type: ignore[misc]
    """Tracks batches in flight and commits what is acknowledged, in order; the rebalance
    listener of a consumer group, which tells the stage's hooks after it committed."""

    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        commit: bool,
        on_assigned: PartitionsHook | None,
        on_revoked: PartitionsHook | None,
    ) -> None:
        self.consumer = consumer
        self.commit = commit
        self.on_assigned = on_assigned
        self.on_revoked = on_revoked
        self.in_flight: deque[_Batch] = deque()
        self.committable: dict[TopicPartition, int] = {}
        self.committed: dict[TopicPartition, int] = {}

    async def settle(self, limit: int) -> bool:
        """Wait until at most ``limit`` batches are in flight; False if one of them failed."""
        while len(self.in_flight) > limit:
            batch = self.in_flight[0]
            error = batch.error or await _first_error(batch.acks)
            if error is not None:
                log.warning("a batch was not stored, it will be read again: %r", error)
                return False
            self.in_flight.popleft()
            self.committable.update(batch.offsets)
        return True

    async def flush(self) -> None:
        """Commit the acknowledged offsets not committed yet (errors are logged)."""
        todo = {
            tp: OffsetAndMetadata(offset, "")
            for tp, offset in self.committable.items()
            if self.committed.get(tp) != offset
        }
        if not self.commit or not todo:
            return
        try:
            await self.consumer.commit(todo)
        except KafkaError as exc:  # a rebalance or an outage: the next flush retries
            log.warning("offset commit failed: %r", exc)
            return
        self.committed.update({tp: meta.offset for tp, meta in todo.items()})

    async def rewind(self) -> None:
        """After a failure: drop what is in flight and read again after the last good batch."""
        for batch in self.in_flight:
            await _first_error(batch.acks)  # let them finish, whatever the outcome
        self.in_flight.clear()
        for tp in self.consumer.assignment():
            start = self.committable.get(tp)
            if start is None and self.commit:
                start = await self.consumer.committed(tp)
            if start is None:
                await self.consumer.seek_to_beginning(tp)
            else:
                self.consumer.seek(tp, start)

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        """Before a rebalance: finish the batches in flight and commit them, then tell the
        stage (which stops what it does for the partitions)."""
        if await self.settle(0):
            await self.flush()
        else:
            self.in_flight.clear()  # uncommitted: the partitions' next owner reads them again
        for tp in revoked:
            self.committable.pop(tp, None)
            self.committed.pop(tp, None)
        if self.on_revoked is not None:
            await self.on_revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        """Reading resumes from the committed offsets (unless the stage seeks elsewhere);
        the stage hears of its partitions."""
        if self.on_assigned is not None:
            await self.on_assigned(set(assigned))


async def _next_batch(
    consumer: AIOKafkaConsumer, first: Sequence[str], max_records: int
) -> dict[TopicPartition, list[Record]]:
    """Up to ``max_records`` fetched records, those of the ``first`` topics before others;
    waits up to 0.5 s when nothing has been fetched yet."""
    batches: dict[TopicPartition, list[Record]] = {}
    if first:
        preferred = [tp for tp in consumer.assignment() if tp.topic in first]
        if preferred:
            batches = await consumer.getmany(*preferred, timeout_ms=0, max_records=max_records)
    room = max_records - sum(len(part) for part in batches.values())
    if room > 0:
        more = await consumer.getmany(timeout_ms=0 if batches else 500, max_records=room)
        for tp, part in more.items():
            batches.setdefault(tp, []).extend(part)
    return batches


async def _first_error(acks: Sequence[Awaitable[object]]) -> BaseException | None:
    """Wait for every ack; the first failure among them, or None.

    Most acks are in by the time a batch settles, so done futures are only looked at;
    ``asyncio.gather`` over thousands of them cost the router 5 % of its time.
    """
    futures = [asyncio.ensure_future(ack) for ack in acks]
    waiting = [f for f in futures if not f.done()]
    if waiting:
        await asyncio.wait(waiting)
    for future in futures:
        error = future.exception() if not future.cancelled() else asyncio.CancelledError()
        if error is not None:
            return error
    return None


@dataclass(frozen=True)
class _Watched:
    stage: str
    consumer: AIOKafkaConsumer
    committer: _Committer


_WATCHED: list[_Watched] = []
_LAG: dict[tuple[str, str, int], int] = {}


async def refresh_lag() -> None:
    """Bring :func:`lag_families` up to date: for every partition a running
    :func:`consume_batches` reads, the records between its high watermark (from the last
    fetch) and what the stage has handled and had acknowledged, or else its position."""
    lags: dict[tuple[str, str, int], int] = {}
    for watched in list(_WATCHED):
        consumer = watched.consumer
        for tp in consumer.assignment():
            end = consumer.highwater(tp)
            done = watched.committer.committable.get(tp)
            if done is None:
                try:
                    done = await asyncio.wait_for(consumer.position(tp), 1.0)
                except Exception:  # a partition moving away, or Kafka unreachable
                    continue
            if end is not None:
                lags[(watched.stage, tp.topic, tp.partition)] = max(0, end - done)
    _LAG.clear()
    _LAG.update(lags)


def lag_families() -> Iterable[Metric]:
    """``cormorant_kafka_consumer_lag_records{stage, topic, partition}`` as of the last
    :func:`refresh_lag`."""
    family = GaugeMetricFamily(
        "cormorant_kafka_consumer_lag_records",
        "Records in a partition the stage has not handled yet (high watermark minus what "
        "it handled and had acknowledged).",
        labels=["stage", "topic", "partition"],
    )
    for (stage, topic, partition), lag in sorted(_LAG.items()):
        family.add_metric([stage, topic, str(partition)], lag)
    yield family


metrics.register(lag_families)
metrics.on_scrape(refresh_lag)


async def consume_batches(
    consumer: AIOKafkaConsumer,
    handle: BatchHandler,
    *,
    topics: Sequence[str] = (),
    max_records: int = 2000,
    max_in_flight: int = 4,
    commit_interval: float = 0.2,
    on_assigned: PartitionsHook | None = None,
    on_revoked: PartitionsHook | None = None,
    after_fetch: Callable[[], Awaitable[None]] | None = None,
    first: Sequence[str] = (),
    stage: str = "",
) -> None:
    """Read ``consumer`` forever, hand each batch to ``handle``, commit what is acknowledged.

    With ``topics``, the consumer subscribes to them in its consumer group, with a rebalance
    listener that settles and commits before partitions move, and offsets are committed
    every ``commit_interval`` seconds. Without, the caller assigned the partitions and
    nothing is committed. Batches are handled one after another, in order; up to
    ``max_in_flight`` of them may await their acknowledgements at once. A failed batch is
    logged and read again (with everything after it) after :data:`RETRY_BACKOFF_SECONDS`:
    at-least-once. Runs until cancelled; then what is acknowledged is committed.
    ``on_assigned`` is told the partitions the group gives this consumer after each
    rebalance (all of them, not only the new ones), and may seek them; ``on_revoked`` the
    partitions taken away, once what was read of them is committed. ``after_fetch`` runs
    after every fetch, whether it brought records or not (0.5 s at most between two when
    nothing comes). Records of the ``first`` topics already
    fetched go into a batch before any other: a backlog elsewhere does not hold them up
    (device_persist reads acknowledgements before the messages that wait for them).
    ``stage`` names the reader in ``cormorant_kafka_consumer_lag_records``.
    """
    committer = _Committer(consumer, bool(topics), on_assigned, on_revoked)
    watched = _Watched(stage, consumer, committer)
    _WATCHED.append(watched)
    if topics:
        consumer.subscribe(list(topics), listener=committer)
    last_commit = time.monotonic()
    try:
        while True:
            batches = await _next_batch(consumer, first, max_records)
            if batches:
                records = [record for part in batches.values() for record in part]
                batch = _Batch({tp: part[-1].offset + 1 for tp, part in batches.items()}, ())
                try:
                    batch.acks = await handle(records)
                except Exception as exc:
                    batch.error = exc
                committer.in_flight.append(batch)
            if after_fetch is not None:
                await after_fetch()
            if not await committer.settle(max_in_flight - 1 if batches else 0):
                await committer.rewind()
                await asyncio.sleep(RETRY_BACKOFF_SECONDS)  # Kafka or a store is down
                continue
            now = time.monotonic()
            if now - last_commit >= commit_interval:
                last_commit = now
                await committer.flush()
    finally:
        _WATCHED.remove(watched)
        with contextlib.suppress(Exception):
            if await committer.settle(0):
                await committer.flush()
