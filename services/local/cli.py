"""``cormorant up / status / down / fetch-kafka``: the local cluster from the command line.

Thin wrappers over :mod:`services.local.cluster`; every option comes from the settings
(``CORMORANT_*`` variables or the settings file).
"""

from __future__ import annotations

import click

from services.local import cluster, haproxy, kafka, layout
from services.local.processes import StartError
from services.local.settings import LocalSettings

_INFRA_ONLY = click.option(
    "--infra-only", is_flag=True, help="Only Kafka, Redis and PostgreSQL, not the services."
)


def _print_table(rows: list[cluster.ComponentStatus]) -> None:
    table = [("NAME", "PID", "PORT", "HEALTH")] + [
        (
            row.name,
            "-" if row.pid is None else str(row.pid),
            "-" if row.port is None else str(row.port),
            row.health,
        )
        for row in rows
    ]
    widths = [max(len(line[col]) for line in table) for col in range(len(table[0]))]
    for line in table:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())


def _layout_to_run(settings: LocalSettings, asked: dict[str, int]) -> LocalSettings:
    """The settings ``up`` runs with: the recorded layout while a part of that cluster runs
    (a plain ``up`` brings its dead parts back), else the settings with ``asked``'s counts.
    Raises ``click.ClickException`` when ``asked`` differs from a cluster that runs."""
    running = layout.recorded(settings)
    if running is not None and any(row.pid for row in cluster.status(layout.current(settings))):
        wanted = layout.of(settings.model_copy(update=asked))
        if asked and wanted != running:
            raise click.ClickException(
                f"the local cluster runs with {running.describe()}, not "
                f"{wanted.describe()}: run `cormorant down` first"
            )
        return layout.apply(settings, running)
    return settings.model_copy(update=asked)


@click.command()
@_INFRA_ONLY
@click.option(
    "--production",
    is_flag=True,
    help="As in AWS: 3 Kafka brokers (replication factor 3, min.insync.replicas 2) and Redis "
    "with a replica and 3 Sentinels that fail over to it.",
)
@click.option(
    "--kafka-brokers", type=click.IntRange(1, 9), help="Kafka brokers (setting kafka_brokers)."
)
@click.option(
    "--redis-replicas",
    type=click.IntRange(0, 4),
    help="Redis replicas, with Sentinels (setting redis_replicas).",
)
def up(
    infra_only: bool, production: bool, kafka_brokers: int | None, redis_replicas: int | None
) -> None:
    """Bring the local cluster up (running parts are left alone, dead ones restarted)."""
    asked: dict[str, int] = {}
    if production:
        asked = {
            "kafka_brokers": layout.PRODUCTION.kafka_brokers,
            "redis_replicas": layout.PRODUCTION.redis_replicas,
            "redis_sentinel_count": layout.PRODUCTION.redis_sentinel_count,
        }
    if kafka_brokers is not None:
        asked["kafka_brokers"] = kafka_brokers
    if redis_replicas is not None:
        asked["redis_replicas"] = redis_replicas
    settings = _layout_to_run(LocalSettings(), asked)
    try:
        if infra_only:
            cluster.up_infrastructure(settings)
        else:
            cluster.up(settings)
    except (StartError, kafka.FetchError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from exc
    _print_table(cluster.status(settings, infrastructure_only=infra_only))
    click.echo(f"\nKafka bootstrap: {kafka.bootstrap(settings)}")
    if not infra_only:
        ports = ", ".join(str(p) for p in haproxy.node_ports(settings))
        click.echo(f"MQTT: mqtt://127.0.0.1:{settings.listen_port} (ingest nodes on {ports})")
    click.echo(f"Logs: {settings.state_dir / 'logs'}")


@click.command()
def down() -> None:
    """Stop the local cluster: services first, then Kafka, Redis and PostgreSQL."""
    stopped = cluster.down(layout.current(LocalSettings()))
    click.echo("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))


@click.command()
@_INFRA_ONLY
def status(infra_only: bool) -> None:
    """Show each part's pid, port and health; exit with status 1 if any part is down."""
    rows = cluster.status(layout.current(LocalSettings()), infrastructure_only=infra_only)
    _print_table(rows)
    if not all(row.healthy for row in rows):
        raise SystemExit(1)


@click.command("fetch-kafka")
def fetch_kafka() -> None:
    """Download the Kafka broker's jars with Maven into the cache (no-op when cached)."""
    settings = LocalSettings()
    try:
        libs = kafka.fetch_jars(settings)
    except kafka.FetchError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"Kafka {settings.kafka_version} jars: {libs}")
