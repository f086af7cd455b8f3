"""``cormorant up / status / down / fetch-kafka``: the local cluster from the command line.

Thin wrappers over :mod:`services.local.cluster`; every option comes from the settings
(``CORMORANT_*`` variables or the settings file).
"""

from __future__ import annotations

import click

from services.local import cluster, haproxy, kafka
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


@click.command()
@_INFRA_ONLY
def up(infra_only: bool) -> None:
    """Bring the local cluster up (running parts are left alone, dead ones restarted)."""
    settings = LocalSettings()
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
        if cluster.anonymous_allowed(settings):
            click.echo(
                "Anonymous MQTT clients are allowed (loopback only; "
                "CORMORANT_LOCAL_ANONYMOUS=false requires credentials)"
            )
        click.echo(f"MQTT over TLS: mqtts://localhost:{settings.tls_listen_port}")
        click.echo(
            f"MQTT over WebSocket: ws://localhost:{settings.ws_listen_port}/mqtt, "
            f"wss://localhost:{settings.wss_listen_port}/mqtt"
        )
        if settings.tls_cert_file is None and settings.tls_cert_pem is None:
            tls = cluster.tls_dir(cluster.local_settings(settings))
            click.echo(f"CA certificate: {tls / 'ca.pem'} (a client's: {tls / 'client.pem'})")
    click.echo(f"Logs: {settings.state_dir / 'logs'}")


@click.command()
def down() -> None:
    """Stop the local cluster: services first, then Kafka, Redis and PostgreSQL."""
    stopped = cluster.down(LocalSettings())
    click.echo("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))


@click.command()
@_INFRA_ONLY
def status(infra_only: bool) -> None:
    """Show each part's pid, port and health; exit with status 1 if any part is down."""
    rows = cluster.status(LocalSettings(), infrastructure_only=infra_only)
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
