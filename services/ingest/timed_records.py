"""Messages kept in a compacted Kafka topic until they are due, then published exactly once
by the ingest node that owns their partition: the machinery that Will Messages waiting out
their Will Delay Interval (``client.wills``, :mod:`services.ingest.delayed_wills`) and
delayed publications (``msg.delayed``, :mod:`services.ingest.delayed_publish`) share.

The ingest nodes read such a topic in one consumer group (each node a static member named by
its node id): the node given a partition replays it from its beginning
(:class:`PartitionOwner`), keeps each waiting record with a timer (:class:`TimedRecords`),
and publishes or discards each one in a Kafka transaction of that partition: the message's
``msg.all`` record (and ``msg.retained`` record, with RETAIN) and the waiting record's
tombstone are committed together, or not at all.

Exactly one publication, through any single crash:

- only the owner of a partition publishes or discards its records, and it does so with
  the partition's transactional producer (``transactional.id`` named after the
  partition, :class:`~services.common.kafka.consumer.PartitionTransactions`);
- a node given a partition starts that producer before reading the partition, which
  fences the previous owner (its later commits fail) and aborts its open transaction;
  every reader of ``msg.all`` reads committed records only;
- so the new owner's replay shows a record as gone exactly when its publication (or
  discard) was committed, and the record is published by whichever owner commits first,
  once.

A node that dies has its partitions moved to the others within the consumer session
timeout; with a single node, its records wait until it is back, then the overdue ones are
published at once.

Cancelling (delayed messages: :class:`~services.common.records.DelayedCancel`) is decided
by the owner too, never by the canceller: a cancel request is a record of the partition,
and the owner that reads it discards the record (a transaction with its tombstone, outcome
``cancelled``) unless its publication is under way; then the publication's commit decides
(``published``; after a failed one the record is cancelled). Every tombstone
says which (:class:`~services.common.records.DelayedOutcome`), so the first tombstone
of a key is the truth whoever reads it, and a canceller waits for it. A request for a
record that waits no more is answered with a ``gone`` tombstone, so that no request is left
in the compacted topic.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import IllegalStateError, KafkaError

from services.common.kafka.consumer import (
    PartitionTransactions,
    Record,
    consume_batches,
    fence,
    log_undecodable,
)
from services.common.kafka.names import TopicNames
from services.common.records import DelayedCancel, DelayedOutcome, KafkaRecord, RecordError
from services.ingest.effects import Publication, StorePublish, StoreRetained
from services.ingest.store_pipeline import record_of

log = logging.getLogger(__name__)

#: Seconds before a publication or discard that Kafka refused is tried again.
RETRY_SECONDS = 1.0

#: Seconds before a node whose membership of a group of waiting records ended joins the
#: group again (:func:`own_partitions`).
REJOIN_SECONDS = 1.0

Commit = Callable[[int, list[KafkaRecord]], Awaitable[None]]
"""``await commit(partition, records)`` writes ``records`` in one transaction of that
partition of the topic the records wait in; raises if it was not committed."""

Key = tuple[str, bytes]
"""A waiting record's key: its client id and its id among the client's (a connection id
for a Will Message, a delayed message's id)."""

V = TypeVar("V")

Parse = Callable[[bytes | None, bytes | None], tuple[str, bytes, V | DelayedCancel | None]]
"""Parses a record of the topic into its :data:`Key` parts and the waiting value (None: a
tombstone; a :class:`~services.common.records.DelayedCancel`: a request to cancel it);
raises :class:`~services.common.records.RecordError` on garbage."""


@dataclass(slots=True)
class _Waiting(Generic[V]):
    partition: int
    value: V
    timer: asyncio.TimerHandle | None = None
    settling: bool = False
    # a cancel request was read: it is discarded unless its publication is under way
    cancelled: bool = False


class TimedRecords(Generic[V]):
    """The waiting records (values of type ``V``) of the partitions this node owns.

    ``commit`` writes records in a partition's transaction; ``clock`` is Unix time in ms.
    Partitions are replayed first (:meth:`apply` keeps what the records say), then put live
    (:meth:`go_live`): only then is anything published. A subclass says when a record is
    due (:meth:`due_at_ms`), what its tombstone is (:meth:`tombstone`), what publishes it
    when due (:meth:`at_due`) and, if anything, what settles it before (:meth:`settled`).
    """

    #: What the records are, for the log.
    what = "record"

    def __init__(self, names: TopicNames, commit: Commit, clock: Callable[[], int]) -> None:
        self.names = names
        self._commit = commit
        self._clock = clock
        self._waiting: dict[Key, _Waiting[V]] = {}
        self._live: set[int] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        # cancel requests of records that wait no more, by key: their partition, until
        # a tombstone answers them
        self._unanswered: dict[Key, int] = {}
        #: Records this node ended, by outcome (``published``, ``cancelled``: a delayed
        #: message cancelled, a Will Message discarded), for the metrics.
        self.ended: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._waiting)

    # ------------------------------------------------------------------ what subclasses say

    def due_at_ms(self, value: V) -> int:
        """When ``value`` is to be published (Unix ms)."""
        raise NotImplementedError

    def tombstone(self, key: Key, outcome: DelayedOutcome) -> KafkaRecord:
        """The tombstone that deletes the waiting record ``key``, ended with ``outcome``
        (``cancelled`` also for a record settled without publication)."""
        raise NotImplementedError

    def settled(self, key: Key, value: V) -> Publication | None:
        """What settles ``value`` before it is due (its publication, or [] to discard it),
        or None: it waits. Nothing settles a record early unless a subclass says so."""
        return None

    async def at_due(self, key: Key, value: V) -> Publication:
        """The records that publish ``value`` now that it is due ([] to discard it).
        May raise: the record is then tried again after :data:`RETRY_SECONDS`."""
        raise NotImplementedError

    async def before_live(self) -> None:
        """Awaited before a partition goes live (a subclass's state must be current)."""

    def added(self, key: Key) -> None:
        """``key`` waits from now on (a subclass's index)."""

    def forgotten(self, key: Key) -> None:
        """``key`` waits no more (a subclass's index)."""

    # ------------------------------------------------------------------ ownership

    def revoke(self, partitions: set[int]) -> None:
        """Forget the records of ``partitions`` (their next owner waits them out)."""
        self._live -= partitions
        for key, waiting in list(self._waiting.items()):
            if waiting.partition in partitions:
                self._forget(key)
        for key, partition in list(self._unanswered.items()):
            if partition in partitions:
                del self._unanswered[key]

    async def go_live(self, partition: int) -> None:
        """``partition`` has been replayed: settle, publish or time each of its records
        (after :meth:`before_live`). Raises what :meth:`before_live` raised (call it
        again)."""
        await self.before_live()
        self.put_live(partition)

    def put_live(self, partition: int) -> None:
        """:meth:`go_live` once :meth:`before_live` has returned: the caller checks, with
        no await between the two, that ``partition`` is still its own (a rebalance while
        :meth:`before_live` ran may have given it to another node, whose replay times its
        records now)."""
        self._live.add(partition)
        for key, waiting in list(self._waiting.items()):
            if waiting.partition == partition and key in self._waiting:
                self._evaluate(key)
        for key, unanswered in list(self._unanswered.items()):
            if unanswered == partition:
                self._spawn(self._answer_gone(key))

    # ------------------------------------------------------------------ records

    def apply(self, partition: int, key: Key, value: V | DelayedCancel | None) -> None:
        """A record of an owned partition: a waiting one, a request to cancel one, or the
        tombstone of one that was published, discarded or cancelled."""
        if value is None:
            self._forget(key)
            self._unanswered.pop(key, None)  # a later tombstone answered the request
            return
        if isinstance(value, DelayedCancel):
            self._cancel(partition, key)
            return
        if key in self._waiting:
            return  # already waiting (a record read again)
        self._waiting[key] = _Waiting(partition, value)
        self.added(key)
        if partition in self._live:
            self._evaluate(key)

    def _cancel(self, partition: int, key: Key) -> None:
        """A request to cancel ``key``: discarded now if it waits and is live; decided by
        the publication under way if there is one; at :meth:`go_live` if the partition is
        being replayed. A request for a record that does not wait is answered ``gone``."""
        waiting = self._waiting.get(key)
        if waiting is None:
            self._unanswered[key] = partition
            if partition in self._live:
                self._spawn(self._answer_gone(key))
            return
        waiting.cancelled = True
        if partition in self._live and not waiting.settling:
            self._settle(key, [])

    async def _answer_gone(self, key: Key) -> None:
        """Answer the cancel request of a record that waits no more with a ``gone``
        tombstone (tried again while Kafka refuses and the partition is still owned)."""
        while (partition := self._unanswered.get(key)) is not None and partition in self._live:
            try:
                await self._commit(partition, [self.tombstone(key, DelayedOutcome.GONE)])
            except Exception as exc:
                log.warning("a cancel of %r not answered, tried again: %r", key[0], exc)
                await asyncio.sleep(RETRY_SECONDS)
                continue
            if self._unanswered.get(key) == partition:
                del self._unanswered[key]
            return

    # ------------------------------------------------------------------ decisions

    def _evaluate(self, key: Key) -> None:
        """Settle the record now (a cancel, :meth:`settled`), or time it."""
        waiting = self._waiting[key]
        if waiting.cancelled:
            self._settle(key, [])
            return
        records = self.settled(key, waiting.value)
        if records is not None:
            self._settle(key, records)
            return
        delay = max(0.0, (self.due_at_ms(waiting.value) - self._clock()) / 1000)
        if waiting.timer is not None:
            waiting.timer.cancel()
        waiting.timer = asyncio.get_running_loop().call_later(delay, self._due, key)

    def _due(self, key: Key) -> None:
        waiting = self._waiting.get(key)
        if waiting is not None and not waiting.settling:
            waiting.settling = True
            self._spawn(self._publish_due(key))

    async def _publish_due(self, key: Key) -> None:
        waiting = self._waiting.get(key)
        if waiting is None:
            return
        try:
            records = await self.at_due(key, waiting.value)
        except Exception as exc:
            log.warning("%s of %r waits, not ready to publish: %r", self.what, key[0], exc)
            self._retry(key)
            return
        await self._write(key, records)

    def _settle(self, key: Key, records: Publication) -> None:
        waiting = self._waiting[key]
        waiting.settling = True
        if waiting.timer is not None:
            waiting.timer.cancel()
            waiting.timer = None
        self._spawn(self._write(key, records))

    async def _write(self, key: Key, effects: Sequence[StorePublish | StoreRetained]) -> None:
        """Publish (``effects``: the message's records) or discard (none) the record, with
        its tombstone, in one transaction of its partition; retried while Kafka refuses."""
        waiting = self._waiting.get(key)
        if waiting is None:
            return
        if waiting.cancelled:
            effects = []  # cancelled before its publication was under way
        client_id = key[0]
        records = [record_of(self.names, client_id, effect) for effect in effects]
        outcome = DelayedOutcome.PUBLISHED if effects else DelayedOutcome.CANCELLED
        records.append(self.tombstone(key, outcome))
        try:
            await self._commit(waiting.partition, records)
        except Exception as exc:
            log.warning("%s of %r not settled, tried again: %r", self.what, client_id, exc)
            self._retry(key)
            return
        log.info("client %r: %s %s", client_id, self.what, outcome.value)
        self.ended[outcome.value] = self.ended.get(outcome.value, 0) + 1
        # Cancelled while its publication was under way, the publication won: a request
        # that lies after this tombstone is read and answered like any other (_cancel).
        self._forget(key)

    def _retry(self, key: Key) -> None:
        waiting = self._waiting.get(key)
        if waiting is None or waiting.partition not in self._live:
            return
        waiting.settling = False
        # (a cancel read meanwhile wins then: _evaluate)
        waiting.timer = asyncio.get_running_loop().call_later(
            RETRY_SECONDS, lambda: self._evaluate(key) if key in self._waiting else None
        )

    def _forget(self, key: Key) -> None:
        waiting = self._waiting.pop(key, None)
        if waiting is None:
            return
        if waiting.timer is not None:
            waiting.timer.cancel()
        self.forgotten(key)

    def _spawn(self, coroutine: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        """Cancel the timers and the publications under way (their transactions are
        aborted by the partitions' next owner)."""
        self.revoke(set(self._live) | {w.partition for w in self._waiting.values()})
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class PartitionOwner(Generic[V]):
    """This node's membership of the consumer group of one topic of waiting records:
    replays each assigned partition (after fencing its previous owner) and feeds
    ``timers``.

    ``consumer`` is started, in the group, not subscribed; ``transactions`` holds the
    partitions' transactional producers; ``parse`` reads a record (:data:`Parse`);
    ``stage`` names the consumer in metrics and logs. :meth:`run` raises what ends the
    membership (:func:`own_partitions` joins again).

    A rebalance can happen during any await of the read loop (aiokafka runs the
    rebalance listener, :meth:`revoked` and :meth:`assigned`, in its own task): each
    step that awaited checks :attr:`rebalances` before it acts on the partitions it
    looked at, and leaves the new assignment to the next fetch. (The replay's check went
    on with the partitions of the previous assignment: aiokafka's ``IllegalStateError``
    for a partition gone, or a ``KeyError`` for the ends the new assignment forgot,
    ended the read loop. Seen on both ingest nodes at once in the rebalances of a
    loaded start: ``client.wills`` had no owner left, and a killed node's wills waited
    until it was back.)
    """

    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        transactions: PartitionTransactions,
        timers: TimedRecords[V],
        topic: str,
        parse: Parse[V],
        stage: str,
    ) -> None:
        self.consumer = consumer
        self.transactions = transactions
        self.timers = timers
        self.topic = topic
        self.parse = parse
        self.stage = stage
        self._ends: dict[TopicPartition, int] = {}
        self._replaying: set[TopicPartition] = set()
        self._unfenced: set[TopicPartition] = set()
        #: Revocations and assignments so far.
        self.rebalances = 0

    async def run(self) -> None:
        """Read the owned partitions until cancelled; raises what ends the membership (a
        Kafka error aiokafka hands the read loop)."""
        await consume_batches(
            self.consumer,
            self.handle,
            topics=[self.topic],
            commit_interval=1.0,
            on_assigned=self.assigned,
            on_revoked=self.revoked,
            after_fetch=self.check_replays,
            stage=self.stage,
        )

    async def handle(self, records: list[Record]) -> list[Awaitable[object]]:
        """Apply each record to the timers (undecodable ones are logged and skipped)."""
        for record in records:
            try:
                client_id, ident, waiting = self.parse(record.key, record.value)
            except RecordError as exc:
                log_undecodable(log, record, exc)
                continue
            self.timers.apply(record.partition, (client_id, ident), waiting)
        return []

    async def revoked(self, revoked: set[TopicPartition]) -> None:
        """Stop timing the partitions' records (before another node can start)."""
        self.rebalances += 1
        self.timers.revoke({tp.partition for tp in revoked})
        self._replaying -= revoked
        self._unfenced -= revoked

    async def assigned(self, assigned: set[TopicPartition]) -> None:
        """Note the partitions the group gave this node, paused until :meth:`check_replays`
        has fenced their previous owners. Not here: aiokafka 0.14 sends no heartbeat while
        this rebalance listener runs, and starting a transactional producer per partition
        took longer than the session timeout on a loaded machine: the coordinator then
        dropped the member (as the router's loop found, :mod:`services.common.kafka.
        consumer`)."""
        self.rebalances += 1
        self.consumer.pause(*assigned)
        self._unfenced = set(assigned)
        self._ends = {}
        self._replaying = set()

    async def _fence_assigned(self) -> None:
        """Fence the assigned partitions' previous owners (until Kafka lets it happen:
        reading before would let a fenced owner's last commit go unseen), then replay them
        from their beginning up to their end (:meth:`check_replays` puts them live).

        A rebalance while it fenced or sought leaves the partitions paused: the new
        assignment is fenced at the next fetch (resuming a partition gone would raise)."""
        rebalances = self.rebalances
        assigned, self._unfenced = self._unfenced, set()
        await fence(self.transactions, assigned)
        if self.rebalances != rebalances or not assigned:
            return
        await self.consumer.seek_to_beginning(*assigned)
        if self.rebalances != rebalances:
            return
        self.consumer.resume(*assigned)
        # Their ends are asked by check_replays: here a failure (Kafka just came back)
        # would be lost, and the partitions would never go live.
        self._replaying = set(assigned)

    async def check_replays(self) -> None:
        """After each fetch: fence newly assigned partitions (:meth:`_fence_assigned`), and
        put the partitions whose replay is complete live (a failure is logged, and tried
        again after the next fetch; so is anything a rebalance meanwhile interrupted)."""
        if self._unfenced:
            await self._fence_assigned()
        rebalances = self.rebalances
        unknown = [tp for tp in self._replaying if tp not in self._ends]
        if unknown:
            try:
                ends = await self.consumer.end_offsets(unknown)
            except KafkaError as exc:
                log.warning("end offsets of %s unknown yet: %r", sorted(unknown), exc)
                return
            if self.rebalances != rebalances:
                return
            self._ends.update(ends)
        for tp in sorted(self._replaying):
            try:
                position = await self.consumer.position(tp)
            except IllegalStateError:
                return  # taken away while its position was awaited
            if self.rebalances != rebalances:
                return
            end = self._ends.get(tp)
            if end is None or position < end:
                continue
            try:
                await self.timers.before_live()
            except Exception as exc:
                log.warning("%s of %s not live yet: %r", self.stage, tp, exc)
                return
            if self.rebalances != rebalances:
                return  # it may be another node's now: its replay times the records
            self.timers.put_live(tp.partition)
            self._replaying.discard(tp)


async def own_partitions(
    make_consumer: Callable[[], AIOKafkaConsumer],
    transactions: PartitionTransactions,
    timers: TimedRecords[V],
    topic: str,
    parse: Parse[V],
    stage: str,
    rejoin_seconds: float = REJOIN_SECONDS,
) -> None:
    """Own this node's share of ``topic`` until cancelled: a :class:`PartitionOwner` with a
    consumer from ``make_consumer()`` (not started; in the group, with this node's static
    ``group.instance.id``), and, whenever that membership ends (the read loop raised), a
    new one ``rejoin_seconds`` later, with a new consumer: the failure is logged, the
    records timed so far are forgotten (:meth:`TimedRecords.stop`) and the partitions'
    producers closed, and the new member replays what the group gives it.

    Why: a read loop that ended left its consumer in the group as a static member that
    never heartbeats again; the coordinator drops it after the session timeout, and its
    partitions move to the nodes whose loops still run, but the node itself never owned
    anything again (and when every node's loop had ended, nobody did). Joining again
    under the same ``group.instance.id`` takes the node's partitions back at once when
    the group still holds them for it, or in the next rebalance."""
    while True:
        consumer = make_consumer()
        try:
            await consumer.start()
            await PartitionOwner(consumer, transactions, timers, topic, parse, stage).run()
        except Exception:
            log.exception("%s: the membership ended; joining again in %s s", stage, rejoin_seconds)
        finally:
            await timers.stop()
            await transactions.close()
            await consumer.stop()
        await asyncio.sleep(rejoin_seconds)
