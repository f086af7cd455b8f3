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

A stage whose outputs are new messages (the router: a record it writes twice is delivered
twice) reads in Kafka transactions instead (:class:`PartitionTransactions`, KIP-98): what
it produces for a partition's records and the partition's next offset are committed
together or not at all, so a crash re-reads only what no reader saw. Readers of what such
a stage writes read committed records only (:func:`make_consumer`'s ``read_committed``).
Each input partition has its own transactional producer whose ``transactional.id`` names
the partition: the instance the group gives the partition next starts a producer with the
same id, which fences the previous owner (a process paused past its session timeout can
no longer commit) and aborts its open transaction at once, instead of after Kafka's
transaction timeout. (aiokafka 0.14 commits offsets in a transaction with the group id
only, not the group generation, so Kafka 2.5's one-producer-per-instance fencing, KIP-447,
is not available to it.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

from aiokafka import (
    AIOKafkaConsumer,
    AIOKafkaProducer,
    ConsumerRebalanceListener,
    ConsumerRecord,
    TopicPartition,
)
from aiokafka.consumer.group_coordinator import GroupCoordinator
from aiokafka.errors import (
    GroupAuthorizationFailedError,
    InconsistentGroupProtocolError,
    InvalidGroupIdError,
    InvalidSessionTimeoutError,
    KafkaError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    TopicAuthorizationFailedError,
)
from aiokafka.producer import sender as aiokafka_sender
from aiokafka.structs import OffsetAndMetadata
from prometheus_client.core import GaugeMetricFamily, Metric

from services.common import metrics
from services.common.kafka.names import kind_of_topic
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

CommittedOffset = Callable[[TopicPartition], Awaitable[int | None]]
"""The committed offset of a partition (None: none yet). Raises ``KafkaError`` when Kafka
cannot say."""

CommitHook = Callable[[Mapping[TopicPartition, int], Mapping[TopicPartition, BaseException]], None]
"""Told, after transactions were committed or given up, the partitions whose transactions
committed (with the next offset committed) and those whose transactions were aborted (with
the error that aborted each)."""

#: Seconds to wait before re-reading a failed batch (Kafka or a store is down).
RETRY_BACKOFF_SECONDS = 1.0

#: Seconds a transactional producer being replaced may take to hand over what it holds.
PRODUCER_CLOSE_SECONDS = 5.0

#: Seconds aiokafka waits before asking again when Kafka refuses to add a partition to a
#: transaction with CONCURRENT_TRANSACTIONS: the partition's previous transaction committed
#: a moment ago and its commit markers are not written yet. aiokafka 0.14 waits 20 ms
#: (``aiokafka.producer.sender.BACKOFF_OVERRIDE``), and a stage that commits one
#: transaction per batch at low rates meets that wait on most batches: 2 ms halved the
#: router's hop at 500 msg/s (p50 20 → 11 ms) for a quarter more router CPU per message
#: (bench/NOTES.md, 2026-11-24 "Lever 2"). Set for every aiokafka producer of the process.
CONCURRENT_TRANSACTIONS_RETRY_SECONDS = 0.002

aiokafka_sender.BACKOFF_OVERRIDE = CONCURRENT_TRANSACTIONS_RETRY_SECONDS

#: Errors ``getmany`` raises that joining the group again cannot cure: wrong settings or
#: ACLs (the process stops, so that its supervisor and operator see it), and the fetch
#: errors of one partition (raised by the fetcher, not by the group's coordination).
_NOT_REJOINABLE = (
    GroupAuthorizationFailedError,
    TopicAuthorizationFailedError,
    InvalidSessionTimeoutError,
    InconsistentGroupProtocolError,
    InvalidGroupIdError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
)


class StaleOutputs(Exception):
    """Raised by an acknowledgement a transactional stage's handler returned (see
    :func:`consume_batches`) when what it produced for the records is out of date: what it
    decided on changed before the transaction was to commit. The partition's transaction
    is aborted and its records are read again at once, without a retry backoff."""


MakeProducer = Callable[[str], AIOKafkaProducer]
"""Makes a transactional producer (not started) with the given ``transactional.id``."""


class Transaction:
    """One partition's open Kafka transaction, as :func:`consume_in_transactions` hands it
    to the stage with each batch of the partition's records.

    ``producer`` is the partition's transactional producer: what the stage sends with it
    belongs to the transaction (:func:`services.common.faust_app.send_in_transaction`).
    Every batch handled before the transaction commits gets the same object, and the next
    transaction of the partition a new one, so ``is`` tells whether two batches share a
    transaction. :meth:`before_commit` registers a check to run just before the commit.
    """

    __slots__ = ("checks", "producer")

    def __init__(self, producer: AIOKafkaProducer) -> None:
        self.producer = producer
        #: The checks :meth:`before_commit` registered, in order.
        self.checks: list[Callable[[], Awaitable[None]]] = []

    def before_commit(self, check: Callable[[], Awaitable[None]]) -> None:
        """Call ``check()`` just before the transaction commits, beside the wait for the
        acknowledgements of what it produced and the other partitions' checks (so checks
        that are best made together, like state barriers sharing one end-offsets request,
        are). If it raises, the transaction is aborted and the partition read again: at
        once for :class:`StaleOutputs`, after :data:`RETRY_BACKOFF_SECONDS` otherwise."""
        self.checks.append(check)


TransactionalHandler = Callable[[list[Record], Transaction], Awaitable[Sequence[Awaitable[object]]]]
"""Handles one partition's records inside that partition's open :class:`Transaction`
(what it produces goes into the transaction through ``transaction.producer``) and returns
the acknowledgements of what it produced. Raising aborts the transaction."""


async def close_producer(producer: AIOKafkaProducer, timeout: float) -> None:
    """Stop ``producer``, giving what it holds ``timeout`` seconds to reach Kafka.

    An idempotent producer retries until Kafka answers, and its ``stop`` waits for that;
    past the timeout its sender is cancelled, which fails what it held, and it closes.
    """
    stopping = asyncio.ensure_future(producer.stop())
    done, _ = await asyncio.wait([stopping], timeout=timeout)
    if not done:
        # aiokafka has no public way to give up on unsent batches: stopping the sender
        # task fails them, and the stop above then completes.
        await producer._sender.close()
    await stopping


def log_undecodable(logger: logging.Logger, record: Record, exc: BaseException) -> None:
    """Log that ``record`` (topic, partition, offset) is skipped because it could not be
    decoded: garbage on a topic is never a reason to stop a service or to lose the rest.
    Counted in ``cormorant_kafka_undecodable_records_total`` by the topic's kind."""
    metrics.undecodable(kind_of_topic(record.topic))
    logger.warning(
        "skipping undecodable record %s[%d]@%d: %r",
        record.topic,
        record.partition,
        record.offset,
        exc,
    )


def make_consumer(
    settings: Settings,
    *topics: str,
    group_id: str | None,
    instance_id: str | None = None,
    **overrides: object,
) -> AIOKafkaConsumer:
    """An aiokafka consumer of ``topics`` tuned for the hot path (not started).

    ``group_id`` None means no consumer group (the caller assigns partitions). Offsets are
    committed by :func:`consume_batches`, never automatically. Only committed records are
    read (``read_committed``). A fetch returns as soon as one record is there; when none
    is, it waits ``fetch_max_wait_ms`` at the broker, which costs no latency and keeps idle
    consumers from spinning. In a group, the member is static when ``instance_id`` is
    given (``group.instance.id``, KIP-345: unique in the group; a restarted instance takes
    its partitions back without a rebalance), and is taken out of it after
    ``consumer_session_timeout_seconds`` without a heartbeat (:func:`group_options`).
    """
    options: dict[str, object] = {
        "bootstrap_servers": settings.kafka_bootstrap,
        "group_id": group_id,
        # Records of aborted transactions (a router that crashed mid-batch) are never seen.
        "isolation_level": "read_committed",
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "fetch_max_wait_ms": 500,
        "max_partition_fetch_bytes": max(settings.max_packet_size * 2, 1024 * 1024),
        "request_timeout_ms": max(int(settings.kafka_request_timeout_seconds * 1000), 15000),
        **client_security(settings),
    }
    if group_id is not None:
        options.update(group_options(settings, instance_id))
    options.update(overrides)
    return AIOKafkaConsumer(*topics, **options)


def group_options(settings: Settings, instance_id: str | None = None) -> dict[str, object]:
    """A consumer group member's options: session timeout and heartbeat interval from
    ``settings`` (how soon a dead member's partitions move, bench/NOTES.md "Recovery"),
    and ``group_instance_id`` when ``instance_id`` makes it a static member."""
    options: dict[str, object] = {
        "session_timeout_ms": int(settings.consumer_session_timeout_seconds * 1000),
        "heartbeat_interval_ms": int(settings.consumer_heartbeat_interval_seconds * 1000),
    }
    if instance_id is not None:
        options["group_instance_id"] = instance_id
    return options


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
    starts: dict[TopicPartition, int] = field(default_factory=dict)  # first offset read


def _batch(batches: Mapping[TopicPartition, Sequence[Record]]) -> _Batch:
    """A batch in flight of the records ``batches`` holds (each partition's in order)."""
    return _Batch(
        {tp: part[-1].offset + 1 for tp, part in batches.items()},
        (),
        starts={tp: part[0].offset for tp, part in batches.items()},
    )


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
        """After a failure: drop what is in flight and read again after the last good batch.

        Each partition of a batch in flight goes back to the first offset the oldest of them
        read of it (every record handed out since the last good batch is in one of them);
        the other partitions are where they should be already. A local seek, no request to
        Kafka: asking the coordinator for every assigned partition's committed offset, and
        the broker for the beginning of those without one, took device_persist 5-16 s on a
        loaded machine after each failed batch, which all went on top of a Redis failover.
        """
        starts: dict[TopicPartition, int] = {}
        for batch in self.in_flight:
            await _first_error(batch.acks)  # let them finish, whatever the outcome
            for tp, offset in batch.starts.items():
                starts.setdefault(tp, offset)
        self.in_flight.clear()
        assigned = self.consumer.assignment()
        for tp, offset in starts.items():
            if tp in assigned:
                self.consumer.seek(tp, offset)

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
    consumer: AIOKafkaConsumer, first: Sequence[str], max_records: int, wait: bool = True
) -> dict[TopicPartition, list[Record]]:
    """Up to ``max_records`` fetched records, those of the ``first`` topics before others;
    waits up to 0.5 s (with ``wait``) when nothing has been fetched yet."""
    batches: dict[TopicPartition, list[Record]] = {}
    if first:
        preferred = [tp for tp in consumer.assignment() if tp.topic in first]
        if preferred:
            batches = await _getmany(consumer, preferred, 0, max_records)
    room = max_records - sum(len(part) for part in batches.values())
    if room > 0:
        more = await _getmany(consumer, [], 500 if wait and not batches else 0, room)
        for tp, part in more.items():
            batches.setdefault(tp, []).extend(part)
    return batches


async def _getmany(
    consumer: AIOKafkaConsumer,
    partitions: Sequence[TopicPartition],
    timeout_ms: int,
    max_records: int,
) -> dict[TopicPartition, list[Record]]:
    """``consumer.getmany`` (of ``partitions``, all assigned ones when empty); a group
    member whose coordination failed joins its group again (:func:`_rejoin_after`) and
    gets nothing this time, after :data:`RETRY_BACKOFF_SECONDS`. Raises what
    ``getmany`` raises otherwise."""
    try:
        fetched: dict[TopicPartition, list[Record]] = await consumer.getmany(
            *partitions, timeout_ms=timeout_ms, max_records=max_records
        )
    except KafkaError as exc:
        if not _rejoin_after(consumer, exc):
            raise
        await asyncio.sleep(RETRY_BACKOFF_SECONDS)
        return {}
    return fetched


def _rejoin_after(consumer: AIOKafkaConsumer, error: KafkaError) -> bool:
    """After ``getmany`` of ``consumer`` raised ``error``: if it is a failure of the
    consumer group's coordination, make the member join its group again as a new member
    and return True; False when joining again cannot help (no group, wrong settings or
    ACLs, a partition's fetch error, or aiokafka's coordination or fetch task is gone).

    Why: aiokafka 0.14 hands every error of the group's coordination it has no rule for
    to the caller of ``getmany`` (JoinGroup's, SyncGroup's, a heartbeat's), once, and then
    tries again with the same member id. Kafka's FENCED_INSTANCE_ID (82, which aiokafka
    reads as UnknownError) is one: a static member (``group.instance.id``) whose JoinGroup
    a coordinator moving to another broker answered but whose answer was lost (the
    broker killed, or the connection closed by a request timeout) holds a member id the
    new coordinator has replaced, and every request it sends with it is refused so. The
    stages let the error end their main task, and the process exited (a supervisor
    restarts it after 20-40 s; ``cormorant up`` does not at all): deliveries stopped for
    good after a broker's kill -9 (tests/topology/test_kafka_brokers.py, CI 2026-11-27).
    Forgetting the member id (``reset_generation``) makes the next JoinGroup take the
    instance's place again, as a restarted process would, without the restart.
    """
    coordinator = getattr(consumer, "_coordinator", None)
    if not isinstance(coordinator, GroupCoordinator) or isinstance(error, _NOT_REJOINABLE):
        return False
    fetcher = getattr(consumer, "_fetcher", None)
    if coordinator._coordination_task.done() or (
        fetcher is not None and fetcher.error_future.done()
    ):
        # aiokafka's coordination or fetch task is gone: nothing would join again or
        # fetch; the process has to start afresh.
        return False
    log.warning(
        "consumer group %s: %r from its coordination, joining again as a new member",
        coordinator.group_id,
        error,
    )
    coordinator.reset_generation()
    coordinator.request_rejoin()
    return True


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
    """A running :func:`consume_batches`: ``done`` holds, per partition, the next offset
    of what the stage handled and had acknowledged (or committed, in transactions)."""

    stage: str
    consumer: AIOKafkaConsumer
    done: Mapping[TopicPartition, int]


_WATCHED: list[_Watched] = []
_LAG: dict[tuple[str, str, int], int] = {}


@contextlib.contextmanager
def _watching(watched: _Watched) -> Iterator[None]:
    """Count ``watched`` in :func:`refresh_lag` while the block runs."""
    _WATCHED.append(watched)
    try:
        yield
    finally:
        _WATCHED.remove(watched)


async def refresh_lag() -> None:
    """Bring :func:`lag_families` up to date: for every partition a running
    :func:`consume_batches` reads, the records between its high watermark (from the last
    fetch) and what the stage has handled and had acknowledged, or else its position."""
    lags: dict[tuple[str, str, int], int] = {}
    for watched in list(_WATCHED):
        consumer = watched.consumer
        for tp in consumer.assignment():
            if tp not in consumer.assignment():
                continue  # moved away while an earlier partition's position was awaited
            end = consumer.highwater(tp)
            done = watched.done.get(tp)
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


def _check_stage(stage: str) -> None:
    """Raise ``ValueError`` unless ``stage`` can name a reader in the lag metric."""
    if not stage:
        raise ValueError("a consumer loop needs its stage name (the lag metric's label)")


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
    stage: str,
    prepare: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Read ``consumer`` forever, hand each batch to ``handle``, commit what is acknowledged.

    With ``topics``, the consumer subscribes to them in its consumer group, with a rebalance
    listener that settles and commits before partitions move, and offsets are committed
    every ``commit_interval`` seconds. Without, the caller assigned the partitions and
    nothing is committed. Batches are handled one after another, in order; up to
    ``max_in_flight`` of them may await their acknowledgements at once. A failed batch is
    logged and read again (with everything after it) after :data:`RETRY_BACKOFF_SECONDS`:
    at-least-once; a batch whose ``handle`` raised is read again before any later batch is
    handled. Runs until cancelled; then what is acknowledged is committed.
    ``on_assigned`` is told the partitions the group gives this consumer after each
    rebalance (all of them, not only the new ones), and may seek them; ``on_revoked`` the
    partitions taken away, once what was read of them is committed. ``after_fetch`` runs
    after every fetch, whether it brought records or not (0.5 s at most between two when
    nothing comes). Records of the ``first`` topics already
    fetched go into a batch before any other: a backlog elsewhere does not hold them up
    (device_persist reads acknowledgements before the messages that wait for them).
    ``stage`` names the reader in ``cormorant_kafka_consumer_lag_records`` (required and
    non-empty: a series with an empty label value cannot be told from one without it;
    ``ValueError`` otherwise).
    ``prepare`` runs once per fetched batch, before ``handle`` sees it (a failure fails
    the batch). A stage whose outputs must be written exactly once reads with
    :func:`consume_in_transactions` instead.
    """
    _check_stage(stage)
    committer = _Committer(consumer, bool(topics), on_assigned, on_revoked)
    if topics:
        consumer.subscribe(list(topics), listener=committer)
    last_commit = time.monotonic()
    with _watching(_Watched(stage, consumer, committer.committable)):
        try:
            while True:
                batches = await _next_batch(consumer, first, max_records)
                limit = max_in_flight - 1 if batches else 0
                if batches:
                    records = [record for part in batches.values() for record in part]
                    batch = _batch(batches)
                    try:
                        if prepare is not None:
                            await prepare()
                        batch.acks = await handle(records)
                    except Exception as exc:
                        batch.error = exc
                        # Read again before any later batch is handled: a later one handled
                        # first could make the stage take the failed records for seen ones
                        # (device_persist's store skips offsets below the highest it stored).
                        limit = 0
                    committer.in_flight.append(batch)
                if after_fetch is not None:
                    await after_fetch()
                if not await committer.settle(limit):
                    await committer.rewind()
                    await asyncio.sleep(RETRY_BACKOFF_SECONDS)  # Kafka or a store is down
                    continue
                now = time.monotonic()
                if now - last_commit >= commit_interval:
                    last_commit = now
                    await committer.flush()
        finally:
            with contextlib.suppress(Exception):
                if await committer.settle(0):
                    await committer.flush()


async def consume_in_transactions(
    consumer: AIOKafkaConsumer,
    handle: TransactionalHandler,
    transactions: PartitionTransactions,
    *,
    topics: Sequence[str],
    max_records: int = 2000,
    commit_interval: float = 0.2,
    on_assigned: PartitionsHook | None = None,
    on_revoked: PartitionsHook | None = None,
    after_fetch: Callable[[], Awaitable[None]] | None = None,
    first: Sequence[str] = (),
    stage: str,
    prepare: Callable[[], Awaitable[None]] | None = None,
    committed_offset: CommittedOffset | None = None,
    on_commit: CommitHook | None = None,
) -> None:
    """:func:`consume_batches` in Kafka transactions: read ``topics`` in ``consumer``'s
    group forever, each partition's records handled inside that partition's transaction
    (:class:`PartitionTransactions`): ``handle(records, transaction)`` is called once per
    partition of a batch with the partition's open :class:`Transaction`, and what it
    produces with ``transaction.producer`` belongs to it. The transactions are committed
    with the partitions' next offsets as soon as no more records are waiting, or after
    ``commit_interval`` seconds under load: exactly once. A failed partition's transaction
    is aborted and the partition read again from its committed offset after
    :data:`RETRY_BACKOFF_SECONDS` (at once when it failed with :class:`StaleOutputs`). The
    acknowledgements ``handle`` returns are awaited just before the commit, those of all
    partitions at once, beside the checks registered with :meth:`Transaction.before_commit`
    (started only then). ``committed_offset`` says where a partition is read again from
    (default: its offset committed in ``consumer``'s group; a stage whose transactions
    commit the offsets in another Kafka cluster, the integrations' Kafka sink, reads them
    there); ``on_commit`` hears which partitions' transactions committed and which were
    aborted, and why (the integrations' metrics and status). The other arguments are
    :func:`consume_batches`'s.
    """
    _check_stage(stage)
    loop = _TransactionalLoop(
        consumer,
        handle,
        transactions,
        on_assigned,
        on_revoked,
        after_fetch,
        prepare,
        committed_offset,
        on_commit,
    )
    with _watching(_Watched(stage, consumer, loop.committed)):
        await loop.run(topics, first, max_records, commit_interval)


class PartitionTransactions:
    """The transactions of a consume → produce → commit stage: one transactional producer
    per input partition the stage owns, ``transactional.id`` ``<id_prefix><topic>-<n>``.

    ``make_producer`` makes a producer for an id (:func:`services.common.faust_app.
    transactional_producer`); ``group_id`` is the consumer group whose offsets the
    transactions commit. Starting a partition's producer (:meth:`assign`) fences the
    partition's previous owner and aborts its open transaction. Used by
    :func:`consume_in_transactions` and, for transactions of their own, by stages that follow a
    compacted topic's partitions (:meth:`run_in`); not safe to use from two tasks at once
    for one partition.
    """

    def __init__(self, make_producer: MakeProducer, id_prefix: str, group_id: str) -> None:
        self._make = make_producer
        self._prefix = id_prefix
        self.group_id = group_id
        self._producers: dict[TopicPartition, AIOKafkaProducer] = {}
        self._owned: set[TopicPartition] = set()
        self._open: set[TopicPartition] = set()

    def transactional_id(self, tp: TopicPartition) -> str:
        """The ``transactional.id`` of ``tp``'s producer."""
        return f"{self._prefix}{tp.topic}-{tp.partition}"

    @property
    def partitions(self) -> set[TopicPartition]:
        """The partitions assigned (:meth:`assign`)."""
        return set(self._owned)

    async def assign(self, partitions: Collection[TopicPartition]) -> None:
        """Own exactly ``partitions``: close the producers of the others, start those of
        the new ones (each start fences the partition's previous owner). Raises
        ``KafkaError`` if Kafka cannot be reached; the partitions started so far stay."""
        self._owned = set(partitions)
        gone = [tp for tp in self._producers if tp not in partitions]
        await asyncio.gather(*(self._close(tp) for tp in gone))
        await asyncio.gather(*(self._start(tp) for tp in partitions if tp not in self._producers))

    async def _start(self, tp: TopicPartition) -> AIOKafkaProducer:
        producer = self._make(self.transactional_id(tp))
        try:
            await producer.start()  # InitProducerId: the fence
        except BaseException:
            await producer.stop()
            raise
        self._producers[tp] = producer
        return producer

    async def _close(self, tp: TopicPartition) -> None:
        self._open.discard(tp)
        producer = self._producers.pop(tp, None)
        if producer is not None:
            await close_producer(producer, PRODUCER_CLOSE_SECONDS)

    async def begin(self, tp: TopicPartition) -> AIOKafkaProducer:
        """``tp``'s producer, in a transaction (begun now unless one is open); its producer
        is started first if a reset could not start it (:meth:`abort`). Raises ``KeyError``
        for a partition not assigned (starting its producer would fence its owner)."""
        if tp not in self._owned:
            raise KeyError(f"{tp} is not assigned to these transactions")
        producer = self._producers.get(tp) or await self._start(tp)
        if tp not in self._open:
            await producer.begin_transaction()
            self._open.add(tp)
        return producer

    def is_open(self, tp: TopicPartition) -> bool:
        """Whether ``tp`` has a transaction begun and not yet committed or aborted."""
        return tp in self._open

    async def commit(
        self, offsets: Mapping[TopicPartition, int | None]
    ) -> dict[TopicPartition, BaseException]:
        """Commit the open transactions of the partitions of ``offsets``, each with its
        partition's next offset for :attr:`group_id` (None: no offset), all at once.
        Returns the failures by partition; their transactions are aborted (:meth:`abort`)."""

        async def one(tp: TopicPartition, offset: int | None) -> None:
            producer = self._producers[tp]
            if offset is not None:
                await producer.send_offsets_to_transaction(
                    {tp: OffsetAndMetadata(offset, "")}, self.group_id
                )
            await producer.commit_transaction()

        todo = [(tp, offset) for tp, offset in offsets.items() if tp in self._open]
        results = await asyncio.gather(
            *(one(tp, offset) for tp, offset in todo), return_exceptions=True
        )
        failed: dict[TopicPartition, BaseException] = {}
        for (tp, _), result in zip(todo, results, strict=True):
            self._open.discard(tp)
            if isinstance(result, BaseException):
                failed[tp] = result
        for tp, error in failed.items():
            log.warning("transaction of %s not committed: %r", tp, error)
        await self.abort(failed)
        return failed

    async def abort(self, partitions: Collection[TopicPartition]) -> None:
        """Give up the open transactions of ``partitions``: each partition's producer is
        replaced by a new one with the same id, whose start aborts what the old one left
        open (an error may have left the old one unable to abort itself). A partition whose
        new producer cannot start gets one at its next :meth:`begin`."""
        for tp in partitions:
            await self._close(tp)
        owned = [tp for tp in partitions if tp in self._owned]  # the others have new owners
        starts = await asyncio.gather(*(self._start(tp) for tp in owned), return_exceptions=True)
        for tp, result in zip(owned, starts, strict=True):
            if isinstance(result, BaseException):
                log.warning("transactional producer of %s not started: %r", tp, result)

    async def run_in(
        self,
        tp: TopicPartition,
        produce: Callable[[AIOKafkaProducer], Awaitable[Sequence[Awaitable[object]]]],
        timeout: float,
    ) -> None:
        """Run ``produce(producer)`` (which sends with ``producer``, ``tp``'s transactional
        producer, and returns the acknowledgements) in a transaction of ``tp`` alone, and
        commit it (no offsets), within ``timeout`` seconds. Raises what failed
        (``TimeoutError`` past the timeout); the transaction is then aborted."""
        try:
            async with asyncio.timeout(timeout):
                producer = await self.begin(tp)
                error = await _first_error(await produce(producer))
                if error is not None:
                    raise error
                failed = await self.commit({tp: None})
        except BaseException:
            if self.is_open(tp):
                await self.abort([tp])
            raise
        if tp in failed:
            raise failed[tp]

    async def close(self) -> None:
        """Close every producer (open transactions are left to Kafka's timeout, or to the
        next owner's fence)."""
        await asyncio.gather(*(self._close(tp) for tp in list(self._producers)))


async def fence(
    transactions: PartitionTransactions, partitions: Collection[TopicPartition]
) -> None:
    """:meth:`PartitionTransactions.assign` ``partitions``, tried again until Kafka answers:
    a partition may only be read once its previous owner is fenced (else that owner's last
    commit could land after the new owner read where to start)."""
    while True:
        try:
            await transactions.assign(partitions)
            return
        except KafkaError as exc:
            log.warning("previous owners of %s not fenced yet: %r", sorted(partitions), exc)
            await asyncio.sleep(RETRY_BACKOFF_SECONDS)  # Kafka is down


@dataclass
class _Pending:
    """A partition's records handled in its open ``transaction``: the next offset to read,
    and the acknowledgements of what was produced for them."""

    transaction: Transaction
    offset: int = 0
    acks: list[Awaitable[object]] = field(default_factory=list)


class _TransactionalLoop(ConsumerRebalanceListener):  # type: ignore[misc]
    """:func:`consume_in_transactions`: the loop, and the rebalance listener
    that commits before partitions move and fences their previous owners after."""

    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        handle: TransactionalHandler,
        transactions: PartitionTransactions,
        on_assigned: PartitionsHook | None,
        on_revoked: PartitionsHook | None,
        after_fetch: Callable[[], Awaitable[None]] | None,
        prepare: Callable[[], Awaitable[None]] | None,
        committed_offset: CommittedOffset | None = None,
        on_commit: CommitHook | None = None,
    ) -> None:
        self.consumer = consumer
        self.handle = handle
        self.transactions = transactions
        self.committed_offset: CommittedOffset = committed_offset or consumer.committed
        self.on_commit = on_commit
        self.on_assigned = on_assigned
        self.on_revoked = on_revoked
        self.after_fetch = after_fetch
        self.prepare = prepare
        self.pending: dict[TopicPartition, _Pending] = {}
        self.opened_at = 0.0
        # Held while records are handled or committed, and by the rebalance listener, so a
        # rebalance never cuts into a batch.
        self.lock = asyncio.Lock()
        # Rebalances so far: a batch fetched before the latest one is not handled.
        self.rebalances = 0
        # Where partitions were last read again from (their committed offsets).
        self.rewound: dict[TopicPartition, int] = {}
        # The offsets committed by this loop's transactions, per partition (for the lag).
        self.committed: dict[TopicPartition, int] = {}
        # Partitions whose last failure was StaleOutputs: read again without a backoff.
        self.stale: set[TopicPartition] = set()
        # Whether the group assigned partitions the loop has not fenced yet (paused until).
        self.fence_due = False

    async def run(
        self, topics: Sequence[str], first: Sequence[str], max_records: int, interval: float
    ) -> None:
        self.consumer.subscribe(list(topics), listener=self)
        try:
            while True:
                if self.fence_due:
                    await self._fence_assigned()
                rebalances = self.rebalances
                batches = await _next_batch(
                    self.consumer, first, max_records, wait=not self.pending
                )
                async with self.lock:
                    if rebalances != self.rebalances:
                        batches = self._drop_stale(batches)
                    failed = await self._handle(batches) if batches else set()
                    if self.after_fetch is not None:
                        await self.after_fetch()
                    due = time.monotonic() - self.opened_at >= interval
                    if self.pending and (not batches or due):
                        failed |= await self._commit(set(self.pending))
                    if failed:
                        await self._rewind(failed)
                if failed - self.stale:
                    await asyncio.sleep(RETRY_BACKOFF_SECONDS)  # Kafka is down
                self.stale.clear()
        finally:
            with contextlib.suppress(Exception):
                async with self.lock:
                    await self._commit(set(self.pending))
            await self.transactions.close()

    def _drop_stale(
        self, batches: dict[TopicPartition, list[Record]]
    ) -> dict[TopicPartition, list[Record]]:
        """A batch fetched while a rebalance went on: its partitions may have moved, or been
        read again from their committed offsets before or after it was fetched. Nothing of
        it is handled; each partition still assigned is read again from where the
        rebalance put it, or (kept through it) from the batch's first record."""
        assigned = self.consumer.assignment()
        for tp, records in batches.items():
            if tp in assigned:
                self.consumer.seek(tp, self.rewound.get(tp, records[0].offset))
        return {}

    async def _handle(self, batches: dict[TopicPartition, list[Record]]) -> set[TopicPartition]:
        """Hand each partition's records to the stage inside its transaction; returns the
        partitions that failed (their transactions aborted)."""
        if not self.pending:
            self.opened_at = time.monotonic()
        try:
            if self.prepare is not None:
                await self.prepare()
        except Exception as exc:
            log.warning("a batch could not be prepared, it will be read again: %r", exc)
            unprepared = dict.fromkeys(set(batches) | set(self.pending), exc)
            await self._abort(unprepared)
            return set(unprepared)
        failed: dict[TopicPartition, BaseException] = {}
        for tp, records in batches.items():
            try:
                producer = await self.transactions.begin(tp)
                pending = self.pending.get(tp)
                if pending is None:
                    pending = self.pending[tp] = _Pending(Transaction(producer))
                acks = await self.handle(records, pending.transaction)
            except Exception as exc:
                log.warning("records of %s not handled, they will be read again: %r", tp, exc)
                failed[tp] = exc
                continue
            pending.offset = records[-1].offset + 1
            pending.acks.extend(acks)
        await self._abort(failed)
        return set(failed)

    async def _commit(self, partitions: set[TopicPartition]) -> set[TopicPartition]:
        """Commit the transactions of ``partitions`` (those whose produced records were
        all acknowledged; the others are aborted); returns the partitions that failed."""
        todo = {tp: self.pending.pop(tp) for tp in partitions if tp in self.pending}
        errors = await asyncio.gather(
            *(
                _first_error([*p.acks, *(check() for check in p.transaction.checks)])
                for p in todo.values()
            )
        )
        failed: dict[TopicPartition, BaseException] = {}
        for tp, error in zip(todo, errors, strict=True):
            if isinstance(error, StaleOutputs):
                log.info("records of %s are handled again: %s", tp, error)
                self.stale.add(tp)
                failed[tp] = error
            elif error is not None:
                log.warning("records for %s were not stored, read again: %r", tp, error)
                failed[tp] = error
        await self._abort(failed)
        offsets = {tp: p.offset for tp, p in todo.items() if tp not in failed}
        refused = await self.transactions.commit(offsets)
        failed |= refused
        done = {tp: o for tp, o in offsets.items() if tp not in failed}
        self.committed.update(done)
        if self.on_commit is not None:
            self.on_commit(done, refused)
        return set(failed)

    async def _abort(self, partitions: Mapping[TopicPartition, BaseException]) -> None:
        """Abort the transactions of ``partitions`` (each with the error that ends it)."""
        for tp in partitions:
            self.pending.pop(tp, None)
        await self.transactions.abort([tp for tp in partitions if self.transactions.is_open(tp)])
        if self.on_commit is not None and partitions:
            self.on_commit({}, partitions)

    async def _rewind(self, partitions: set[TopicPartition]) -> dict[TopicPartition, int]:
        """Read ``partitions`` again from their committed offsets, asked of Kafka (a failed
        commit may have happened after all) until it answers: reading on from anywhere else
        would skip records or read them twice. Returns the offsets read from."""
        positions: dict[TopicPartition, int] = {}
        assigned = self.consumer.assignment()
        for tp in partitions:
            if tp not in assigned:
                continue
            while True:
                try:
                    start = await self.committed_offset(tp)
                    break
                except KafkaError as exc:
                    log.warning("committed offset of %s unknown, asking again: %r", tp, exc)
                    await asyncio.sleep(RETRY_BACKOFF_SECONDS)  # Kafka is down
            if start is None:
                await self.consumer.seek_to_beginning(tp)  # as auto_offset_reset=earliest
                start = await self.consumer.position(tp)
            else:
                self.consumer.seek(tp, start)
            positions[tp] = start
        return positions

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        """Before a rebalance: commit the open transactions, then tell the stage."""
        async with self.lock:
            self.rebalances += 1
            self.rewound = {}
            await self._commit(set(self.pending))
            for tp in revoked:
                self.committed.pop(tp, None)
        if self.on_revoked is not None:
            await self.on_revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        """After a rebalance: pause the partitions new to this loop until it has fenced
        their previous owners (:meth:`_fence_assigned`, the loop's next step). Not here:
        aiokafka 0.14 sends no heartbeat while this listener runs, and starting the new
        partitions' producers (each InitProducerId aborts the previous owner's open
        transaction) took longer than the session timeout after a router restart on a
        loaded machine: the coordinator then dropped the member and the group rebalanced
        once more (bench/NOTES.md, "Recovery time")."""
        async with self.lock:
            self.rebalances += 1
            self.consumer.pause(*(set(assigned) - self.transactions.partitions))
            self.fence_due = True

    async def _fence_assigned(self) -> None:
        """Own exactly the partitions the group assigned: start the producers of the new
        ones (fencing their previous owners), read each new partition from its committed
        offset as it is once they are fenced, resume them, then tell the stage. A batch
        fetched before this is dropped (:meth:`_drop_stale`)."""
        async with self.lock:
            self.rebalances += 1
            self.fence_due = False
            partitions = self.consumer.assignment()
            new = partitions - self.transactions.partitions
            await fence(self.transactions, partitions)
            self.rewound = await self._rewind(new)
            self.committed.update(self.rewound)
            self.consumer.resume(*new)
        if self.on_assigned is not None:
            await self.on_assigned(set(partitions))
