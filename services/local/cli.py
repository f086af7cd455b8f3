"""``cormorant up / status / down / fetch-kafka``: the local cluster from the command line.

Thin wrappers over :mod:`services.local.cluster`; every option comes from the settings
(``CORMORANT_*`` variables or the settings file). ``status`` adds each service's live
figures, read from its ``/metrics`` twice, ``--interval`` seconds apart.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

import click

from services.common.metrics import Samples, parse_exposition, total
from services.local import cluster, haproxy, kafka, layout, open_files, progress
from services.local.processes import StartError
from services.local.settings import LocalSettings


@dataclass(frozen=True)
class Figures:
    """A service's live figures: connected clients, PUBLISH packets per second in and out
    (ingest nodes), records its consumers are behind (every stage)."""

    connections: int | None
    msg_in: float | None
    msg_out: float | None
    lag: int | None


def scrape(port: int) -> Samples | None:
    """The metrics of the process serving ``/metrics`` on ``port``; None if it does not
    answer within 2 s."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            return parse_exposition(response.read().decode("utf-8"))
    except (OSError, ValueError, urllib.error.URLError):
        return None


def figures(first: Samples, second: Samples, seconds: float) -> Figures:
    """The figures of two scrapes of one process taken ``seconds`` apart."""
    connections = lag = None
    msg_in = msg_out = None
    if "cormorant_mqtt_connections" in second:
        connections = int(total(second, "cormorant_mqtt_connections"))
        received, sent = (
            "cormorant_mqtt_publish_received_total",
            "cormorant_mqtt_publish_sent_total",
        )
        msg_in = max(0.0, total(second, received) - total(first, received)) / seconds
        msg_out = max(0.0, total(second, sent) - total(first, sent)) / seconds
    if second.get("cormorant_kafka_consumer_lag_records"):
        lag = int(total(second, "cormorant_kafka_consumer_lag_records"))
    return Figures(connections, msg_in, msg_out, lag)


def live_figures(rows: list[cluster.ComponentStatus], interval: float) -> dict[str, Figures]:
    """Each service's :class:`Figures`, from two scrapes ``interval`` seconds apart."""
    ports = {row.name: row.http_port for row in rows if row.http_port and row.pid}
    first = {name: scrape(port) for name, port in ports.items()}
    started = time.monotonic()
    time.sleep(interval)
    second = {name: scrape(port) for name, port in ports.items()}
    elapsed = time.monotonic() - started
    found = {}
    for name in ports:
        before, after = first[name], second[name]
        if before is not None and after is not None:
            found[name] = figures(before, after, elapsed)
    return found


def _number(value: float | None, rate: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:,.1f}" if rate else f"{int(value):,}"


_INFRA_ONLY = click.option(
    "--infra-only", is_flag=True, help="Only Kafka, Redis and PostgreSQL, not the services."
)


def _status_json(
    row: cluster.ComponentStatus, live: dict[str, Figures] | None
) -> dict[str, object]:
    """One part as ``status --json`` prints it (figures None where not known)."""
    got = None if live is None else live.get(row.name)
    return {
        "name": row.name,
        "pid": row.pid,
        "port": row.port,
        "http_port": row.http_port,
        "healthy": row.healthy,
        "health": row.health,
        "connections": None if got is None else got.connections,
        "msg_in_per_second": None if got is None else got.msg_in,
        "msg_out_per_second": None if got is None else got.msg_out,
        "lag": None if got is None else got.lag,
    }


def _print_table(
    rows: list[cluster.ComponentStatus], live: dict[str, Figures] | None = None
) -> None:
    head: tuple[str, ...] = ("NAME", "PID", "PORT", "HEALTH")
    if live is not None:
        head += ("HTTP", "CONNS", "MSG/S IN", "MSG/S OUT", "LAG")
    table: list[tuple[str, ...]] = [head]
    for row in rows:
        line: tuple[str, ...] = (
            row.name,
            "-" if row.pid is None else str(row.pid),
            "-" if row.port is None else str(row.port),
            row.health,
        )
        if live is not None:
            got = live.get(row.name)
            line += ("-" if row.http_port is None else str(row.http_port),)
            line += (
                ("-",) * 4
                if got is None
                else (
                    _number(got.connections),
                    _number(got.msg_in, rate=True),
                    _number(got.msg_out, rate=True),
                    _number(got.lag),
                )
            )
        table.append(line)
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
    "with 2 replicas and 3 Sentinels that fail over to one of them.",
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
    progress.listen(lambda line: click.echo(line, err=True))
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
        maxconn = haproxy.max_connections(settings)
        click.echo(_connection_ceiling(maxconn))
        if (short := _short_of_scale(settings, maxconn)) is not None:
            click.echo(short, err=True)
        ports = ", ".join(str(p) for p in haproxy.node_ports(settings))
        click.echo(f"MQTT: mqtt://127.0.0.1:{settings.listen_port} (ingest nodes on {ports})")
        if cluster.anonymous_allowed(settings):
            rules = ", ".join(repr(r) for r in cluster.local_anonymous_rules(settings))
            click.echo(
                f"Anonymous MQTT clients are allowed with the rules {rules} (loopback only; "
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
        click.echo(
            f"Console and admin API: http://127.0.0.1:{settings.admin_port}/ (API docs: /docs); "
            "first user: cormorant admin-users add <name>"
        )
        http = ", ".join(
            f"{name} {port}"
            for name, port in cluster.http_ports(settings).items()
            if name != cluster.ADMIN
        )
        click.echo(f"Metrics: http://127.0.0.1:<port>/metrics ({http})")
    click.echo(f"Logs: {settings.state_dir / 'logs'}")


@click.command()
def down() -> None:
    """Stop the local cluster: services first, then Kafka, Redis and PostgreSQL."""
    stopped = cluster.down(layout.current(LocalSettings()))
    click.echo("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))


def _connection_ceiling(maxconn: int | None) -> str:
    """The status line that says how many connections HAProxy takes (None: not running)."""
    if maxconn is None:
        return "Connections through HAProxy: unknown (HAProxy does not answer)"
    return (
        f"Connections through HAProxy: at most {maxconn:,} (its maxconn: two open files "
        f"each; raise the hard open-file limit, ulimit -Hn, for more)"
    )


def _short_of_scale(settings: LocalSettings, maxconn: int | None) -> str | None:
    """A warning when HAProxy's ``maxconn`` is below the connections the ingest nodes take
    (``ingest_nodes`` x ``max_connections``): the open-file limit could not be raised that
    far (docs/operations/connections.md). None when it is not."""
    scale = settings.ingest_nodes * settings.max_connections
    if maxconn is None or maxconn >= scale:
        return None
    needed = open_files.target_open_files(settings.ingest_nodes, settings.max_connections)
    return (
        f"Warning: HAProxy takes at most {maxconn:,} connections, fewer than the {scale:,} "
        f"the ingest nodes take ({settings.ingest_nodes} x max_connections "
        f"{settings.max_connections:,}): the hard open-file limit is too low. Raise "
        f"the hard limit to {needed:,} (nofile in /etc/security/limits.conf, LimitNOFILE= "
        "in a systemd unit, the container's ulimit; `cormorant up` raises it itself when "
        "it has CAP_SYS_RESOURCE), then `cormorant down` and `cormorant up`."
    )


@click.command()
@_INFRA_ONLY
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    default=1.0,
    show_default=True,
    help="Seconds between the two reads of each service's /metrics (the rates' window).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print JSON: {"parts": [{"name", "pid", "port", "http_port", "healthy", "health", '
    '"connections", "msg_in_per_second", "msg_out_per_second", "lag"}]}.',
)
def status(infra_only: bool, interval: float, as_json: bool) -> None:
    """Show each part's pid, port and health, and each service's live figures (connected
    clients, PUBLISH packets per second in and out, Kafka consumer lag); exit with status 1
    if any part is down."""
    settings = layout.current(LocalSettings())
    rows = cluster.status(settings, infrastructure_only=infra_only)
    live = None if infra_only else live_figures(rows, interval)
    if as_json:
        click.echo(json.dumps({"parts": [_status_json(row, live) for row in rows]}, indent=2))
        if not all(row.healthy for row in rows):
            raise SystemExit(1)
        return
    _print_table(rows, live)
    if not infra_only:
        maxconn = haproxy.max_connections(settings)
        click.echo(_connection_ceiling(maxconn))
        if (short := _short_of_scale(settings, maxconn)) is not None:
            click.echo(short)
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
