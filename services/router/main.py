"""The router service: a Faust agent on ``msg.all`` that writes downlink records.

State (subscriptions and client locations) is replayed from the compacted topics before the
first message is routed, so a restarted router routes exactly as before. Before each batch the
router waits until it has applied every state record that existed when the batch arrived
(:meth:`CompactedTopicReader.barrier`): a subscription acknowledged by SUBACK before a
PUBLISH was acknowledged is always honoured.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import faust

from services.common.faust_app import make_app, run_worker
from services.common.kafka.admin import core_topic_specs, ensure_topics
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

BATCH_MAX = 1000
BATCH_WITHIN_SECONDS = 0.002


def build_app(settings: Settings) -> faust.App:
    """Build the router's Faust app: the state reader and the ``msg.all`` agent."""
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
    state_ready = asyncio.Event()
    msg_all = app.topic(names.msg_all, value_type=bytes, key_type=bytes)

    @app.task
    async def start_state() -> None:
        await reader.start()
        state_ready.set()
        mark_ready(settings.ready_file, "router")
        log.info(
            "router ready: %d subscriptions, %d sessions", len(table.trie), len(table.sessions)
        )

    @app.agent(msg_all)
    async def route(stream: faust.StreamT[bytes]) -> AsyncIterator[None]:
        await state_ready.wait()
        async for events in stream.take_events(BATCH_MAX, within=BATCH_WITHIN_SECONDS):
            await reader.barrier()
            pending = []
            for event in events:
                for args in _downlink_records(table, names, event):
                    pending.append(await app.producer.send(**args))
            # The batch's offsets are committed only after its downlink records are in Kafka.
            await asyncio.gather(*pending)
            yield None

    @app.on_before_shutdown.connect
    async def stop_state(app: faust.App, **kwargs: object) -> None:
        clear_ready(settings.ready_file)
        await reader.stop()

    return app


def _downlink_records(
    table: RoutingTable, names: TopicNames, event: faust.EventT[bytes]
) -> list[dict[str, object]]:
    """The producer ``send`` arguments of one ``msg.all`` event's downlink records."""
    message = event.message
    headers = dict(message.headers or [])
    try:
        meta_raw = headers[HEADER_META]
        meta = decode_meta(meta_raw)
        publisher = (message.key or b"").decode("utf-8")
    except (KeyError, RecordError, UnicodeDecodeError) as exc:
        log.warning(
            "skipping undecodable msg.all record %s[%d]@%d: %r",
            message.topic,
            message.partition,
            message.offset,
            exc,
        )
        return []
    return [
        {
            "topic": names.downlink(node),
            "key": message.key,
            "value": message.value,
            "partition": None,
            "timestamp": None,
            "headers": [(HEADER_META, meta_raw), (HEADER_TARGETS, encode_targets(targets))],
        }
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
