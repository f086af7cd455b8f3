"""The owners of a topic of waiting records (``client.wills``, ``msg.delayed``) against the
real broker: a rebalance in the middle of the read loop's work, and a membership that
ends, leave no partition without an owner (services/ingest/timed_records.py)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from dataclasses import dataclass, field

import pytest
import pytest_asyncio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from services.common.faust_app import transactional_producer
from services.common.kafka.admin import TopicSpec, ensure_topics
from services.common.kafka.consumer import PartitionTransactions, make_consumer
from services.common.kafka.names import TopicNames
from services.common.records import DelayedCancel, DelayedOutcome, KafkaRecord
from services.common.settings import Settings
from services.ingest.effects import Publication
from services.ingest.timed_records import Key, PartitionOwner, TimedRecords, own_partitions
from tests.waiting import wait_for

pytestmark = pytest.mark.kafka

PARTITIONS = 2

#: Seconds for a partition's records to be ended once its owner is settled (a fence, a
#: replay and a transaction; the local cluster's session timeout and a rebalance when a
#: membership is joined again), with room for a loaded machine.
ENDED_TIMEOUT = 45.0


class _Timers(TimedRecords[int]):
    """Records due at their value (Unix ms), discarded when due. :meth:`before_live` waits
    for :attr:`gate` (set: it does not wait), and sets :attr:`waiting` meanwhile."""

    what = "test record"

    def __init__(self, topic: str, names: TopicNames, commit: Callable[..., Awaitable[None]]):
        super().__init__(names, commit, lambda: int(time.time() * 1000))
        self.topic = topic
        self.gate = asyncio.Event()
        self.gate.set()
        self.waiting = asyncio.Event()

    def due_at_ms(self, value: int) -> int:
        return value

    def tombstone(self, key: Key, outcome: DelayedOutcome) -> KafkaRecord:
        return KafkaRecord(self.topic, _key(*key), None)

    async def at_due(self, key: Key, value: int) -> Publication:
        return []

    async def before_live(self) -> None:
        if not self.gate.is_set():
            self.waiting.set()
            await self.gate.wait()


def _key(client_id: str, ident: bytes) -> bytes:
    return client_id.encode() + b"/" + ident


def _parse(key: bytes | None, value: bytes | None) -> tuple[str, bytes, int | DelayedCancel | None]:
    assert key is not None
    client_id, ident = key.split(b"/")
    return client_id.decode(), ident, None if value is None else int(value)


@dataclass
class _Node:
    """One ingest node's share of the topic: its timers, its partitions' producers, the
    keys its transactions ended."""

    name: str
    timers: _Timers
    transactions: PartitionTransactions
    ended: list[bytes] = field(default_factory=list)


@dataclass
class _Group:
    """A fresh topic of waiting records and its consumer group."""

    topic: str
    group: str
    settings: Settings
    producer: AIOKafkaProducer
    nodes: list[_Node] = field(default_factory=list)

    def node(self, name: str, kind: type[PartitionTransactions] = PartitionTransactions) -> _Node:
        """A node of the group (its membership not started), its producers held by a
        ``kind``."""
        transactions = kind(
            lambda transactional_id: transactional_producer(self.settings, transactional_id),
            f"{self.group}.",
            self.group,
        )

        async def commit(partition: int, records: list[KafkaRecord]) -> None:
            async def produce(producer: AIOKafkaProducer) -> list[Awaitable[object]]:
                return [
                    await producer.send(r.topic, r.value, key=r.key, partition=partition)
                    for r in records
                ]

            await transactions.run_in(TopicPartition(self.topic, partition), produce, 15.0)
            node.ended.extend(r.key for r in records)

        names = TopicNames.from_settings(self.settings)
        node = _Node(name, _Timers(self.topic, names, commit), transactions)
        self.nodes.append(node)
        return node

    def consumer(self, node: _Node) -> AIOKafkaConsumer:
        """``node``'s consumer (not started): a static member named by the node."""
        return make_consumer(
            self.settings, group_id=self.group, instance_id=node.name, fetch_max_wait_ms=100
        )

    async def put_due(self, partition: int) -> bytes:
        """A record due now in ``partition``; returns its key."""
        key = _key(f"client-{uuid.uuid4().hex[:6]}", b"1")
        due = str(int(time.time() * 1000)).encode()
        await (await self.producer.send(self.topic, due, key=key, partition=partition))
        return key

    def ended(self) -> dict[bytes, str]:
        """The keys ended so far, by the node that ended them."""
        return {key: node.name for node in self.nodes for key in node.ended}


@pytest_asyncio.fixture(loop_scope="function")
async def waiting_group(kafka_bootstrap: str, settings: Settings) -> AsyncIterator[_Group]:
    name = f"it-{uuid.uuid4().hex[:8]}"
    topic = f"{name}.waiting"
    await ensure_topics(kafka_bootstrap, [TopicSpec(topic, PARTITIONS)])
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        yield _Group(topic, name, settings, producer)
    finally:
        await producer.stop()


async def test_a_rebalance_while_a_partition_goes_live_leaves_the_owner_reading(
    waiting_group: _Group,
) -> None:
    """Node a owns both partitions and is putting the first live (its session state being
    made current) when node b joins: the group takes one partition from a. a's read loop
    goes on, replays the partition it kept and ends its record; b ends the other's.
    (It ended: aiokafka's ``IllegalStateError`` for the partition gone, or a ``KeyError``
    for the ends forgotten by the new assignment; nobody read a's partition again.)"""
    group = waiting_group
    keys = [await group.put_due(p) for p in range(PARTITIONS)]
    a, b = group.node("a"), group.node("b")
    a.timers.gate.clear()
    consumer_a, consumer_b = group.consumer(a), group.consumer(b)
    owners = []
    for node, consumer in ((a, consumer_a), (b, consumer_b)):
        owners.append(
            PartitionOwner(consumer, node.transactions, node.timers, group.topic, _parse, "test")
        )
    await consumer_a.start()
    run_a = asyncio.create_task(owners[0].run())
    run_b: asyncio.Task[None] | None = None
    try:
        await asyncio.wait_for(a.timers.waiting.wait(), ENDED_TIMEOUT)
        await consumer_b.start()
        run_b = asyncio.create_task(owners[1].run())

        async def one_each() -> bool:
            return len(consumer_a.assignment()) == len(consumer_b.assignment()) == 1

        await wait_for(one_each, "the partitions shared by the rebalance", ENDED_TIMEOUT)
        a.timers.gate.set()

        async def all_ended() -> bool:
            assert not run_a.done(), "node a's read loop ended"
            return set(group.ended()) == set(keys)

        await wait_for(all_ended, "both records ended", ENDED_TIMEOUT)
        # Each by the owner of its partition now.
        [kept_by_a] = consumer_a.assignment()
        assert group.ended()[keys[kept_by_a.partition]] == "a"
        assert group.ended()[keys[1 - kept_by_a.partition]] == "b"
    finally:
        for task in (run_a, run_b):
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in (run_a, run_b) if t), return_exceptions=True)
        for node, consumer in ((a, consumer_a), (b, consumer_b)):
            await node.timers.stop()
            await node.transactions.close()
            await consumer.stop()


class _FencingFailsOnce(PartitionTransactions):
    """Its first fence raises what the read loop does not expect."""

    failed = False

    async def assign(self, partitions: Collection[TopicPartition]) -> None:
        if not self.failed:
            self.failed = True
            raise RuntimeError("the fence fails once")
        await super().assign(partitions)


async def test_a_node_whose_membership_ended_joins_again_and_ends_its_records(
    waiting_group: _Group,
) -> None:
    """The only node's read loop raises (here its first fence; an error aiokafka hands the
    loop, a bug): the node joins the group again with a new consumer, replays its
    partitions and ends their records. (Its task ended with the loop: the records waited
    until the node was restarted.)"""
    group = waiting_group
    keys = [await group.put_due(p) for p in range(PARTITIONS)]
    node = group.node("a", _FencingFailsOnce)
    owning = asyncio.create_task(
        own_partitions(
            lambda: group.consumer(node),
            node.transactions,
            node.timers,
            group.topic,
            _parse,
            "test",
            rejoin_seconds=0.1,
        )
    )
    try:

        async def all_ended() -> bool:
            assert not owning.done(), "the node stopped owning"
            return set(group.ended()) == set(keys)

        await wait_for(all_ended, "both records ended", ENDED_TIMEOUT)
        assert isinstance(node.transactions, _FencingFailsOnce) and node.transactions.failed
    finally:
        owning.cancel()
        await asyncio.gather(owning, return_exceptions=True)
