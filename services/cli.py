"""The ``cormorant`` command: run one service, or manage the local cluster.

Every service reads its settings from ``CORMORANT_*`` environment variables or the settings
file (see :mod:`services.common.settings`); options given here override them.
"""

from __future__ import annotations

import os

import click

from services.local.cli import down, fetch_kafka, status, up
from spark_emr.cli import analytics


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
def ingest(node_id: str | None, mqtt_host: str | None, mqtt_port: int | None) -> None:
    """Run an ingest node: the MQTT listener (connection container) of one node."""
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


@main.command("settings")
def show_settings() -> None:
    """List every setting: environment variable, current value and meaning."""
    from spark_emr.settings import AnalyticsSettings

    current = AnalyticsSettings()
    for name, info in AnalyticsSettings.model_fields.items():
        value = getattr(current, name)
        click.echo(f"CORMORANT_{name.upper()}={'' if value is None else value}")
        if info.description:
            click.echo(f"    {info.description}")


main.add_command(up)
main.add_command(down)
main.add_command(status)
main.add_command(fetch_kafka)
main.add_command(analytics)

if __name__ == "__main__":
    main()
