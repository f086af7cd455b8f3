"""The web console's page (``/``) and the API's docs page (``/docs``; ``/redoc`` leads
there), not in the OpenAPI document; what the console needs to know of the deployment
(``GET /api/console/settings``). Their files are mounted by
:func:`services.admin.api.create_app`: :data:`CONSOLE` at ``/console``, Swagger UI's at
``/docs/assets``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, RedirectResponse
from pydantic import BaseModel, Field

from services.admin import security_headers
from services.admin.auth import ERRORS, User
from services.admin.context import context_of

CONSOLE = Path(__file__).resolve().parent / "console"
"""The web console's files (plain HTML, CSS and JavaScript; no build step)."""

router = APIRouter(include_in_schema=False)
"""Included by :func:`services.admin.api.create_app`."""

settings_router = APIRouter(prefix="/api/console", tags=["console"])
"""Included by :func:`services.admin.api.create_app`."""


class ConsoleSettings(BaseModel):
    """What the console's pages take from the deployment's settings."""

    mqtt_ws_url: str | None = Field(
        description="The MQTT over WebSocket URL the WebSocket client connects to by "
        "default (setting admin_console_ws_url); null: none set."
    )


@router.get("/")
async def console() -> FileResponse:
    """The web console's page."""
    return FileResponse(CONSOLE / "index.html")


@router.get("/docs")
async def docs() -> Any:
    """The API's Swagger UI page, its files served from here (no CDN)."""
    return security_headers.swagger_page("Cormorant admin API", "/openapi.json", "/docs/assets")


@router.get("/redoc")
async def no_redoc() -> RedirectResponse:
    """There is no ReDoc page: to ``/docs``."""
    return RedirectResponse("/docs")


@settings_router.get("/settings", response_model=ConsoleSettings, responses=ERRORS)
async def console_settings(request: Request, user: User) -> ConsoleSettings:
    """The deployment's settings the console uses."""
    return ConsoleSettings(mqtt_ws_url=context_of(request).settings.admin_console_ws_url)
