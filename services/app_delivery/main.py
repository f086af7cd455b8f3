"""The app_delivery service: APPLICATION clients at Kafka speed (DESIGN.md, app_delivery).

``client.sessions``, ``client.subscriptions`` and ``client.acks`` are read in the consumer
group ``<prefix>cormorant-app-delivery`` with the range assignor: the instance given a
partition number owns the clients whose records are there (:mod:`.ownership`). The state
topics are compacted, so an assigned partition of them is read from its beginning, not from
a committed offset, and its clients are acted upon once that replay has reached the end
offsets of the moment it was assigned; ``client.acks`` resumes from its committed offset.
Each owned, connected, persistent APPLICATION client gets a feed (:mod:`.feed`) reading its
``msg.app`` topic (and its shared groups' topics) and sending to its node.
"""

from __future__ import annotations

import asyncio
import logging
import time

import faust
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata

from services.app_delivery.ownership import AppDelivery
from services.common.faust_app import make_app, run_service, sender
from services.common.kafka.consumer import log_undecodable, make_consumer
from services.common.kafka.names import TopicNames
from services.common.mqtt.errors import MQTTError
from services.common.readiness import clear_ready, mark_ready
from services.common.records import RecordError
from services.common.settings import Settings

log = logging.getLogger(__name__)

#: Most records of the ownership topics handled in one go.
BATCH_MAX = 2000

#: Seconds between commits of the ``client.acks`` position.
COMMIT_INTERVAL = 1.0


class Ownership(ConsumerRebalanceListener):  # type: ignore[misc]
    """The ownership consumer: replays assigned state partitions, feeds every record to
    :class:`AppDelivery`, commits its ``client.acks`` position.

    ``ready`` is set once the first assignment has been replayed.
    """

    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        delivery: AppDelivery,
        names: TopicNames,
        ready: asyncio.Event,
    ) -> None:
        self.consumer = consumer
        self.delivery = delivery
        self.names = names
        self.ready = ready
        self._state_topics = (names.client_sessions, names.client_subscriptions)
        self._ends: dict[TopicPartition, int] = {}
        self._replaying: set[int] = set()
        # client.acks offsets applied (next to read), tracked here rather than asked of the
        # consumer: position() may wait for the group coordinator, which waits for us while
        # a rebalance listener runs.
        self._acks_read: dict[TopicPartition, int] = {}
        self._acks_committed: dict[TopicPartition, int] = {}

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        """Stop the feeds of the partitions (before another instance can start them)."""
        await self._commit_acks()
        await self.delivery.revoke({tp.partition for tp in revoked})
        self._replaying.clear()
        self._acks_read.clear()
        self._acks_committed.clear()

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        """Replay the state partitions from their beginning up to their current end (the
        reading loop puts them live)."""
        state = [tp for tp in assigned if tp.topic in self._state_topics]
        if state:
            await self.consumer.seek_to_beginning(*state)
            self._ends = await self.consumer.end_offsets(state)
        partitions = {tp.partition for tp in assigned}
        self._replaying = set(partitions)
        self.delivery.assign(partitions)
        if not partitions:
            self.ready.set()

    async def check_replays(self) -> None:
        """Put the partitions whose replay is complete live (not from a rebalance listener:
        it asks the consumer for positions)."""
        for partition in sorted(self._replaying):
            tps = [TopicPartition(topic, partition) for topic in self._state_topics]
            positions = [await self.consumer.position(tp) for tp in tps]
            if all(pos >= self._ends.get(tp, 0) for tp, pos in zip(tps, positions, strict=True)):
                self._replaying.discard(partition)
                self.delivery.go_live(partition)
        if not self._replaying:
            self.ready.set()

    async def _commit_acks(self) -> None:
        """Commit how far ``client.acks`` has been applied (errors are logged)."""
        offsets = {
            tp: OffsetAndMetadata(offset, "")
            for tp, offset in self._acks_read.items()
            if self._acks_committed.get(tp) != offset
        }
        if not offsets:
            return
        try:
            await self.consumer.commit(offsets)
        except KafkaError as exc:  # a rebalance or an outage: the next commit retries
            log.warning("client.acks commit failed: %r", exc)
            return
        self._acks_committed.update({tp: m.offset for tp, m in offsets.items()})

    async def run(self) -> None:
        """Read the owned partitions until cancelled."""
        last_commit = time.monotonic()
        while True:
            batches = await self.consumer.getmany(timeout_ms=500, max_records=BATCH_MAX)
            for tp, records in batches.items():
                if tp.topic == self.names.client_acks:
                    self._acks_read[tp] = records[-1].offset + 1
                for record in records:
                    try:
                        self.delivery.apply(tp.topic, tp.partition, record.key, record.value)
                    except (AttributeError, ValueError, RecordError, MQTTError) as exc:
                        log_undecodable(log, record, exc)
            if self._replaying:
                await self.check_replays()
            if time.monotonic() - last_commit >= COMMIT_INTERVAL:
                last_commit = time.monotonic()
                await self._commit_acks()


def build_app(settings: Settings) -> faust.App:
    """Build app_delivery's Faust app: the ownership consumer, the feeds, the expiry timer."""
    names = TopicNames.from_settings(settings)
    app = make_app(settings, "app-delivery")

    send = sender(app)

    delivery = AppDelivery(settings, send)

    @app.task
    async def serve() -> None:
        await delivery.start()
        consumer = make_consumer(
            settings,
            group_id=app.conf.id,
            partition_assignment_strategy=(RangePartitionAssignor,),
            # Kafka's smallest: a killed instance's clients move within seconds.
            session_timeout_ms=6000,
            heartbeat_interval_ms=2000,
        )
        await consumer.start()
        ready = asyncio.Event()
        ownership = Ownership(consumer, delivery, names, ready)
        consumer.subscribe(
            [names.client_sessions, names.client_subscriptions, names.client_acks],
            listener=ownership,
        )
        reading = asyncio.create_task(ownership.run(), name="app-delivery-ownership")
        try:
            await ready.wait()
            mark_ready(settings.ready_file, "app_delivery")
            await reading
        finally:
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)
            await delivery.close()
            await consumer.stop()

    @app.timer(settings.session_expiry_check_seconds)
    async def expire_sessions() -> None:
        try:
            acks = await delivery.expire_sessions(time.time_ns() // 1_000_000)
            await asyncio.gather(*acks)
        except Exception as exc:  # Kafka is down: the next tick tries again
            log.warning("session expiry check failed: %r", exc)

    @app.on_before_shutdown.connect
    async def stop(app: faust.App, **kwargs: object) -> None:
        clear_ready(settings.ready_file)

    return app


def run() -> None:
    """Entry point of ``cormorant app-delivery``."""
    run_service(build_app)
