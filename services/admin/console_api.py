"""The web console's page (``/``) and the API's docs page (``/docs``; ``/redoc`` leads
there), not in the OpenAPI document. Their files are mounted by
:func:`services.admin.api.create_app`: :data:`CONSOLE` at ``/console``, Swagger UI's at
``/docs/assets``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter
from fastapi.responses import FileResponse, RedirectResponse

from services.admin import security_headers

CONSOLE = Path(__file__).resolve().parent / "console"
"""The web console's files (plain HTML, CSS and JavaScript; no build step)."""

router = APIRouter(include_in_schema=False)
"""Included by :func:`services.admin.api.create_app`."""


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
