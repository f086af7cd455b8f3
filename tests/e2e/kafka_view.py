"""What the cluster wrote to Kafka, for end-to-end tests that check records other services
rely on (session records, acknowledgements, retained message requests), with deadlines.

- :func:`latest_state`: the state topics as they are now (latest record per client);
- :func:`latest_values`: any compacted topic as it is now (latest value per key);
- :func:`waiting_of`: how many records of a client wait in ``client.wills`` or
  ``msg.delayed`` now;
- :class:`TopicTail`: the records written to a topic from now on;
- :func:`downlink_writer`: a producer that plays a message store writing downlink records.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord

from services.common.kafka.consumer import assign_whole_topics
from services.common.kafka.names import TopicNames
from services.common.kafka.state_reader import CompactedTopicReader
from tests.e2e.clients import TIMEOUT
from tests.servers import LocalCluster


async def latest_state(cluster: LocalCluster) -> tuple[dict[str, bytes | None], set[str]]:
    """The latest value of every ``client.sessions`` key (None: a tombstone), and the
    client ids that have a ``client.subscriptions`` record, as the topics hold them now."""
    names = TopicNames.from_settings(cluster.settings)
    sessions: dict[str, bytes | None] = {}
    subscribed: set[str] = set()

    def apply(topic: str, key: bytes, value: bytes | None, offset: int, headers: object) -> None:
        client_id = key.decode()
        if topic == names.client_sessions:
            sessions[client_id] = value
        elif value is None:
            subscribed.discard(client_id)
        else:
            subscribed.add(client_id)

    reader = CompactedTopicReader(
        cluster.kafka_bootstrap, [names.client_sessions, names.client_subscriptions], apply
    )
    await reader.start(timeout=TIMEOUT)
    await reader.stop()
    return sessions, subscribed


async def latest_values(cluster: LocalCluster, topic: str) -> dict[bytes, bytes | None]:
    """The latest value of every key of ``topic`` (None: a tombstone), committed records
    only, as the topic holds them now."""
    values: dict[bytes, bytes | None] = {}

    def apply(topic: str, key: bytes, value: bytes | None, offset: int, headers: object) -> None:
        values[key] = value

    reader = CompactedTopicReader(cluster.kafka_bootstrap, [topic], apply)
    await reader.start(timeout=TIMEOUT)
    await reader.stop()
    return values


async def waiting_of(
    cluster: LocalCluster,
    topic: str,
    parse: Callable[[bytes, bytes], tuple[str, bytes, object]],
    client_id: str,
) -> int:
    """How many records of ``client_id`` wait in ``topic`` now (``client.wills`` or
    ``msg.delayed``, whose keys ``parse`` reads: the latest value of each key, not a
    tombstone)."""
    values = await latest_values(cluster, topic)
    return sum(
        1
        for key, value in values.items()
        if value is not None and parse(key, value)[0] == client_id
    )


class TopicTail:
    """Records written to one topic after :meth:`open` (every partition, no group)."""

    def __init__(self, consumer: AIOKafkaConsumer) -> None:
        self._consumer = consumer

    @classmethod
    @asynccontextmanager
    async def open(
        cls, bootstrap: str, topic: str, committed: bool = True
    ) -> AsyncIterator[TopicTail]:
        """Follow ``topic`` from its current end for the block: committed records only, as
        the services read (wills are written in transactions), unless ``committed`` is
        False (records of transactions still open too: a publication under way)."""
        isolation = "read_committed" if committed else "read_uncommitted"
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, group_id=None, isolation_level=isolation
        )
        await consumer.start()
        try:
            async with asyncio.timeout(TIMEOUT):
                await assign_whole_topics(consumer, [topic], from_end=True)
            yield cls(consumer)
        finally:
            await consumer.stop()

    async def next_with_key(self, key: bytes) -> ConsumerRecord[bytes, bytes]:
        """The next record keyed ``key`` (others are skipped); ``TimeoutError`` after TIMEOUT."""
        async with asyncio.timeout(TIMEOUT):
            while True:
                record = await self._consumer.getone()
                if record.key == key:
                    return record


@asynccontextmanager
async def downlink_writer(cluster: LocalCluster) -> AsyncIterator[AIOKafkaProducer]:
    """A producer (acks=all) for writing downlink records by hand, as a message store does."""
    producer = AIOKafkaProducer(bootstrap_servers=cluster.kafka_bootstrap, acks="all")
    await producer.start()
    try:
        yield producer
    finally:
        await producer.stop()
