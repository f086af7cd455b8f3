"""CompactedTopicReader against the real broker: replay, follow, barrier, poisoned records."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
import pytest_asyncio
from aiokafka import AIOKafkaProducer

from services.common.kafka.admin import TopicSpec, ensure_topics
from services.common.kafka.state_reader import CompactedTopicReader
from tests.waiting import wait_for

pytestmark = pytest.mark.kafka

PARTITIONS = 3
POISON = b"poison"


@dataclass
class Applied:
    """A handler that records the latest value per (topic, key), refusing POISON."""

    latest: dict[tuple[str, bytes], bytes | None] = field(default_factory=dict)
    offsets: list[tuple[str, bytes, int]] = field(default_factory=list)

    def __call__(
        self, topic: str, key: bytes, value: bytes | None, offset: int, headers: object
    ) -> None:
        if value == POISON:
            raise ValueError("a record the service cannot decode")
        self.latest[topic, key] = value
        self.offsets.append((topic, key, offset))


@dataclass
class Topics:
    """Two fresh compacted topics and a producer writing to them."""

    names: list[str]
    producer: AIOKafkaProducer
    bootstrap: str

    async def put(self, topic: str, key: bytes | None, value: bytes | None) -> None:
        """Write one record and wait for Kafka's acknowledgement."""
        await self.producer.send_and_wait(topic, value, key=key)


# In the test's own event loop (async fixtures default to the session's loop).
@pytest_asyncio.fixture(loop_scope="function")
async def topics(kafka_bootstrap: str) -> AsyncIterator[Topics]:
    prefix = f"it-{uuid.uuid4().hex[:8]}."
    names = [f"{prefix}sessions", f"{prefix}subscriptions"]
    compacted = {"cleanup.policy": "compact"}
    await ensure_topics(kafka_bootstrap, [TopicSpec(n, PARTITIONS, compacted) for n in names])
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        yield Topics(names, producer, kafka_bootstrap)
    finally:
        await producer.stop()


async def test_start_replays_every_existing_record(topics: Topics) -> None:
    sessions, subscriptions = topics.names
    expected: dict[tuple[str, bytes], bytes | None] = {}
    for i in range(30):
        topic = sessions if i % 2 else subscriptions
        key = f"client-{i % 10}".encode()
        await topics.put(topic, key, f"v{i}".encode())
        expected[topic, key] = f"v{i}".encode()
    await topics.put(sessions, b"client-1", None)  # a tombstone is passed on as None
    expected[sessions, b"client-1"] = None

    applied = Applied()
    reader = CompactedTopicReader(topics.bootstrap, topics.names, applied)
    await reader.start(timeout=30)
    try:
        # start() returns only once the replay reached the end of every partition.
        assert applied.latest == expected
        # Records of one key arrive in offset order.
        for key in {k for _, k in expected}:
            offsets = [o for t, k, o in applied.offsets if (t, k) == (sessions, key)]
            assert offsets == sorted(offsets)
    finally:
        await reader.stop()


async def test_it_follows_records_written_after_start(topics: Topics) -> None:
    sessions, _ = topics.names
    applied = Applied()
    reader = CompactedTopicReader(topics.bootstrap, topics.names, applied)
    await reader.start(timeout=30)
    try:
        assert applied.latest == {}
        await topics.put(sessions, b"late", b"1")
        await wait_for(lambda: applied.latest.get((sessions, b"late")) == b"1", "late record")
    finally:
        await reader.stop()


async def test_barrier_returns_after_earlier_records_are_applied(topics: Topics) -> None:
    sessions, subscriptions = topics.names
    applied = Applied()
    reader = CompactedTopicReader(topics.bootstrap, topics.names, applied)
    await reader.start(timeout=30)
    try:
        for round_ in range(5):
            written = {}
            for i in range(20):
                topic = (sessions, subscriptions)[i % 2]
                key = f"k{i}".encode()
                written[topic, key] = f"{round_}-{i}".encode()
                await topics.put(topic, key, written[topic, key])
            await asyncio.wait_for(reader.barrier(), 10)
            # No waiting here: everything acknowledged before barrier() must be applied.
            assert {k: applied.latest.get(k) for k in written} == written
    finally:
        await reader.stop()


async def test_a_poisoned_record_is_skipped_without_blocking_its_partition(
    topics: Topics,
) -> None:
    sessions, _ = topics.names
    applied = Applied()
    await topics.put(sessions, b"victim", b"before")
    await topics.put(sessions, b"victim", POISON)
    reader = CompactedTopicReader(topics.bootstrap, topics.names, applied)
    await reader.start(timeout=30)
    try:
        assert applied.latest == {(sessions, b"victim"): b"before"}
        # Same key, so same partition, behind the poison (replayed and live alike).
        await topics.put(sessions, b"victim", POISON)
        await topics.put(sessions, b"victim", b"after")
        await asyncio.wait_for(reader.barrier(), 10)
        assert applied.latest == {(sessions, b"victim"): b"after"}
    finally:
        await reader.stop()


async def test_a_missing_topic_is_reported_at_once(topics: Topics) -> None:
    missing = f"it-missing-{uuid.uuid4().hex[:8]}"
    reader = CompactedTopicReader(topics.bootstrap, [*topics.names, missing], Applied())
    async with asyncio.timeout(10):  # not aiokafka's 40 s request timeout
        with pytest.raises(RuntimeError, match=missing):
            await reader.start(timeout=30)
