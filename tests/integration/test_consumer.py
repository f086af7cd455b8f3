"""consume_batches against the real broker: commit after acknowledgement, re-read on failure."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass

import pytest
import pytest_asyncio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import UnknownError

from services.common.kafka.admin import TopicSpec, ensure_topics
from services.common.kafka.consumer import (
    PartitionTransactions,
    Record,
    Transaction,
    consume_batches,
    consume_in_transactions,
    make_consumer,
)
from services.common.settings import Settings
from tests.waiting import wait_for

pytestmark = pytest.mark.kafka

PARTITIONS = 3
TIMEOUT = 20.0


@dataclass
class Topic:
    """A fresh topic, a producer writing to it and settings pointing at the broker."""

    name: str
    producer: AIOKafkaProducer
    settings: Settings

    async def put_many(self, count: int) -> None:
        """Write ``count`` records (keys k0..k{count-1}) and wait for Kafka's acks."""
        acks = [
            await self.producer.send(self.name, str(i).encode(), key=f"k{i}".encode())
            for i in range(count)
        ]
        await asyncio.gather(*acks)

    def consumer(self, group: str) -> AIOKafkaConsumer:
        """A hot-path consumer in consumer group ``group`` (not started)."""
        return make_consumer(self.settings, group_id=group, fetch_max_wait_ms=100)

    async def committed(self, group: str) -> int:
        """Offsets committed by ``group``, summed over the topic's partitions."""
        probe = AIOKafkaConsumer(bootstrap_servers=self.settings.kafka_bootstrap, group_id=group)
        await probe.start()
        try:
            total = 0
            for p in range(PARTITIONS):
                total += await probe.committed(TopicPartition(self.name, p)) or 0
            return total
        finally:
            await probe.stop()


@pytest_asyncio.fixture(loop_scope="function")
async def topic(kafka_bootstrap: str, settings: Settings) -> AsyncIterator[Topic]:
    name = f"it-{uuid.uuid4().hex[:8]}.batches"
    await ensure_topics(kafka_bootstrap, [TopicSpec(name, PARTITIONS)])
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        yield Topic(name, producer, settings)
    finally:
        await producer.stop()


async def _committed(topic: Topic, group: str, offset: int) -> None:
    """Wait until ``group`` has committed ``offset`` in ``topic``."""

    async def reached() -> bool:
        return await topic.committed(group) == offset

    await wait_for(reached, f"offset {offset} committed", TIMEOUT)


async def _run(consumer: AIOKafkaConsumer, task: Awaitable[None]) -> asyncio.Task[None]:
    await consumer.start()
    return asyncio.ensure_future(task)


async def _stop(consumer: AIOKafkaConsumer, task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await consumer.stop()


async def test_offsets_are_committed_only_once_the_batch_is_acknowledged(topic: Topic) -> None:
    group = f"g-{uuid.uuid4().hex[:8]}"
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    seen: list[bytes] = []

    async def handle(records: list[Record]) -> list[Awaitable[object]]:
        seen.extend(r.value for r in records)
        return [gate]

    await topic.put_many(10)
    consumer = topic.consumer(group)
    task = await _run(
        consumer,
        consume_batches(consumer, handle, topics=[topic.name], commit_interval=0.05, stage="test"),
    )
    try:
        await wait_for(lambda: len(seen) == 10, "all ten records handled", TIMEOUT)
        assert await topic.committed(group) == 0  # handled, but not acknowledged yet
        gate.set_result(None)
        await _committed(topic, group, 10)
    finally:
        await _stop(consumer, task)
    assert sorted(seen, key=int) == [str(i).encode() for i in range(10)]


async def test_a_failed_batch_is_read_again_and_nothing_is_lost(topic: Topic) -> None:
    group = f"g-{uuid.uuid4().hex[:8]}"
    handled: list[bytes] = []
    failures = 0

    async def handle(records: list[Record]) -> list[Awaitable[object]]:
        nonlocal failures
        if failures < 2 and any(r.value == b"7" for r in records):
            failures += 1
            failed: asyncio.Future[object] = asyncio.get_running_loop().create_future()
            failed.set_exception(RuntimeError("the store is down"))
            return [failed]
        handled.extend(r.value for r in records)
        return []

    await topic.put_many(20)
    consumer = topic.consumer(group)
    task = await _run(
        consumer,
        consume_batches(consumer, handle, topics=[topic.name], commit_interval=0.05, stage="test"),
    )
    try:
        await wait_for(lambda: b"7" in handled, "the failing record handled at last", TIMEOUT)
        await wait_for(
            lambda: set(handled) == {str(i).encode() for i in range(20)}, "all records", TIMEOUT
        )
        await _committed(topic, group, 20)
    finally:
        await _stop(consumer, task)
    assert failures == 2


async def test_a_handler_that_raises_fails_its_batch_the_same_way(topic: Topic) -> None:
    group = f"g-{uuid.uuid4().hex[:8]}"
    handled: list[bytes] = []
    raised = False

    async def handle(records: list[Record]) -> list[Awaitable[object]]:
        nonlocal raised
        if not raised:
            raised = True
            raise ConnectionError("Redis is down")
        handled.extend(r.value for r in records)
        return []

    await topic.put_many(5)
    consumer = topic.consumer(group)
    task = await _run(
        consumer, consume_batches(consumer, handle, topics=[topic.name], stage="test")
    )
    try:
        await wait_for(
            lambda: set(handled) == {str(i).encode() for i in range(5)}, "all records", TIMEOUT
        )
    finally:
        await _stop(consumer, task)
    assert raised


async def test_a_failed_batch_is_read_again_without_asking_kafka_where_to_start(
    topic: Topic,
) -> None:
    # Where to read again is known locally: the first offset of each partition the batches
    # in flight read. Asking the coordinator for every assigned partition's committed
    # offset, and the broker for the beginning of those with none, one partition at a
    # time, held device_persist's retry 5-16 s after a Redis failover on a loaded machine.
    group = f"g-{uuid.uuid4().hex[:8]}"
    handled: list[bytes] = []
    failed = False
    asked: list[str] = []

    async def handle(records: list[Record]) -> list[Awaitable[object]]:
        nonlocal failed
        if not failed:
            failed = True
            raise ConnectionError("Redis is failing over")
        handled.extend(r.value for r in records)
        return []

    await topic.put_many(12)
    consumer = topic.consumer(group)
    committed, to_beginning = consumer.committed, consumer.seek_to_beginning

    async def spy_committed(tp: TopicPartition) -> int | None:
        asked.append("committed")
        return await committed(tp)

    async def spy_to_beginning(*partitions: TopicPartition) -> None:
        asked.append("seek_to_beginning")
        await to_beginning(*partitions)

    task = await _run(
        consumer, consume_batches(consumer, handle, topics=[topic.name], stage="test")
    )
    consumer.committed = spy_committed  # type: ignore[method-assign]
    consumer.seek_to_beginning = spy_to_beginning  # type: ignore[method-assign]
    try:
        await wait_for(
            lambda: sorted(handled, key=int) == [str(i).encode() for i in range(12)],
            "every record handled after the failure",
            TIMEOUT,
        )
    finally:
        await _stop(consumer, task)
    assert failed
    assert asked == []


async def test_no_batch_after_a_failed_one_is_handled_before_it_is_read_again(
    kafka_bootstrap: str, settings: Settings
) -> None:
    # A later batch stored while the failed one waits to be read again would make a store
    # that skips what it has seen (device_persist's source offsets) skip the failed one.
    name = f"it-{uuid.uuid4().hex[:8]}.ordered"
    await ensure_topics(kafka_bootstrap, [TopicSpec(name, 1)])
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        await asyncio.gather(*[await producer.send(name, str(i).encode()) for i in range(8)])
    finally:
        await producer.stop()
    calls: list[list[bytes]] = []

    async def handle(records: list[Record]) -> list[Awaitable[object]]:
        calls.append([r.value for r in records])
        if len(calls) == 1:
            raise ConnectionError("PostgreSQL is restarting")
        return []

    consumer = make_consumer(settings, group_id=f"g-{uuid.uuid4().hex[:8]}")
    task = await _run(
        consumer, consume_batches(consumer, handle, topics=[name], max_records=2, stage="test")
    )
    try:
        await wait_for(lambda: len(calls) >= 2, "the batch after the failure", TIMEOUT)
    finally:
        await _stop(consumer, task)
    assert calls[0] == [b"0", b"1"]
    assert calls[1][0] == b"0"


async def test_records_of_the_first_topics_overtake_a_backlog(
    kafka_bootstrap: str, settings: Settings
) -> None:
    prefix = f"it-{uuid.uuid4().hex[:8]}."
    backlog, urgent = f"{prefix}backlog", f"{prefix}urgent"
    await ensure_topics(kafka_bootstrap, [TopicSpec(backlog, 1), TopicSpec(urgent, 1)])
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        acks = [await producer.send(backlog, b"x" * 200) for _ in range(5000)]
        acks.append(await producer.send(urgent, b"now"))
        await asyncio.gather(*acks)
    finally:
        await producer.stop()
    seen: list[bytes] = []

    async def handle(records: list[Record]) -> list[Awaitable[object]]:
        seen.extend(r.value for r in records)
        return []

    consumer = make_consumer(settings, group_id=f"g-{uuid.uuid4().hex[:8]}")
    task = await _run(
        consumer,
        consume_batches(
            consumer,
            handle,
            topics=[backlog, urgent],
            max_records=100,
            first=[urgent],
            stage="test",
        ),
    )
    try:
        await wait_for(lambda: b"now" in seen, "the urgent record", TIMEOUT)
    finally:
        await _stop(consumer, task)
    assert seen.index(b"now") < 1000  # not behind the 5,000 records fetched before it


#: The consumer group session timeout of the test below (seconds): the local cluster's
#: stages' (a shorter one expires on a loaded machine whatever the listener does).
SESSION_TIMEOUT = 3.0

#: Seconds longer than usual the transactional producers of the test below take to start:
#: twice :data:`SESSION_TIMEOUT`.
SLOW_START = 2 * SESSION_TIMEOUT


class _SlowStart(AIOKafkaProducer):  # type: ignore[misc]
    """A transactional producer whose start (InitProducerId, the fence of the partition's
    previous owner) takes :data:`SLOW_START` seconds longer, as the router's twelve did on
    a loaded machine after a restart (bench/NOTES.md, "Recovery time")."""

    async def start(self) -> None:
        await asyncio.sleep(SLOW_START)
        await super().start()


async def test_a_slow_fence_after_an_assignment_keeps_the_member_in_its_group(
    topic: Topic,
) -> None:
    """The fence of newly assigned partitions runs outside aiokafka's rebalance listener,
    which sends no heartbeat: a fence longer than the session timeout used to get the
    member dropped by the coordinator and the group rebalanced once more."""
    settings = topic.settings.model_copy(
        update={
            "consumer_session_timeout_seconds": SESSION_TIMEOUT,
            "consumer_heartbeat_interval_seconds": SESSION_TIMEOUT / 6,
        }
    )
    group = f"it-{uuid.uuid4().hex[:8]}"
    consumer = make_consumer(settings, group_id=group, fetch_max_wait_ms=100)
    transactions = PartitionTransactions(
        lambda transactional_id: _SlowStart(
            bootstrap_servers=settings.kafka_bootstrap, transactional_id=transactional_id
        ),
        f"{group}.",
        group,
    )
    handled: list[Record] = []
    revoked: list[set[TopicPartition]] = []

    async def handle(records: list[Record], transaction: Transaction) -> list[Awaitable[object]]:
        handled.extend(records)
        return []

    async def on_revoked(partitions: set[TopicPartition]) -> None:
        if partitions:  # aiokafka revokes the empty set before the first join
            revoked.append(partitions)

    task = await _run(
        consumer,
        consume_in_transactions(
            consumer, handle, transactions, topics=[topic.name], on_revoked=on_revoked, stage="test"
        ),
    )
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    await admin.start()
    try:
        await topic.put_many(PARTITIONS * 2)
        await wait_for(lambda: len(handled) >= PARTITIONS * 2, "the records handled", 60.0)
        # Handled only once fenced, SLOW_START after the assignment: well past the
        # session timeout, so a member the coordinator dropped meanwhile is gone or back
        # through a revocation by now.
        [description] = await admin.describe_consumer_groups([group])
        [_, _, state, _, _, members, *_] = description.groups[0]
        assert (state, len(members), revoked) == ("Stable", 1, [])
    finally:
        await admin.close()
        await _stop(consumer, task)


async def test_a_member_whose_group_coordination_failed_joins_again_and_reads_on(
    topic: Topic,
) -> None:
    """aiokafka hands an error of the group's coordination it has no rule for to the
    caller of ``getmany`` (Kafka's FENCED_INSTANCE_ID, read as UnknownError: a static
    member whose JoinGroup answer a broker's death lost); the loop used to end with it, and
    the stage's process with it, which stopped deliveries after a broker's kill -9."""
    group = f"g-{uuid.uuid4().hex[:8]}"
    handled: list[bytes] = []

    async def handle(records: list[Record]) -> list[Awaitable[object]]:
        handled.extend(r.value for r in records)
        return []

    consumer = make_consumer(
        topic.settings, group_id=group, instance_id=f"{group}-1", fetch_max_wait_ms=100
    )
    task = await _run(
        consumer,
        consume_batches(consumer, handle, topics=[topic.name], commit_interval=0.05, stage="test"),
    )
    try:
        await topic.put_many(3)
        await wait_for(lambda: len(handled) == 3, "the first records handled", TIMEOUT)
        # What aiokafka 0.14 does with such an error (group_coordinator.py, the
        # coordination routine's ``except KafkaError``): the next getmany raises it.
        pushed = asyncio.ensure_future(consumer._coordinator._push_error_to_user(UnknownError()))
        later = [f"n{i}".encode() for i in range(6)]
        await asyncio.gather(*[await topic.producer.send(topic.name, value) for value in later])
        await wait_for(
            lambda: set(later) <= set(handled) or task.done(), "the later records", TIMEOUT
        )
        assert not task.done(), task.exception()
        await pushed
    finally:
        await _stop(consumer, task)
