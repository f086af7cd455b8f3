"""Every service's HTTP endpoints, served by its Faust app's own web server.

- ``GET /health``: alive (the process's event loop answers): 200 with the service, its
  version and node id. ECS and the container's HEALTHCHECK use it to replace a hung task.
- ``GET /ready``: ready to take work: 200 when the service serves (its state replayed,
  its listener bound) and every check passes (Kafka answers, the message store answers),
  503 otherwise; the body names each check's outcome. Load balancers use it (HAProxy in
  the local cluster, the NLB's target health in AWS): an ingest node that lost Kafka gets
  no new clients.
- ``GET /metrics``: Prometheus' text format (:mod:`services.common.metrics`), with
  ``cormorant_ready`` and ``cormorant_ready_check{check}``: what ``/ready`` would answer,
  its checks run before each scrape (:func:`readiness_families`).

Bound to ``settings.http_host:http_port`` (loopback by default; one port per process).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import faust
from prometheus_client.core import GaugeMetricFamily, Metric

from services.common import metrics
from services.common.readiness import clear_ready, mark_ready
from services.common.versions import cormorant_version

log = logging.getLogger(__name__)

Check = Callable[[], Awaitable[object]]
"""A readiness check: returns when what it checks answers, raises otherwise."""

#: Seconds every check of one ``/ready`` request may take together.
CHECK_TIMEOUT_SECONDS = 2.0


class Readiness:
    """Whether a service is ready to take work: it serves, and each named check passes.

    ``ready_file`` is the launcher's ready file (:mod:`services.common.readiness`), written
    by :meth:`serving` and removed by :meth:`stopping`.
    """

    def __init__(self, ready_file: Path | None) -> None:
        self._ready_file = ready_file
        self._serving = False
        self._checks: dict[str, Check] = {}

    @property
    def is_serving(self) -> bool:
        """True between :meth:`serving` and :meth:`stopping`."""
        return self._serving

    def add(self, name: str, check: Check) -> None:
        """Run ``check`` on every ``/ready`` request, reported as ``name``."""
        self._checks[name] = check

    def serving(self, detail: str) -> None:
        """The service serves (state replayed, listener bound); ``detail`` goes into the
        ready file."""
        self._serving = True
        mark_ready(self._ready_file, detail)

    def stopping(self) -> None:
        """The service stops: not ready any more."""
        self._serving = False
        clear_ready(self._ready_file)

    async def report(self) -> tuple[bool, dict[str, str]]:
        """``(ready, outcome of each check)``: ``ok``, or what failed. The checks run
        together, for at most :data:`CHECK_TIMEOUT_SECONDS`."""
        outcomes = {"serving": "ok" if self._serving else "starting or stopping"}
        if not self._serving:
            return False, outcomes
        names = list(self._checks)
        results = await asyncio.gather(
            *(_timed(self._checks[name]) for name in names), return_exceptions=True
        )
        for name, result in zip(names, results, strict=True):
            outcomes[name] = "ok" if result is None else _describe(result)
        return all(value == "ok" for value in outcomes.values()), outcomes


async def _timed(check: Check) -> None:
    async with asyncio.timeout(CHECK_TIMEOUT_SECONDS):
        await check()


def _describe(error: object) -> str:
    if isinstance(error, TimeoutError):
        return f"no answer within {CHECK_TIMEOUT_SECONDS:g} s"
    return f"{type(error).__name__}: {error}"[:300]


def readiness_families(checks: dict[str, str]) -> Iterable[Metric]:
    """``cormorant_ready`` (1 when every check of ``checks``, the outcomes of
    :meth:`Readiness.report`, is ``ok``: ``/ready`` answers 200) and
    ``cormorant_ready_check{check}`` (1 ok, 0 failed, per check)."""
    ready = bool(checks) and all(outcome == "ok" for outcome in checks.values())
    yield GaugeMetricFamily(
        "cormorant_ready",
        "1 when the process is ready to take work (/ready answers 200; a load balancer "
        "sends it clients), 0 otherwise.",
        value=float(ready),
    )
    family = GaugeMetricFamily(
        "cormorant_ready_check",
        "Each readiness check's outcome as of the scrape: 1 passed, 0 failed (serving, "
        "kafka, store...).",
        labels=["check"],
    )
    for name, outcome in sorted(checks.items()):
        family.add_metric([name], float(outcome == "ok"))
    yield family


def serve_http(
    app: faust.App, service: str, ready_file: Path | None, node_id: str | None = None
) -> Readiness:
    """Add ``/health``, ``/ready`` and ``/metrics`` to ``app``'s web server (enabled by
    :func:`services.common.faust_app.make_app`); returns the service's :class:`Readiness`."""
    readiness = Readiness(ready_file)
    version = cormorant_version()
    metrics.info(service, version, node_id)
    outcomes: dict[str, str] = {}

    async def refresh() -> None:
        _, checks = await readiness.report()
        outcomes.clear()
        outcomes.update(checks)

    metrics.on_scrape(refresh)
    metrics.register(lambda: readiness_families(outcomes))
    identity = {"service": service, "version": version, "node_id": node_id}

    async def health(self: Any, request: Any) -> Any:
        return self.json({"status": "alive", **identity})

    async def ready(self: Any, request: Any) -> Any:
        ok, checks = await readiness.report()
        return self.json({"ready": ok, "checks": checks, **identity}, status=200 if ok else 503)

    async def scrape(self: Any, request: Any) -> Any:
        body = await metrics.exposition()
        return self.bytes(body, content_type=metrics.CONTENT_TYPE)

    app.page("/health")(health)
    app.page("/ready")(ready)
    app.page("/metrics")(scrape)
    return readiness
