"""The admin service's own ``/health``, ``/ready`` and ``/metrics``, as every service's
(not in the OpenAPI document)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from services.admin.context import context_of
from services.common import metrics
from services.common.versions import cormorant_version

router = APIRouter(include_in_schema=False)
"""Included by :func:`services.admin.api.create_app`."""


@router.get("/health")
async def health() -> dict[str, str]:
    """The process is alive: its service and version."""
    return {"status": "alive", "service": "admin", "version": cormorant_version()}


@router.get("/ready")
async def ready(request: Request) -> JSONResponse:
    """Whether the service is ready, each check (:class:`~services.common.web.Readiness`):
    200, else 503."""
    ok, checks = await context_of(request).readiness.report()
    return JSONResponse({"ready": ok, "checks": checks}, 200 if ok else 503)


@router.get("/metrics")
async def metrics_page() -> Response:
    """The process's Prometheus metrics (text exposition format)."""
    return Response(await metrics.exposition(), media_type=metrics.CONTENT_TYPE)
