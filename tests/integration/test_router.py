"""The router process against real Kafka: state from the compacted topics, poisoned input.

The test plays the ingest side by hand: it writes a subscriber's ``client.subscriptions``
and ``client.sessions`` records (located on a made-up node whose downlink topic it reads)
and PUBLISH records to ``msg.all``, then reads what the cluster's router wrote.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest
import pytest_asyncio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord

from services.common.kafka.admin import core_topic_specs, downlink_topic_spec, ensure_topics
from services.common.kafka.names import TopicNames
from services.common.kafka.partitioner import partition_of
from services.common.records import (
    HEADER_META,
    HEADER_TARGETS,
    PublishMeta,
    SessionRecord,
    Target,
    decode_meta,
    decode_targets,
    encode_meta,
    encode_session,
    encode_subscriptions,
)
from services.common.subscription import Subscription
from services.local.settings import LocalSettings
from tests.servers import LocalCluster

pytestmark = pytest.mark.cluster

TIMEOUT = 20.0


@dataclass
class Probe:
    """A made-up ingest node: its id, a reader of its downlink topic, and a producer."""

    node_id: str
    names: TopicNames
    producer: AIOKafkaProducer
    downlink: AIOKafkaConsumer

    async def put(
        self, topic: str, key: bytes, value: bytes | None, headers: list[tuple[str, bytes]]
    ) -> None:
        """Write one record and wait for Kafka's acknowledgement."""
        await self.producer.send_and_wait(topic, value, key=key, headers=headers)

    async def subscriber(self, client_id: str, topic_filter: str, qos: int) -> None:
        """Store a connected subscriber of ``topic_filter`` on this node."""
        subs = [Subscription(client_id=client_id, topic_filter=topic_filter, qos=qos)]
        key = client_id.encode()
        await self.put(self.names.client_subscriptions, key, encode_subscriptions(subs), [])
        record = SessionRecord(
            node_id=self.node_id,
            connection_id=uuid.uuid4().bytes,
            connected=True,
            protocol_version=5,
            clean_start=True,
            persistent=False,
            connected_at_ms=int(time.time() * 1000),
        )
        await self.put(self.names.client_sessions, key, encode_session(record), [])

    async def publish(self, publisher: str, topic: str, payload: bytes, qos: int = 1) -> None:
        """Write an accepted PUBLISH to ``msg.all``, as an ingest node does."""
        meta = PublishMeta(topic, qos, False, int(time.time() * 1000), 5)
        header = [(HEADER_META, encode_meta(meta))]
        await self.put(self.names.msg_all, publisher.encode(), payload, header)

    async def routed(self, count: int) -> list[ConsumerRecord[bytes, bytes]]:
        """The next ``count`` records of this node's downlink topic."""
        records: list[ConsumerRecord[bytes, bytes]] = []
        async with asyncio.timeout(TIMEOUT):
            while len(records) < count:
                batches = await self.downlink.getmany(timeout_ms=200)
                for batch in batches.values():
                    records.extend(batch)
        return records

    async def nothing_more(self, publisher: str, topic: str) -> None:
        """Assert that no further downlink record comes, by order: ``publisher``'s next
        message to ``topic`` (one this node's subscriber gets) is the next record routed
        here (one publisher's messages keep their order through msg.all and the downlink
        topic, MQTT 4.6)."""
        await self.publish(publisher, topic, b"marker")
        [record] = await self.routed(1)
        assert record.value == b"marker", record


@pytest_asyncio.fixture(loop_scope="function")
async def probe(cluster: LocalCluster) -> AsyncIterator[Probe]:
    async with _probe(cluster.settings) as probe:
        yield probe


@asynccontextmanager
async def _probe(settings: LocalSettings) -> AsyncIterator[Probe]:
    """A :class:`Probe` on the topics of ``settings``."""
    node_id = f"probe{uuid.uuid4().hex[:8]}"
    downlink = downlink_topic_spec(settings, node_id)
    await ensure_topics(settings.kafka_bootstrap, [downlink])
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all")
    consumer = AIOKafkaConsumer(
        downlink.name,
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        # As every reader of the router's topics: what an aborted transaction wrote (a
        # router stopped mid-batch) is never seen; the batch is routed again.
        isolation_level="read_committed",
    )
    await producer.start()
    await consumer.start()
    try:
        yield Probe(node_id, TopicNames.from_settings(settings), producer, consumer)
    finally:
        await consumer.stop()
        await producer.stop()


def _decoded(record: ConsumerRecord[bytes, bytes]) -> tuple[bytes, PublishMeta, list[Target]]:
    headers = dict(record.headers)
    return record.value, decode_meta(headers[HEADER_META]), decode_targets(headers[HEADER_TARGETS])


async def test_a_restarted_router_routes_from_the_state_in_kafka(
    cluster: LocalCluster, probe: Probe
) -> None:
    base = f"it/router/{uuid.uuid4().hex[:8]}"
    await probe.subscriber("dev-a", f"{base}/+", qos=1)
    await probe.subscriber("dev-b", f"{base}/#", qos=0)

    old_pid = cluster.pid("router")
    assert cluster.stop("router")
    # While the router is down the state changes: only Kafka can tell the new router.
    await probe.subscriber("dev-c", f"{base}/x", qos=1)
    await probe.put(probe.names.client_subscriptions, b"dev-b", None, [])  # b unsubscribed
    await probe.publish("pub-1", f"{base}/x", b"queued while down")
    assert cluster.start("router") != old_pid

    await probe.publish("pub-1", f"{base}/x", b"after restart")
    routed = [_decoded(r) for r in await probe.routed(2)]
    assert [payload for payload, _, _ in routed] == [b"queued while down", b"after restart"]
    for _, meta, targets in routed:
        assert meta.topic == f"{base}/x"
        assert sorted(targets, key=lambda t: t.client_id) == [
            Target("dev-a", 1),
            Target("dev-c", 1),
        ]
    await probe.nothing_more("pub-1", f"{base}/x")


@pytest.mark.parametrize(
    "headers",
    [
        [],  # no metadata header at all
        [(HEADER_META, b"")],  # empty
        [(HEADER_META, b"\x07garbage")],  # unknown format version
        [(HEADER_META, b"\x01\x03")],  # truncated
        [(HEADER_META, encode_meta(PublishMeta("t", 1, False, 0))[:-1] + b"\xff")],  # bad UTF-8
    ],
    ids=["no-header", "empty", "bad-version", "truncated", "bad-utf8-topic"],
)
async def test_a_poisoned_msg_all_record_is_skipped_and_the_next_routes(
    probe: Probe, headers: list[tuple[str, bytes]]
) -> None:
    topic = f"it/poison/{uuid.uuid4().hex[:8]}"
    await probe.subscriber("dev-p", topic, qos=1)
    # Same key as the good record: same partition, right in front of it.
    await probe.put(probe.names.msg_all, b"pub-p", b"poison", headers)
    await probe.publish("pub-p", topic, b"good")
    [(payload, meta, targets)] = [_decoded(r) for r in await probe.routed(1)]
    assert (payload, meta.topic, targets) == (b"good", topic, [Target("dev-p", 1)])
    await probe.nothing_more("pub-p", topic)


#: A backlog of ``client.subscriptions`` records written in one transaction (so the router
#: sees it all at once): records, and the subscriptions of each. The router takes tens of
#: ms to apply each one, and about a second for all, reading on between them.
BACKLOG_RECORDS = 30
BACKLOG_SUBSCRIPTIONS = 5000


async def _write_backlog(settings: LocalSettings, names: TopicNames, client_id: str) -> None:
    """Commit :data:`BACKLOG_RECORDS` subscription records of another client (whose filters
    no test message matches) to ``client_id``'s partition of ``client.subscriptions``, in
    one transaction: a later record of ``client_id`` is read only after all of them."""
    count = settings.state_topic_partitions
    partition = partition_of(client_id, count)
    filler = next(
        c
        for c in (f"backlog-{uuid.uuid4().hex[:8]}" for _ in itertools.count())
        if partition_of(c, count) == partition
    )
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap, transactional_id=f"it-{filler}"
    )
    await producer.start()
    try:
        async with producer.transaction():
            for i in range(BACKLOG_RECORDS):
                subs = [
                    Subscription(client_id=filler, topic_filter=f"it/backlog/{i}/{j}", qos=0)
                    for j in range(BACKLOG_SUBSCRIPTIONS)
                ]
                await producer.send(
                    names.client_subscriptions, encode_subscriptions(subs), key=filler.encode()
                )
    finally:
        await producer.stop()


@pytest.mark.parametrize("transactions", [True, False], ids=["transactions", "at-least-once"])
async def test_a_subscription_stored_before_a_publish_applies_even_behind_a_state_backlog(
    cluster: LocalCluster, transactions: bool
) -> None:
    """The router's ordering guarantee (docs/guarantees/index.md): a
    subscription record Kafka acknowledged before a PUBLISH record was written applies to
    that PUBLISH, even when the router's state reader is still a second behind (a backlog
    in front of the subscription record, in its partition) as the PUBLISH is fetched. Only
    the router's barrier makes it wait for the subscription; without it the message is
    routed to nobody and this test fails. In transactions the router routes at once and
    the barrier comes before the commit (the routing, outdated, is aborted and done again);
    at least once, before the routing.

    A router of its own (its own topic prefix, so the backlog stays out of the cluster's
    state topics), caught up with its empty state before the backlog is written.
    """
    prefix = f"it-barrier-{uuid.uuid4().hex[:8]}."
    settings = cluster.settings.model_copy(update={"topic_prefix": prefix})
    await ensure_topics(settings.kafka_bootstrap, core_topic_specs(settings))
    cluster.start_extra(
        "router-barrier",
        "router",
        topic_prefix=prefix,
        router_transactions=str(transactions).lower(),
    )
    try:
        async with _probe(settings) as probe:
            topic = f"it/barrier/{uuid.uuid4().hex[:8]}"
            subscriber = "dev-behind"
            # The subscriber is known, with another subscription; once a message to that
            # one is routed, the router is routing (its consumer group formed).
            await probe.subscriber(subscriber, f"{topic}-warm-up", qos=1)
            await probe.publish("pub-behind", f"{topic}-warm-up", b"warm-up")
            [warm_up] = await probe.routed(1)
            assert warm_up.value == b"warm-up"
            await _write_backlog(settings, probe.names, subscriber)
            subs = [Subscription(client_id=subscriber, topic_filter=topic, qos=1)]
            await probe.put(
                probe.names.client_subscriptions,
                subscriber.encode(),
                encode_subscriptions(subs),
                [],
            )
            await probe.publish("pub-behind", topic, b"first")
            [(payload, meta, targets)] = [_decoded(r) for r in await probe.routed(1)]
    finally:
        cluster.stop_extra("router-barrier")
    assert (payload, meta.topic, targets) == (b"first", topic, [Target(subscriber, 1)])
