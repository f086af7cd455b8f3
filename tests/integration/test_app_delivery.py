"""app_delivery's feed (services/app_delivery/feed.py) against the real broker.

A client's ``msg.app`` topic is filled by hand as the router would; the feed's ``send`` keeps
the downlink records it is given and acknowledges them at once, so each test reads exactly
what would reach the client's node. What the feed commits (offset and metadata) is read back
from Kafka. The whole path through the cluster is in tests/e2e/test_application.py.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field

import pytest
import pytest_asyncio
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from services.app_delivery.feed import ClientFeed
from services.app_delivery.window import decode_mark
from services.common.kafka.admin import app_topic_spec, ensure_topics
from services.common.kafka.names import TopicNames
from services.common.kafka.reroutes import RerouteFilter
from services.common.records import (
    HEADER_META,
    HEADER_SESSION,
    HEADER_TARGETS,
    AckKind,
    AckRecord,
    PublishMeta,
    SessionRecord,
    Target,
    decode_targets,
    encode_meta,
    encode_targets,
)
from services.common.settings import Settings
from tests.waiting import wait_for

pytestmark = pytest.mark.kafka

SESSION = b"session-00000001"
TIMEOUT = 20.0


@dataclass
class Harness:
    """One APPLICATION client's topic, a producer for it, and the feeds' downlink output."""

    settings: Settings
    client_id: str
    producer: AIOKafkaProducer
    admin: AIOKafkaAdminClient
    sent: list[Target] = field(default_factory=list)
    payloads: list[bytes] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def names(self) -> TopicNames:
        return TopicNames.from_settings(self.settings)

    def session(self, connection: bytes = b"conn-000000000a", rm: int = 3) -> SessionRecord:
        """A connected persistent APPLICATION session record of the client."""
        return SessionRecord(
            "n1", connection, True, 5, False, True, session_id=SESSION, receive_maximum=rm
        )

    async def route(self, *payloads: bytes, session: bytes = SESSION) -> None:
        """Write ``payloads`` to the client's topic as the router does (QoS 1)."""
        meta = encode_meta(PublishMeta("t/x", 1, False, 0, 5))
        targets = encode_targets([Target(self.client_id, 1)])
        for payload in payloads:
            headers = [(HEADER_META, meta), (HEADER_TARGETS, targets), (HEADER_SESSION, session)]
            await self.producer.send_and_wait(
                self.names.app(self.client_id), payload, key=b"pub", headers=headers
            )

    async def send(
        self, topic: str, key: bytes, value: bytes | None, headers: list[tuple[str, bytes]]
    ) -> Awaitable[object]:
        [target] = decode_targets(dict(headers)[HEADER_TARGETS])
        self.sent.append(target)
        self.payloads.append(value or b"")
        done: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    def feed(self, session: SessionRecord) -> ClientFeed:
        """A feed of the client (not started)."""
        return ClientFeed(
            self.settings,
            self.client_id,
            session,
            self.send,
            self.admin,
            lambda: self.failures.append("feed failed"),
            RerouteFilter(),
        )

    async def wait_sent(self, count: int) -> list[tuple[bytes, int, bool]]:
        """Wait until ``count`` deliveries were made; (payload, Packet Identifier, DUP)."""
        await wait_for(lambda: len(self.sent) >= count, f"{count} deliveries", TIMEOUT)
        return [(p, t.packet_id, t.dup) for p, t in zip(self.payloads, self.sent, strict=True)]

    async def committed(self) -> tuple[int, int]:
        """The client's committed (offset, sent mark) in partition 0 of its topic."""
        tp = TopicPartition(self.names.app(self.client_id), 0)
        offsets = await self.admin.list_consumer_group_offsets(
            self.names.app_group(self.client_id), partitions=[tp]
        )
        mark = offsets[tp]
        return mark.offset, decode_mark(mark.metadata, mark.offset)[0]

    async def wait_committed(self, expected: tuple[int, int]) -> None:
        """Wait until the committed (offset, sent mark) is ``expected``."""

        async def reached() -> bool:
            return await self.committed() == expected

        await wait_for(reached, f"committed {expected}", TIMEOUT)


@pytest_asyncio.fixture(loop_scope="function")
async def h(kafka_bootstrap: str) -> AsyncIterator[Harness]:
    settings = Settings(kafka_bootstrap=kafka_bootstrap, topic_prefix=f"it-{uuid.uuid4().hex[:8]}.")
    client_id = "app-it"
    await ensure_topics(kafka_bootstrap, [app_topic_spec(settings, client_id)])
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    await admin.start()
    try:
        yield Harness(settings, client_id, producer, admin)
    finally:
        await producer.stop()
        await admin.close()


async def test_deliveries_within_receive_maximum_and_commits_on_acknowledgement(
    h: Harness,
) -> None:
    await h.route(*(f"m{i}".encode() for i in range(5)))
    feed = h.feed(h.session(rm=3))
    await feed.start()
    try:
        assert await h.wait_sent(3) == [(b"m0", 1, False), (b"m1", 2, False), (b"m2", 3, False)]
        # Before anything is sent, the sent mark is committed as metadata, raised to all
        # that was fetched (5) so the next deliveries need no commit; the offset waits.
        await h.wait_committed((0, 5))
        feed.acknowledge(AckRecord(SESSION, [(AckKind.PUBACK, 1), (AckKind.PUBACK, 2)]))
        assert (await h.wait_sent(5))[3:] == [(b"m3", 4, False), (b"m4", 5, False)]
        await h.wait_committed((2, 5))
        feed.acknowledge(AckRecord(b"another-session!", [(AckKind.PUBACK, 3)]))
        feed.acknowledge(AckRecord(SESSION, [(AckKind.PUBACK, 3), (AckKind.PUBACK, 4)]))
        await h.wait_committed((4, 5))
    finally:
        await feed.stop()
    assert h.failures == []


async def test_a_restarted_feed_resends_what_was_sent_with_dup_and_skips_the_acknowledged(
    h: Harness,
) -> None:
    await h.route(b"a", b"b", b"c")
    first = h.feed(h.session(rm=10))
    await first.start()
    await h.wait_sent(3)
    await h.wait_committed((0, 3))
    await first.stop()  # as after a crash: nothing acknowledged was committed yet
    h.sent.clear()
    h.payloads.clear()
    # The PUBACK of "b" was read before the new feed read its position.
    second = h.feed(h.session(b"conn-000000000b", rm=10))
    second.acknowledge(AckRecord(SESSION, [(AckKind.PUBACK, 2)]))
    await second.start()
    try:
        await h.route(b"d")
        assert await h.wait_sent(3) == [(b"a", 1, True), (b"c", 3, True), (b"d", 4, False)]
    finally:
        await second.stop()


async def test_records_of_an_earlier_session_are_skipped_and_committed_past(
    h: Harness,
) -> None:
    await h.route(b"old-1", b"old-2", session=b"session-00000000")
    await h.route(b"new")
    feed = h.feed(h.session())
    await feed.start()
    try:
        assert await h.wait_sent(1) == [(b"new", 3, False)]
        feed.acknowledge(AckRecord(SESSION, [(AckKind.PUBACK, 3)]))
        await h.wait_committed((3, 3))
    finally:
        await feed.stop()


async def test_a_new_connection_gets_the_unacknowledged_again(h: Harness) -> None:
    await h.route(b"x", b"y")
    feed = h.feed(h.session(rm=10))
    await feed.start()
    try:
        await h.wait_sent(2)
        feed.acknowledge(AckRecord(SESSION, [(AckKind.PUBACK, 1)]))
        feed.update(h.session(b"conn-000000000c", rm=10))
        assert (await h.wait_sent(3))[2:] == [(b"y", 2, True)]
    finally:
        await feed.stop()
