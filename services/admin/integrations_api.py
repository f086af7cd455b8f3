"""The integrations API (``/api/integrations``): list, add, show, change (enable and
disable included), delete (docs/integrations/index.md).

Integrations live in PostgreSQL (:class:`~services.common.integrations.store.
IntegrationStore`, over the credential store's pool) and are checked by
:func:`~services.common.integrations.model.check_integration`, the one check; every change
reaches the integrations stage within a second (PostgreSQL's notification). A sink's SASL
password is write-only: answers say only whether one is set, and the audit trail never
holds it. Every change is audited.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Path, Request, Response
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from services.admin import models
from services.admin.auth import ERRORS, User
from services.admin.context import StoreChangeAudit
from services.common.integrations.model import (
    MAX_TOPIC_FILTERS,
    NAME_PATTERN,
    Integration,
    IntegrationError,
    IntegrationKind,
    KafkaSink,
    PayloadFormat,
    SinkSecrets,
    changed,
    new_integration,
)
from services.common.integrations.store import (
    IntegrationConflict,
    IntegrationNotFound,
    IntegrationStore,
)

router = APIRouter(prefix="/api/integrations", tags=["integrations"])
"""Included by :func:`services.admin.api.create_app`."""

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"]

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


class IntegrationView(BaseModel):
    """An integration as stored, without secrets."""

    id: uuid.UUID
    name: str
    enabled: bool
    kind: Literal["kafka"]
    topic_filters: list[str]
    client_id_filter: str | None
    payload_format: Literal["raw", "json"]
    sink: KafkaSinkView
    revision: int
    created_at: datetime | None
    updated_at: datetime | None


class IntegrationList(BaseModel):
    """The integrations, by name."""

    integrations: list[IntegrationView]


class KafkaSinkBody(BaseModel):
    """A topic of another Kafka cluster: ``bootstrap`` (``host:port[,...]``), the record's
    ``topic`` and ``key`` templates (``${client_id}``, ``${topic}``, ``${topic_level[N]}``;
    characters a Kafka topic name cannot hold become ``_``), the security protocol, SASL
    mechanism, user name and password (write-only), and a CA file on the stage's hosts."""

    model_config = ConfigDict(extra="forbid")

    bootstrap: str = Field(min_length=1, max_length=2048)
    topic: str = Field(min_length=1, max_length=1024)
    key: str = Field("${client_id}", min_length=1, max_length=1024)
    security_protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: SaslMechanism | None = None
    sasl_username: str | None = Field(None, max_length=1024)
    sasl_password: SecretStr | None = None
    ssl_cafile: str | None = Field(None, max_length=4096)


class NewIntegration(BaseModel):
    """An integration to add: its ``name``, Topic Filters, optional Client Identifier
    pattern (shell style, ``sensor-*``), payload format and Kafka sink."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN)
    kind: Literal["kafka"] = "kafka"
    topic_filters: list[str] = Field(min_length=1, max_length=MAX_TOPIC_FILTERS)
    client_id_filter: str | None = Field(None, min_length=1, max_length=1024)
    payload_format: Literal["raw", "json"] = "json"
    enabled: bool = True
    sink: KafkaSinkBody


class KafkaSinkChanges(BaseModel):
    """Changes to a Kafka sink: a field left out is kept, ``null`` clears an optional one
    (``sasl_mechanism``, ``sasl_username``, ``sasl_password``, ``ssl_cafile``)."""

    model_config = ConfigDict(extra="forbid")

    bootstrap: str | None = Field(None, min_length=1, max_length=2048)
    topic: str | None = Field(None, min_length=1, max_length=1024)
    key: str | None = Field(None, min_length=1, max_length=1024)
    security_protocol: SecurityProtocol | None = None
    sasl_mechanism: SaslMechanism | None = None
    sasl_username: str | None = Field(None, max_length=1024)
    sasl_password: SecretStr | None = None
    ssl_cafile: str | None = Field(None, max_length=4096)


class IntegrationChanges(BaseModel):
    """Changes to an integration: a field left out is kept; ``client_id_filter: null``
    takes every client again."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool | None = None
    topic_filters: list[str] | None = Field(None, min_length=1, max_length=MAX_TOPIC_FILTERS)
    client_id_filter: str | None = Field(None, min_length=1, max_length=1024)
    payload_format: Literal["raw", "json"] | None = None
    sink: KafkaSinkChanges | None = None


def view(integration: Integration) -> IntegrationView:
    """``integration`` as the API shows it (no password)."""
    sink = integration.sink
    return IntegrationView(
        id=integration.id,
        name=integration.name,
        enabled=integration.enabled,
        kind="kafka",
        topic_filters=list(integration.topic_filters),
        client_id_filter=integration.client_id_filter,
        payload_format=integration.payload_format.value,
        sink=KafkaSinkView(
            bootstrap=sink.bootstrap,
            topic=sink.topic,
            key=sink.key,
            security_protocol=sink.security_protocol,
            sasl_mechanism=sink.sasl_mechanism,
            sasl_username=sink.sasl_username,
            sasl_password_set=integration.secrets.sasl_password is not None,
            ssl_cafile=sink.ssl_cafile,
        ),
        revision=integration.revision,
        created_at=integration.created_at,
        updated_at=integration.updated_at,
    )


def _password(secret: SecretStr | None) -> str | None:
    return None if secret is None else secret.get_secret_value()


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
        sink_given = body.sink.model_fields_set
        values = stored.sink.to_json()
        for name in KafkaSink.__dataclass_fields__:
            if name in sink_given:
                value = getattr(body.sink, name)
                if value is None and name in ("bootstrap", "topic", "key", "security_protocol"):
                    raise IntegrationError(f"sink.{name} cannot be cleared")
                values[name] = value
        changes["sink"] = KafkaSink.from_json(values)
        if "sasl_password" in sink_given:
            changes["secrets"] = SinkSecrets(_password(body.sink.sasl_password))
    return changed(stored, **changes)


def _store(request: Request) -> IntegrationStore:
    return IntegrationStore(request.app.state.context.credentials.store.pool)


def _detail(body: BaseModel) -> dict[str, Any]:
    """What the audit trail keeps of a request: its fields, the password only as set or
    cleared."""
    detail = body.model_dump(exclude_unset=True, mode="json")
    sink = detail.get("sink")
    if isinstance(sink, dict) and "sasl_password" in sink:
        sink["sasl_password"] = "set" if sink["sasl_password"] is not None else None
    return detail


_audited = StoreChangeAudit(
    invalid=IntegrationError, not_found=IntegrationNotFound, conflict=IntegrationConflict
)
"""Carries out a change of the integrations and audits it (422, 404, 409 for their errors)."""


@router.get("", response_model=IntegrationList, responses={**ERRORS, **_UNAVAILABLE})
async def list_integrations(request: Request, user: User) -> IntegrationList:
    """Every integration, by name."""
    return IntegrationList(integrations=[view(i) for i in await _store(request).all()])


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
        sink = body.sink
        integration = new_integration(
            body.name,
            IntegrationKind(body.kind),
            tuple(body.topic_filters),
            KafkaSink(
                bootstrap=sink.bootstrap,
                topic=sink.topic,
                key=sink.key,
                security_protocol=sink.security_protocol,
                sasl_mechanism=sink.sasl_mechanism,
                sasl_username=sink.sasl_username,
                ssl_cafile=sink.ssl_cafile,
            ),
            payload_format=PayloadFormat(body.payload_format),
            client_id_filter=body.client_id_filter,
            enabled=body.enabled,
            secrets=SinkSecrets(_password(sink.sasl_password)),
        )
        return await _store(request).insert(integration)

    added = await _audited(request, user, "add integration", body.name, _detail(body), change, 201)
    return view(added)


@router.get(
    "/{ref}", response_model=IntegrationView, responses={**ERRORS, **_NOT_FOUND, **_UNAVAILABLE}
)
async def show_integration(request: Request, ref: Ref, user: User) -> IntegrationView:
    """One integration."""
    try:
        return view(await _store(request).get(ref))
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
