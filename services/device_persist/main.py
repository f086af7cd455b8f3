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
from services.common.kafka.reroutes import recall
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
    """Build device_persist's Faust app: a :class:`DevicePersistService` run by the app's
    worker, with its session expiry timer."""
    app = make_app(settings, "device-persist")
    service = DevicePersistService(settings, app)
    run_task(app, service.run)
    every(
        app, settings.session_expiry_check_seconds, service.expire_sessions, "session expiry check"
    )
    on_shutdown(app, service.stop)
    return app


class DevicePersistService:
    """device_persist in ``app`` (its Faust app): :meth:`run` reads the sessions and then
    stores and delivers ``msg.persisted`` and ``client.acks`` until cancelled (the app's
    main task); :meth:`expire_sessions` is its timer, :meth:`stop` its shutdown hook. The
    :class:`~services.device_persist.persister.DevicePersister` decides; this class
    connects it to Kafka and the store."""

    def __init__(self, settings: Settings, app: faust.App) -> None:
        self.settings = settings
        self.group = app.conf.id
        self.names = TopicNames.from_settings(settings)
        self.readiness = serve_http(app, "device-persist", settings.ready_file)
        self.store = open_store(settings)
        self.persister = DevicePersister(settings, self.store, sender(app))
        store_metrics = StoreMetrics(self.persister)
        metrics.register(store_metrics.families)
        metrics.on_scrape(store_metrics.refresh)
        self.reader = CompactedTopicReader(
            settings.kafka_bootstrap,
            [self.names.client_sessions],
            self.apply_session,
            security=client_security(settings),
        )
        self.readiness.add("kafka", self.reader.end_offsets)
        self.readiness.add("store", self.store.ping)

    def apply_session(
        self, topic: str, key: bytes, value: bytes | None, offset: int, headers: Headers
    ) -> None:
        """Apply one ``client.sessions`` record (the state reader's callback)."""
        self.persister.apply_session(key, value, headers)

    async def handle(self, records: list[Record]) -> list[Awaitable[object]]:
        """Handle a batch of ``msg.persisted`` and ``client.acks`` records."""
        # Session records stored before these records were are applied first: a message
        # is stamped with the session it was routed for.
        await self.reader.barrier()
        return await self.persister.handle_batch(records, now_ms())

    async def assigned(self, partitions: set[TopicPartition]) -> None:
        """The consumer group gave this instance ``partitions``: the ``msg.persisted`` ones
        it did not have are read back into its reroute marks first (a copy a crashed
        router routed again after the committed offset of an original before it is still
        dropped, :func:`~services.common.kafka.reroutes.recall`)."""
        msg_persisted = self.names.msg_persisted
        persister = self.persister
        new = {
            tp
            for tp in partitions
            if tp.topic == msg_persisted and tp.partition not in persister.owned
        }
        if new:
            read = await recall(self.settings, self.group, persister.reroutes, new, _key)
            log.info("read back %d msg.persisted records of %d partitions", read, len(new))
        persister.assign(tp.partition for tp in partitions if tp.topic == msg_persisted)

    async def start(self) -> None:
        """Read the sessions up to their end offsets; the persister goes live."""
        await self.reader.start()
        self.persister.go_live()

    async def run(self) -> None:
        """:meth:`start`, then consume in device_persist's group until cancelled."""
        await self.start()
        settings, names = self.settings, self.names
        consumer = make_consumer(
            settings,
            group_id=self.group,
            instance_id=settings.group_instance_id,
            partition_assignment_strategy=(RangePartitionAssignor,),
        )
        await consumer.start()
        dirty = asyncio.create_task(self.persister.run_dirty(), name="device-persist-dirty")
        try:
            self.readiness.serving("device_persist")
            await consume_batches(
                consumer,
                self.handle,
                topics=[names.msg_persisted, names.client_acks],
                max_records=BATCH_MAX,
                on_assigned=self.assigned,
                first=[names.client_acks],  # they free the windows the messages wait for
                stage="device-persist",
            )
        finally:
            dirty.cancel()
            await consumer.stop()

    async def expire_sessions(self) -> None:
        """End the sessions whose Session Expiry Interval has passed (the timer's job)."""
        await asyncio.gather(*await self.persister.expire_sessions(now_ms()))

    async def stop(self) -> None:
        """The shutdown hook: not ready any more, the reader and the store closed."""
        self.readiness.stopping()
        await self.reader.stop()
        await self.store.close()


def _key(record: Record) -> bytes | None:
    """The reroute scope of a ``msg.persisted`` record: its key, the subscriber."""
    key: bytes | None = record.key
    return key


def run() -> None:
    """Entry point of ``cormorant device-persist``."""
    run_service(build_app)
