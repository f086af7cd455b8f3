"""Kafka topic administration: the topics Cormorant needs, with their partitions and configs.

Topics are created idempotently at start-up (an existing topic is left as it is). State
topics (``client.sessions``, ``client.subscriptions``, ``msg.retained``) are compacted
(``cleanup.policy=compact``): only the latest record per client id (or topic name) matters.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import (
    GroupIdNotFound,
    KafkaError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
    for_code,
)
from aiokafka.protocol.admin import DeleteGroupsRequest

from services.common.kafka.names import TopicNames
from services.common.settings import KafkaFlavor, Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """One Kafka topic to create: name, partition count and topic-level configs (str → str)."""

    name: str
    partitions: int
    configs: dict[str, str] = field(default_factory=dict)


MSK_SERVERLESS_TOPIC_CONFIGS = frozenset(
    {
        "cleanup.policy",
        "compression.type",
        "max.message.bytes",
        "message.timestamp.difference.max.ms",
        "message.timestamp.type",
        "retention.bytes",
        "retention.ms",
    }
)
"""The topic-level configs MSK Serverless accepts. AWS, MSK Developer Guide, "Configuration
properties for MSK Serverless clusters": "you can set or modify the following topic-level
configuration properties. All other topic-level configuration properties are not
configurable." A CreateTopics naming any other config is refused."""


def refused_configs(spec: TopicSpec, flavor: KafkaFlavor) -> list[str]:
    """The configs of ``spec`` that a Kafka of ``flavor`` (setting ``kafka_flavor``) refuses,
    sorted; empty when it accepts them all."""
    if flavor == "msk-serverless":
        return sorted(set(spec.configs) - MSK_SERVERLESS_TOPIC_CONFIGS)
    return []


def _compacted(settings: Settings) -> dict[str, str]:
    if settings.kafka_flavor == "msk-serverless":
        return {"cleanup.policy": "compact"}
    # A short segment.ms keeps the dirty part small so compaction actually runs on
    # low-traffic state topics; min.compaction.lag keeps freshly written records readable.
    return {"cleanup.policy": "compact", "segment.ms": str(3600 * 1000)}


def core_topic_specs(settings: Settings) -> list[TopicSpec]:
    """The topics every deployment has (docs/design.md "The data path"), sized from ``settings``."""
    names = TopicNames.from_settings(settings)
    msg_retention = {"retention.ms": str(settings.msg_retention_seconds * 1000)}
    return [
        TopicSpec(names.msg_all, settings.msg_all_partitions, msg_retention),
        TopicSpec(names.msg_persisted, settings.state_topic_partitions, msg_retention),
        TopicSpec(names.client_acks, settings.state_topic_partitions, msg_retention),
        TopicSpec(names.client_events, settings.state_topic_partitions, msg_retention),
        TopicSpec(names.client_sessions, settings.state_topic_partitions, _compacted(settings)),
        TopicSpec(
            names.client_subscriptions, settings.state_topic_partitions, _compacted(settings)
        ),
        TopicSpec(names.msg_retained, settings.state_topic_partitions, _compacted(settings)),
        TopicSpec(names.client_wills, settings.state_topic_partitions, _compacted(settings)),
        TopicSpec(names.msg_delayed, settings.state_topic_partitions, _compacted(settings)),
    ]


def dead_letter_topic_spec(settings: Settings) -> TopicSpec:
    """``integrations.dead-letter``, what integrations gave up on: partitioned like
    ``msg.all`` (keyed by the publisher's Client Identifier), retention
    ``integrations_dead_letter_retention_seconds``."""
    return TopicSpec(
        TopicNames.from_settings(settings).integrations_dead_letter,
        settings.msg_all_partitions,
        {"retention.ms": str(settings.integrations_dead_letter_retention_seconds * 1000)},
    )


def downlink_topic_spec(settings: Settings, node_id: str) -> TopicSpec:
    """The downlink topic of ingest node ``node_id`` (short retention: live traffic only)."""
    return TopicSpec(
        TopicNames.from_settings(settings).downlink(node_id),
        settings.downlink_partitions,
        {"retention.ms": str(settings.downlink_retention_seconds * 1000)},
    )


def app_topic_spec(settings: Settings, client_id: str) -> TopicSpec:
    """``msg.app.<client>`` of a persistent APPLICATION client (TBMQ's per-client topic):
    ``app_topic_partitions`` partitions, retention ``app_retention_seconds``."""
    return TopicSpec(
        TopicNames.from_settings(settings).app(client_id),
        settings.app_topic_partitions,
        {"retention.ms": str(settings.app_retention_seconds * 1000)},
    )


def app_shared_topic_spec(settings: Settings, share_name: str, topic_filter: str) -> TopicSpec:
    """``msg.app-shared.<group>`` of Shared Subscription ``$share/<share_name>/<filter>``:
    ``app_shared_topic_partitions`` partitions, retention ``app_retention_seconds``."""
    return TopicSpec(
        TopicNames.from_settings(settings).app_shared(share_name, topic_filter),
        settings.app_shared_topic_partitions,
        {"retention.ms": str(settings.app_retention_seconds * 1000)},
    )


def app_spec_of(settings: Settings, topic: str) -> TopicSpec | None:
    """The spec of ``topic`` if it is an APPLICATION topic (``msg.app.<client>`` or
    ``msg.app-shared.<group>``, by its name), else None: for a writer that holds only the
    name."""
    app, app_shared = TopicNames.from_settings(settings).app_prefixes
    retention = {"retention.ms": str(settings.app_retention_seconds * 1000)}
    if topic.startswith(app_shared):
        return TopicSpec(topic, settings.app_shared_topic_partitions, retention)
    if topic.startswith(app):
        return TopicSpec(topic, settings.app_topic_partitions, retention)
    return None


async def delete_topics_and_groups(
    bootstrap: str,
    topics: list[str],
    groups: list[str],
    timeout: float = 30.0,
    *,
    security: Mapping[str, Any] | None = None,
) -> None:
    """Delete ``topics`` and the consumer groups ``groups`` (with their committed offsets).

    What does not exist is skipped. A group must have no active member (Kafka answers
    ``NON_EMPTY_GROUP`` otherwise). ``timeout`` in seconds; ``security``: the client
    security options (:func:`~services.common.kafka.security.client_security`). Raises
    ``aiokafka.errors.KafkaError`` on any other failure.
    """
    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap, request_timeout_ms=int(timeout * 1000), **(security or {})
    )
    try:
        await admin.start()
        if topics:
            response = await admin.delete_topics(topics)
            for name, code, *_ in response.topic_error_codes:
                error = for_code(code)
                if code and error is not UnknownTopicOrPartitionError:
                    raise error(f"deleting topic {name}")
        for group in groups:
            # aiokafka 0.14's admin client has no DeleteGroups call; its request type exists.
            coordinator = await admin.find_coordinator(group)
            response = await admin._send_request(DeleteGroupsRequest([group]), coordinator)
            for name, code in response.results:
                error = for_code(code)
                if code and error is not GroupIdNotFound:
                    raise error(f"deleting consumer group {name}")
    finally:
        await admin.close()


async def wait_for_kafka(
    bootstrap: str, timeout: float = 60.0, *, security: Mapping[str, Any] | None = None
) -> None:
    """Wait until the Kafka cluster at ``bootstrap`` answers a metadata request.

    ``timeout`` is in seconds; ``security``: the client security options. Raises
    ``TimeoutError`` if Kafka does not answer in time (also when it refuses the login).
    """
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        admin = AIOKafkaAdminClient(
            bootstrap_servers=bootstrap, request_timeout_ms=5000, **(security or {})
        )
        try:
            await admin.start()
            await admin.list_topics()
            return
        except (KafkaError, OSError) as exc:
            last = exc
        finally:
            await admin.close()
        await asyncio.sleep(0.5)  # retry pacing while the broker boots, not a synchronization
    raise TimeoutError(f"Kafka at {bootstrap} did not answer within {timeout}s: {last!r}")


async def ensure_topics(
    bootstrap: str,
    specs: list[TopicSpec],
    replication: int = 1,
    *,
    security: Mapping[str, Any] | None = None,
) -> list[str]:
    """Create each topic of ``specs`` that does not exist yet; return the names created.
    ``security``: the client security options (none: PLAINTEXT).

    Returns once every topic of ``specs`` is visible in the cluster's metadata. Existing
    topics are left unchanged. Raises ``TimeoutError`` if new topics stay invisible for
    30 s, ``aiokafka.errors.KafkaError`` on any other failure (``KafkaConnectionError``
    when the cluster cannot be reached).
    """
    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap, request_timeout_ms=15000, **(security or {})
    )
    try:
        await admin.start()
        existing = set(await admin.list_topics())
        missing = [s for s in specs if s.name not in existing]
        if not missing:
            return []
        response = await admin.create_topics(
            [
                NewTopic(
                    name=spec.name,
                    num_partitions=spec.partitions,
                    replication_factor=replication,
                    topic_configs=spec.configs,
                )
                for spec in missing
            ]
        )
        created: list[str] = []
        for name, code, *rest in response.topic_errors:
            error = for_code(code)
            if code == 0:
                created.append(name)
            elif error is not TopicAlreadyExistsError:  # lost a race with another creator
                raise error(f"creating topic {name}: {rest[0] if rest else ''}")
        if created:
            log.info("created Kafka topics: %s", ", ".join(created))
        # Metadata reaches the broker's cache a moment after creation; callers start
        # consumers right away, so return only once every topic is visible.
        deadline = time.monotonic() + 30.0
        wanted = {s.name for s in specs}
        while not wanted <= set(await admin.list_topics()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"topics not visible in metadata: {wanted}")
            await asyncio.sleep(0.1)  # polling pace of a condition with a deadline
        return created
    finally:
        await admin.close()
