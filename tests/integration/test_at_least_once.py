"""The at-least-once rounds of the webhook and the MQTT bridge
(:func:`services.integrations.at_least_once.consume_at_least_once`) against the session's
real Kafka: a new consumer group hands out nothing before its partitions are placed at
their start (the webhook sent a client's messages twice when aiokafka's own reset to the
earliest offset won the race with the start offset's seek, issue 27), and a partition
revoked in the middle of a round, while it gathers or while it delivers, loses nothing and
keeps each Client Identifier's order, with two runners in one consumer group."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field

import pytest
import pytest_asyncio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from services.common.integrations.model import (
    Integration,
    IntegrationKind,
    PayloadFormat,
    SinkSecrets,
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
from services.integrations.webhook import WebhookDeliverer
from tests.waiting import wait_for
from tests.webhook_server import SECRET, serve_webhook

pytestmark = pytest.mark.kafka

TIMEOUT = 30.0

#: Where the test's clients publish (the integrations take ``t/#``).
MQTT_TOPIC = "t/x"


def integration(url: str = "http://127.0.0.1:9/unused") -> Integration:
    """A webhook integration taking ``t/#``, one raw payload per request to ``url``."""
    return Integration(
        uuid.uuid4(),
        "rounds",
        IntegrationKind.WEBHOOK,
        ("t/#",),
        WebhookSink(url, timeout_seconds=5.0),
        PayloadFormat.RAW,
        secrets=SinkSecrets(signing_secret=SECRET),
    )


@dataclass
class Topic:
    """A fresh ``msg.all``-like topic and a producer writing publications into it."""

    name: str
    partitions: int
    producer: AIOKafkaProducer

    async def publish(self, client_id: str, partition: int, *payloads: bytes) -> None:
        """``client_id``'s publications of ``payloads`` on :data:`MQTT_TOPIC`, in order,
        into ``partition`` (as the broker keys a client's messages to one partition)."""
        for payload in payloads:
            meta = PublishMeta(MQTT_TOPIC, 1, False, 0)
            _, key, value, headers = publish_record(TopicNames(), client_id, meta, payload)
            await self.producer.send_and_wait(
                self.name, value, key=key, headers=list(headers), partition=partition
            )


@pytest_asyncio.fixture(loop_scope="function")
async def producer(kafka_bootstrap: str) -> AsyncIterator[AIOKafkaProducer]:
    """A producer of the session's Kafka."""
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        yield producer
    finally:
        await producer.stop()


async def new_topic(producer: AIOKafkaProducer, kafka_bootstrap: str, partitions: int) -> Topic:
    """A new topic of ``partitions`` partitions that ``producer`` writes to."""
    name = f"it-{uuid.uuid4().hex[:8]}.rounds"
    await ensure_topics(kafka_bootstrap, [TopicSpec(name, partitions)])
    return Topic(name, partitions, producer)


@dataclass
class Recorder:
    """A :class:`~services.integrations.at_least_once.Deliverer` that appends what it is
    handed to ``arrived`` (shared by the runners of a test: the order the sink saw), and
    waits for ``gate`` first when there is one (``entered`` is set then)."""

    arrived: list[tuple[str, bytes]]
    gathering: Gathering = field(default_factory=Gathering)
    gate: asyncio.Event | None = None
    entered: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self) -> None:
        """Nothing to connect."""

    async def deliver(self, messages: Sequence[Outgoing]) -> None:
        """Record ``messages`` (after the gate opens)."""
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        self.arrived.extend((message.client_id, message.value) for message in messages)

    async def close(self) -> None:
        """Nothing to release."""


@dataclass
class Runner:
    """One integration runner's consumer (in ``group``) and its rounds' task."""

    consumer: AIOKafkaConsumer
    task: asyncio.Task[None]

    async def positions(self, topic: Topic) -> dict[int, int]:
        """The consumer's position in each partition of ``topic`` it is assigned."""
        return {
            tp.partition: await self.consumer.position(tp)
            for tp in self.consumer.assignment()
            if tp.topic == topic.name
        }

    async def stop(self) -> None:
        """Cancel the rounds and stop the consumer."""
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.consumer.stop()


async def run(settings: Settings, topic: Topic, group: str, deliverer: Recorder) -> Runner:
    """Rounds of ``topic`` in ``group`` through ``deliverer``, every partition starting at
    its beginning."""
    consumer = make_consumer(settings, group_id=group, fetch_max_wait_ms=100)
    await consumer.start()

    async def beginning(tp: TopicPartition) -> int:
        return 0

    rounds = consume_at_least_once(
        consumer, topic.name, Matcher(integration()), deliverer, IntegrationCounters(),
        beginning, {},
    )  # fmt: skip
    return Runner(consumer, asyncio.create_task(rounds))


def per_client(arrived: list[tuple[str, bytes]], client_id: str) -> list[bytes]:
    """What the sink received of ``client_id``, in order."""
    return [value for client, value in arrived if client == client_id]


#: What each client of the rebalance tests publishes: four before, the rest after the split.
SEQUENCE = [b"1", b"2", b"3", b"4", b"5", b"6", b"7", b"8", b"end"]


async def test_a_new_group_hands_out_nothing_before_its_start_and_nothing_twice(
    settings: Settings, kafka_bootstrap: str, producer: AIOKafkaProducer
) -> None:
    topic = await new_topic(producer, kafka_bootstrap, 1)
    await topic.publish("c", 0, b"before-1", b"before-2")  # before the integration began
    await topic.publish("c", 0, b"1", b"2", b"3")
    with serve_webhook() as server:
        consumer = make_consumer(settings, group_id=f"g-{uuid.uuid4().hex[:8]}")
        await consumer.start()

        async def start_offset(tp: TopicPartition) -> int:
            # A late answer, as ListOffsets may give on a loaded machine: only once the
            # partition's records could no longer be handed out early (it is paused until
            # placed) or were (the endpoint received a request).
            await wait_for(
                lambda: server.received or tp in consumer.paused(), "paused or sent", TIMEOUT
            )
            return 2

        deliverer = WebhookDeliverer(settings, integration(server.url), IntegrationCounters())
        await deliverer.start()
        matcher = Matcher(deliverer.integration)
        rounds = asyncio.create_task(
            consume_at_least_once(
                consumer, topic.name, matcher, deliverer, IntegrationCounters(), start_offset, {}
            )
        )
        try:

            def bodies() -> list[bytes]:
                return [request.body for request in server.accepted()]

            await wait_for(lambda: len(bodies()) >= 3, "three requests accepted", TIMEOUT)
            # An ordering marker: a copy again of the first three would come before it.
            await topic.publish("c", 0, b"end")
            await wait_for(lambda: b"end" in bodies(), "the marker accepted", TIMEOUT)
        finally:
            rounds.cancel()
            await asyncio.gather(rounds, return_exceptions=True)
            await consumer.stop()
            await deliverer.close()
    assert bodies() == [b"1", b"2", b"3", b"end"]


async def _two_runners_finish(
    settings: Settings, topic: Topic, first: Runner, group: str, arrived: list[tuple[str, bytes]]
) -> None:
    """Once the group split ``topic`` between ``first`` and a second runner: the rest of
    each client's :data:`SEQUENCE` (its last a marker), then every client's messages
    once, in order."""
    second = await run(settings, topic, group, Recorder(arrived))
    try:

        async def split() -> bool:
            return [len(await r.positions(topic)) for r in (first, second)] == [1, 1]

        await wait_for(split, "one partition each", TIMEOUT)
        for partition in range(topic.partitions):
            await topic.publish(f"c{partition}", partition, *SEQUENCE[4:])

        def markers() -> bool:
            return sum(value == b"end" for _, value in arrived) == topic.partitions

        await wait_for(markers, "every client's marker", TIMEOUT)
    finally:
        await second.stop()
    for partition in range(topic.partitions):
        assert per_client(arrived, f"c{partition}") == SEQUENCE


async def test_a_partition_revoked_while_its_round_gathers_is_left_to_its_next_owner(
    settings: Settings, kafka_bootstrap: str, producer: AIOKafkaProducer
) -> None:
    topic = await new_topic(producer, kafka_bootstrap, 2)
    for partition in range(2):
        await topic.publish(f"c{partition}", partition, *SEQUENCE[:4])
    arrived: list[tuple[str, bytes]] = []
    group = f"g-{uuid.uuid4().hex[:8]}"
    # The first runner's rounds wait for nine messages: its first (eight) is cut short by
    # the rebalance; its next fills up with those published after the split.
    lingering = Recorder(arrived, Gathering(max_messages=9, linger_seconds=60))
    first = await run(settings, topic, group, lingering)
    try:

        async def gathered() -> bool:
            return await first.positions(topic) == {0: 4, 1: 4}

        await wait_for(gathered, "the eight messages in the first runner's round", TIMEOUT)
        await _two_runners_finish(settings, topic, first, group, arrived)
    finally:
        await first.stop()


@pytest.fixture
def revocations(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """aiokafka's log of the partitions a member is about to give up."""
    with caplog.at_level(logging.INFO, logger="aiokafka.consumer.group_coordinator"):
        yield caplog


async def test_a_partition_revoked_while_its_round_delivers_moves_after_its_commit(
    settings: Settings,
    kafka_bootstrap: str,
    producer: AIOKafkaProducer,
    revocations: pytest.LogCaptureFixture,
) -> None:
    topic = await new_topic(producer, kafka_bootstrap, 2)
    for partition in range(2):
        await topic.publish(f"c{partition}", partition, *SEQUENCE[:4])
    arrived: list[tuple[str, bytes]] = []
    group = f"g-{uuid.uuid4().hex[:8]}"
    gate = asyncio.Event()
    held = Recorder(arrived, gate=gate)
    first = await run(settings, topic, group, held)
    try:
        await wait_for(held.entered.is_set, "the first round delivering", TIMEOUT)

        def revoking() -> bool:
            return any(
                "Revoking previously assigned partitions frozenset" in r.getMessage()
                and group in r.getMessage()
                for r in revocations.records
            )

        async def open_once_revoking() -> None:
            await wait_for(revoking, "the first runner giving its partitions up", TIMEOUT)
            gate.set()

        opening = asyncio.create_task(open_once_revoking())
        try:
            await _two_runners_finish(settings, topic, first, group, arrived)
        finally:
            opening.cancel()
            await asyncio.gather(opening, return_exceptions=True)
    finally:
        await first.stop()
