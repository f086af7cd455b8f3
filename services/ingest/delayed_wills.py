"""Will Messages waiting out their Will Delay Interval: kept in Kafka, timed and published
by the ingest node that owns their partition.

A connection that closes with a delayed Will Message stores it in ``client.wills``
(:class:`~services.ingest.effects.StoreWill`, before anything says its session has ended)
and is done with it. The ingest nodes read ``client.wills`` in one consumer group
(:attr:`~services.common.kafka.names.TopicNames.wills_group`, each node a static member
named by its node id): the node given a partition replays it from its beginning
(:class:`WillOwnership`), keeps its waiting wills with a timer each (:class:`WillTimers`),
and publishes or discards each one in a Kafka transaction of that partition: the Will
Message's ``msg.all`` record (and ``msg.retained`` record, with Will Retain) and the
will's tombstone are committed together, or not at all.

Exactly one publication, through any single crash:

- only the owner of a partition publishes or discards its wills, and it does so with
  the partition's transactional producer (``transactional.id`` named after the
  partition, :class:`~services.common.kafka.consumer.PartitionTransactions`);
- a node given a partition starts that producer before reading the partition, which
  fences the previous owner (its later commits fail) and aborts its open transaction;
  every reader of ``msg.all`` reads committed records only;
- so the new owner's replay shows a will as gone exactly when its publication (or
  discard) was committed, and the will is published by whichever owner commits first,
  once.

Why the ingest nodes, rather than the router or device_persist: they already decide
everything about Will Messages (:mod:`services.ingest.will_rules`), write the client's other
``msg.all`` records, and follow every client's ``client.sessions`` records with their
offsets, which is what settles a waiting will (a newer connection: discarded, or published
at once with Clean Start 1); every deployment runs them, and no other service need import
the will rules. A node that dies has its partitions moved to the others within the
consumer session timeout; with a single node, its wills wait until it is back, then the
overdue ones are published at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from services.common.kafka.consumer import (
    PartitionTransactions,
    Record,
    consume_batches,
    fence,
    log_undecodable,
)
from services.common.kafka.names import TopicNames
from services.common.records import (
    KafkaRecord,
    RecordError,
    SessionRecord,
    WillRecord,
    parse_will,
    will_tombstone,
)
from services.ingest import will_rules
from services.ingest.effects import StorePublish, StoreRetained
from services.ingest.store_pipeline import record_of

log = logging.getLogger(__name__)

#: Seconds before a publication or discard that Kafka refused is tried again.
RETRY_SECONDS = 1.0

Commit = Callable[[int, list[KafkaRecord]], Awaitable[None]]
"""``await commit(partition, records)`` writes ``records`` in one transaction of that
``client.wills`` partition; raises if it was not committed."""

LatestSession = Callable[[str], tuple[SessionRecord | None, int]]
"""The latest ``client.sessions`` record of a client known to the node (None: none, or a
tombstone) and its offset (-1 when none was seen)."""


@dataclass(slots=True)
class _Waiting:
    partition: int
    will: WillRecord
    timer: asyncio.TimerHandle | None = None
    settling: bool = False


class WillTimers:
    """The waiting Will Messages of the ``client.wills`` partitions this node owns.

    ``commit`` writes records in a partition's transaction; ``sync_state`` returns once
    the node has applied every ``client.sessions`` record written before the call;
    ``latest_session`` looks a client's session up (:data:`LatestSession`); ``clock``
    is Unix time in ms. Partitions are replayed first (:meth:`apply` keeps what the
    records say), then put live (:meth:`go_live`): only then is anything published.
    """

    def __init__(
        self,
        names: TopicNames,
        commit: Commit,
        sync_state: Callable[[], Awaitable[None]],
        latest_session: LatestSession,
        clock: Callable[[], int],
    ) -> None:
        self.names = names
        self._commit = commit
        self._sync_state = sync_state
        self._latest_session = latest_session
        self._clock = clock
        self._waiting: dict[tuple[str, bytes], _Waiting] = {}
        self._by_client: dict[str, set[bytes]] = {}
        self._live: set[int] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def __contains__(self, client_id: str) -> bool:
        return client_id in self._by_client

    def __len__(self) -> int:
        return len(self._waiting)

    # ------------------------------------------------------------------ ownership

    def revoke(self, partitions: set[int]) -> None:
        """Forget the wills of ``partitions`` (their next owner waits them out)."""
        self._live -= partitions
        for key, waiting in list(self._waiting.items()):
            if waiting.partition in partitions:
                self._forget(key)

    async def go_live(self, partition: int) -> None:
        """``partition`` has been replayed: settle, publish or time each of its wills by
        the client's latest session record, once the node's session state is current.
        Raises ``KafkaError`` if the session state cannot be read (call it again)."""
        await self._sync_state()
        self._live.add(partition)
        for key, waiting in list(self._waiting.items()):
            if waiting.partition == partition and key in self._waiting:
                self._evaluate(key)

    # ------------------------------------------------------------------ records

    def apply(
        self, partition: int, client_id: str, connection_id: bytes, waiting: WillRecord | None
    ) -> None:
        """A ``client.wills`` record of an owned partition: a waiting will, or the
        tombstone of one that was published or discarded."""
        key = (client_id, connection_id)
        if waiting is None:
            self._forget(key)
            return
        if key in self._waiting:
            return  # already waiting (a record read again)
        self._waiting[key] = _Waiting(partition, waiting)
        self._by_client.setdefault(client_id, set()).add(connection_id)
        if partition in self._live:
            self._evaluate(key)

    def session_record(self, client_id: str, record: SessionRecord | None, offset: int) -> None:
        """A ``client.sessions`` record of ``client_id`` at ``offset``: a newer connection,
        or the session's end, settles its waiting wills (:func:`will_rules.on_session`)."""
        for connection_id in list(self._by_client.get(client_id, ())):
            key = (client_id, connection_id)
            waiting = self._waiting[key]
            if waiting.partition not in self._live or waiting.settling:
                continue
            records = will_rules.on_session(waiting.will, record, offset, self._clock())
            if records is not None:
                self._settle(key, records)

    # ------------------------------------------------------------------ decisions

    def _evaluate(self, key: tuple[str, bytes]) -> None:
        """Settle the will by the client's latest session record, or time it."""
        waiting = self._waiting[key]
        record, offset = self._latest_session(key[0])
        records = will_rules.on_session(waiting.will, record, offset, self._clock())
        if records is not None:
            self._settle(key, records)
            return
        delay = max(0.0, (waiting.will.due_at_ms - self._clock()) / 1000)
        if waiting.timer is not None:
            waiting.timer.cancel()
        waiting.timer = asyncio.get_running_loop().call_later(delay, self._due, key)

    def _due(self, key: tuple[str, bytes]) -> None:
        waiting = self._waiting.get(key)
        if waiting is not None and not waiting.settling:
            waiting.settling = True
            self._spawn(self._publish_due(key))

    async def _publish_due(self, key: tuple[str, bytes]) -> None:
        """The delay has passed: once the session records written until now are applied
        (a reconnect just before it settles the will), publish it."""
        try:
            await self._sync_state()
        except Exception as exc:
            log.warning("session state not read, Will Message of %r waits: %r", key[0], exc)
            self._retry(key)
            return
        waiting = self._waiting.get(key)
        if waiting is None:
            return
        record, offset = self._latest_session(key[0])
        now = self._clock()
        records = will_rules.on_session(waiting.will, record, offset, now)
        if records is None:
            records = will_rules.published_after_delay(waiting.will, now)
        await self._write(key, records)

    def _settle(self, key: tuple[str, bytes], records: list[StorePublish | StoreRetained]) -> None:
        waiting = self._waiting[key]
        waiting.settling = True
        if waiting.timer is not None:
            waiting.timer.cancel()
            waiting.timer = None
        self._spawn(self._write(key, records))

    async def _write(
        self, key: tuple[str, bytes], effects: Sequence[StorePublish | StoreRetained]
    ) -> None:
        """Publish (``effects``: the will's records) or discard (none) the will, with its
        tombstone, in one transaction of its partition; retried while Kafka refuses."""
        waiting = self._waiting.get(key)
        if waiting is None:
            return
        client_id, connection_id = key
        records = [record_of(self.names, client_id, effect) for effect in effects]
        records.append(will_tombstone(self.names, client_id, connection_id))
        try:
            await self._commit(waiting.partition, records)
        except Exception as exc:
            log.warning("Will Message of %r not settled, tried again: %r", client_id, exc)
            self._retry(key)
            return
        log.info("client %r: Will Message %s", client_id, "published" if effects else "discarded")
        self._forget(key)

    def _retry(self, key: tuple[str, bytes]) -> None:
        waiting = self._waiting.get(key)
        if waiting is None or waiting.partition not in self._live:
            return
        waiting.settling = False
        waiting.timer = asyncio.get_running_loop().call_later(
            RETRY_SECONDS, lambda: self._evaluate(key) if key in self._waiting else None
        )

    def _forget(self, key: tuple[str, bytes]) -> None:
        waiting = self._waiting.pop(key, None)
        if waiting is None:
            return
        if waiting.timer is not None:
            waiting.timer.cancel()
        connections = self._by_client.get(key[0])
        if connections is not None:
            connections.discard(key[1])
            if not connections:
                del self._by_client[key[0]]

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


class WillOwnership:
    """This node's membership of the ``client.wills`` group: replays each assigned
    partition (after fencing its previous owner) and feeds :class:`WillTimers`.

    ``consumer`` is started, in the group, not subscribed; ``transactions`` holds the
    partitions' transactional producers.
    """

    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        transactions: PartitionTransactions,
        timers: WillTimers,
        names: TopicNames,
    ) -> None:
        self.consumer = consumer
        self.transactions = transactions
        self.timers = timers
        self.names = names
        self._ends: dict[TopicPartition, int] = {}
        self._replaying: set[TopicPartition] = set()

    async def run(self) -> None:
        """Read the owned partitions until cancelled."""
        await consume_batches(
            self.consumer,
            self.handle,
            topics=[self.names.client_wills],
            commit_interval=1.0,
            on_assigned=self.assigned,
            on_revoked=self.revoked,
            after_fetch=self.check_replays,
            stage="ingest-wills",
        )

    async def handle(self, records: list[Record]) -> list[Awaitable[object]]:
        """Apply each record to the timers (undecodable ones are logged and skipped)."""
        for record in records:
            try:
                client_id, connection_id, waiting = parse_will(record.key, record.value)
            except RecordError as exc:
                log_undecodable(log, record, exc)
                continue
            self.timers.apply(record.partition, client_id, connection_id, waiting)
        return []

    async def revoked(self, revoked: set[TopicPartition]) -> None:
        """Stop timing the partitions' wills (before another node can start)."""
        self.timers.revoke({tp.partition for tp in revoked})
        self._replaying -= revoked

    async def assigned(self, assigned: set[TopicPartition]) -> None:
        """Fence the partitions' previous owners (until Kafka lets it happen: reading before
        would let a fenced owner's last commit go unseen), then replay them from their
        beginning up to their end (:meth:`check_replays` asks it, and puts them live)."""
        await fence(self.transactions, assigned)
        if assigned:
            await self.consumer.seek_to_beginning(*assigned)
        # Their ends are asked by check_replays: here a failure (Kafka just came back)
        # would only be logged by aiokafka, and the partitions would never go live.
        self._ends = {}
        self._replaying = set(assigned)

    async def check_replays(self) -> None:
        """Put the partitions whose replay is complete live (a failure is logged, and
        tried again after the next fetch)."""
        unknown = [tp for tp in self._replaying if tp not in self._ends]
        if unknown:
            try:
                self._ends.update(await self.consumer.end_offsets(unknown))
            except KafkaError as exc:
                log.warning("end offsets of %s unknown yet: %r", sorted(unknown), exc)
                return
        for tp in sorted(self._replaying):
            if await self.consumer.position(tp) < self._ends[tp]:
                continue
            try:
                await self.timers.go_live(tp.partition)
            except Exception as exc:
                log.warning("wills of %s not live yet: %r", tp, exc)
                return
            self._replaying.discard(tp)
