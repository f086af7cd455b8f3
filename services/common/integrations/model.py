"""What an integration is: where the integrations stage (:mod:`services.integrations`) sends
the broker's messages, and which of them.

An :class:`Integration` has a unique name, an enabled flag, Topic Filters (MQTT wildcards,
MQTT 5.0 section 4.7; matched by the router's own trie,
:class:`~services.common.topics.trie.SubscriptionTrie`), an optional Client Identifier
pattern (shell style: ``sensor-*``), a payload format (:class:`PayloadFormat`, the JSON one
is :mod:`.message_format`) and a sink of its kind (:class:`IntegrationKind`): a topic of
another Kafka cluster (:class:`KafkaSink`), whose record topic and key are templates
(:func:`render`), or an HTTP endpoint (:class:`WebhookSink`). :data:`Sink` is the union of
the sink types and :data:`SINK_TYPES` their one table by kind (:func:`sink_from_json`
reads a stored sink). A sink's secrets (the Kafka sink's SASL password, the webhook's
signing secret) are a :class:`SinkSecrets`: stored, given to the stage, never shown
(:func:`public_view`).

:func:`check_integration` is the one check every writer (CLI, admin API) applies;
:class:`IntegrationError` says what is wrong.
"""

from __future__ import annotations

import fnmatch
import re
import urllib.parse
import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Any

import httpx

from services.common.integrations.topic_mapping import (
    check_prefix,
    filters_overlap,
    map_topic,
    under_prefix,
)
from services.common.mqtt.errors import MQTTError
from services.common.topics.validation import SHARE_PREFIX, validate_topic_filter

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
"""An integration's name: 1 to 64 letters, digits, ``.``, ``_``, ``-``, not starting with a
punctuation mark (it names a Prometheus label value and Kafka group and transactional ids)."""

MAX_TOPIC_FILTERS = 100
"""Topic Filters one integration may have."""

MSK_IAM = "AWS_MSK_IAM"
"""The Kafka sink's SASL mechanism for Amazon MSK IAM authentication: SASL/OAUTHBEARER with
tokens signed by the stage's AWS credentials
(:class:`~services.common.kafka.security.MskIamTokenProvider`), over TLS only."""

SASL_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN", MSK_IAM)
"""SASL mechanisms the Kafka sink can log in with."""

AWS_REGION_PATTERN = r"^[a-z]{2}(-[a-z]+)+-[0-9]{1,2}$"
"""An AWS Region's code (``eu-west-1``, ``us-gov-west-1``)."""

AWS_ROLE_ARN_PATTERN = r"^arn:aws(-[a-z]+)*:iam::[0-9]{12}:role/[A-Za-z0-9_+=,.@/-]{1,512}$"
"""An IAM role's ARN (``arn:aws:iam::123456789012:role/path/name``), as STS AssumeRole
takes it."""

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
"""Kafka security protocols of the Kafka sink (Kafka's ``security.protocol``)."""

MIN_SIGNING_SECRET = 32
"""The shortest signing secret of a webhook (characters), as for ``auth_http_secret``."""

WEBHOOK_LIMITS: dict[str, tuple[float, float]] = {
    "batch_size": (1, 1000),
    "linger_seconds": (0, 60),
    "timeout_seconds": (0.1, 300),
    "max_attempts": (1, 100),
    "backoff_seconds": (0.01, 3600),
    "backoff_max_seconds": (0.01, 3600),
    "max_in_flight": (1, 64),
}
"""The smallest and largest value of each number of a :class:`WebhookSink`."""

RESERVED_HEADERS = frozenset(
    {
        "content-type",
        "content-length",
        "host",
        "transfer-encoding",
        "connection",
        "x-cormorant-timestamp",
        "x-cormorant-signature",
        "x-cormorant-integration",
        "x-cormorant-topic",
        "x-cormorant-client-id",
    }
)
"""Headers (lowercase) the webhook sets itself, refused among a sink's headers."""

_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}$")
_URL_ILLEGAL = re.compile(r"[\x00-\x20\x7f]")
_HEADER_VALUE = re.compile(r"^[\t\x20-\x7e]{0,4096}$")
_TEMPLATE_VARIABLE = re.compile(r"\$\{([^}]*)\}")
_LEVEL = re.compile(r"^topic_level\[(\d{1,2})\]$")
_KAFKA_TOPIC_ILLEGAL = re.compile(r"[^A-Za-z0-9._-]")


class IntegrationError(ValueError):
    """An integration that cannot be stored or run; the message says what is wrong."""


class IntegrationKind(StrEnum):
    """Where an integration sends messages: a Kafka topic of another cluster (``kafka``,
    exactly once), an HTTP endpoint (``webhook``) or another MQTT broker (``mqtt``, the
    bridge), both at least once."""

    KAFKA = "kafka"
    WEBHOOK = "webhook"
    MQTT = "mqtt"


class PayloadFormat(StrEnum):
    """What a sink receives of a message: the payload's bytes as published (``raw``), or
    the JSON document of :mod:`.message_format` (``json``)."""

    RAW = "raw"
    JSON = "json"


def default_payload_format(kind: IntegrationKind) -> PayloadFormat:
    """The payload format of an integration of ``kind`` added without one: ``raw`` for an
    MQTT bridge (the payload goes on as published, its properties beside it), ``json``
    for the others."""
    return PayloadFormat.RAW if kind is IntegrationKind.MQTT else PayloadFormat.JSON


@dataclass(frozen=True, slots=True)
class KafkaSink:
    """A topic of another Kafka cluster.

    ``bootstrap``: ``host:port[,host:port...]``; ``topic`` and ``key``: templates
    (:func:`render`) of the record's topic and key; ``security_protocol`` one of
    :data:`SECURITY_PROTOCOLS`; ``sasl_mechanism`` one of :data:`SASL_MECHANISMS` with
    ``sasl_username`` (the password is a :class:`SinkSecrets`), or :data:`MSK_IAM` with
    ``aws_region`` (the cluster's Region) and, for a cluster of another account,
    ``aws_role_arn``: a role the stage's credentials assume (no secret: the stage's own
    AWS credentials sign); ``ssl_cafile``: a CA bundle
    on the stage's hosts that signed the cluster's certificates (None: the system's);
    ``events_topic``: a topic of that cluster that also receives the clients' lifecycle
    events (:mod:`.event_format`; None: no events stream).
    """

    bootstrap: str
    topic: str
    key: str = "${client_id}"
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    ssl_cafile: str | None = None
    events_topic: str | None = None
    aws_region: str | None = None
    aws_role_arn: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The sink as stored and shown (no secret in it)."""
        return {
            "bootstrap": self.bootstrap,
            "topic": self.topic,
            "key": self.key,
            "security_protocol": self.security_protocol,
            "sasl_mechanism": self.sasl_mechanism,
            "sasl_username": self.sasl_username,
            "ssl_cafile": self.ssl_cafile,
            "events_topic": self.events_topic,
            "aws_region": self.aws_region,
            "aws_role_arn": self.aws_role_arn,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> KafkaSink:
        """The sink :meth:`to_json` gave. Raises :class:`IntegrationError` on garbage."""
        try:
            return cls(
                bootstrap=str(data["bootstrap"]),
                topic=str(data["topic"]),
                key=str(data.get("key", "${client_id}")),
                security_protocol=str(data.get("security_protocol", "PLAINTEXT")),
                sasl_mechanism=data.get("sasl_mechanism"),
                sasl_username=data.get("sasl_username"),
                ssl_cafile=data.get("ssl_cafile"),
                events_topic=data.get("events_topic"),
                aws_region=data.get("aws_region"),
                aws_role_arn=data.get("aws_role_arn"),
            )
        except (KeyError, TypeError) as exc:
            raise IntegrationError(f"not a Kafka sink: {exc!r}") from None


MQTT_PROTOCOL_VERSIONS = (4, 5)
"""MQTT versions the bridge speaks to the remote broker: 4 (3.1.1) and 5 (5.0)."""


@dataclass(frozen=True, slots=True)
class MqttSink:
    """Another MQTT broker (the MQTT bridge, :mod:`services.integrations.mqtt_bridge`;
    docs/integrations/mqtt-bridge.md).

    ``host``/``port``: the remote broker; ``protocol_version`` 4 (MQTT 3.1.1) or 5;
    ``client_id``: the Client Identifier the bridge's connections are named after (None:
    ``cormorant-<integration name>``); ``username`` (the password is a
    :class:`SinkSecrets`); ``tls``: MQTT over TLS, verifying the broker against ``ca_file``
    (None: the system's CAs), with ``cert_file``/``key_file`` as the client certificate
    when given (PEM files on the stage's hosts); ``qos``: the highest QoS sent (a message
    goes with the lower of its own and this one); ``retain``: keep the RETAIN flag as
    published (False: always 0); ``local_prefix``/``remote_prefix``: the topic mapping
    (:mod:`.topic_mapping`); ``reverse_topic_filters``: remote Topic Filters subscribed to
    and published here, mapped back, as the local credential ``local_username`` (its
    password a :class:`SinkSecrets`).
    """

    host: str
    port: int = 1883
    protocol_version: int = 5
    client_id: str | None = None
    username: str | None = None
    tls: bool = False
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    qos: int = 1
    retain: bool = True
    local_prefix: str = ""
    remote_prefix: str = ""
    reverse_topic_filters: tuple[str, ...] = ()
    local_username: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The sink as stored and shown (no secret in it)."""
        return {
            "host": self.host,
            "port": self.port,
            "protocol_version": self.protocol_version,
            "client_id": self.client_id,
            "username": self.username,
            "tls": self.tls,
            "ca_file": self.ca_file,
            "cert_file": self.cert_file,
            "key_file": self.key_file,
            "qos": self.qos,
            "retain": self.retain,
            "local_prefix": self.local_prefix,
            "remote_prefix": self.remote_prefix,
            "reverse_topic_filters": list(self.reverse_topic_filters),
            "local_username": self.local_username,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MqttSink:
        """The sink :meth:`to_json` gave (fields left out take their defaults). Raises
        :class:`IntegrationError` on garbage."""
        try:
            return cls(
                host=str(data["host"]),
                port=int(data.get("port", 1883)),
                protocol_version=int(data.get("protocol_version", 5)),
                client_id=data.get("client_id"),
                username=data.get("username"),
                tls=bool(data.get("tls", False)),
                ca_file=data.get("ca_file"),
                cert_file=data.get("cert_file"),
                key_file=data.get("key_file"),
                qos=int(data.get("qos", 1)),
                retain=bool(data.get("retain", True)),
                local_prefix=str(data.get("local_prefix", "")),
                remote_prefix=str(data.get("remote_prefix", "")),
                reverse_topic_filters=tuple(
                    str(f) for f in data.get("reverse_topic_filters") or ()
                ),
                local_username=data.get("local_username"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise IntegrationError(f"not an MQTT sink: {exc!r}") from None

    def connection_client_id(self, integration_name: str) -> str:
        """The Client Identifier the bridge's connections are named after."""
        return self.client_id or f"cormorant-{integration_name}"


def check_mqtt_sink(sink: MqttSink, secrets: SinkSecrets, topic_filters: tuple[str, ...]) -> None:
    """Raise :class:`IntegrationError` unless the MQTT bridge ``sink`` can run for an
    integration of ``topic_filters``: the address, version, QoS (0 to 2), TLS files (given
    only with TLS; a key needs a certificate), a password only with a user name, prefixes
    (:func:`.topic_mapping.check_prefix`), every Topic Filter under ``local_prefix`` and
    every reverse one valid and under ``remote_prefix`` (so each message maps), a reverse
    direction only with a local user name and password, and no loop: no Topic Name the
    forward direction writes on the remote broker may match a reverse filter
    (:func:`.topic_mapping.filters_overlap`), else each message would come back and go out
    again forever."""
    if not sink.host.strip():
        raise IntegrationError("the MQTT sink needs the remote broker's host")
    if not 1 <= sink.port <= 65535:
        raise IntegrationError(f"port {sink.port}: 1 to 65535")
    if sink.protocol_version not in MQTT_PROTOCOL_VERSIONS:
        raise IntegrationError(f"MQTT version {sink.protocol_version}: 4 (3.1.1) or 5")
    if sink.qos not in (0, 1, 2):
        raise IntegrationError(f"QoS {sink.qos}: 0, 1 or 2")
    if sink.client_id is not None and not 1 <= len(sink.client_id.encode()) <= 200:
        raise IntegrationError("the Client Identifier has 1 to 200 bytes (leave it out for "
                               "cormorant-<name>)")  # fmt: skip
    if not sink.tls and (sink.ca_file or sink.cert_file or sink.key_file):
        raise IntegrationError("a CA file or a client certificate needs TLS")
    if bool(sink.cert_file) != bool(sink.key_file):
        raise IntegrationError("a client certificate needs both its certificate and key file")
    if secrets.sasl_password is not None or secrets.signing_secret is not None:
        raise IntegrationError("a SASL password or a signing secret is not for MQTT bridges")
    if secrets.mqtt_password is not None and not sink.username:
        raise IntegrationError("an MQTT password needs a user name")
    try:
        check_prefix(sink.local_prefix, "local prefix")
        check_prefix(sink.remote_prefix, "remote prefix")
    except ValueError as exc:
        raise IntegrationError(str(exc)) from None
    for topic_filter in topic_filters:
        if not under_prefix(topic_filter, sink.local_prefix):
            raise IntegrationError(
                f"{topic_filter!r} is not under the local prefix {sink.local_prefix!r} "
                "(its first levels must be the prefix's)"
            )
    reverse = sink.reverse_topic_filters
    if len(reverse) > MAX_TOPIC_FILTERS:
        raise IntegrationError(f"at most {MAX_TOPIC_FILTERS} reverse topic filters")
    for topic_filter in reverse:
        if topic_filter.startswith(SHARE_PREFIX):
            raise IntegrationError(f"{topic_filter!r}: shared subscriptions are not filters here")
        try:
            validate_topic_filter(topic_filter)
        except MQTTError:
            raise IntegrationError(f"{topic_filter!r} is not a valid topic filter") from None
        if not under_prefix(topic_filter, sink.remote_prefix):
            raise IntegrationError(
                f"the reverse filter {topic_filter!r} is not under the remote prefix "
                f"{sink.remote_prefix!r}"
            )
        for local in topic_filters:
            sent = map_topic(local, sink.local_prefix, sink.remote_prefix)
            if sent is not None and filters_overlap(sent, topic_filter):
                raise IntegrationError(
                    f"loop: {local!r} is forwarded as {sent!r}, which the reverse filter "
                    f"{topic_filter!r} would bring back"
                )
    if reverse and not (sink.local_username and secrets.local_password):
        raise IntegrationError(
            "the reverse direction publishes here as a credential: give its user name and password"
        )
    if not reverse and (sink.local_username or secrets.local_password):
        raise IntegrationError("a local credential is only used with reverse topic filters")


@dataclass(frozen=True, slots=True)
class WebhookSink:
    """An HTTP endpoint the messages are POSTed to, at least once
    (:mod:`services.integrations.webhook`, docs/integrations/webhook.md).

    ``url``: ``http://`` or ``https://``, no user name or password in it; ``batch_size``:
    messages per request (1: the body is the message as formatted; more: a JSON array of
    the ``json`` documents, so it needs that payload format); ``linger_seconds``: how long
    a batch may wait for more messages before it is sent; ``timeout_seconds``: the whole
    request's deadline; ``max_attempts``: attempts per request before its messages go to
    the dead-letter topic; ``backoff_seconds``/``backoff_max_seconds``: the first and the
    longest pause between two attempts (exponential, with jitter); ``max_in_flight``:
    requests on the way at once; ``headers``: ``(name, value)`` pairs added to every
    request (shown: no credentials here, the signing secret is a :class:`SinkSecrets`);
    ``ssl_cafile``: a CA bundle on the stage's hosts that signed the endpoint's certificate
    (None: the system's).
    """

    url: str
    batch_size: int = 1
    linger_seconds: float = 0.0
    timeout_seconds: float = 10.0
    max_attempts: int = 5
    backoff_seconds: float = 0.5
    backoff_max_seconds: float = 30.0
    max_in_flight: int = 4
    headers: tuple[tuple[str, str], ...] = ()
    ssl_cafile: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The sink as stored and shown (no secret in it)."""
        return {
            "url": self.url,
            "batch_size": self.batch_size,
            "linger_seconds": self.linger_seconds,
            "timeout_seconds": self.timeout_seconds,
            "max_attempts": self.max_attempts,
            "backoff_seconds": self.backoff_seconds,
            "backoff_max_seconds": self.backoff_max_seconds,
            "max_in_flight": self.max_in_flight,
            "headers": [[name, value] for name, value in self.headers],
            "ssl_cafile": self.ssl_cafile,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WebhookSink:
        """The sink :meth:`to_json` gave (a field left out takes its default). Raises
        :class:`IntegrationError` on garbage."""
        defaults = cls("")
        try:
            return cls(
                url=str(data["url"]),
                batch_size=int(data.get("batch_size", defaults.batch_size)),
                linger_seconds=float(data.get("linger_seconds", defaults.linger_seconds)),
                timeout_seconds=float(data.get("timeout_seconds", defaults.timeout_seconds)),
                max_attempts=int(data.get("max_attempts", defaults.max_attempts)),
                backoff_seconds=float(data.get("backoff_seconds", defaults.backoff_seconds)),
                backoff_max_seconds=float(
                    data.get("backoff_max_seconds", defaults.backoff_max_seconds)
                ),
                max_in_flight=int(data.get("max_in_flight", defaults.max_in_flight)),
                headers=tuple((str(name), str(value)) for name, value in data.get("headers", [])),
                ssl_cafile=data.get("ssl_cafile"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise IntegrationError(f"not a webhook sink: {exc!r}") from None


Sink = KafkaSink | WebhookSink | MqttSink
"""Every sink type."""

SINK_TYPES: dict[IntegrationKind, type[KafkaSink] | type[WebhookSink] | type[MqttSink]] = {
    IntegrationKind.KAFKA: KafkaSink,
    IntegrationKind.WEBHOOK: WebhookSink,
    IntegrationKind.MQTT: MqttSink,
}
"""The sink type of each kind (the one table; a kind without one cannot be stored yet)."""


def sink_from_json(kind: IntegrationKind, data: dict[str, Any]) -> Sink:
    """The sink of an integration of ``kind`` that ``to_json`` gave (as stored, or as an
    API body's fields). Raises :class:`IntegrationError` on garbage or a kind without a
    sink type."""
    sink_type = SINK_TYPES.get(kind)
    if sink_type is None:
        raise IntegrationError(f"integrations of kind {kind.value!r} are not supported yet")
    return sink_type.from_json(data)


@dataclass(frozen=True, slots=True)
class SinkSecrets:
    """A sink's secrets: the Kafka sink's SASL password, the webhook's signing secret
    (the HMAC-SHA-256 key of its requests' signatures), the MQTT bridge's Password on the
    remote broker (``mqtt_password``) and its local credential's (``local_password``). Its
    ``repr`` never shows them."""

    sasl_password: str | None = field(default=None, repr=False)
    signing_secret: str | None = field(default=None, repr=False)
    mqtt_password: str | None = field(default=None, repr=False)
    local_password: str | None = field(default=None, repr=False)

    def to_json(self) -> dict[str, Any]:
        """The secrets as stored (never shown)."""
        stored = {
            "sasl_password": self.sasl_password,
            "signing_secret": self.signing_secret,
            "mqtt_password": self.mqtt_password,
            "local_password": self.local_password,
        }
        return {name: value for name, value in stored.items() if value is not None}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SinkSecrets:
        """The secrets :meth:`to_json` gave."""

        def text(name: str) -> str | None:
            value = data.get(name)
            return None if value is None else str(value)

        return cls(
            text("sasl_password"),
            text("signing_secret"),
            text("mqtt_password"),
            text("local_password"),
        )


@dataclass(frozen=True, slots=True)
class Integration:
    """One integration (see the module). ``revision`` grows with every stored change;
    ``updated_at`` is when it last changed (a sink with no stored position starts with the
    messages accepted from then on, :mod:`services.integrations.stage`)."""

    id: uuid.UUID
    name: str
    kind: IntegrationKind
    topic_filters: tuple[str, ...]
    sink: Sink
    payload_format: PayloadFormat = PayloadFormat.JSON
    client_id_filter: str | None = None
    enabled: bool = True
    secrets: SinkSecrets = SinkSecrets()
    revision: int = 1
    created_at: datetime | None = None
    updated_at: datetime | None = None

    def matches_client(self, client_id: str) -> bool:
        """Whether ``client_id`` matches the Client Identifier pattern (shell style,
        case-sensitive; no pattern: every client)."""
        pattern = self.client_id_filter
        return pattern is None or fnmatch.fnmatchcase(client_id, pattern)


def new_integration(
    name: str,
    kind: IntegrationKind,
    topic_filters: tuple[str, ...],
    sink: Sink,
    *,
    payload_format: PayloadFormat = PayloadFormat.JSON,
    client_id_filter: str | None = None,
    enabled: bool = True,
    secrets: SinkSecrets = SinkSecrets(),
) -> Integration:
    """A new integration (not stored yet), checked (:func:`check_integration`). Raises
    :class:`IntegrationError`."""
    return check_integration(
        Integration(
            uuid.uuid4(),
            name,
            kind,
            topic_filters,
            sink,
            payload_format,
            client_id_filter,
            enabled,
            secrets,
        )
    )


def check_template(template: str, what: str) -> None:
    """Raise :class:`IntegrationError` unless ``template`` is text with only the variables
    :func:`render` knows."""
    if not template:
        raise IntegrationError(f"the {what} template is empty")
    for variable in _TEMPLATE_VARIABLE.findall(template):
        if variable not in ("client_id", "topic") and not _LEVEL.match(variable):
            raise IntegrationError(
                f"the {what} template names ${{{variable}}}: use ${{client_id}}, ${{topic}} "
                "or ${topic_level[N]} (N from 0)"
            )


def render(template: str, client_id: str, topic: str) -> str:
    """``template`` with ``${client_id}`` (the publisher's Client Identifier), ``${topic}``
    (the Topic Name) and ``${topic_level[N]}`` (its level N, from 0; empty when it has
    fewer levels) replaced. ``template`` was checked (:func:`check_template`)."""
    levels = topic.split("/")

    def value(match: re.Match[str]) -> str:
        variable = match.group(1)
        if variable == "client_id":
            return client_id
        if variable == "topic":
            return topic
        level = _LEVEL.match(variable)
        assert level is not None
        index = int(level.group(1))
        return levels[index] if index < len(levels) else ""

    return _TEMPLATE_VARIABLE.sub(value, template)


def kafka_topic_name(rendered: str) -> str:
    """A rendered topic template as a Kafka topic name: every character Kafka does not
    allow (outside ``A-Z a-z 0-9 . _ -``; an MQTT ``/`` for one) becomes ``_``, cut to
    Kafka's 249 characters. Raises :class:`IntegrationError` when nothing is left."""
    name = _KAFKA_TOPIC_ILLEGAL.sub("_", rendered)[:249]
    if name in ("", ".", ".."):
        raise IntegrationError(f"the topic template renders {rendered!r}: no Kafka topic name")
    return name


def check_integration(integration: Integration) -> Integration:
    """``integration`` if it can be stored and run; raises :class:`IntegrationError` naming
    what is wrong: the name (:data:`NAME_PATTERN`), a Topic Filter (not valid, MQTT 5.0
    4.7; a Shared Subscription's), the Client Identifier pattern, a sink not of the
    integration's kind, the sink's settings (:func:`check_kafka_sink`,
    :func:`check_webhook_sink`)."""
    if not re.match(NAME_PATTERN, integration.name):
        raise IntegrationError(
            f"{integration.name!r} is not a name: 1 to 64 letters, digits, '.', '_', '-', "
            "starting with a letter or digit"
        )
    filters = integration.topic_filters
    if not filters:
        raise IntegrationError("an integration needs at least one topic filter")
    if len(filters) > MAX_TOPIC_FILTERS:
        raise IntegrationError(f"at most {MAX_TOPIC_FILTERS} topic filters")
    for topic_filter in filters:
        if topic_filter.startswith(SHARE_PREFIX):
            raise IntegrationError(f"{topic_filter!r}: shared subscriptions are not filters here")
        try:
            validate_topic_filter(topic_filter)
        except MQTTError:
            raise IntegrationError(f"{topic_filter!r} is not a valid topic filter") from None
    if integration.client_id_filter is not None and not integration.client_id_filter:
        raise IntegrationError("the client id filter is empty (leave it out for every client)")
    sink_type = SINK_TYPES.get(integration.kind)
    if sink_type is None or not isinstance(integration.sink, sink_type):
        raise IntegrationError(f"not a sink of kind {integration.kind.value!r}")
    sink = integration.sink
    if isinstance(sink, KafkaSink):
        check_kafka_sink(sink, integration.secrets)
    elif isinstance(sink, WebhookSink):
        check_webhook_sink(sink, integration.secrets, integration.payload_format)
    else:
        check_mqtt_sink(sink, integration.secrets, integration.topic_filters)
    if integration.kind is not IntegrationKind.MQTT and (
        integration.secrets.mqtt_password is not None
        or integration.secrets.local_password is not None
    ):
        raise IntegrationError("MQTT passwords are for MQTT bridges")
    return integration


def check_kafka_sink(sink: KafkaSink, secrets: SinkSecrets) -> None:
    """Raise :class:`IntegrationError` unless ``sink`` (with ``secrets``) can run: a
    bootstrap address, the templates, the Kafka security settings: a SASL mechanism with
    SASL; a user name and password with SCRAM and PLAIN; with :data:`MSK_IAM`, TLS
    (``SASL_SSL``: MSK serves IAM on its TLS ports 9098 and 9198 only), a Region
    (:data:`AWS_REGION_PATTERN`), an optional role ARN (:data:`AWS_ROLE_ARN_PATTERN`)
    and no user name or password; AWS settings only with :data:`MSK_IAM`."""
    if not sink.bootstrap.strip():
        raise IntegrationError("the Kafka sink needs a bootstrap address (host:port)")
    check_template(sink.topic, "topic")
    check_template(sink.key, "key")
    if sink.security_protocol not in SECURITY_PROTOCOLS:
        raise IntegrationError(
            f"security protocol {sink.security_protocol!r}: one of {', '.join(SECURITY_PROTOCOLS)}"
        )
    if secrets.signing_secret is not None:
        raise IntegrationError("a signing secret is for webhooks")
    sasl = sink.security_protocol.startswith("SASL_")
    if sasl:
        if sink.sasl_mechanism not in SASL_MECHANISMS:
            raise IntegrationError(
                f"SASL mechanism {sink.sasl_mechanism!r}: one of {', '.join(SASL_MECHANISMS)}"
            )
        if sink.sasl_mechanism == MSK_IAM:
            _check_msk_iam(sink, secrets)
        elif not sink.sasl_username or not secrets.sasl_password:
            raise IntegrationError("SASL needs a user name and a password")
    elif sink.sasl_mechanism or sink.sasl_username or secrets.sasl_password:
        raise IntegrationError("SASL settings need security protocol SASL_PLAINTEXT or SASL_SSL")
    if sink.sasl_mechanism != MSK_IAM and (sink.aws_region or sink.aws_role_arn):
        raise IntegrationError(
            f"an AWS Region or role ARN is for SASL mechanism {MSK_IAM} (MSK IAM)"
        )
    if sink.ssl_cafile and not sink.security_protocol.endswith("SSL"):
        raise IntegrationError("a CA file needs security protocol SSL or SASL_SSL")
    events = sink.events_topic
    if events is not None and (not events or kafka_topic_name(events) != events):
        raise IntegrationError(
            f"events topic {events!r}: a Kafka topic name (letters, digits, '.', '_', '-')"
        )


def _check_msk_iam(sink: KafkaSink, secrets: SinkSecrets) -> None:
    """The MSK IAM part of :func:`check_kafka_sink`."""
    if sink.security_protocol != "SASL_SSL":
        raise IntegrationError(
            f"{MSK_IAM} needs security protocol SASL_SSL: MSK takes IAM logins over TLS only "
            "(port 9098, or 9198 from outside its VPC)"
        )
    if sink.sasl_username or secrets.sasl_password:
        raise IntegrationError(
            f"{MSK_IAM} takes no user name or password: the stage's AWS credentials sign"
        )
    if not sink.aws_region:
        raise IntegrationError(f"{MSK_IAM} needs the cluster's AWS Region (eu-west-1)")
    if not re.fullmatch(AWS_REGION_PATTERN, sink.aws_region):
        raise IntegrationError(f"{sink.aws_region!r} is not an AWS Region (eu-west-1)")
    role = sink.aws_role_arn
    if role is not None and not re.fullmatch(AWS_ROLE_ARN_PATTERN, role):
        raise IntegrationError(
            f"{role!r} is not an IAM role ARN (arn:aws:iam::123456789012:role/name)"
        )


def _check_range(what: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise IntegrationError(f"{what} {value}: from {low:g} to {high:g}")


def check_webhook_sink(
    sink: WebhookSink, secrets: SinkSecrets, payload_format: PayloadFormat
) -> None:
    """Raise :class:`IntegrationError` unless ``sink`` (with ``secrets``, sending
    ``payload_format``) can run: an ``http(s)`` URL with a host and no credentials in it,
    a signing secret of :data:`MIN_SIGNING_SECRET` characters or more, batches only of JSON
    documents, the numbers within their limits (:data:`WEBHOOK_LIMITS`), headers that are
    valid (RFC 9110 section 5) and none that the webhook sets itself
    (:data:`RESERVED_HEADERS`)."""
    if _URL_ILLEGAL.search(sink.url):
        raise IntegrationError(f"{sink.url!r} is not a URL (spaces or control characters)")
    try:
        httpx.URL(sink.url)  # what the webhook's client will parse (IDNA host names...)
        url = urllib.parse.urlsplit(sink.url)
        usable = url.scheme in ("http", "https") and bool(url.hostname) and url.port != 0
    except (ValueError, httpx.InvalidURL):  # a port that is not a number, a bad host
        raise IntegrationError(f"{sink.url!r} is not a URL") from None
    if not usable:
        raise IntegrationError("the webhook URL must be http:// or https:// with a host")
    if url.username is not None or url.password is not None:
        raise IntegrationError(
            "no user name or password in the webhook URL (it is shown): requests are signed"
        )
    if secrets.sasl_password is not None:
        raise IntegrationError("a SASL password is for Kafka sinks")
    if secrets.signing_secret is None or len(secrets.signing_secret) < MIN_SIGNING_SECRET:
        raise IntegrationError(
            f"a webhook needs a signing secret of {MIN_SIGNING_SECRET} characters or more "
            "(openssl rand -base64 32)"
        )
    if sink.batch_size > 1 and payload_format is not PayloadFormat.JSON:
        raise IntegrationError("batches (batch size over 1) need the json payload format")
    for what, (low, high) in WEBHOOK_LIMITS.items():
        _check_range(what.replace("_", " "), getattr(sink, what), low, high)
    if sink.backoff_max_seconds < sink.backoff_seconds:
        raise IntegrationError("the longest backoff is shorter than the first")
    if sink.ssl_cafile and url.scheme != "https":
        raise IntegrationError("a CA file needs an https:// URL")
    if sink.ssl_cafile and "\x00" in sink.ssl_cafile:
        raise IntegrationError("the CA file's name holds a NUL character")
    for name, value in sink.headers:
        if not _HEADER_NAME.match(name):
            raise IntegrationError(f"{name!r} is not an HTTP header name")
        if name.lower() in RESERVED_HEADERS:
            raise IntegrationError(f"the webhook sets header {name!r} itself")
        if not _HEADER_VALUE.match(value):
            raise IntegrationError(
                f"the value of header {name!r} is not a valid header value (printable ASCII)"
            )


def changed(integration: Integration, **changes: Any) -> Integration:
    """``integration`` with ``changes`` (field name → value), checked. Raises
    :class:`IntegrationError`."""
    return check_integration(replace(integration, **changes))


def public_view(integration: Integration) -> dict[str, Any]:
    """``integration`` as JSON for people and machines (CLI ``--json``, admin API): every
    field but the secrets, of which only whether each is set."""
    return {
        "id": str(integration.id),
        "name": integration.name,
        "enabled": integration.enabled,
        "kind": integration.kind.value,
        "topic_filters": list(integration.topic_filters),
        "client_id_filter": integration.client_id_filter,
        "payload_format": integration.payload_format.value,
        "sink": integration.sink.to_json(),
        "sasl_password_set": integration.secrets.sasl_password is not None,
        "signing_secret_set": integration.secrets.signing_secret is not None,
        "mqtt_password_set": integration.secrets.mqtt_password is not None,
        "local_password_set": integration.secrets.local_password is not None,
        "revision": integration.revision,
        "created_at": None
        if integration.created_at is None
        else integration.created_at.isoformat(),
        "updated_at": None
        if integration.updated_at is None
        else integration.updated_at.isoformat(),
    }
