"""What the admin service writes to Kafka: the records that change the cluster, built by
:mod:`services.common.records` like every other writer's.

- Disconnect a client: an :class:`~services.common.records.AdminDisconnect` command on the
  downlink topic of the node its session record names (``msg.downlink.<node>``), which
  that node alone reads, from its end, for its live connections: the node closes the
  connection the command names with DISCONNECT 0x98 Administrative action (a newer
  connection of the client, elsewhere or later, is not touched).
- Delete a session: of a connected client, the same command with ``end_session``: the node
  ends the session as a v5 DISCONNECT with Session Expiry Interval 0 would; of a
  disconnected one, the tombstones of its session and subscription records, which make
  every service forget it (device_persist deletes its stored messages, app_delivery its
  topic), as when a session expires.
- Delete a retained message: the tombstone an empty retained PUBLISH writes
  (:func:`~services.common.records.retained_record`).

- Publish a message for the HTTP publish API (:mod:`services.admin.publish_api`): the
  ``msg.all`` record (and ``msg.retained`` one) an ingest node writes for a PUBLISH.

Records go out with ``acks=all`` and Cormorant's partitioner (a client's records share
its partition in every keyed topic).
"""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaProducer
from aiokafka.structs import RecordMetadata

from services.common.clock import now_ms
from services.common.faust_app import producer_options
from services.common.kafka.names import TopicNames
from services.common.records import (
    AdminDisconnect,
    KafkaRecord,
    PublishMeta,
    SessionRecord,
    admin_disconnect_record,
    client_session_record,
    client_subscriptions_record,
    retained_record,
)
from services.common.settings import Settings


def disconnect_records(
    names: TopicNames, client_id: str, session: SessionRecord, end_session: bool
) -> list[KafkaRecord]:
    """What disconnects ``client_id`` (whose latest session record is ``session``), or
    deletes its session with ``end_session``."""
    if session.connected:
        command = AdminDisconnect(client_id, session.connection_id, end_session)
        return [admin_disconnect_record(names, session.node_id, command)]
    if not end_session:
        return []
    return [
        client_subscriptions_record(names, client_id, []),
        client_session_record(names, client_id, None),
    ]


def retained_delete_record(names: TopicNames, topic: str) -> KafkaRecord:
    """The tombstone of ``topic``'s retained message (as an empty retained PUBLISH)."""
    meta = PublishMeta(topic=topic, qos=0, retain=True, received_at_ms=now_ms(), protocol_version=5)
    return retained_record(names, meta, b"")


class CommandWriter:
    """A producer for the admin service's records (``acks=all``). :meth:`start` first."""

    def __init__(self, settings: Settings) -> None:
        self.names = TopicNames.from_settings(settings)
        self.settings = settings
        self._producer: AIOKafkaProducer | None = None

    async def start(self) -> None:
        """Connect to Kafka. Raises ``KafkaError``."""
        settings = self.settings
        # The services' producer options: acks=all, Cormorant's partitioner, and requests
        # large enough for a message of max_packet_size (the HTTP publish API's).
        self._producer = AIOKafkaProducer(**producer_options(settings))
        await self._producer.start()

    async def stop(self) -> None:
        """Flush and close."""
        if self._producer is not None:
            await self._producer.stop()

    async def enqueue(self, records: list[KafkaRecord]) -> list[asyncio.Future[RecordMetadata]]:
        """Hand ``records`` to the producer in order (waiting only while its buffer is
        full); each future completes when Kafka stored its record (acks=all) or fails with
        ``KafkaError``. Records of one key keep their order: they share a partition, and
        the producer sends one batch per partition at a time. Raises ``KafkaError``."""
        assert self._producer is not None, "start() first"
        sent: list[asyncio.Future[RecordMetadata]] = []
        for record in records:
            sent.append(
                await self._producer.send(
                    record.topic, record.value, key=record.key, headers=list(record.headers)
                )
            )
        return sent

    async def write(self, records: list[KafkaRecord]) -> None:
        """Write ``records`` in order and return once Kafka stored each. Raises
        ``KafkaError``."""
        assert self._producer is not None, "start() first"
        for record in records:
            await self._producer.send_and_wait(
                record.topic, record.value, key=record.key, headers=list(record.headers)
            )
