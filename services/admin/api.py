"""The admin REST API (FastAPI): cluster, stats, clients and sessions, subscriptions,
retained messages, the audit trail, admin users, MQTT credentials and their rules, blocked
clients, API keys, integrations; the HTTP publish API (:mod:`services.admin.publish_api`);
the console and the API's docs page beside it; the service's own ``/health``, ``/ready``
and ``/metrics``, as every service's.

Every ``/api`` call but ``POST /api/login`` and the publish API (an API key or an MQTT
credential) needs ``Authorization: Bearer <token>`` (401 without a valid one); every
mutating call is audited (:mod:`services.admin.users`). Reads come from Cormorant's own
state (:mod:`services.admin.state`, :mod:`services.admin.cluster`, the DEVICE store);
writes go to Kafka (:mod:`services.admin.commands`).

:func:`create_app` assembles the application: one :class:`~fastapi.APIRouter` per resource
(``*_api`` modules beside this one, sharing :mod:`services.admin.context`), the security
headers, the error answers, the console's and Swagger UI's files.
"""

from __future__ import annotations

import json
from typing import Any

from aiokafka.errors import KafkaError
from fastapi import FastAPI, HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path

from services.admin import (
    admin_users_api,
    api_keys_api,
    audit_api,
    blocked_api,
    cluster_api,
    console_api,
    credentials_api,
    credentials_bulk_api,
    delayed_api,
    health_api,
    infrastructure_api,
    integrations_api,
    login_api,
    nodes_api,
    publish_api,
    retained_api,
    security_headers,
    sessions_api,
    subscriptions_api,
)
from services.admin.context import AdminContext
from services.admin.login_throttle import LoginGuard
from services.common.stores.base import StoreUnavailable
from services.common.versions import cormorant_version

__all__ = ["AdminContext", "create_app"]


class _EscapedJSONResponse(JSONResponse):
    """JSON with every non-ASCII character escaped: an error can echo the request's text
    back, and JSON bodies can carry lone surrogates, which UTF-8 cannot encode (Starlette's
    own rendering then fails, and a refused request would be answered 500)."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def _answer_errors(app: FastAPI) -> None:
    """Answer errors as ``{"detail": ...}``: a request its schema refuses with 422 and
    pydantic's errors (as FastAPI does), an :class:`HTTPException` with its status, Kafka
    or PostgreSQL not answering with 503."""

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _EscapedJSONResponse({"detail": jsonable_encoder(exc.errors())}, 422)

    @app.exception_handler(HTTPException)
    async def problem(request: Request, exc: HTTPException) -> JSONResponse:
        return _EscapedJSONResponse(
            {"detail": str(exc.detail)}, exc.status_code, headers=exc.headers
        )

    @app.exception_handler(KafkaError)
    async def kafka_down(request: Request, exc: KafkaError) -> JSONResponse:
        return JSONResponse({"detail": f"Kafka did not answer: {exc!r}"}, 503)

    @app.exception_handler(StoreUnavailable)
    async def store_down(request: Request, exc: StoreUnavailable) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, 503)


def create_app(context: AdminContext) -> FastAPI:
    """The admin service's FastAPI application over ``context`` (on
    ``app.state.context``; its login throttle on ``app.state.login_guard``)."""
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
    app.state.login_guard = LoginGuard(context.users, context.settings)
    security_headers.install(app, context.settings.admin_console_ws_url)
    _answer_errors(app)

    app.include_router(health_api.router)
    app.include_router(console_api.router)
    app.mount("/console", StaticFiles(directory=console_api.CONSOLE), name="console")
    app.mount("/docs/assets", StaticFiles(directory=swagger_ui_path), name="swagger-ui")
    for router in (
        login_api.router,
        cluster_api.router,
        sessions_api.router,
        nodes_api.router,
        subscriptions_api.router,
        retained_api.router,
        delayed_api.router,
        audit_api.router,
        admin_users_api.router,
        credentials_api.router,
        credentials_bulk_api.router,
        blocked_api.router,
        api_keys_api.router,
        publish_api.router,
        integrations_api.router,
        console_api.settings_router,
        infrastructure_api.router,
    ):
        app.include_router(router)
    return app
