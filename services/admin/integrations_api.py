"""The integrations API (``/api/integrations``): list, add, show, change (enable and
disable included), delete (docs/integrations/index.md).

Integrations live in PostgreSQL (:class:`~services.common.integrations.store.
IntegrationStore`, over the credential store's pool) and are checked by
:func:`~services.common.integrations.model.check_integration`, the one check; every change
reaches the integrations stage within a second (PostgreSQL's notification). A sink's
secrets (a Kafka sink's SASL password, a webhook's signing secret) are write-only: answers
say only whether each is set, and the audit trail never holds them. Every change is
audited. The ``sink`` of a body is the one of the integration's ``kind``
(:data:`~services.common.integrations.model.SINK_TYPES`). The list and an
integration's page carry its ``status`` (state, counters, last error:
:mod:`services.admin.integration_status`).
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Path, Request, Response
from pydantic import BaseModel, ConfigDict, Field, SecretStr
from pydantic.types import NonNegativeFloat, PositiveFloat, PositiveInt

from services.admin import models
from services.admin.auth import ERRORS, User
from services.admin.context import StoreChangeAudit, context_of
from services.admin.integration_status import IntegrationStatus, Reported, reported, status_of
from services.common.integrations.model import (
    MAX_TOPIC_FILTERS,
    NAME_PATTERN,
    Integration,
    IntegrationError,
    IntegrationKind,
    KafkaSink,
    MqttSink,
    PayloadFormat,
    SinkSecrets,
    changed,
    default_payload_format,
    new_integration,
    sink_from_json,
)
from services.common.integrations.store import (
    IntegrationConflict,
    IntegrationNotFound,
    IntegrationStore,
)

router = APIRouter(prefix="/api/integrations", tags=["integrations"])
"""Included by :func:`services.admin.api.create_app`."""

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN", "AWS_MSK_IAM"]
Kind = Literal["kafka", "webhook", "mqtt"]
Header = tuple[
    Annotated[str, Field(min_length=1, max_length=256)], Annotated[str, Field(max_length=4096)]
]

SECRETS = ("sasl_password", "signing_secret", "mqtt_password", "local_password")
"""The secret fields of a sink body (kept in :class:`SinkSecrets`, never shown)."""

NULLABLE = (
    "sasl_mechanism",
    "sasl_username",
    "ssl_cafile",
    "client_id",
    "username",
    "ca_file",
    "cert_file",
    "key_file",
    "local_username",
    "aws_region",
    "aws_role_arn",
)
"""The sink settings a change may clear with ``null``."""

_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": models.Problem, "description": "No such integration."}
}
_CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {"model": models.Problem, "description": "An integration with this name exists."}
}
_UNAVAILABLE: dict[int | str, dict[str, Any]] = {
    503: {"model": models.Problem, "description": "PostgreSQL did not answer."}
}

Ref = Annotated[
    str,
    Path(max_length=64, description="The integration's name (or its id)."),
]


class KafkaSinkView(BaseModel):
    """A Kafka sink as stored, without its password."""

    bootstrap: str
    topic: str
    key: str
    security_protocol: SecurityProtocol
    sasl_mechanism: SaslMechanism | None
    sasl_username: str | None
    sasl_password_set: bool
    ssl_cafile: str | None
    events_topic: str | None
    aws_region: str | None
    aws_role_arn: str | None


class WebhookSinkView(BaseModel):
    """A webhook as stored, without its signing secret."""

    url: str
    batch_size: int
    linger_seconds: float
    timeout_seconds: float
    max_attempts: int
    backoff_seconds: float
    backoff_max_seconds: float
    max_in_flight: int
    headers: list[tuple[str, str]]
    ssl_cafile: str | None
    signing_secret_set: bool


class MqttSinkView(BaseModel):
    """An MQTT bridge's other broker as stored, without its passwords."""

    host: str
    port: int
    protocol_version: Literal[4, 5]
    client_id: str | None
    username: str | None
    tls: bool
    ca_file: str | None
    cert_file: str | None
    key_file: str | None
    qos: Literal[0, 1, 2]
    retain: bool
    local_prefix: str
    remote_prefix: str
    reverse_topic_filters: list[str]
    local_username: str | None
    mqtt_password_set: bool
    local_password_set: bool


class IntegrationView(BaseModel):
    """An integration as stored, without secrets."""

    id: uuid.UUID
    name: str
    enabled: bool
    kind: Kind
    topic_filters: list[str]
    client_id_filter: str | None
    payload_format: Literal["raw", "json"]
    sink: KafkaSinkView | WebhookSinkView | MqttSinkView
    revision: int
    created_at: datetime | None
    updated_at: datetime | None
    status: IntegrationStatus | None = Field(
        None,
        description="What the integrations stages say of it (in the list and an "
        "integration's page; null in the answers to changes).",
    )


class IntegrationList(BaseModel):
    """The integrations, by name."""

    integrations: list[IntegrationView]


class KafkaSinkBody(BaseModel):
    """A topic of another Kafka cluster: ``bootstrap`` (``host:port[,...]``), the record's
    ``topic`` and ``key`` templates (``${client_id}``, ``${topic}``, ``${topic_level[N]}``;
    characters a Kafka topic name cannot hold become ``_``), the security protocol, SASL
    mechanism, user name and password (write-only), a CA file on the stage's hosts,
    ``events_topic``: a topic of the same cluster that also receives the clients'
    lifecycle events (schema ``cormorant.client_event/1``; leave it out for none), and for
    Amazon MSK IAM (``sasl_mechanism`` ``AWS_MSK_IAM``, ``SASL_SSL`` only, no user name or
    password) the cluster's ``aws_region`` and, for a cluster of another account, the
    ``aws_role_arn`` the stage assumes."""

    model_config = ConfigDict(extra="forbid")

    bootstrap: str = Field(min_length=1, max_length=2048)
    topic: str = Field(min_length=1, max_length=1024)
    key: str = Field("${client_id}", min_length=1, max_length=1024)
    security_protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: SaslMechanism | None = None
    sasl_username: str | None = Field(None, max_length=1024)
    sasl_password: SecretStr | None = None
    ssl_cafile: str | None = Field(None, max_length=4096)
    events_topic: str | None = Field(None, min_length=1, max_length=249)
    aws_region: str | None = Field(None, min_length=1, max_length=64)
    aws_role_arn: str | None = Field(None, min_length=1, max_length=2048)


class WebhookSinkBody(BaseModel):
    """An HTTP endpoint the messages are POSTed to (docs/integrations/webhook.md): its
    ``url``, messages per request (``batch_size``; over 1 needs the json format) and how
    long a batch may wait for more (``linger_seconds``), each request's
    ``timeout_seconds``, ``max_attempts`` before its messages go to the dead-letter topic,
    the first and the longest pause between attempts, requests on the way at once
    (``max_in_flight``), ``headers`` added to each request (``[name, value]`` pairs,
    shown), a CA file on the stage's hosts, and the ``signing_secret`` (write-only, 32
    characters or more) of the HMAC-SHA-256 signature of each request."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(min_length=1, max_length=4096)
    batch_size: PositiveInt = 1
    linger_seconds: NonNegativeFloat = 0.0
    timeout_seconds: PositiveFloat = 10.0
    max_attempts: PositiveInt = 5
    backoff_seconds: PositiveFloat = 0.5
    backoff_max_seconds: PositiveFloat = 30.0
    max_in_flight: PositiveInt = 4
    headers: list[Header] = Field(default_factory=list, max_length=64)
    ssl_cafile: str | None = Field(None, max_length=4096)
    signing_secret: SecretStr = Field(min_length=1, max_length=4096)


class MqttSinkBody(BaseModel):
    """Another MQTT broker (docs/integrations/mqtt-bridge.md): its ``host`` and ``port``,
    ``protocol_version`` 4 (3.1.1) or 5, the ``client_id`` its connections are named
    after (default ``cormorant-<name>``), ``username`` and ``mqtt_password``
    (write-only), TLS (``tls``, a ``ca_file``, a client certificate ``cert_file`` and
    ``key_file``: files on the stage's hosts), the highest ``qos`` sent, whether
    ``retain`` flags are kept, the topic mapping (``local_prefix`` → ``remote_prefix``,
    whole levels), and the reverse direction: remote ``reverse_topic_filters`` published
    here as the credential ``local_username``/``local_password`` (write-only)."""

    model_config = ConfigDict(extra="forbid")

    host: str = Field(min_length=1, max_length=1024)
    port: int = Field(1883, ge=1, le=65535)
    protocol_version: Literal[4, 5] = 5
    client_id: str | None = Field(None, min_length=1, max_length=200)
    username: str | None = Field(None, max_length=1024)
    mqtt_password: SecretStr | None = Field(None, max_length=4096)
    tls: bool = False
    ca_file: str | None = Field(None, max_length=4096)
    cert_file: str | None = Field(None, max_length=4096)
    key_file: str | None = Field(None, max_length=4096)
    qos: Literal[0, 1, 2] = 1
    retain: bool = True
    local_prefix: str = Field("", max_length=1024)
    remote_prefix: str = Field("", max_length=1024)
    reverse_topic_filters: list[str] = Field(default_factory=list, max_length=MAX_TOPIC_FILTERS)
    local_username: str | None = Field(None, max_length=1024)
    local_password: SecretStr | None = Field(None, max_length=4096)


class NewIntegration(BaseModel):
    """An integration to add: its ``name``, ``kind``, Topic Filters, optional Client
    Identifier pattern (shell style, ``sensor-*``), payload format and the sink of its
    kind."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN)
    kind: Kind = "kafka"
    topic_filters: list[str] = Field(min_length=1, max_length=MAX_TOPIC_FILTERS)
    client_id_filter: str | None = Field(None, min_length=1, max_length=1024)
    payload_format: Literal["raw", "json"] | None = Field(
        None, description="Default: raw for an MQTT bridge, json for the other kinds."
    )
    enabled: bool = True
    sink: KafkaSinkBody | WebhookSinkBody | MqttSinkBody


class KafkaSinkChanges(BaseModel):
    """Changes to a Kafka sink: a field left out is kept, ``null`` clears an optional one
    (``sasl_mechanism``, ``sasl_username``, ``sasl_password``, ``ssl_cafile``,
    ``events_topic``, ``aws_region``, ``aws_role_arn``)."""

    model_config = ConfigDict(extra="forbid")

    bootstrap: str | None = Field(None, min_length=1, max_length=2048)
    topic: str | None = Field(None, min_length=1, max_length=1024)
    key: str | None = Field(None, min_length=1, max_length=1024)
    security_protocol: SecurityProtocol | None = None
    sasl_mechanism: SaslMechanism | None = None
    sasl_username: str | None = Field(None, max_length=1024)
    sasl_password: SecretStr | None = None
    ssl_cafile: str | None = Field(None, max_length=4096)
    events_topic: str | None = Field(None, min_length=1, max_length=249)
    aws_region: str | None = Field(None, min_length=1, max_length=64)
    aws_role_arn: str | None = Field(None, min_length=1, max_length=2048)


class WebhookSinkChanges(BaseModel):
    """Changes to a webhook: a field left out is kept, ``ssl_cafile: null`` clears it,
    ``headers`` replaces them all."""

    model_config = ConfigDict(extra="forbid")

    url: str | None = Field(None, min_length=1, max_length=4096)
    batch_size: PositiveInt | None = None
    linger_seconds: NonNegativeFloat | None = None
    timeout_seconds: PositiveFloat | None = None
    max_attempts: PositiveInt | None = None
    backoff_seconds: PositiveFloat | None = None
    backoff_max_seconds: PositiveFloat | None = None
    max_in_flight: PositiveInt | None = None
    headers: list[Header] | None = Field(None, max_length=64)
    ssl_cafile: str | None = Field(None, max_length=4096)
    signing_secret: SecretStr | None = Field(None, min_length=1, max_length=4096)


class MqttSinkChanges(BaseModel):
    """Changes to an MQTT bridge's sink: a field left out is kept, ``null`` clears an
    optional one (``client_id``, ``username``, ``mqtt_password``, ``ca_file``,
    ``cert_file``, ``key_file``, ``local_username``, ``local_password``),
    ``reverse_topic_filters`` replaces them all (``[]``: no reverse direction)."""

    model_config = ConfigDict(extra="forbid")

    host: str | None = Field(None, min_length=1, max_length=1024)
    port: int | None = Field(None, ge=1, le=65535)
    protocol_version: Literal[4, 5] | None = None
    client_id: str | None = Field(None, min_length=1, max_length=200)
    username: str | None = Field(None, max_length=1024)
    mqtt_password: SecretStr | None = Field(None, max_length=4096)
    tls: bool | None = None
    ca_file: str | None = Field(None, max_length=4096)
    cert_file: str | None = Field(None, max_length=4096)
    key_file: str | None = Field(None, max_length=4096)
    qos: Literal[0, 1, 2] | None = None
    retain: bool | None = None
    local_prefix: str | None = Field(None, max_length=1024)
    remote_prefix: str | None = Field(None, max_length=1024)
    reverse_topic_filters: list[str] | None = Field(None, max_length=MAX_TOPIC_FILTERS)
    local_username: str | None = Field(None, max_length=1024)
    local_password: SecretStr | None = Field(None, max_length=4096)


class IntegrationChanges(BaseModel):
    """Changes to an integration: a field left out is kept; ``client_id_filter: null``
    takes every client again."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool | None = None
    topic_filters: list[str] | None = Field(None, min_length=1, max_length=MAX_TOPIC_FILTERS)
    client_id_filter: str | None = Field(None, min_length=1, max_length=1024)
    payload_format: Literal["raw", "json"] | None = None
    sink: KafkaSinkChanges | WebhookSinkChanges | MqttSinkChanges | None = None


def view(integration: Integration, found: dict[str, Reported] | None = None) -> IntegrationView:
    """``integration`` as the API shows it (no secret: only whether each is set), with its
    status when what the stages reported is ``found``
    (:func:`~services.admin.integration_status.reported`)."""
    sink = integration.sink
    secrets = integration.secrets
    shown: KafkaSinkView | WebhookSinkView | MqttSinkView
    if isinstance(sink, KafkaSink):
        shown = KafkaSinkView(**sink.to_json(), sasl_password_set=secrets.sasl_password is not None)
    elif isinstance(sink, MqttSink):
        shown = MqttSinkView(
            **sink.to_json(),
            mqtt_password_set=secrets.mqtt_password is not None,
            local_password_set=secrets.local_password is not None,
        )
    else:
        shown = WebhookSinkView(
            **sink.to_json(), signing_secret_set=secrets.signing_secret is not None
        )
    return IntegrationView(
        id=integration.id,
        name=integration.name,
        enabled=integration.enabled,
        kind=integration.kind.value,
        topic_filters=list(integration.topic_filters),
        client_id_filter=integration.client_id_filter,
        payload_format=integration.payload_format.value,
        sink=shown,
        revision=integration.revision,
        created_at=integration.created_at,
        updated_at=integration.updated_at,
        status=None if found is None else status_of(integration, found),
    )


def _password(secret: SecretStr | None) -> str | None:
    return None if secret is None else secret.get_secret_value()


def _sink_values(body: BaseModel, given: set[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``given`` fields of a sink ``body``: ``(settings, secrets)`` as stored."""
    settings: dict[str, Any] = {}
    secrets: dict[str, Any] = {}
    for name in given:
        value = getattr(body, name)
        if name in SECRETS:
            secrets[name] = _password(value)
        elif name == "headers" and value is not None:
            settings[name] = [list(header) for header in value]
        else:
            settings[name] = value
    return settings, secrets


def _changed_sink(stored: Integration, body: BaseModel) -> dict[str, Any]:
    """The changes (field name → value) ``body`` (a sink's changes) makes to ``stored``'s
    sink and secrets. Raises :class:`IntegrationError` for a setting the kind's sink does
    not have, or one cleared that cannot be."""
    settings, secrets = _sink_values(body, body.model_fields_set)
    values = stored.sink.to_json()
    kind = stored.kind.value
    for name, value in settings.items():
        if name not in values:
            raise IntegrationError(f"sink.{name} is not a setting of a {kind} sink")
        if value is None and name not in NULLABLE:
            raise IntegrationError(f"sink.{name} cannot be cleared")
        values[name] = value
    changes: dict[str, Any] = {"sink": sink_from_json(stored.kind, values)}
    if secrets:
        changes["secrets"] = replace(stored.secrets, **secrets)
    return changes


def _changed_integration(stored: Integration, body: IntegrationChanges) -> Integration:
    """``stored`` with ``body``'s changes, checked. Raises :class:`IntegrationError`."""
    changes: dict[str, Any] = {}
    given = body.model_fields_set
    if body.enabled is not None:
        changes["enabled"] = body.enabled
    if body.topic_filters is not None:
        changes["topic_filters"] = tuple(body.topic_filters)
    if "client_id_filter" in given:
        changes["client_id_filter"] = body.client_id_filter
    if body.payload_format is not None:
        changes["payload_format"] = PayloadFormat(body.payload_format)
    if body.sink is not None:
        changes.update(_changed_sink(stored, body.sink))
    return changed(stored, **changes)


def _store(request: Request) -> IntegrationStore:
    return IntegrationStore(request.app.state.context.credentials.store.pool)


def _reported(request: Request) -> dict[str, Reported]:
    """What the stages reported at the admin service's last probe of the cluster."""
    return reported(context_of(request).sampler.probes)


def _detail(body: BaseModel) -> dict[str, Any]:
    """What the audit trail keeps of a request: its fields, the secrets only as set or
    cleared."""
    detail = body.model_dump(exclude_unset=True, mode="json")
    sink = detail.get("sink")
    if isinstance(sink, dict):
        for name in SECRETS:
            if name in sink:
                sink[name] = "set" if sink[name] is not None else None
    return detail


_audited = StoreChangeAudit(
    invalid=IntegrationError, not_found=IntegrationNotFound, conflict=IntegrationConflict
)
"""Carries out a change of the integrations and audits it (422, 404, 409 for their errors)."""


@router.get("", response_model=IntegrationList, responses={**ERRORS, **_UNAVAILABLE})
async def list_integrations(request: Request, user: User) -> IntegrationList:
    """Every integration, by name, with its status."""
    integrations = await _store(request).all()
    found = _reported(request)
    return IntegrationList(integrations=[view(i, found) for i in integrations])


@router.post(
    "",
    status_code=201,
    response_model=IntegrationView,
    responses={**ERRORS, **_CONFLICT, **_UNAVAILABLE},
)
async def add_integration(request: Request, body: NewIntegration, user: User) -> IntegrationView:
    """Add an integration; the integrations stage starts it within a second (with the
    messages accepted from then on)."""

    async def change() -> Integration:
        kind = IntegrationKind(body.kind)
        settings, secrets = _sink_values(body.sink, set(type(body.sink).model_fields))
        integration = new_integration(
            body.name,
            kind,
            tuple(body.topic_filters),
            sink_from_json(kind, settings),
            payload_format=default_payload_format(kind)
            if body.payload_format is None
            else PayloadFormat(body.payload_format),
            client_id_filter=body.client_id_filter,
            enabled=body.enabled,
            secrets=SinkSecrets(**secrets),
        )
        return await _store(request).insert(integration)

    added = await _audited(request, user, "add integration", body.name, _detail(body), change, 201)
    return view(added)


@router.get(
    "/{ref}", response_model=IntegrationView, responses={**ERRORS, **_NOT_FOUND, **_UNAVAILABLE}
)
async def show_integration(request: Request, ref: Ref, user: User) -> IntegrationView:
    """One integration, with its status."""
    try:
        return view(await _store(request).get(ref), _reported(request))
    except IntegrationNotFound as exc:
        raise HTTPException(404, str(exc)) from None


@router.patch(
    "/{ref}",
    response_model=IntegrationView,
    responses={**ERRORS, **_NOT_FOUND, **_UNAVAILABLE},
)
async def change_integration(
    request: Request, ref: Ref, body: IntegrationChanges, user: User
) -> IntegrationView:
    """Change an integration (``{"enabled": false}`` disables it); the stage restarts it
    with the change within a second, from where its sink stands."""
    stored = await _audited(
        request,
        user,
        "change integration",
        ref,
        _detail(body),
        lambda: _store(request).update(ref, lambda old: _changed_integration(old, body)),
        200,
    )
    return view(stored)


@router.delete("/{ref}", status_code=204, responses={**ERRORS, **_NOT_FOUND, **_UNAVAILABLE})
async def delete_integration(request: Request, ref: Ref, user: User) -> Response:
    """Delete an integration; the stage stops it within a second."""
    await _audited(
        request, user, "delete integration", ref, {}, lambda: _store(request).delete(ref), 204
    )
    return Response(status_code=204)
