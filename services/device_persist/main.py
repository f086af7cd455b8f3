"""The device_persist service: stored messages of persistent DEVICE sessions (docs/design.md).

``msg.persisted`` and ``client.acks`` are read together in the consumer group
``<prefix>cormorant-device-persist`` with the range assignor: both are keyed by client id
with the same partition count, so each instance gets the same partition numbers of both and
owns every record about its clients. ``client.sessions`` is followed in full (where each
client is connected, its session and Receive Maximum). The logic is in
:mod:`services.device_persist.persister`; this module wires it to Kafka and the store.

Kafka is the source of truth where the store's replication cannot promise durability (a
Redis failover may drop writes a replica had confirmed: the promoted replica may not be
the one that confirmed them, and the others then resynchronise from it). When the store
refuses a batch because its primary changed
(:class:`~services.common.stores.base.StoreFailedOver`), :meth:`DevicePersistService.reapply`
reads each owned ``msg.persisted`` partition again from the offset the new primary's data
is complete to, up to where this batch starts, stores it again (idempotently: appends are
keyed by their partition and offset), and only then hands the batch again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Mapping

import faust
from aiokafka import AIOKafkaConsumer, TopicPartition
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
    watched,
)
from services.common.kafka.consumer import Record, consume_batches, make_consumer
from services.common.kafka.names import TopicNames
from services.common.kafka.reroutes import recall
from services.common.kafka.security import client_security
from services.common.kafka.state_reader import CompactedTopicReader
from services.common.records import Headers
from services.common.settings import Settings
from services.common.stores import open_store
from services.common.stores.base import StoreError, StoreFailedOver, StoreUnavailable
from services.common.web import serve_http
from services.device_persist.persister import DevicePersister, StoreMetrics

log = logging.getLogger(__name__)

#: Most records handled as one batch (one state barrier, one commit point).
BATCH_MAX = 1000

#: Seconds between two checks for a store failover while no batch finds one.
FAILOVER_CHECK_SECONDS = 1.0


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
        self.consumer: AIOKafkaConsumer | None = None
        self._checked_at = 0.0

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
        try:
            return await self.persister.handle_batch(records, now_ms())
        except StoreFailedOver as failover:
            await self.reapply(records, failover.replication_id)
        return await self.persister.handle_batch(records, now_ms())

    async def check_failover(self) -> None:
        """Between batches (the consume loop's ``after_fetch``), at most every
        :data:`FAILOVER_CHECK_SECONDS`: when the store's primary is not the one the owned
        partitions were last applied on, re-apply them now, so that what a failover dropped
        comes back even when no new record of the partition arrives (a failure is logged:
        the next batch's appends find the failover anyway)."""
        loop = asyncio.get_running_loop()
        if loop.time() - self._checked_at < FAILOVER_CHECK_SECONDS or not self.persister.owned:
            return
        self._checked_at = loop.time()
        try:
            state = await self.store.failover_state(self.persister.owned)
            if state is not None and not self.persister.owned <= state.current:
                await self.reapply([], state.replication_id)
        except StoreError as exc:
            log.warning("could not check the store for a failover: %r", exc)

    async def reapply(self, records: list[Record], replication_id: str) -> None:
        """The store's primary is now the one with ``replication_id`` and may lack writes
        of the owned ``msg.persisted`` partitions: store their records again from where its
        data is complete (:meth:`~services.common.stores.base.MessageStore.failover_state`)
        up to where ``records`` (the refused batch) start, or else up to the consumer's
        position, then mark the partitions as applied on it. The connected clients get
        their windows again (``DevicePersister.failed_over``).

        Raises :class:`~services.common.stores.base.StoreUnavailable` when the primary
        changed again meanwhile (the batch is read again, and this starts over).
        """
        persister, topic = self.persister, self.names.msg_persisted
        owned = set(persister.owned)
        state = await self.store.failover_state(owned)
        if state is None:
            return
        persister.failed_over()
        starts: dict[int, int] = {}
        for record in records:
            if record.topic == topic:
                starts.setdefault(record.partition, record.offset)
        ranges: dict[int, tuple[int, int]] = {}
        for partition in owned:
            start = state.applied.get(partition)
            end = starts.get(partition)
            if end is None and self.consumer is not None and start is not None:
                end = await self.consumer.position(TopicPartition(topic, partition))
            if start is not None and end is not None and start < end:
                ranges[partition] = (start, end)
        if ranges:
            log.warning(
                "the store's primary changed (replication id %s): re-applying %d offsets of "
                "%s partitions %s",
                replication_id,
                sum(end - start for start, end in ranges.values()),
                topic,
                sorted(ranges),
            )
        await self.replay(ranges, state.replication_id)
        if not await self.store.adopt(owned, state.replication_id):
            raise StoreUnavailable("the store's primary changed again while re-applying")
        log.info(
            "%s partitions %s applied on the primary with replication id %s",
            topic,
            sorted(owned),
            state.replication_id,
        )

    async def replay(self, ranges: Mapping[int, tuple[int, int]], replication_id: str) -> None:
        """Hand the ``msg.persisted`` records of each partition's ``(start, end)`` offsets
        to the persister again, in order, as re-applied on ``replication_id``'s primary
        (read without a consumer group: nothing is committed)."""
        if not ranges:
            return
        topic = self.names.msg_persisted
        reader = make_consumer(self.settings, group_id=None)
        await reader.start()
        try:
            ends = {TopicPartition(topic, p): end for p, (_, end) in ranges.items()}
            reader.assign(list(ends))
            for tp in ends:
                reader.seek(tp, ranges[tp.partition][0])
            while ends:
                fetched = await reader.getmany(*ends, timeout_ms=500, max_records=BATCH_MAX)
                batch = [r for tp, part in fetched.items() for r in part if r.offset < ends[tp]]
                if batch:
                    acks = await self.persister.handle_batch(batch, now_ms(), replication_id)
                    await asyncio.gather(*acks)
                for tp in list(ends):
                    # The position, not the last record: transaction markers take offsets.
                    if await reader.position(tp) >= ends[tp]:
                        del ends[tp]
        finally:
            await reader.stop()

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
        self.consumer = consumer
        dirty = asyncio.create_task(self.persister.run_dirty(), name="device-persist-dirty")
        try:
            self.readiness.serving("device_persist")
            await watched(
                consume_batches(
                    consumer,
                    self.handle,
                    topics=[names.msg_persisted, names.client_acks],
                    max_records=BATCH_MAX,
                    on_assigned=self.assigned,
                    first=[names.client_acks],  # they free the windows the messages wait for
                    after_fetch=self.check_failover,
                    stage="device-persist",
                ),
                [dirty],
                lambda: False,  # the shutdown cancels this task first, then ``dirty``
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
