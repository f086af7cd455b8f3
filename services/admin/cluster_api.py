"""The cluster API: every service process's health (``/api/cluster``) and the cluster's
traffic over the last hour at most (``/api/stats``), from
:class:`~services.admin.cluster.StatsSampler`'s probes of their ``/health``, ``/ready``
and ``/metrics``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Query, Request

from services.admin import models
from services.admin.auth import ERRORS, User
from services.admin.cluster import Probe
from services.admin.context import context_of
from services.common.versions import cormorant_version

router = APIRouter(prefix="/api", tags=["cluster"])
"""Included by :func:`services.admin.api.create_app`."""


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


@router.get("/cluster", response_model=models.ClusterResponse, responses=ERRORS)
async def cluster(request: Request, user: User) -> models.ClusterResponse:
    """Every service process: alive, ready (each check), version, connections, lag."""
    context = context_of(request)
    await context.sampler.sample()
    return models.ClusterResponse(
        services=[_service_status(p) for p in context.sampler.probes],
        kafka_bootstrap=context.settings.kafka_bootstrap,
        admin_version=cormorant_version(),
    )


@router.get("/stats", response_model=models.StatsResponse, responses=ERRORS)
async def stats(
    request: Request,
    user: User,
    seconds: Annotated[
        int, Query(ge=10, le=3600, description="How far back the history goes (seconds).")
    ] = 300,
) -> models.StatsResponse:
    """Connections, PUBLISH rates in and out, lag per stage: the latest sample and the
    last ``seconds`` (the admin service keeps an hour, from its start)."""
    sampler = context_of(request).sampler
    since = sampler.history[-1].at - seconds if sampler.history else 0.0
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
        for s in sampler.history
        if s.at >= since
    ]
    return models.StatsResponse(
        interval_seconds=sampler.interval,
        current=samples[-1] if samples else None,
        history=samples,
    )
