"""The local cluster's infrastructure, for real: Kafka, Redis and PostgreSQL via the launcher."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys

import psutil
import psycopg
import pytest
import redis as redis_client
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from services.common.kafka.admin import core_topic_specs, ensure_topics
from services.common.settings import Settings
from services.local import cluster, haproxy, kafka, processes, redis
from services.local.settings import LocalSettings
from tests.waiting import wait_until

INFRA = ["kafka", "redis", "postgres"]


def _cli(settings: LocalSettings, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``cormorant <args>`` in a child process configured like the test cluster."""
    env = cluster.child_environment(cluster.local_settings(settings))
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def _infra_pids(settings: LocalSettings) -> dict[str, int | None]:
    return {row.name: row.pid for row in cluster.status(settings, infrastructure_only=True)}


async def _topic_configs(bootstrap: str, names: list[str]) -> dict[str, dict[str, str]]:
    """Each topic's effective configs (name → value), from DescribeConfigs."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        responses = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, name) for name in names]
        )
    finally:
        await admin.close()
    configs: dict[str, dict[str, str]] = {}
    for response in responses:
        for error_code, _message, _type, topic, entries in response.resources:
            assert error_code == 0, f"DescribeConfigs of {topic} failed: {error_code}"
            configs[topic] = {entry[0]: entry[1] for entry in entries}
    return configs


async def test_core_topics_exist_with_their_partition_counts(
    kafka_bootstrap: str, settings: LocalSettings
) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        specs = core_topic_specs(settings)
        described = await admin.describe_topics([spec.name for spec in specs])
    finally:
        await admin.close()
    partitions = {topic["topic"]: len(topic["partitions"]) for topic in described}
    assert partitions == {spec.name: spec.partitions for spec in specs}
    assert all(spec.name.startswith(settings.topic_prefix) for spec in specs)


async def test_state_topics_are_compacted_and_message_topics_are_not(
    kafka_bootstrap: str, settings: LocalSettings
) -> None:
    specs = core_topic_specs(settings)
    configs = await _topic_configs(kafka_bootstrap, [spec.name for spec in specs])
    policies = {name: values["cleanup.policy"] for name, values in configs.items()}
    prefix = settings.topic_prefix
    assert policies == {
        f"{prefix}msg.all": "delete",
        f"{prefix}msg.persisted": "delete",
        f"{prefix}client.acks": "delete",
        f"{prefix}client.events": "delete",
        f"{prefix}client.sessions": "compact",
        f"{prefix}client.subscriptions": "compact",
        f"{prefix}msg.retained": "compact",
        f"{prefix}client.wills": "compact",
        f"{prefix}msg.delayed": "compact",
    }
    week_ms = str(settings.msg_retention_seconds * 1000)
    assert configs[f"{prefix}msg.all"]["retention.ms"] == week_ms
    assert configs[f"{prefix}client.events"]["retention.ms"] == week_ms


def test_redis_answers_and_keeps_an_append_only_file(redis_server: str) -> None:
    client = redis_client.Redis.from_url(redis_server, socket_timeout=5)
    try:
        assert client.ping() is True
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        client.set("cormorant:test", b"\x00\xff")
        assert client.get("cormorant:test") == b"\x00\xff"
    finally:
        client.close()


def test_postgres_serves_the_cormorant_database(postgres_server: str) -> None:
    with psycopg.connect(postgres_server, connect_timeout=5) as conn:
        row = conn.execute("SELECT current_user, current_database()").fetchone()
    assert row == ("cormorant", "cormorant")


def test_status_reports_the_infrastructure_healthy(
    kafka_bootstrap: str, redis_server: str, postgres_server: str, settings: LocalSettings
) -> None:
    rows = cluster.status(settings, infrastructure_only=True)
    assert [(row.name, row.health) for row in rows] == [(name, "up") for name in INFRA]
    result = _cli(settings, "status", "--infra-only")
    assert result.returncode == 0, result.stdout + result.stderr
    for row in rows:
        assert row.name in result.stdout and str(row.pid) in result.stdout


def test_up_again_leaves_running_parts_alone(
    kafka_bootstrap: str, redis_server: str, postgres_server: str, settings: LocalSettings
) -> None:
    before = _infra_pids(settings)
    assert cluster.up_infrastructure(settings) == before
    result = _cli(settings, "up", "--infra-only")
    assert result.returncode == 0, result.stdout + result.stderr
    assert _infra_pids(settings) == before


def test_up_restarts_only_a_dead_part(
    kafka_bootstrap: str, redis_server: str, postgres_server: str, settings: LocalSettings
) -> None:
    before = _infra_pids(settings)
    victim = before["redis"]
    assert victim is not None
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: processes.find(settings.state_dir, "redis") is None, "redis death")
    after = cluster.up_infrastructure(settings)
    assert after["redis"] != victim
    assert {k: v for k, v in after.items() if k != "redis"} == {
        k: v for k, v in before.items() if k != "redis"
    }
    assert redis.ping(settings.redis_port)


@pytest.mark.stops_cluster
def test_down_stops_everything_and_up_brings_it_back(
    kafka_bootstrap: str, redis_server: str, postgres_server: str, settings: LocalSettings
) -> None:
    procs = {name: psutil.Process(pid) for name, pid in _infra_pids(settings).items() if pid}
    assert sorted(procs) == sorted(INFRA)

    result = _cli(settings, "down")
    assert result.returncode == 0, result.stdout + result.stderr
    for proc in procs.values():
        # Already gone; wait() also reaps them, as they are this process's own children.
        proc.wait(timeout=1)
    ports = [settings.kafka_port, settings.redis_port, settings.postgres_port]
    assert not any(processes.port_open(port) for port in ports)
    assert processes.recorded_names(settings.state_dir) == []
    status = _cli(settings, "status", "--infra-only")
    assert status.returncode == 1
    assert status.stdout.count("down (no process)") == len(INFRA)

    # Restarted on their existing data: Kafka keeps its topics, nothing is re-created.
    cluster.up_infrastructure(settings)
    assert all(row.healthy for row in cluster.status(settings, infrastructure_only=True))
    assert asyncio.run(ensure_topics(kafka_bootstrap, core_topic_specs(settings))) == []


def test_services_see_exactly_the_launchers_settings(settings: LocalSettings) -> None:
    resolved = cluster.local_settings(settings)
    runtime = cluster.runtime_settings(resolved)
    env = cluster.child_environment(runtime, node_id="node2", mqtt_port="21902")
    # Secrets in clear (a JSON dump masks them, and a masked key is no valid key).
    code = (
        "import json; from pydantic import SecretStr; "
        "from services.common.settings import Settings; "
        "values = {name: value.get_secret_value() if isinstance(value, SecretStr) else value "
        "for name, value in Settings().model_dump().items()}; "
        "print(json.dumps(values, default=str))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    seen = Settings.model_validate_json(result.stdout)
    # Exactly the run-time part: the launcher's own settings (ports, heap) stay with it.
    assert seen == runtime.model_copy(update={"node_id": "node2", "mqtt_port": 21902})
    assert not set(env) & {"CORMORANT_KAFKA_HEAP", "CORMORANT_LISTEN_PORT"}


def test_haproxy_config_is_accepted_and_it_listens(settings: LocalSettings) -> None:
    config = haproxy.write_config(settings)
    binary = shutil.which("haproxy") or "/usr/sbin/haproxy"
    check = subprocess.run([binary, "-c", "-f", str(config)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    was_running = processes.find(settings.state_dir, haproxy.NAME) is not None
    pid = cluster.start_component(settings, haproxy.NAME)
    assert processes.port_open(settings.listen_port)
    assert cluster.start_component(settings, haproxy.NAME) == pid
    if not was_running:  # leave a whole-cluster session's proxy as it was
        assert cluster.stop_component(settings, haproxy.NAME) is True
        assert not processes.port_open(settings.listen_port)


def test_a_process_that_dies_while_starting_is_reported_with_its_log(
    settings: LocalSettings,
) -> None:
    argv = [sys.executable, "-c", "print('cannot open the widget', flush=True); exit(3)"]
    with pytest.raises(processes.StartError) as failure:
        processes.ensure_started(settings.state_dir, "doomed", argv, lambda: False, 30)
    message = str(failure.value)
    assert "doomed exited while starting" in message
    assert str(processes.log_file(settings.state_dir, "doomed")) in message
    assert "cannot open the widget" in message
    assert processes.find(settings.state_dir, "doomed") is None


def test_a_taken_port_is_reported_instead_of_starting(
    redis_server: str, settings: LocalSettings
) -> None:
    argv = [sys.executable, "-c", "raise SystemExit('must not run')"]
    with pytest.raises(processes.StartError, match=f"port {settings.redis_port} is already"):
        processes.ensure_started(
            settings.state_dir, "squatter", argv, lambda: True, 30, port=settings.redis_port
        )
    assert processes.find(settings.state_dir, "squatter") is None


def test_kafka_storage_formats_with_a_cluster_id_starting_with_a_dash(
    tmp_path_factory: pytest.TempPathFactory, settings: LocalSettings
) -> None:
    # One random cluster id in 64 starts with "-": it once read as an option and failed.
    state = tmp_path_factory.mktemp("dash")
    own = settings.model_copy(update={"state_dir": state})
    home = state / "kafka"
    home.mkdir()
    (home / "cluster.id").write_text("-wAAAAAAAAAAAAAAAAAAAA\n", encoding="utf-8")
    kafka.prepare(own)
    meta = (home / "data" / "meta.properties").read_text(encoding="utf-8")
    assert "cluster.id=-wAAAAAAAAAAAAAAAAAAAA" in meta
