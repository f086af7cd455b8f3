"""consume_at_least_once against the real broker: a new integration's first round starts
at its start offset even when that offset is found only after the consumer already fetched
(aiokafka publishes an assignment, and starts fetching it from ``auto_offset_reset``,
before the rebalance listener that seeks to the start has returned). Found by
bench/bench_integrations.py on a loaded machine: a new webhook delivered thousands of
messages accepted before it was created."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition

from services.common.integrations.model import (
    Integration,
    IntegrationKind,
    PayloadFormat,
    WebhookSink,
)
from services.common.kafka.admin import TopicSpec, ensure_topics
from services.common.kafka.consumer import make_consumer
from services.common.kafka.names import TopicNames
from services.common.records import PublishMeta, publish_record
from services.common.settings import Settings
from services.integrations.at_least_once import Gathering, consume_at_least_once
from services.integrations.matching import Matcher, Outgoing
from services.integrations.stage import IntegrationCounters
from tests.waiting import wait_for

pytestmark = pytest.mark.kafka

OLD, NEW = 5, 5


class Collecting:
    """A deliverer that keeps what it is given."""

    gathering = Gathering()

    def __init__(self) -> None:
        self.payloads: list[bytes] = []

    async def start(self) -> None:
        """Nothing to connect."""

    async def deliver(self, messages: Sequence[Outgoing]) -> None:
        """Keep ``messages``' values (raw format: the payloads)."""
        self.payloads.extend(message.value for message in messages)

    async def close(self) -> None:
        """Nothing to release."""


async def test_first_round_starts_at_the_start_offset_found_late(
    kafka_bootstrap: str, settings: Settings
) -> None:
    prefix = f"it-{uuid.uuid4().hex[:8]}."
    names = TopicNames(prefix)
    topic = names.msg_all
    await ensure_topics(kafka_bootstrap, [TopicSpec(topic, 1)])
    tp = TopicPartition(topic, 0)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        for i in range(OLD + NEW):
            meta = PublishMeta("plant/s/temp", 1, False, int(time.time() * 1000), 4, b"")
            _, key, value, headers = publish_record(names, "s", meta, f"m{i}".encode())
            await producer.send_and_wait(topic, value, key=key, headers=list(headers))
    finally:
        await producer.stop()
    integration = Integration(
        uuid.uuid4(),
        "start",
        IntegrationKind.WEBHOOK,
        ("plant/#",),
        WebhookSink("http://127.0.0.1:9/"),
        PayloadFormat.RAW,
    )
    consumer = make_consumer(settings, group_id=f"{prefix}group", fetch_max_wait_ms=100)
    deliverer = Collecting()

    async def start_offset(partition: TopicPartition) -> int:
        # The start is known only once the consumer fetched from the earliest offset.
        await wait_for(lambda: consumer.highwater(partition) is not None, "a first fetch")
        return OLD

    await consumer.start()
    run = asyncio.create_task(
        consume_at_least_once(
            consumer,
            topic,
            Matcher(integration),
            deliverer,
            IntegrationCounters(),
            start_offset,
            {},
        )
    )
    try:
        await wait_for(lambda: len(deliverer.payloads) >= NEW or run.done(), "the new messages")
        assert deliverer.payloads == [f"m{i}".encode() for i in range(OLD, OLD + NEW)]
        assert await consumer.committed(tp) == OLD + NEW
    finally:
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        await consumer.stop()
