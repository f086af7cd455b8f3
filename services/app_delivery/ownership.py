"""Which APPLICATION clients an app_delivery instance owns: Kafka decides.

``client.sessions``, ``client.subscriptions`` and ``client.acks`` are keyed by client id with
the same partition count and read in the consumer group ``<prefix>cormorant-app-delivery``
with the range assignor, so each instance is given the same partition numbers of all three
and owns every client whose records are there; adding an instance rebalances the clients.

:class:`Ownership` reads them with the consume loop every stage shares
(:func:`~services.common.kafka.consumer.consume_batches`, which commits what was applied).
The state topics are compacted, so an assigned partition of them is replayed from its
beginning rather than from a committed offset, and its clients are acted upon
(:class:`~services.app_delivery.clients.AppClients`) once that replay has reached the end
offsets of the moment it was assigned; ``client.acks`` resumes from its committed offset.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable

from aiokafka import AIOKafkaConsumer, TopicPartition

from services.app_delivery.clients import AppClients
from services.common.kafka.consumer import Record, consume_batches, log_undecodable
from services.common.kafka.names import TopicNames
from services.common.records import RecordError

log = logging.getLogger(__name__)

#: Most records of the ownership topics handled in one go.
BATCH_MAX = 2000

#: Seconds between commits of the ``client.acks`` position.
COMMIT_INTERVAL = 1.0


class Ownership:
    """The ownership consumer: replays assigned state partitions, feeds every record to
    ``clients``, and has the shared loop commit its position.

    ``consumer`` is started and not subscribed (:meth:`run` subscribes it); ``ready`` is
    set once the first assignment has been replayed.
    """

    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        clients: AppClients,
        names: TopicNames,
        ready: asyncio.Event,
    ) -> None:
        self.consumer = consumer
        self.clients = clients
        self.names = names
        self.ready = ready
        self._state_topics = (names.client_sessions, names.client_subscriptions)
        self._ends: dict[TopicPartition, int] = {}
        self._replaying: set[int] = set()

    async def run(self) -> None:
        """Read the owned partitions until cancelled."""
        await consume_batches(
            self.consumer,
            self.handle,
            topics=[
                self.names.client_sessions,
                self.names.client_subscriptions,
                self.names.client_acks,
            ],
            max_records=BATCH_MAX,
            commit_interval=COMMIT_INTERVAL,
            on_assigned=self.assigned,
            on_revoked=self.revoked,
            after_fetch=self.check_replays,
            stage="app-delivery",
        )

    async def handle(self, records: list[Record]) -> list[Awaitable[object]]:
        """Apply each record to the clients (undecodable ones are logged and skipped); the
        batch is done at once, nothing is produced for it."""
        for record in records:
            try:
                self.clients.apply(record.topic, record.partition, record.key, record.value)
            except RecordError as exc:
                log_undecodable(log, record, exc)
        return []

    async def revoked(self, revoked: set[TopicPartition]) -> None:
        """Stop the feeds of the partitions (before another instance can start them)."""
        await self.clients.revoke({tp.partition for tp in revoked})
        self._replaying.clear()

    async def assigned(self, assigned: set[TopicPartition]) -> None:
        """Replay the state partitions from their beginning up to their current end
        (:meth:`check_replays` puts them live)."""
        state = [tp for tp in assigned if tp.topic in self._state_topics]
        if state:
            await self.consumer.seek_to_beginning(*state)
            self._ends = await self.consumer.end_offsets(state)
        partitions = {tp.partition for tp in assigned}
        self._replaying = set(partitions)
        self.clients.assign(partitions)
        if not partitions:
            self.ready.set()

    async def check_replays(self) -> None:
        """Put the partitions whose replay is complete live (after a fetch, not from a
        rebalance listener: it asks the consumer for positions)."""
        for partition in sorted(self._replaying):
            tps = [TopicPartition(topic, partition) for topic in self._state_topics]
            positions = [await self.consumer.position(tp) for tp in tps]
            if all(pos >= self._ends.get(tp, 0) for tp, pos in zip(tps, positions, strict=True)):
                self._replaying.discard(partition)
                self.clients.go_live(partition)
        if not self._replaying:
            self.ready.set()
