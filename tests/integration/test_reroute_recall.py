"""A reader given a partition reads back what precedes its committed offset into its reroute
marks (services/common/kafka/reroutes.py ``recall``), against the real broker: a copy a
crashed router routed again after that offset is dropped although its original stood
before it."""

from __future__ import annotations

import uuid

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.structs import OffsetAndMetadata

from services.common.kafka.admin import TopicSpec, ensure_topics
from services.common.kafka.consumer import Record, make_consumer
from services.common.kafka.reroutes import RerouteFilter, recall
from services.common.records import HEADER_ORIGIN, Origin, encode_origin
from services.common.settings import Settings

pytestmark = pytest.mark.kafka


def _key(record: Record) -> bytes | None:
    key: bytes | None = record.key
    return key


async def test_a_copy_after_the_committed_offset_of_its_original_is_dropped(
    kafka_bootstrap: str, settings: Settings
) -> None:
    topic, group = f"it-{uuid.uuid4().hex[:8]}.persisted", f"it-{uuid.uuid4().hex[:8]}"
    tp = TopicPartition(topic, 0)
    await ensure_topics(kafka_bootstrap, [TopicSpec(topic, 1)])
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        # msg.all partition 2, offsets 10 and 11 for subscriber a; then, after a router
        # crash, the same two again and offset 12.
        for offset in (10, 11, 10, 11, 12):
            origin = encode_origin(Origin(2, offset, 0))
            await producer.send_and_wait(topic, b"m", key=b"a", headers=[(HEADER_ORIGIN, origin)])
    finally:
        await producer.stop()
    committer = make_consumer(settings, group_id=group)
    await committer.start()
    try:
        committer.assign([tp])
        await committer.commit({tp: OffsetAndMetadata(2, "")})  # the originals were read
        committer.seek(tp, 2)
        rest = (await committer.getmany(tp, timeout_ms=10_000))[tp]
    finally:
        await committer.stop()
    assert [r.offset for r in rest] == [2, 3, 4]

    recalled = RerouteFilter()
    assert await recall(settings, group, recalled, {tp}, _key) == 2
    assert [recalled.first(r, r.key) for r in rest] == [False, False, True]
    # Without reading back, the copies would pass: stored twice.
    forgetful = RerouteFilter()
    assert [forgetful.first(r, r.key) for r in rest] == [True, True, True]
