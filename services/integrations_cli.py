"""``cormorant integrations add|list|show|update|enable|disable|delete``: where the
integrations stage sends the broker's messages (docs/integrations/index.md).

Through the admin API with the stored login (:mod:`services.admin_client`,
``/api/integrations``), so the commands work the same on the local cluster and on a
deployed stack, and every change is audited. Each kind has its own sink options
(:data:`SINK_OPTIONS`). A secret (a Kafka sink's SASL password, a webhook's signing secret)
is read from a file (``--sasl-password-file``, ``--signing-secret-file``; ``-`` for
standard input), never taken on the command line, and never shown. ``--json`` prints the
API's answer. Errors exit with status 1 and one line saying what is wrong.
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
_MECHANISM = click.Choice(["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN", "AWS_MSK_IAM"])

KINDS = ("kafka", "webhook", "mqtt")
"""The kinds of integrations (:class:`~services.common.integrations.model.IntegrationKind`)."""

_KAFKA = frozenset({"kafka"})
_WEBHOOK = frozenset({"webhook"})
_MQTT = frozenset({"mqtt"})

SINK_OPTIONS: dict[str, tuple[str, str, frozenset[str]]] = {
    "bootstrap": ("--bootstrap", "bootstrap", _KAFKA),
    "kafka_topic": ("--kafka-topic", "topic", _KAFKA),
    "key": ("--key", "key", _KAFKA),
    "security_protocol": ("--security-protocol", "security_protocol", _KAFKA),
    "sasl_mechanism": ("--sasl-mechanism", "sasl_mechanism", _KAFKA),
    "sasl_username": ("--sasl-username", "sasl_username", _KAFKA),
    "sasl_password_file": ("--sasl-password-file", "sasl_password", _KAFKA),
    "ssl_cafile": ("--ssl-cafile", "ssl_cafile", _KAFKA | _WEBHOOK),
    "events_topic": ("--events-topic", "events_topic", _KAFKA),
    "aws_region": ("--aws-region", "aws_region", _KAFKA),
    "aws_role_arn": ("--aws-role-arn", "aws_role_arn", _KAFKA),
    "url": ("--url", "url", _WEBHOOK),
    "batch_size": ("--batch-size", "batch_size", _WEBHOOK),
    "linger": ("--linger", "linger_seconds", _WEBHOOK),
    "timeout": ("--timeout", "timeout_seconds", _WEBHOOK),
    "max_attempts": ("--max-attempts", "max_attempts", _WEBHOOK),
    "backoff": ("--backoff", "backoff_seconds", _WEBHOOK),
    "backoff_max": ("--backoff-max", "backoff_max_seconds", _WEBHOOK),
    "max_in_flight": ("--max-in-flight", "max_in_flight", _WEBHOOK),
    "headers": ("--header", "headers", _WEBHOOK),
    "signing_secret_file": ("--signing-secret-file", "signing_secret", _WEBHOOK),
    "mqtt_host": ("--mqtt-host", "host", _MQTT),
    "mqtt_port": ("--mqtt-port", "port", _MQTT),
    "mqtt_version": ("--mqtt-version", "protocol_version", _MQTT),
    "mqtt_client_id": ("--mqtt-client-id", "client_id", _MQTT),
    "mqtt_username": ("--mqtt-username", "username", _MQTT),
    "mqtt_password_file": ("--mqtt-password-file", "mqtt_password", _MQTT),
    "mqtt_tls": ("--mqtt-tls", "tls", _MQTT),
    "mqtt_cafile": ("--mqtt-ca-file", "ca_file", _MQTT),
    "mqtt_cert": ("--mqtt-cert-file", "cert_file", _MQTT),
    "mqtt_key": ("--mqtt-key-file", "key_file", _MQTT),
    "qos": ("--qos", "qos", _MQTT),
    "retain": ("--retain", "retain", _MQTT),
    "local_prefix": ("--local-prefix", "local_prefix", _MQTT),
    "remote_prefix": ("--remote-prefix", "remote_prefix", _MQTT),
    "reverse_topic_filters": ("--reverse-topic-filter", "reverse_topic_filters", _MQTT),
    "local_username": ("--local-username", "local_username", _MQTT),
    "local_password_file": ("--local-password-file", "local_password", _MQTT),
}
"""Each sink option's parameter name → (its flag, the API's sink field, the kinds it
belongs to). A parameter ending in ``_file`` names a file holding a secret."""

REQUIRED: dict[str, tuple[str, ...]] = {
    "kafka": ("bootstrap", "kafka_topic"),
    "webhook": ("url", "signing_secret_file"),
    "mqtt": ("mqtt_host",),
}
"""The sink options ``add`` needs, per kind."""

_SECRET_NAMES = {
    "sasl_password": "SASL password",
    "signing_secret": "signing secret",
    "mqtt_password": "MQTT password",
    "local_password": "local credential's password",
}

#: ``--mqtt-version`` → the sink's ``protocol_version`` (MQTT's Protocol Level).
_MQTT_VERSIONS = {"5": 5, "3.1.1": 4}


def _describe(item: dict[str, Any]) -> str:
    """An integration in a few lines, for people: its fields, then its sink's (a secret
    only as set or not)."""
    lines = [
        f"{item['name']}  ({'enabled' if item['enabled'] else 'disabled'}, "
        f"revision {item['revision']}, id {item['id']})",
        f"  kind:            {item['kind']}",
        f"  topic filters:   {' '.join(item['topic_filters'])}",
        f"  client ids:      {item['client_id_filter'] or '(every client)'}",
        f"  payload format:  {item['payload_format']}",
    ]
    for name, value in item["sink"].items():
        if value is None or value == []:
            continue
        label = name.replace("_", " ")
        if name.endswith("_set"):
            label, value = label.removesuffix(" set"), "set" if value else "not set"
        elif name == "headers":
            value = ", ".join(f"{header}: {text}" for header, text in value)
        lines.append(f"  {label + ':':<16} {value}")
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


def _target(item: dict[str, Any]) -> str:
    """Where an integration sends its messages, in a few words."""
    sink = item["sink"]
    if item["kind"] == "kafka":
        return f"{sink['topic']} at {sink['bootstrap']}"
    return str(sink.get("url") or sink.get("host") or "")


def _print(item: dict[str, Any], as_json: bool, verb: str = "") -> None:
    if as_json:
        click.echo(json.dumps(item))
    else:
        if verb:
            click.echo(f"{verb}:")
        click.echo(_describe(item))


def _secret(path: Path, what: str) -> str:
    """The secret (``what``) in file ``path``. Raises ``click.UsageError`` when it is not
    UTF-8 text."""
    try:
        return read_secret(path).decode("utf-8")
    except UnicodeDecodeError:
        raise click.UsageError(f"the {what} is not UTF-8 text") from None


def _header(text: str) -> list[str]:
    """``Name: value`` as ``[name, value]``. Raises ``click.UsageError``."""
    name, colon, value = text.partition(":")
    if not colon or not name.strip():
        raise click.UsageError(f"--header {text!r}: give it as 'Name: value'")
    return [name.strip(), value.strip()]


def _sink_options() -> list[Callable[[Any], Any]]:
    return [
        click.option("--bootstrap",
                     help="kafka: the other Kafka cluster's bootstrap servers: "
                     "host:port[,host:port]."),
        click.option("--kafka-topic",
                     help="kafka: the Kafka topic, a template: ${client_id}, ${topic}, "
                     "${topic_level[N]} (characters Kafka does not allow become _)."),
        click.option("--key", help="kafka: the record key template (default ${client_id})."),
        click.option("--security-protocol", type=_SECURITY,
                     help="kafka: how to reach the cluster (default PLAINTEXT)."),
        click.option("--sasl-mechanism", type=_MECHANISM,
                     help="kafka: the SASL mechanism (AWS_MSK_IAM: Amazon MSK IAM, with "
                     "SASL_SSL and --aws-region)."),
        click.option("--sasl-username", help="kafka: the SASL user name."),
        click.option("--sasl-password-file", type=click.Path(allow_dash=True, path_type=Path),
                     help="kafka: read the SASL password from this file ('-': standard "
                     "input)."),
        click.option("--aws-region",
                     help="kafka, AWS_MSK_IAM: the MSK cluster's AWS Region (eu-west-1)."),
        click.option("--aws-role-arn",
                     help="kafka, AWS_MSK_IAM: an IAM role the stage assumes to sign (a "
                     "cluster of another account; default: the stage's own credentials)."),
        click.option("--ssl-cafile",
                     help="kafka, webhook: a CA bundle on the stage's hosts that signed the "
                     "cluster's or endpoint's certificates (default: the system's)."),
        click.option("--url", help="webhook: the endpoint's http:// or https:// URL."),
        click.option("--batch-size", type=click.IntRange(1, 1000),
                     help="webhook: messages per request (default 1; over 1: a JSON array, "
                     "json format only)."),
        click.option("--linger", type=click.FloatRange(0, 60),
                     help="webhook: seconds a batch may wait for more messages (default 0)."),
        click.option("--timeout", type=click.FloatRange(0.1, 300),
                     help="webhook: seconds each request may take (default 10)."),
        click.option("--max-attempts", type=click.IntRange(1, 100),
                     help="webhook: attempts per request before its messages go to the "
                     "dead-letter topic (default 5)."),
        click.option("--backoff", type=click.FloatRange(0.01, 3600),
                     help="webhook: seconds before the second attempt, doubling, with "
                     "jitter (default 0.5)."),
        click.option("--backoff-max", type=click.FloatRange(0.01, 3600),
                     help="webhook: the longest pause between attempts (default 30)."),
        click.option("--max-in-flight", type=click.IntRange(1, 64),
                     help="webhook: requests on the way at once (default 4)."),
        click.option("--header", "headers", multiple=True,
                     help="webhook: 'Name: value' added to each request (shown: no "
                     "credentials); repeat for more; replaces them all."),
        click.option("--signing-secret-file",
                     type=click.Path(allow_dash=True, path_type=Path),
                     help="webhook: read the HMAC-SHA-256 signing secret (32 characters or "
                     "more) from this file ('-': standard input)."),
        click.option("--mqtt-host", help="mqtt: the other broker's host name or address."),
        click.option("--mqtt-port", type=click.IntRange(1, 65535),
                     help="mqtt: the other broker's port (default 1883)."),
        click.option("--mqtt-version", type=click.Choice(list(_MQTT_VERSIONS)),
                     help="mqtt: the MQTT version spoken to it (default 5)."),
        click.option("--mqtt-client-id",
                     help="mqtt: the Client Identifier its connections are named after "
                     "(default cormorant-NAME)."),
        click.option("--mqtt-username", help="mqtt: the User Name of the bridge's CONNECT."),
        click.option("--mqtt-password-file", type=click.Path(allow_dash=True, path_type=Path),
                     help="mqtt: read the Password of its CONNECT from this file ('-': "
                     "standard input)."),
        click.option("--mqtt-tls/--mqtt-no-tls", default=None,
                     help="mqtt: MQTT over TLS, the broker's certificate and host name checked "
                     "(default: no TLS)."),
        click.option("--mqtt-ca-file", "mqtt_cafile",
                     help="mqtt: a CA bundle on the stage's hosts that signed the broker's "
                     "certificate (default: the system's)."),
        click.option("--mqtt-cert-file", "mqtt_cert",
                     help="mqtt: a client certificate (PEM) on the stage's hosts."),
        click.option("--mqtt-key-file", "mqtt_key",
                     help="mqtt: the client certificate's key (PEM) on the stage's hosts."),
        click.option("--qos", type=click.IntRange(0, 2),
                     help="mqtt: the highest QoS sent (default 1); each message goes with the "
                     "lower of its own and this."),
        click.option("--retain/--no-retain", default=None,
                     help="mqtt: keep the RETAIN flag as published (default) or clear it."),
        click.option("--local-prefix",
                     help="mqtt: the first topic levels here that --remote-prefix replaces "
                     "there (every --topic-filter must start with them)."),
        click.option("--remote-prefix",
                     help="mqtt: the topic levels there that replace --local-prefix."),
        click.option("--reverse-topic-filter", "reverse_topic_filters", multiple=True,
                     help="mqtt: a Topic Filter on the other broker whose messages are "
                     "published here (under --remote-prefix); repeat for more; replaces them "
                     "all."),
        click.option("--local-username",
                     help="mqtt: the User Name of the credential the reverse direction "
                     "publishes here with."),
        click.option("--local-password-file", type=click.Path(allow_dash=True, path_type=Path),
                     help="mqtt: read that credential's password from this file ('-': "
                     "standard input)."),
        click.option("--events-topic",
                     help="kafka: also write the clients' lifecycle events (connect, "
                     "disconnect, subscription changes; cormorant.client_event/1) to this "
                     "Kafka topic."),
    ]  # fmt: skip


def _with(options: list[Callable[[Any], Any]]) -> Callable[[F], F]:
    """A decorator applying ``options`` (click options) in order."""

    def decorate(command: F) -> F:
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


def _sink_body(options: dict[str, Any], kind: str | None) -> dict[str, Any]:
    """The sink fields given (``options`` as click passes them), for an integration of
    ``kind`` (None: the stored one's, unknown here). Raises ``click.UsageError`` for an
    option of another kind, or options of several kinds together."""
    given = {name: value for name, value in options.items() if value not in (None, ())}
    kinds = set(KINDS) if kind is None else {kind}
    for name in given:
        flag, _, belongs = SINK_OPTIONS[name]
        if not kinds & belongs:
            what = f"a {kind} integration" if kind else "the same integration as the others"
            raise click.UsageError(f"{flag} is not an option of {what}")
        kinds &= belongs
    body: dict[str, Any] = {}
    for name, value in given.items():
        _, field, _ = SINK_OPTIONS[name]
        if name.endswith("_file"):
            value = _secret(value, _SECRET_NAMES[field])
        elif name == "headers":
            value = [_header(text) for text in value]
        elif name == "mqtt_version":
            value = _MQTT_VERSIONS[value]
        elif name == "reverse_topic_filters":
            value = list(value)
        body[field] = value
    return body


@click.group()
def integrations() -> None:
    """Send matching messages into other systems: a topic of another Kafka cluster (exactly
    once), an HTTP endpoint or another MQTT broker (at least once), as JSON or raw
    payloads."""


@integrations.command("add")
@click.argument("name")
@click.option(
    "--kind",
    type=click.Choice(KINDS),
    default="kafka",
    show_default=True,
    help="Where the messages go: kafka (another Kafka cluster), webhook (an HTTP endpoint), "
    "mqtt (another MQTT broker).",
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
    help="json: the cormorant.message/1 document; raw: the payload's bytes (default: raw "
    "for mqtt, json for the others).",
)
@click.option("--disabled", is_flag=True, help="Store it disabled.")
@_with(_sink_options())
@_JSON
def add(
    name: str,
    kind: str,
    topic_filters: tuple[str, ...],
    client_id_filter: str | None,
    payload_format: str | None,
    disabled: bool,
    as_json: bool,
    **sink: Any,
) -> None:
    """Add integration NAME; the stage starts it within a second, with the messages
    accepted from then on. The sink options of its --kind are the ones marked so;
    kafka needs --bootstrap and --kafka-topic, webhook --url and --signing-secret-file,
    mqtt --mqtt-host."""
    sink_body = _sink_body(sink, kind)
    missing = [SINK_OPTIONS[option][0] for option in REQUIRED.get(kind, ()) if sink[option] is None]
    if missing:
        raise click.UsageError(f"a {kind} integration needs {' and '.join(missing)}")
    body = {
        "name": name,
        "kind": kind,
        "topic_filters": list(topic_filters),
        "enabled": not disabled,
        "sink": sink_body,
    }
    if payload_format is not None:
        body["payload_format"] = payload_format
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
        ("NAME", "ENABLED", "KIND", "TOPIC FILTERS", "SENDS TO", "STATE"),
        [
            (
                item["name"],
                "yes" if item["enabled"] else "no",
                item["kind"],
                " ".join(item["topic_filters"]),
                _target(item),
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
@click.option(
    "--no-sasl",
    is_flag=True,
    help="kafka: drop the SASL mechanism, user name and password (and MSK IAM's Region and role).",
)
@click.option("--no-headers", is_flag=True, help="webhook: drop the headers.")
@click.option(
    "--no-reverse",
    is_flag=True,
    help="mqtt: drop the reverse direction (its filters and local credential).",
)
@click.option("--no-events", is_flag=True, help="kafka: stop writing the lifecycle events.")
@_with(_sink_options())
@_JSON
def update(
    name: str,
    topic_filters: tuple[str, ...],
    client_id_filter: str | None,
    every_client: bool,
    payload_format: str | None,
    no_sasl: bool,
    no_headers: bool,
    no_reverse: bool,
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
    sink = _sink_body(sink_options, None)
    if no_sasl:
        sink |= {
            "sasl_mechanism": None,
            "sasl_username": None,
            "sasl_password": None,
            "aws_region": None,
            "aws_role_arn": None,
        }
    if no_headers:
        if "headers" in sink:
            raise click.UsageError("give --header or --no-headers, not both")
        sink["headers"] = []
    if no_reverse:
        if "reverse_topic_filters" in sink:
            raise click.UsageError("give --reverse-topic-filter or --no-reverse, not both")
        sink |= {"reverse_topic_filters": [], "local_username": None, "local_password": None}
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
