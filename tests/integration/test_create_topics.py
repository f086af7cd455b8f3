"""``cormorant create-topics`` (the one-off ECS task of the deployment) on the real broker."""

from __future__ import annotations

import os
import subprocess
import uuid

from aiokafka.admin import AIOKafkaAdminClient

from services.common.kafka.admin import core_topic_specs
from services.common.settings import Settings
from tests.commands import run_cormorant

pytestmark = __import__("pytest").mark.kafka


def _create_topics(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_cormorant("create-topics", "--timeout", "30", env=env)


async def test_create_topics_creates_the_core_topics_once(kafka_bootstrap: str) -> None:
    prefix = f"ct-{uuid.uuid4().hex[:8]}."
    env = {
        **os.environ,
        "CORMORANT_SETTINGS_FILE": os.devnull,
        "CORMORANT_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "CORMORANT_TOPIC_PREFIX": prefix,
        "CORMORANT_STATE_TOPIC_PARTITIONS": "3",
    }
    first = _create_topics(env)
    assert first.returncode == 0, first.stderr
    specs = core_topic_specs(Settings(topic_prefix=prefix, state_topic_partitions=3))
    assert first.stdout.splitlines() == [
        f"{spec.name}  partitions={spec.partitions}  created" for spec in specs
    ]

    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics([spec.name for spec in specs])
    finally:
        await admin.close()
    assert {t["topic"]: len(t["partitions"]) for t in described} == {
        spec.name: spec.partitions for spec in specs
    }

    second = _create_topics(env)
    assert second.returncode == 0, second.stderr
    assert all(line.endswith("  exists") for line in second.stdout.splitlines())


def test_create_topics_fails_clearly_without_kafka() -> None:
    env = {
        **os.environ,
        "CORMORANT_SETTINGS_FILE": os.devnull,
        "CORMORANT_KAFKA_BOOTSTRAP": "127.0.0.1:1",  # nothing listens on port 1
    }
    result = run_cormorant("create-topics", "--timeout", "1", env=env)
    assert result.returncode == 1
    assert "Error: creating topics at 127.0.0.1:1: Kafka at 127.0.0.1:1 did not answer" in (
        result.stderr
    )
