"""Topic administration against the real broker: idempotent creation, partitions, configs."""

from __future__ import annotations

import uuid

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from services.common.kafka.admin import (
    TopicSpec,
    core_topic_specs,
    downlink_topic_spec,
    ensure_topics,
)
from services.common.settings import Settings

pytestmark = __import__("pytest").mark.kafka


def _prefix() -> str:
    return f"it-{uuid.uuid4().hex[:8]}."


async def _describe(bootstrap: str, names: list[str]) -> dict[str, tuple[int, dict[str, str]]]:
    """Each topic's partition count and effective configs."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        topics = await admin.describe_topics(names)
        responses = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, name) for name in names]
        )
    finally:
        await admin.close()
    partitions = {t["topic"]: len(t["partitions"]) for t in topics if t["error_code"] == 0}
    configs: dict[str, dict[str, str]] = {}
    for response in responses:
        for error_code, _message, _type, topic, entries in response.resources:
            assert error_code == 0, f"DescribeConfigs of {topic} failed: {error_code}"
            configs[topic] = {entry[0]: entry[1] for entry in entries}
    return {name: (partitions[name], configs[name]) for name in names}


async def test_ensure_topics_creates_once_with_partitions_and_configs(
    kafka_bootstrap: str,
) -> None:
    prefix = _prefix()
    specs = [
        TopicSpec(f"{prefix}state", 3, {"cleanup.policy": "compact", "segment.ms": "3600000"}),
        TopicSpec(f"{prefix}stream", 2, {"retention.ms": "120000"}),
    ]
    assert sorted(await ensure_topics(kafka_bootstrap, specs)) == sorted(s.name for s in specs)
    # Existing topics are left as they are, even when asked with other settings.
    changed = [TopicSpec(f"{prefix}state", 7, {"cleanup.policy": "delete"}), specs[1]]
    assert await ensure_topics(kafka_bootstrap, changed) == []

    described = await _describe(kafka_bootstrap, [s.name for s in specs])
    state_partitions, state_configs = described[f"{prefix}state"]
    stream_partitions, stream_configs = described[f"{prefix}stream"]
    assert (state_partitions, state_configs["cleanup.policy"]) == (3, "compact")
    assert state_configs["segment.ms"] == "3600000"
    assert (stream_partitions, stream_configs["cleanup.policy"]) == (2, "delete")
    assert stream_configs["retention.ms"] == "120000"


async def test_ensure_topics_adds_only_what_is_missing(kafka_bootstrap: str) -> None:
    settings = Settings(topic_prefix=_prefix(), kafka_bootstrap=kafka_bootstrap)
    core = core_topic_specs(settings)
    downlink = downlink_topic_spec(settings, "node7")
    assert len(await ensure_topics(kafka_bootstrap, core)) == len(core)
    # A node joining later creates its downlink topic; the core ones exist already.
    assert await ensure_topics(kafka_bootstrap, [*core, downlink]) == [downlink.name]
    assert await ensure_topics(kafka_bootstrap, [*core, downlink]) == []

    described = await _describe(kafka_bootstrap, [downlink.name, *(s.name for s in core)])
    assert described[downlink.name][0] == settings.downlink_partitions
    assert described[downlink.name][1]["cleanup.policy"] == "delete"
    for spec in core:
        assert described[spec.name][0] == spec.partitions
        assert described[spec.name][1]["cleanup.policy"] == spec.configs.get(
            "cleanup.policy", "delete"
        )
