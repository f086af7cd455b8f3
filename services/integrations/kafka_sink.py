"""The Kafka sink: an integration's messages into a topic of another Kafka cluster, each
exactly once (docs/integrations/kafka.md).

What the stage produces for one ``msg.all`` partition's records, and that partition's next
offset, go into one Kafka transaction of the sink cluster (KIP-98): the offsets are
committed there (``sendOffsetsToTransaction``, aiokafka's ``send_offsets_to_transaction``)
in a consumer group of the sink cluster named after the integration, not in the broker's
own Kafka, because one transaction can only span one cluster. The stage reads a partition
again from the offset stored there (:meth:`KafkaSinkWriter.committed`): after a crash
between produce and commit the transaction is aborted (its records are never read by a
``read_committed`` consumer) and its source records are written again in a new one. Each
``msg.all`` partition has its own transactional producer (``transactional.id``
``<group>.<msg.all topic>-<n>``, :class:`~services.common.kafka.consumer.
PartitionTransactions`): the instance that takes a partition over fences the previous one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from services.common.integrations.model import MSK_IAM, Integration, KafkaSink
from services.common.kafka.admin import TopicSpec, ensure_topics
from services.common.kafka.consumer import PartitionTransactions
from services.common.kafka.names import TopicNames
from services.common.kafka.security import MskIamTokenProvider, tls_context
from services.common.settings import Settings
from services.integrations.matching import Outgoing


def kafka_sink(integration: Integration) -> KafkaSink:
    """``integration``'s sink. Raises ``TypeError`` when it is not a Kafka sink."""
    sink = integration.sink
    if not isinstance(sink, KafkaSink):
        raise TypeError(f"integration {integration.name} has no Kafka sink")
    return sink


def sink_security(integration: Integration) -> dict[str, Any]:
    """aiokafka's security options for ``integration``'s sink cluster: its security
    protocol, a TLS context verifying the brokers (its CA file, else the system's) and the
    SASL login: a user name and password, or for :data:`~services.common.integrations.
    model.MSK_IAM` SASL/OAUTHBEARER with an MSK IAM token provider for the sink's Region
    (and role), the one the services use for their own cluster. Nothing is connected or
    signed yet. Raises ``OSError``/``ssl.SSLError`` when the CA file cannot be read,
    ``TypeError`` when the sink is not a Kafka sink."""
    sink = kafka_sink(integration)
    options: dict[str, Any] = {"security_protocol": sink.security_protocol}
    if sink.security_protocol in ("SSL", "SASL_SSL"):
        options["ssl_context"] = tls_context(Path(sink.ssl_cafile) if sink.ssl_cafile else None)
    if sink.security_protocol.startswith("SASL_"):
        if sink.sasl_mechanism == MSK_IAM:
            assert sink.aws_region is not None  # check_kafka_sink refuses it without one
            options["sasl_mechanism"] = "OAUTHBEARER"
            options["sasl_oauth_token_provider"] = MskIamTokenProvider(
                sink.aws_region, sink.aws_role_arn, f"cormorant-{integration.name}"[:64]
            )
        else:
            options["sasl_mechanism"] = sink.sasl_mechanism
            options["sasl_plain_username"] = sink.sasl_username
            options["sasl_plain_password"] = integration.secrets.sasl_password
    return options


class KafkaSinkWriter:
    """Writes ``integration``'s messages to its sink cluster in transactions that hold the
    source offsets, committed in consumer group ``group_id`` of the sink cluster.

    :attr:`transactions` are the per-partition transactions the stage's consume loop
    drives; :meth:`send` queues one partition's messages in its open transaction;
    :meth:`committed` is where a partition is read again from. :meth:`start` before use,
    :meth:`close` after.
    """

    def __init__(self, settings: Settings, integration: Integration, group_id: str) -> None:
        self.settings = settings
        self.integration = integration
        self.sink = kafka_sink(integration)
        self.group_id = group_id
        self.security = sink_security(integration)
        self.transactions = PartitionTransactions(self._producer, f"{group_id}.", group_id)
        self._admin = AIOKafkaAdminClient(
            bootstrap_servers=self.sink.bootstrap,
            request_timeout_ms=int(settings.kafka_request_timeout_seconds * 1000),
            **self.security,
        )

    def _producer(self, transactional_id: str) -> AIOKafkaProducer:
        """A transactional (so idempotent, ``acks=all``) producer of the sink cluster."""
        settings = self.settings
        return AIOKafkaProducer(
            bootstrap_servers=self.sink.bootstrap,
            acks="all",
            transactional_id=transactional_id,
            transaction_timeout_ms=int(settings.transaction_timeout_seconds * 1000),
            request_timeout_ms=int(settings.kafka_request_timeout_seconds * 1000),
            linger_ms=int(settings.producer_linger_seconds * 1000),
            max_request_size=max(settings.max_packet_size * 2, 1024 * 1024),
            **self.security,
        )

    async def start(self) -> None:
        """Connect the admin client (offsets are read with it), and make sure the sink
        cluster knows a topic named like ``msg.all`` (:meth:`ensure_offsets_topic`).
        Raises ``KafkaError``."""
        await self._admin.start()
        await self.ensure_offsets_topic()

    async def ensure_offsets_topic(self) -> None:
        """Create, in the sink cluster, an empty topic named like the broker's ``msg.all``
        with its partitions, if it is missing (and one like ``client.events`` when the sink
        has an events stream): Kafka takes the offsets of a transaction
        (``TxnOffsetCommit``) only for partitions of topics it has, and answers
        UNKNOWN_TOPIC_OR_PARTITION otherwise, which aiokafka retries until the transaction
        times out. Nothing is ever written to them (replication 1, one hour's retention).
        Raises ``KafkaError``."""
        settings = self.settings
        names = TopicNames.from_settings(settings)
        retention = {"retention.ms": str(3600 * 1000)}
        specs = [TopicSpec(names.msg_all, settings.msg_all_partitions, retention)]
        if self.sink.events_topic is not None:
            specs.append(TopicSpec(names.client_events, settings.state_topic_partitions, retention))
        await ensure_topics(self.sink.bootstrap, specs, 1, security=self.security)

    async def committed(self, tp: TopicPartition) -> int | None:
        """The next offset of source partition ``tp`` committed with the sink's
        transactions, or None when none was. Raises ``KafkaError``."""
        stored = await self._admin.list_consumer_group_offsets(self.group_id, partitions=[tp])
        found = stored.get(tp)
        if found is None or found.offset < 0:
            return None
        return int(found.offset)

    async def send(
        self, producer: AIOKafkaProducer, messages: Sequence[Outgoing]
    ) -> list[Awaitable[object]]:
        """Queue ``messages`` in ``producer``'s open transaction (topic and key as the
        sink's templates render them, the value as formatted, the User Properties as
        headers); returns their acknowledgements."""
        return [
            await producer.send(
                message.kafka_topic,
                message.value,
                key=message.key,
                headers=list(message.headers),
            )
            for message in messages
        ]

    async def close(self) -> None:
        """Close the producers and the admin client."""
        await asyncio.gather(self.transactions.close(), self._admin.close())
