"""The router service: reads ``msg.all`` and writes one downlink record per message per node.

State (subscriptions and client locations) is replayed from the compacted topics before the
first message is routed, so a restarted router routes exactly as before. Before each batch the
router waits until it has applied every state record that existed when the batch arrived
(:meth:`CompactedTopicReader.barrier`): a subscription acknowledged by SUBACK before a
PUBLISH was acknowledged is always honoured.

``msg.all`` is read in the router's consumer group (``<prefix>cormorant-router``: more
routers share its partitions) by :func:`~services.common.kafka.consumer.consume_batches`;
a batch's offsets are committed once its downlink records are in Kafka.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable

import faust

from services.common.faust_app import make_app, run_worker
from services.common.kafka.admin import core_topic_specs, ensure_topics
from services.common.kafka.consumer import Record, consume_batches, make_consumer
from services.common.kafka.names import TopicNames
from services.common.kafka.state_reader import CompactedTopicReader
from services.common.readiness import clear_ready, mark_ready
from services.common.records import (
    HEADER_META,
    HEADER_TARGETS,
    RecordError,
    decode_meta,
    encode_targets,
)
from services.common.settings import Settings, get_settings
from services.router.routing import RoutingTable

log = logging.getLogger(__name__)

#: Most ``msg.all`` records routed as one batch (one state barrier, one commit point).
BATCH_MAX = 2000

Headers = list[tuple[str, bytes]]


def build_app(settings: Settings) -> faust.App:
    """Build the router's Faust app: the state reader and the ``msg.all`` routing task."""
    names = TopicNames.from_settings(settings)
    app = make_app(settings, "router")
    table = RoutingTable()

    def apply_state(topic: str, key: bytes, value: bytes | None, offset: int) -> None:
        if topic == names.client_subscriptions:
            table.apply_subscriptions_record(key, value)
        else:
            table.apply_session_record(key, value)

    reader = CompactedTopicReader(
        settings.kafka_bootstrap, [names.client_subscriptions, names.client_sessions], apply_state
    )

    async def route_batch(records: list[Record]) -> list[Awaitable[object]]:
        await reader.barrier()
        send = app.producer.send
        acks: list[Awaitable[object]] = []
        for record in records:
            for topic, headers in downlink_records(table, names, record):
                acks.append(await send(topic, record.key, record.value, None, None, headers))
        return acks

    @app.task
    async def route() -> None:
        await reader.start()
        log.info(
            "router ready: %d subscriptions, %d sessions", len(table.trie), len(table.sessions)
        )
        consumer = make_consumer(settings, group_id=app.conf.id)
        await consumer.start()
        try:
            mark_ready(settings.ready_file, "router")
            await consume_batches(
                consumer, route_batch, topics=[names.msg_all], max_records=BATCH_MAX
            )
        finally:
            await consumer.stop()

    @app.on_before_shutdown.connect
    async def stop_state(app: faust.App, **kwargs: object) -> None:
        clear_ready(settings.ready_file)
        await reader.stop()

    return app


def downlink_records(
    table: RoutingTable, names: TopicNames, record: Record
) -> list[tuple[str, Headers]]:
    """Topic and headers of each downlink record for one ``msg.all`` record (value and key
    are the input's). A record that does not decode is logged and yields none."""
    try:
        meta_raw = dict(record.headers or ())[HEADER_META]
        meta = decode_meta(meta_raw)
        publisher = (record.key or b"").decode("utf-8")
    except (KeyError, RecordError, UnicodeDecodeError) as exc:
        log.warning(
            "skipping undecodable msg.all record %s[%d]@%d: %r",
            record.topic,
            record.partition,
            record.offset,
            exc,
        )
        return []
    return [
        (names.downlink(node), [(HEADER_META, meta_raw), (HEADER_TARGETS, encode_targets(targets))])
        for node, targets in table.route(publisher, meta).items()
    ]


def run() -> None:
    """Entry point of ``cormorant router``."""
    settings = get_settings()
    asyncio.run(
        ensure_topics(
            settings.kafka_bootstrap, core_topic_specs(settings), settings.replication_factor
        )
    )
    run_worker(build_app(settings), settings)
