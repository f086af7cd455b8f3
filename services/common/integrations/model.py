"""What an integration is: where the integrations stage (:mod:`services.integrations`) sends
the broker's messages, and which of them.

An :class:`Integration` has a unique name, an enabled flag, Topic Filters (MQTT wildcards,
MQTT 5.0 section 4.7; matched by the router's own trie,
:class:`~services.common.topics.trie.SubscriptionTrie`), an optional Client Identifier
pattern (shell style: ``sensor-*``), a payload format (:class:`PayloadFormat`, the JSON one
is :mod:`.message_format`) and a sink: today a topic of another Kafka cluster
(:class:`KafkaSink`), whose record topic and key are templates (:func:`render`). The SASL
password of a sink is a :class:`SinkSecrets`: stored, given to the stage, never shown
(:func:`public_view`).

:func:`check_integration` is the one check every writer (CLI, admin API) applies;
:class:`IntegrationError` says what is wrong.
"""

from __future__ import annotations

import fnmatch
import re
import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Any

from services.common.mqtt.errors import MQTTError
from services.common.topics.validation import SHARE_PREFIX, validate_topic_filter

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
"""An integration's name: 1 to 64 letters, digits, ``.``, ``_``, ``-``, not starting with a
punctuation mark (it names a Prometheus label value and Kafka group and transactional ids)."""

MAX_TOPIC_FILTERS = 100
"""Topic Filters one integration may have."""

SASL_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN")
"""SASL mechanisms the Kafka sink can log in with (MSK IAM is not supported yet)."""

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
"""Kafka security protocols of the Kafka sink (Kafka's ``security.protocol``)."""

_TEMPLATE_VARIABLE = re.compile(r"\$\{([^}]*)\}")
_LEVEL = re.compile(r"^topic_level\[(\d{1,2})\]$")
_KAFKA_TOPIC_ILLEGAL = re.compile(r"[^A-Za-z0-9._-]")


class IntegrationError(ValueError):
    """An integration that cannot be stored or run; the message says what is wrong."""


class IntegrationKind(StrEnum):
    """Where an integration sends messages."""

    KAFKA = "kafka"


class PayloadFormat(StrEnum):
    """What a sink receives of a message: the payload's bytes as published (``raw``), or
    the JSON document of :mod:`.message_format` (``json``)."""

    RAW = "raw"
    JSON = "json"


@dataclass(frozen=True, slots=True)
class KafkaSink:
    """A topic of another Kafka cluster.

    ``bootstrap``: ``host:port[,host:port...]``; ``topic`` and ``key``: templates
    (:func:`render`) of the record's topic and key; ``security_protocol`` one of
    :data:`SECURITY_PROTOCOLS`; ``sasl_mechanism`` one of :data:`SASL_MECHANISMS` with
    ``sasl_username`` (the password is a :class:`SinkSecrets`); ``ssl_cafile``: a CA bundle
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
            )
        except (KeyError, TypeError) as exc:
            raise IntegrationError(f"not a Kafka sink: {exc!r}") from None


@dataclass(frozen=True, slots=True)
class SinkSecrets:
    """A sink's secrets: the SASL password. Its ``repr`` never shows it."""

    sasl_password: str | None = field(default=None, repr=False)

    def to_json(self) -> dict[str, Any]:
        """The secrets as stored (never shown)."""
        return {} if self.sasl_password is None else {"sasl_password": self.sasl_password}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SinkSecrets:
        """The secrets :meth:`to_json` gave."""
        password = data.get("sasl_password")
        return cls(None if password is None else str(password))


@dataclass(frozen=True, slots=True)
class Integration:
    """One integration (see the module). ``revision`` grows with every stored change;
    ``updated_at`` is when it last changed (a sink with no stored position starts with the
    messages accepted from then on, :mod:`services.integrations.stage`)."""

    id: uuid.UUID
    name: str
    kind: IntegrationKind
    topic_filters: tuple[str, ...]
    sink: KafkaSink
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
    sink: KafkaSink,
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
    4.7; a Shared Subscription's), the Client Identifier pattern, the templates, the Kafka
    security settings."""
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
    sink = integration.sink
    if not sink.bootstrap.strip():
        raise IntegrationError("the Kafka sink needs a bootstrap address (host:port)")
    check_template(sink.topic, "topic")
    check_template(sink.key, "key")
    if sink.security_protocol not in SECURITY_PROTOCOLS:
        raise IntegrationError(
            f"security protocol {sink.security_protocol!r}: one of {', '.join(SECURITY_PROTOCOLS)}"
        )
    sasl = sink.security_protocol.startswith("SASL_")
    if sasl:
        if sink.sasl_mechanism not in SASL_MECHANISMS:
            raise IntegrationError(
                f"SASL mechanism {sink.sasl_mechanism!r}: one of {', '.join(SASL_MECHANISMS)} "
                "(MSK IAM is not supported yet)"
            )
        if not sink.sasl_username or not integration.secrets.sasl_password:
            raise IntegrationError("SASL needs a user name and a password")
    elif sink.sasl_mechanism or sink.sasl_username or integration.secrets.sasl_password:
        raise IntegrationError("SASL settings need security protocol SASL_PLAINTEXT or SASL_SSL")
    if sink.ssl_cafile and not sink.security_protocol.endswith("SSL"):
        raise IntegrationError("a CA file needs security protocol SSL or SASL_SSL")
    events = sink.events_topic
    if events is not None and (not events or kafka_topic_name(events) != events):
        raise IntegrationError(
            f"events topic {events!r}: a Kafka topic name (letters, digits, '.', '_', '-')"
        )
    return integration


def changed(integration: Integration, **changes: Any) -> Integration:
    """``integration`` with ``changes`` (field name → value), checked. Raises
    :class:`IntegrationError`."""
    return check_integration(replace(integration, **changes))


def public_view(integration: Integration) -> dict[str, Any]:
    """``integration`` as JSON for people and machines (CLI ``--json``, admin API): every
    field but the secrets, of which only whether a SASL password is set."""
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
        "revision": integration.revision,
        "created_at": None
        if integration.created_at is None
        else integration.created_at.isoformat(),
        "updated_at": None
        if integration.updated_at is None
        else integration.updated_at.isoformat(),
    }
