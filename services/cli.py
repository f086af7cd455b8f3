"""The ``cormorant`` command: run one service, or manage the local cluster.

Every service reads its settings from ``CORMORANT_*`` environment variables or the settings
file (see :mod:`services.common.settings`); options given here override them.
"""

from __future__ import annotations

import os

import click

from services.cloud.cli import cloud
from services.credentials_cli import credentials
from services.local.cli import down, fetch_kafka, status, up
from spark_emr.cli import analytics

SERVICE_COMMANDS = ("ingest", "router", "device-persist", "app-delivery")
"""The commands that each run one deployable service: one container image target
(Dockerfile) and one ECS service (infra/) each."""

TOPICS_COMMAND = "create-topics"
"""The command of the one-off task that creates Cormorant's core Kafka topics."""


def _apply(**overrides: object) -> None:
    """Export command-line overrides as ``CORMORANT_*`` variables before settings are read."""
    for name, value in overrides.items():
        if value is not None:
            os.environ[f"CORMORANT_{name.upper()}"] = str(value)


@click.group()
def main() -> None:
    """Cormorant: a Kafka-backed, horizontally scalable MQTT broker."""


@main.command()
@click.option("--node-id", help="This node's id (names its downlink topic).")
@click.option("--host", "mqtt_host", help="Address to bind the MQTT listener to.")
@click.option("--port", "mqtt_port", type=int, help="Port of the MQTT listener.")
@click.option(
    "--node-id-from-ecs-task",
    is_flag=True,
    help="Take the node id from the ECS task metadata (the task id), so that every task "
    "of an autoscaled ECS service is a node of its own.",
)
def ingest(
    node_id: str | None, mqtt_host: str | None, mqtt_port: int | None, node_id_from_ecs_task: bool
) -> None:
    """Run an ingest node: the MQTT listener (connection container) of one node."""
    if node_id_from_ecs_task:
        if node_id is not None:
            raise click.UsageError("--node-id and --node-id-from-ecs-task exclude each other")
        from services.cloud.ecs_task import NotInEcsTask, task_id

        try:
            node_id = task_id()
        except NotInEcsTask as exc:
            raise click.ClickException(str(exc)) from exc
    _apply(node_id=node_id, mqtt_host=mqtt_host, mqtt_port=mqtt_port)
    from services.ingest.main import run

    run()


@main.command()
def router() -> None:
    """Run a router: matches msg.all against subscriptions, writes downlink records."""
    from services.router.main import run

    run()


@main.command("device-persist")
def device_persist() -> None:
    """Run device_persist: stored messages of persistent DEVICE sessions (Redis/PostgreSQL)."""
    from services.device_persist.main import run

    run()


@main.command("app-delivery")
def app_delivery() -> None:
    """Run app_delivery: APPLICATION clients' messages from their Kafka topics."""
    from services.app_delivery.main import run

    run()


@main.command(TOPICS_COMMAND)
@click.option(
    "--timeout",
    type=float,
    default=120.0,
    show_default=True,
    help="Seconds to wait for Kafka to answer before giving up.",
)
def create_topics(timeout: float) -> None:
    """Create Cormorant's core Kafka topics that do not exist yet, then exit.

    Names, partitions and configs come from the settings (CORMORANT_TOPIC_PREFIX, the
    partition counts, CORMORANT_REPLICATION_FACTOR); existing topics are left as they are.
    Exits with status 1 when Kafka cannot be reached or refuses a topic.
    """
    import asyncio

    from aiokafka.errors import KafkaError

    from services.common.kafka.admin import core_topic_specs, ensure_topics, wait_for_kafka
    from services.common.kafka.security import client_security
    from services.common.settings import get_settings

    settings = get_settings()
    specs = core_topic_specs(settings)
    security = client_security(settings)

    async def create() -> list[str]:
        await wait_for_kafka(settings.kafka_bootstrap, timeout=timeout, security=security)
        return await ensure_topics(
            settings.kafka_bootstrap, specs, settings.replication_factor, security=security
        )

    try:
        created = asyncio.run(create())
    except (KafkaError, TimeoutError) as exc:
        raise click.ClickException(f"creating topics at {settings.kafka_bootstrap}: {exc}") from exc
    for spec in specs:
        state = "created" if spec.name in created else "exists"
        click.echo(f"{spec.name}  partitions={spec.partitions}  {state}")


@main.command("settings")
def show_settings() -> None:
    """List every setting: environment variable, current value and meaning (the services'
    run-time settings first, then the local cluster launcher's, then the analytics')."""
    from services.common.settings import Settings
    from services.local.settings import LocalSettings
    from spark_emr.settings import AnalyticsSettings

    current = AnalyticsSettings()
    sections = {
        "services": list(Settings.model_fields),
        "local cluster": [n for n in LocalSettings.model_fields if n not in Settings.model_fields],
        "analytics": [
            n for n in AnalyticsSettings.model_fields if n not in LocalSettings.model_fields
        ],
    }
    for title, names in sections.items():
        click.echo(f"# {title}")
        for name in names:
            value = getattr(current, name)
            click.echo(f"CORMORANT_{name.upper()}={'' if value is None else value}")
            description = AnalyticsSettings.model_fields[name].description
            if description:
                click.echo(f"    {description}")


main.add_command(up)
main.add_command(down)
main.add_command(status)
main.add_command(fetch_kafka)
main.add_command(cloud)
main.add_command(analytics)
main.add_command(credentials)

if __name__ == "__main__":
    main()
