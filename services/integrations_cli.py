"""``cormorant integrations add|list|show|update|enable|disable|delete``: where the
integrations stage sends the broker's messages (docs/integrations/index.md).

Through the admin API with the stored login (:mod:`services.admin_client`,
``/api/integrations``), so the commands work the same on the local cluster and on a
deployed stack, and every change is audited. A SASL password is read from a file
(``--sasl-password-file``, ``-`` for standard input), never taken on the command line, and
never shown. ``--json`` prints the API's answer. Errors exit with status 1 and one line
saying what is wrong.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from services.admin_client import path_part
from services.cli_common import print_table, read_secret
from services.ops_cli import admin_client

F = TypeVar("F", bound=Callable[..., Any])

_JSON = click.option("--json", "as_json", is_flag=True, help="Print the API's JSON answer.")

_SECURITY = click.Choice(["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"])
_MECHANISM = click.Choice(["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"])


def _describe(item: dict[str, Any]) -> str:
    """An integration in a few lines, for people."""
    sink = item["sink"]
    lines = [
        f"{item['name']}  ({'enabled' if item['enabled'] else 'disabled'}, "
        f"revision {item['revision']}, id {item['id']})",
        f"  kind:            {item['kind']}",
        f"  topic filters:   {' '.join(item['topic_filters'])}",
        f"  client ids:      {item['client_id_filter'] or '(every client)'}",
        f"  payload format:  {item['payload_format']}",
        f"  bootstrap:       {sink['bootstrap']}",
        f"  kafka topic:     {sink['topic']}",
        f"  record key:      {sink['key']}",
        f"  security:        {sink['security_protocol']}",
    ]
    if sink["sasl_mechanism"]:
        password = "password set" if sink["sasl_password_set"] else "no password"
        lines.append(
            f"  sasl:            {sink['sasl_mechanism']} as {sink['sasl_username']} ({password})"
        )
    if sink["ssl_cafile"]:
        lines.append(f"  ca file:         {sink['ssl_cafile']}")
    if sink.get("events_topic"):
        lines.append(f"  events topic:    {sink['events_topic']}")
    status = item.get("status")
    if status:
        figures = ", ".join(
            f"{name} {value:.0f}"
            for name, value in status["counters"].items()
            if not name.endswith("_timestamp_seconds")
        )
        lines += [
            f"  state:           {status['state']} ({status['instances']} stage processes)",
            f"  figures:         {figures or '(none yet)'}",
            f"  last error:      {status['last_error'] or '(none)'}"
            + (f" at {status['last_error_at']}" if status["last_error"] else ""),
        ]
    return "\n".join(lines)


def _print(item: dict[str, Any], as_json: bool, verb: str = "") -> None:
    if as_json:
        click.echo(json.dumps(item))
    else:
        if verb:
            click.echo(f"{verb}:")
        click.echo(_describe(item))


def _password(path: Path | None) -> str | None:
    """The SASL password in file ``path`` (None: not given). Raises ``click.UsageError``
    when it is not UTF-8 text."""
    if path is None:
        return None
    try:
        return read_secret(path).decode("utf-8")
    except UnicodeDecodeError:
        raise click.UsageError("the SASL password is not UTF-8 text") from None


def _sink_options(required: bool) -> list[Callable[[Any], Any]]:
    return [
        click.option("--bootstrap", required=required,
                     help="The other Kafka cluster's bootstrap servers: host:port[,host:port]."),
        click.option("--kafka-topic", required=required,
                     help="The Kafka topic, a template: ${client_id}, ${topic}, "
                     "${topic_level[N]} (characters Kafka does not allow become _)."),
        click.option("--key", help="The record key template (default ${client_id})."),
        click.option("--security-protocol", type=_SECURITY,
                     help="How to reach the cluster (default PLAINTEXT)."),
        click.option("--sasl-mechanism", type=_MECHANISM, help="The SASL mechanism."),
        click.option("--sasl-username", help="The SASL user name."),
        click.option("--sasl-password-file", type=click.Path(allow_dash=True, path_type=Path),
                     help="Read the SASL password from this file ('-': standard input)."),
        click.option("--ssl-cafile",
                     help="A CA bundle on the stage's hosts that signed the cluster's "
                     "certificates (default: the system's)."),
        click.option("--events-topic",
                     help="Also write the clients' lifecycle events (connect, disconnect, "
                     "subscription changes; cormorant.client_event/1) to this Kafka topic."),
    ]  # fmt: skip


def _with(options: list[Callable[[Any], Any]]) -> Callable[[F], F]:
    """A decorator applying ``options`` (click options) in order."""

    def decorate(command: F) -> F:
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


def _sink_body(options: dict[str, Any]) -> dict[str, Any]:
    """The sink fields given (``options`` as click passes them)."""
    fields = {
        "bootstrap": options["bootstrap"],
        "topic": options["kafka_topic"],
        "key": options["key"],
        "security_protocol": options["security_protocol"],
        "sasl_mechanism": options["sasl_mechanism"],
        "sasl_username": options["sasl_username"],
        "sasl_password": _password(options["sasl_password_file"]),
        "ssl_cafile": options["ssl_cafile"],
        "events_topic": options["events_topic"],
    }
    return {name: value for name, value in fields.items() if value is not None}


@click.group()
def integrations() -> None:
    """Send matching messages into other systems (today: a topic of another Kafka cluster,
    exactly once), as JSON or raw payloads."""


@integrations.command("add")
@click.argument("name")
@click.option(
    "--kind",
    type=click.Choice(["kafka"]),
    default="kafka",
    show_default=True,
    help="Where the messages go.",
)
@click.option(
    "--topic-filter",
    "topic_filters",
    multiple=True,
    required=True,
    help="An MQTT Topic Filter (+ and # wildcards); repeat for more.",
)
@click.option(
    "--client-id",
    "client_id_filter",
    help="Only messages of Client Identifiers matching this pattern (sensor-*).",
)
@click.option(
    "--format",
    "payload_format",
    type=click.Choice(["json", "raw"]),
    default="json",
    show_default=True,
    help="json: the cormorant.message/1 document; raw: the payload's bytes.",
)
@click.option("--disabled", is_flag=True, help="Store it disabled.")
@_with(_sink_options(required=True))
@_JSON
def add(
    name: str,
    kind: str,
    topic_filters: tuple[str, ...],
    client_id_filter: str | None,
    payload_format: str,
    disabled: bool,
    as_json: bool,
    **sink: Any,
) -> None:
    """Add integration NAME; the stage starts it within a second, with the messages
    accepted from then on."""
    body = {
        "name": name,
        "kind": kind,
        "topic_filters": list(topic_filters),
        "payload_format": payload_format,
        "enabled": not disabled,
        "sink": _sink_body(sink),
    }
    if client_id_filter is not None:
        body["client_id_filter"] = client_id_filter
    with admin_client() as client:
        _print(client.call("POST", "/api/integrations", body=body), as_json, "added")


@integrations.command("list")
@_JSON
def list_integrations(as_json: bool) -> None:
    """The integrations, by name."""
    with admin_client() as client:
        answer = client.call("GET", "/api/integrations")
    if as_json:
        click.echo(json.dumps(answer))
        return
    found = answer["integrations"]
    if not found:
        click.echo("no integrations (cormorant integrations add NAME ... adds one)")
        return
    print_table(
        ("NAME", "ENABLED", "KIND", "TOPIC FILTERS", "KAFKA TOPIC", "STATE"),
        [
            (
                item["name"],
                "yes" if item["enabled"] else "no",
                item["kind"],
                " ".join(item["topic_filters"]),
                item["sink"]["topic"],
                (item.get("status") or {}).get("state", "?"),
            )
            for item in found
        ],
    )


@integrations.command("show")
@click.argument("name")
@_JSON
def show(name: str, as_json: bool) -> None:
    """Integration NAME (or id)."""
    with admin_client() as client:
        _print(client.call("GET", f"/api/integrations/{path_part(name)}"), as_json)


@integrations.command("update")
@click.argument("name")
@click.option(
    "--topic-filter",
    "topic_filters",
    multiple=True,
    help="Replace the Topic Filters (repeat for more).",
)
@click.option("--client-id", "client_id_filter", help="Replace the Client Identifier pattern.")
@click.option("--every-client", is_flag=True, help="Drop the Client Identifier pattern.")
@click.option(
    "--format",
    "payload_format",
    type=click.Choice(["json", "raw"]),
    help="Replace the payload format.",
)
@click.option("--no-sasl", is_flag=True, help="Drop the SASL mechanism, user name and password.")
@click.option("--no-events", is_flag=True, help="Stop writing the lifecycle events.")
@_with(_sink_options(required=False))
@_JSON
def update(
    name: str,
    topic_filters: tuple[str, ...],
    client_id_filter: str | None,
    every_client: bool,
    payload_format: str | None,
    no_sasl: bool,
    no_events: bool,
    as_json: bool,
    **sink_options: Any,
) -> None:
    """Change integration NAME (only what is given); the stage restarts it within a second,
    from where its sink stands."""
    if every_client and client_id_filter is not None:
        raise click.UsageError("give --client-id or --every-client, not both")
    body: dict[str, Any] = {}
    if topic_filters:
        body["topic_filters"] = list(topic_filters)
    if client_id_filter is not None:
        body["client_id_filter"] = client_id_filter
    if every_client:
        body["client_id_filter"] = None
    if payload_format is not None:
        body["payload_format"] = payload_format
    sink = _sink_body(sink_options)
    if no_sasl:
        sink |= {"sasl_mechanism": None, "sasl_username": None, "sasl_password": None}
    if no_events:
        if "events_topic" in sink:
            raise click.UsageError("give --events-topic or --no-events, not both")
        sink["events_topic"] = None
    if sink:
        body["sink"] = sink
    if not body:
        raise click.UsageError("nothing to change: give at least one option")
    _change(name, body, as_json, "updated")


def _change(name: str, body: dict[str, Any], as_json: bool, verb: str) -> None:
    with admin_client() as client:
        answer = client.call("PATCH", f"/api/integrations/{path_part(name)}", body=body)
    _print(answer, as_json, verb)


@integrations.command("enable")
@click.argument("name")
@_JSON
def enable(name: str, as_json: bool) -> None:
    """Enable integration NAME: it goes on from where its sink stands."""
    _change(name, {"enabled": True}, as_json, "enabled")


@integrations.command("disable")
@click.argument("name")
@_JSON
def disable(name: str, as_json: bool) -> None:
    """Disable integration NAME: the stage stops it within a second (its position is
    kept)."""
    _change(name, {"enabled": False}, as_json, "disabled")


@integrations.command("delete")
@click.argument("name")
@_JSON
def delete(name: str, as_json: bool) -> None:
    """Delete integration NAME."""
    with admin_client() as client:
        client.call("DELETE", f"/api/integrations/{path_part(name)}")
    click.echo(json.dumps({"deleted": name}) if as_json else f"deleted: {name}")
