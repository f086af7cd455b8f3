"""The admin REST API (FastAPI): cluster, stats, clients and sessions, subscriptions,
retained messages, the audit trail, admin users, MQTT credentials and their rules; the
console and the API's docs page beside it; the service's own ``/health``, ``/ready`` and
``/metrics``, as every service's.

Every ``/api`` call but ``POST /api/login`` needs ``Authorization: Bearer <token>`` (401
without a valid one); every mutating call is audited (:mod:`services.admin.users`). Reads
come from Cormorant's own state (:mod:`services.admin.state`, :mod:`services.admin.cluster`,
the DEVICE store); writes go to Kafka (:mod:`services.admin.commands`).
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from aiokafka.errors import KafkaError
from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path

from services.admin import admin_users_api, blocked_api, credentials_api, models, security_headers
from services.admin.auth import ERRORS, Credentials, User
from services.admin.cluster import Probe, StatsSampler
from services.admin.commands import CommandWriter, disconnect_records, retained_delete_record
from services.admin.login_throttle import RESPONSES as LOGIN_RESPONSES
from services.admin.login_throttle import LoginGuard
from services.admin.state import ClientState
from services.admin.users import AdminUsers, AuditEntry
from services.common import metrics
from services.common.auth.manage import CredentialAdmin
from services.common.metrics import PROTOCOL_VERSIONS
from services.common.mqtt.errors import MQTTError
from services.common.records import SessionRecord
from services.common.sessions import DeliveryPath, delivery_path, kept_seconds
from services.common.settings import Settings
from services.common.stores.base import MessageStore, StoreError, StoreUnavailable
from services.common.subscription import Subscription
from services.common.topics.validation import validate_topic_filter, validate_topic_name
from services.common.versions import cormorant_version
from services.common.web import Readiness

log = logging.getLogger(__name__)

CONSOLE = Path(__file__).resolve().parent / "console"
"""The web console's files (plain HTML, CSS and JavaScript; no build step)."""

#: Payload bytes of a retained message shown by the API.
PAYLOAD_PREVIEW = 1024

TOPIC_NAME = r"^[^+#\x00]+$"
"""A Topic Name, as the OpenAPI document says it (MQTT 4.7.1, 4.7.3: no wildcard, no
U+0000); :func:`validate_topic_name` is the rule itself."""

TOPIC_FILTER = r"^(#|(\+|[^+#/\x00]*)(/(\+|[^+#/\x00]*))*(/#)?)$"
"""A Topic Filter, as the OpenAPI document says it (MQTT 4.7.1: ``+`` a whole level, ``#``
the last whole level); :func:`validate_topic_filter` is the rule itself."""

TOPIC_CHARS = 16383
"""The longest Topic Name or Filter the API takes, in characters: any 16,383 characters
fit in MQTT's 65,535 bytes of UTF-8 (MQTT 1.5.4)."""

#: Seconds a read waits for the state topics to be applied up to date.
SYNC_SECONDS = 2.0


@dataclass
class AdminContext:
    """What the API's handlers use."""

    settings: Settings
    state: ClientState
    sampler: StatsSampler
    users: AdminUsers
    writer: CommandWriter
    store: MessageStore
    readiness: Readiness
    credentials: CredentialAdmin


def _ms(value: int) -> datetime | None:
    return datetime.fromtimestamp(value / 1000, UTC) if value else None


def _subscription(sub: Subscription) -> models.SubscriptionView:
    return models.SubscriptionView(
        client_id=sub.client_id,
        topic_filter=sub.topic_filter,
        qos=sub.qos,
        no_local=sub.no_local,
        retain_as_published=sub.retain_as_published,
        retain_handling=sub.retain_handling,
        subscription_identifier=sub.subscription_identifier,
    )


def _summary(context: AdminContext, client_id: str, session: SessionRecord) -> dict[str, Any]:
    return {
        "client_id": client_id,
        "connected": session.connected,
        "node_id": session.node_id,
        "protocol_version": PROTOCOL_VERSIONS.get(session.protocol_version, "unknown"),
        "kind": session.kind.name,
        "persistent": session.persistent,
        "clean_start": session.clean_start,
        "session_expiry_interval": session.session_expiry_interval,
        "connected_at": _ms(session.connected_at_ms),
        "updated_at": _ms(session.updated_at_ms),
        "client_address": context.state.address_of(client_id, session),
        "subscriptions": len(context.state.subscriptions.get(client_id, ())),
    }


def _app_lag(probes: list[Probe], client_id: str) -> int | None:
    for probe in probes:
        for labels, value in probe.samples.get("cormorant_app_client_lag_records", ()):
            if labels.get("client_id") == client_id:
                return int(value)
    return None


def _service_status(probe: Probe) -> models.ServiceStatus:
    lag = probe.samples.get("cormorant_kafka_consumer_lag_records")
    return models.ServiceStatus(
        name=probe.endpoint.name,
        url=probe.endpoint.url,
        service=probe.service,
        node_id=probe.node_id,
        version=probe.version,
        alive=probe.alive,
        ready=probe.ready,
        checks=probe.checks,
        error=probe.error,
        connections=(
            int(probe.total("cormorant_mqtt_connections")) if probe.service == "ingest" else None
        ),
        lag=None if lag is None else int(sum(value for _, value in lag)),
    )


def _retained_view(topic: str, message: Any) -> models.RetainedView:
    payload: bytes = message.payload
    preview = payload[:PAYLOAD_PREVIEW]
    try:
        text, encoding = preview.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        text, encoding = base64.b64encode(preview).decode("ascii"), "base64"
    return models.RetainedView(
        topic=topic,
        qos=message.meta.qos,
        payload_size=len(payload),
        payload=text,
        payload_encoding=encoding,
        received_at=datetime.fromtimestamp(message.meta.received_at_ms / 1000, UTC),
    )


_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": models.Problem, "description": "No such session."}
}
_UNAVAILABLE: dict[int | str, dict[str, Any]] = {
    503: {"model": models.Problem, "description": "Kafka or PostgreSQL did not answer."}
}

Offset = Annotated[int, Query(ge=0, le=1_000_000, description="Items to skip.")]
Limit = Annotated[int, Query(ge=1, le=500, description="Items to return.")]


def create_app(context: AdminContext) -> FastAPI:
    """The admin service's FastAPI application over ``context``."""
    app = FastAPI(
        title="Cormorant admin API",
        version=cormorant_version(),
        description=(
            "Operate a Cormorant cluster: its services, clients and sessions, subscriptions, "
            "retained messages. Log in with `POST /api/login`, then send the token as "
            "`Authorization: Bearer <token>`. Every change is audited."
        ),
        docs_url=None,
        redoc_url=None,
    )
    app.state.context = context
    security_headers.install(app)
    users = context.users
    guard = LoginGuard(users, context.settings)
    state = context.state

    @app.exception_handler(HTTPException)
    async def problem(request: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse({"detail": str(exc.detail)}, exc.status_code, headers=exc.headers)

    @app.exception_handler(KafkaError)
    async def kafka_down(request: Request, exc: KafkaError) -> JSONResponse:
        return JSONResponse({"detail": f"Kafka did not answer: {exc!r}"}, 503)

    @app.exception_handler(StoreUnavailable)
    async def store_down(request: Request, exc: StoreUnavailable) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, 503)

    async def audited(
        user: str,
        action: str,
        target: str,
        detail: dict[str, Any],
        change: Callable[[], Awaitable[models.Accepted]],
    ) -> models.Accepted:
        """Carry out ``change`` and audit it with the status it ends with."""
        code = 202
        try:
            return await change()
        except HTTPException as exc:
            code = exc.status_code
            raise
        except KafkaError:
            code = 503
            raise
        finally:
            await users.audit(user, action, target, detail, code)

    async def synced() -> None:
        """Apply the state topics up to now, if Kafka answers in time (else serve what is
        known)."""
        try:
            async with asyncio.timeout(SYNC_SECONDS):
                await state.sync()
        except Exception as exc:
            log.info("serving state not synced with Kafka: %r", exc)

    # ---------------------------------------------------------------- own health, console

    @app.get("/health", include_in_schema=False)
    async def health() -> dict[str, str]:
        return {"status": "alive", "service": "admin", "version": cormorant_version()}

    @app.get("/ready", include_in_schema=False)
    async def ready() -> JSONResponse:
        ok, checks = await context.readiness.report()
        return JSONResponse({"ready": ok, "checks": checks}, 200 if ok else 503)

    @app.get("/metrics", include_in_schema=False)
    async def metrics_page() -> Response:
        return Response(await metrics.exposition(), media_type=metrics.CONTENT_TYPE)

    @app.get("/", include_in_schema=False)
    async def console() -> FileResponse:
        return FileResponse(CONSOLE / "index.html")

    app.mount("/console", StaticFiles(directory=CONSOLE), name="console")
    app.mount("/docs/assets", StaticFiles(directory=swagger_ui_path), name="swagger-ui")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> Any:
        return security_headers.swagger_page("Cormorant admin API", "/openapi.json", "/docs/assets")

    @app.get("/redoc", include_in_schema=False)
    async def no_redoc() -> RedirectResponse:
        return RedirectResponse("/docs")

    # ---------------------------------------------------------------- login

    @app.post(
        "/api/login",
        response_model=models.TokenResponse,
        responses=LOGIN_RESPONSES,
        tags=["login"],
    )
    async def login(body: models.LoginRequest, request: Request) -> models.TokenResponse:
        """Exchange an admin user's name and password for a bearer token (429 after too
        many failed logins from the address or for the user name)."""
        address = request.client.host if request.client else ""
        try:
            token = await guard.login(address, body.username, body.password)
        except HTTPException as exc:
            if exc.status_code == 401:  # a throttled storm is not written to the audit trail
                await users.audit(body.username, "login", body.username, {}, 401)
            raise
        await users.audit(body.username, "login", body.username, {}, 200)
        return models.TokenResponse(
            token=token.value, username=token.username, expires_at=token.expires_at
        )

    @app.post("/api/logout", status_code=204, responses=ERRORS, tags=["login"])
    async def logout(user: User, credentials: Credentials) -> None:
        """Revoke the token of this request."""
        assert credentials is not None  # current_user checked it
        await users.logout(credentials.credentials)
        await users.audit(user, "logout", user, {}, 204)

    # ---------------------------------------------------------------- cluster and stats

    @app.get(
        "/api/cluster", response_model=models.ClusterResponse, responses=ERRORS, tags=["cluster"]
    )
    async def cluster(user: User) -> models.ClusterResponse:
        """Every service process: alive, ready (each check), version, connections, lag."""
        await context.sampler.sample()
        return models.ClusterResponse(
            services=[_service_status(p) for p in context.sampler.probes],
            kafka_bootstrap=context.settings.kafka_bootstrap,
            admin_version=cormorant_version(),
        )

    @app.get("/api/stats", response_model=models.StatsResponse, responses=ERRORS, tags=["cluster"])
    async def stats(user: User) -> models.StatsResponse:
        """Connections, PUBLISH rates in and out, lag per stage: the latest sample and the
        last five minutes."""
        samples = [
            models.StatsSample(
                at=datetime.fromtimestamp(s.at, UTC),
                connections=s.connections,
                msg_in_per_second=s.msg_in_per_second,
                msg_out_per_second=s.msg_out_per_second,
                publish_received_total=s.publish_received,
                publish_sent_total=s.publish_sent,
                received_bytes_total=s.received_bytes,
                sent_bytes_total=s.sent_bytes,
                lag=s.lag,
            )
            for s in context.sampler.history
        ]
        return models.StatsResponse(
            interval_seconds=context.sampler.interval,
            current=samples[-1] if samples else None,
            history=samples,
        )

    # ---------------------------------------------------------------- clients and sessions

    @app.get("/api/sessions", response_model=models.ClientPage, responses=ERRORS, tags=["sessions"])
    async def sessions(
        user: User,
        offset: Offset = 0,
        limit: Limit = 50,
        search: Annotated[
            str | None, Query(max_length=256, description="Part of the client id.")
        ] = None,
        connected: Annotated[bool | None, Query(description="Connected or not.")] = None,
        node: Annotated[str | None, Query(max_length=64, description="Ingest node id.")] = None,
        kind: Annotated[Literal["DEVICE", "APPLICATION"] | None, Query()] = None,
        persistent: Annotated[bool | None, Query()] = None,
    ) -> models.ClientPage:
        """Sessions (connected clients, and persistent sessions waiting for theirs), by
        client id, filtered."""
        await synced()
        matching = [
            (client_id, session)
            for client_id, session in sorted(state.sessions.items())
            if (search is None or search in client_id)
            and (connected is None or session.connected == connected)
            and (node is None or session.node_id == node)
            and (kind is None or session.kind.name == kind)
            and (persistent is None or session.persistent == persistent)
        ]
        page = matching[offset : offset + limit]
        return models.ClientPage(
            total=len(matching),
            offset=offset,
            limit=limit,
            items=[models.ClientSummary(**_summary(context, c, s)) for c, s in page],
        )

    def session_of(client_id: str) -> SessionRecord:
        session = state.sessions.get(client_id)
        if session is None:
            raise HTTPException(404, f"no session of client {client_id!r}")
        return session

    @app.get(
        "/api/sessions/{client_id:path}",
        response_model=models.SessionDetail,
        responses={**ERRORS, **_NOT_FOUND},
        tags=["sessions"],
    )
    async def session_detail(client_id: str, user: User) -> models.SessionDetail:
        """One session: its connection, subscriptions, and what waits for it."""
        await synced()
        session = session_of(client_id)
        stats = None
        if delivery_path(session) is DeliveryPath.PERSISTED:
            try:
                stats = await context.store.stats(client_id)
            except StoreError as exc:
                log.info("stored messages of %r unknown: %r", client_id, exc)
        return models.SessionDetail(
            **_summary(context, client_id, session),
            connection_id=session.connection_id.hex(),
            session_id=session.session_id.hex(),
            receive_maximum=session.receive_maximum,
            kept_seconds=(
                kept_seconds(session, context.settings.session_expiry_max_seconds)
                if session.persistent
                else None
            ),
            subscription_list=[_subscription(s) for s in state.subscriptions.get(client_id, ())],
            stored_messages=None if stats is None else stats.stored,
            dropped_messages=None if stats is None else stats.dropped,
            app_lag=_app_lag(context.sampler.probes, client_id),
        )

    @app.post(
        "/api/sessions/{client_id:path}/disconnect",
        response_model=models.Accepted,
        status_code=202,
        responses={
            **ERRORS,
            **_NOT_FOUND,
            **_UNAVAILABLE,
            409: {"model": models.Problem, "description": "The client is not connected."},
        },
        tags=["sessions"],
    )
    async def disconnect(client_id: str, user: User) -> models.Accepted:
        """Disconnect the client (DISCONNECT 0x98 Administrative action); its session
        stays as its Session Expiry Interval says."""

        async def change() -> models.Accepted:
            await synced()
            session = session_of(client_id)
            if not session.connected:
                raise HTTPException(409, f"client {client_id!r} is not connected")
            await context.writer.write(
                disconnect_records(state.names, client_id, session, end_session=False)
            )
            return models.Accepted(
                action="disconnect", target=client_id, detail={"node_id": session.node_id}
            )

        return await audited(user, "disconnect", client_id, {}, change)

    @app.delete(
        "/api/sessions/{client_id:path}",
        response_model=models.Accepted,
        status_code=202,
        responses={**ERRORS, **_NOT_FOUND, **_UNAVAILABLE},
        tags=["sessions"],
    )
    async def delete_session(client_id: str, user: User) -> models.Accepted:
        """End the session: a connected client is disconnected (0x98) and its session
        ends with the connection; its subscriptions and stored messages are deleted."""

        async def change() -> models.Accepted:
            await synced()
            session = session_of(client_id)
            await context.writer.write(
                disconnect_records(state.names, client_id, session, end_session=True)
            )
            return models.Accepted(
                action="delete-session",
                target=client_id,
                detail={"node_id": session.node_id, "was_connected": session.connected},
            )

        return await audited(user, "delete-session", client_id, {}, change)

    # ---------------------------------------------------------------- subscriptions

    @app.get(
        "/api/subscriptions",
        response_model=models.SubscriptionPage,
        responses=ERRORS,
        tags=["subscriptions"],
    )
    async def subscriptions(
        user: User,
        offset: Offset = 0,
        limit: Limit = 50,
        search: Annotated[
            str | None, Query(max_length=256, description="Part of the Topic Filter.")
        ] = None,
        client_id: Annotated[
            str | None, Query(max_length=65535, description="One client's.")
        ] = None,
    ) -> models.SubscriptionPage:
        """Every subscription, by client id, filtered."""
        await synced()
        matching = [
            sub
            for sub in state.all_subscriptions()
            if (client_id is None or sub.client_id == client_id)
            and (search is None or search in sub.topic_filter)
        ]
        return models.SubscriptionPage(
            total=len(matching),
            offset=offset,
            limit=limit,
            items=[_subscription(s) for s in matching[offset : offset + limit]],
        )

    # ---------------------------------------------------------------- retained messages

    @app.get(
        "/api/retained",
        response_model=models.RetainedPage,
        responses=ERRORS,
        tags=["retained"],
    )
    async def retained(
        user: User,
        offset: Offset = 0,
        limit: Limit = 50,
        topic_filter: Annotated[
            str,
            Query(
                alias="filter",
                min_length=1,
                max_length=TOPIC_CHARS,
                pattern=TOPIC_FILTER,
                description="An MQTT Topic Filter (MQTT 4.7.1).",
            ),
        ] = "#",
    ) -> models.RetainedPage:
        """The retained messages whose Topic Name matches the Topic Filter (MQTT 4.7)."""
        try:
            validate_topic_filter(topic_filter)
        except MQTTError as exc:
            raise HTTPException(422, f"not a Topic Filter: {exc.message}") from exc
        await synced()
        matching = sorted(state.retained.match(topic_filter), key=lambda item: item[0])
        return models.RetainedPage(
            total=len(matching),
            offset=offset,
            limit=limit,
            items=[_retained_view(t, m) for t, m in matching[offset : offset + limit]],
        )

    @app.delete(
        "/api/retained",
        response_model=models.Accepted,
        status_code=202,
        responses={**ERRORS, **_UNAVAILABLE},
        tags=["retained"],
    )
    async def delete_retained(
        user: User,
        topic: Annotated[
            str,
            Query(
                min_length=1,
                max_length=TOPIC_CHARS,
                pattern=TOPIC_NAME,
                description="An MQTT Topic Name (no wildcards).",
            ),
        ],
    ) -> models.Accepted:
        """Delete the retained message of a topic (as an empty retained PUBLISH does)."""
        try:
            validate_topic_name(topic)
        except MQTTError as exc:
            raise HTTPException(422, f"not a Topic Name: {exc.message}") from exc

        async def change() -> models.Accepted:
            await context.writer.write([retained_delete_record(state.names, topic)])
            return models.Accepted(action="delete-retained", target=topic, detail={})

        return await audited(user, "delete-retained", topic, {}, change)

    # ---------------------------------------------------------------- audit

    @app.get("/api/audit", response_model=models.AuditPage, responses=ERRORS, tags=["audit"])
    async def audit(user: User, offset: Offset = 0, limit: Limit = 50) -> models.AuditPage:
        """Who changed what, and when: the newest first."""
        total, entries = await users.audit_trail(offset, limit)
        return models.AuditPage(
            total=total,
            offset=offset,
            limit=limit,
            items=[_audit(entry) for entry in entries],
        )

    app.include_router(admin_users_api.router)
    app.include_router(credentials_api.router)
    app.include_router(blocked_api.router)
    return app


def _audit(entry: AuditEntry) -> models.AuditView:
    return models.AuditView(
        id=entry.id,
        at=entry.at,
        username=entry.username,
        action=entry.action,
        target=entry.target,
        detail=entry.detail,
        status=entry.status,
    )
