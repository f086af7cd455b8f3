"""The device_persist service: stored messages of persistent DEVICE sessions (docs/design.md).

``msg.persisted`` and ``client.acks`` are read together in the consumer group
``<prefix>cormorant-device-persist`` with the range assignor: both are keyed by client id
with the same partition count, so each instance gets the same partition numbers of both and
owns every record about its clients. ``client.sessions`` is followed in full (where each
client is connected, its session and Receive Maximum). The logic is in
:mod:`services.device_persist.persister`; this module wires it to Kafka and the store.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable

import faust
from aiokafka import TopicPartition
from aiokafka.coordinator.assignors.range import RangePartitionAssignor

from services.common import metrics
from services.common.clock import now_ms
from services.common.faust_app import (
    every,
    make_app,
    on_shutdown,
    run_service,
    run_task,
    sender,
)
from services.common.kafka.consumer import Record, consume_batches, make_consumer
from services.common.kafka.names import TopicNames
from services.common.kafka.security import client_security
from services.common.kafka.state_reader import CompactedTopicReader
from services.common.records import Headers
from services.common.settings import Settings
from services.common.stores import open_store
from services.common.web import serve_http
from services.device_persist.persister import DevicePersister, StoreMetrics

log = logging.getLogger(__name__)

#: Most records handled as one batch (one state barrier, one commit point).
BATCH_MAX = 1000


def build_app(settings: Settings) -> faust.App:
    """Build device_persist's Faust app: session reader, store, consumer and timers."""
    names = TopicNames.from_settings(settings)
    app = make_app(settings, "device-persist")
    readiness = serve_http(app, "device-persist", settings.ready_file)
    store = open_store(settings)

    send = sender(app)

    persister = DevicePersister(settings, store, send)
    store_metrics = StoreMetrics(persister)
    metrics.register(store_metrics.families)
    metrics.on_scrape(store_metrics.refresh)

    def apply_session(
        topic: str, key: bytes, value: bytes | None, offset: int, headers: Headers
    ) -> None:
        persister.apply_session(key, value, headers)

    reader = CompactedTopicReader(
        settings.kafka_bootstrap,
        [names.client_sessions],
        apply_session,
        security=client_security(settings),
    )

    readiness.add("kafka", reader.end_offsets)
    readiness.add("store", store.ping)

    async def handle(records: list[Record]) -> list[Awaitable[object]]:
        # Session records stored before these records were are applied first: a message
        # is stamped with the session it was routed for.
        await reader.barrier()
        return await persister.handle_batch(records, now_ms())

    async def assigned(partitions: set[TopicPartition]) -> None:
        persister.assign(tp.partition for tp in partitions if tp.topic == names.msg_persisted)

    async def serve() -> None:
        await reader.start()
        persister.go_live()
        consumer = make_consumer(
            settings,
            group_id=app.conf.id,
            instance_id=settings.group_instance_id,
            partition_assignment_strategy=(RangePartitionAssignor,),
        )
        await consumer.start()
        dirty = asyncio.create_task(persister.run_dirty(), name="device-persist-dirty")
        try:
            readiness.serving("device_persist")
            await consume_batches(
                consumer,
                handle,
                topics=[names.msg_persisted, names.client_acks],
                max_records=BATCH_MAX,
                on_assigned=assigned,
                first=[names.client_acks],  # they free the windows the messages wait for
                stage="device-persist",
            )
        finally:
            dirty.cancel()
            await consumer.stop()

    async def expire_sessions() -> None:
        await asyncio.gather(*await persister.expire_sessions(now_ms()))

    async def stop() -> None:
        readiness.stopping()
        await reader.stop()
        await store.close()

    run_task(app, serve)
    every(app, settings.session_expiry_check_seconds, expire_sessions, "session expiry check")
    on_shutdown(app, stop)
    return app


def run() -> None:
    """Entry point of ``cormorant device-persist``."""
    run_service(build_app)
