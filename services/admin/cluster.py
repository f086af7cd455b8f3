"""The cluster as its services tell it: each process's ``/health``, ``/ready`` and ``/metrics``.

Where the processes are: ``cluster_endpoints`` (process name → base URL; the local cluster
sets it), or in AWS the private DNS namespace ``cluster_dns_namespace`` where ECS registers
each service's tasks (``<service>.<namespace>``, one A record per task, on ``http_port``).

:class:`StatsSampler` scrapes every process every ``interval`` seconds and keeps the last
samples: connections, PUBLISH rates in and out, consumer lag per stage. Rates are the
difference of two scrapes of the ``_total`` counters over the time between them (a
restarted process, whose counters start again at 0, counts from its restart on).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from services.command_names import ADMIN_COMMAND, SERVICE_COMMANDS
from services.common.metrics import Samples, parse_exposition
from services.common.settings import Settings

log = logging.getLogger(__name__)

SERVICES = tuple(command for command in SERVICE_COMMANDS if command != ADMIN_COMMAND)
"""The services whose tasks the DNS namespace names (``services/cli.py`` commands)."""

#: Seconds one probe of a process (health, readiness, metrics together) may take.
PROBE_TIMEOUT_SECONDS = 3.0

#: Samples kept: an hour at the default 2 s interval (the console's longest time range).
HISTORY = 1800


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One service process: its name (``ingest-node1``, ``router``, an ECS task's address)
    and the base URL of its HTTP endpoints."""

    name: str
    url: str


@dataclass
class Probe:
    """What one process said: alive (``/health``), ready (``/ready``, with each check),
    and its metrics (name → samples of (labels, value)), or the error."""

    endpoint: Endpoint
    alive: bool = False
    ready: bool = False
    service: str = ""
    version: str = ""
    node_id: str | None = None
    checks: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    samples: Samples = field(default_factory=dict)

    def total(self, name: str, where: Callable[[dict[str, str]], bool] = lambda _: True) -> float:
        """The sum of the samples of metric ``name`` whose labels pass ``where``."""
        return sum(value for labels, value in self.samples.get(name, ()) if where(labels))


def endpoints_from(
    settings: Settings, resolve: Callable[[str], list[str]] | None = None
) -> list[Endpoint]:
    """The processes to probe: ``cluster_endpoints``, plus the tasks the DNS namespace
    lists (``resolve(host)`` → addresses; the system resolver unless given)."""
    found = [
        Endpoint(name, url.rstrip("/")) for name, url in sorted(settings.cluster_endpoints.items())
    ]
    namespace = settings.cluster_dns_namespace
    if namespace:
        lookup = resolve or _resolve
        for service in SERVICES:
            for address in lookup(f"{service}.{namespace}"):
                found.append(
                    Endpoint(f"{service}@{address}", f"http://{address}:{settings.http_port}")
                )
    return found


def _resolve(host: str) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except socket.gaierror:
        return []
    return sorted({str(info[4][0]) for info in infos})


async def probe(session: aiohttp.ClientSession, endpoint: Endpoint) -> Probe:
    """Ask one process for its health, readiness and metrics (never raises)."""
    result = Probe(endpoint)
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_SECONDS):
            async with session.get(f"{endpoint.url}/health") as response:
                health: dict[str, Any] = await response.json()
                result.alive = response.status == 200
            result.service = str(health.get("service", ""))
            result.version = str(health.get("version", ""))
            result.node_id = health.get("node_id")
            async with session.get(f"{endpoint.url}/ready") as response:
                ready: dict[str, Any] = await response.json()
                result.ready = response.status == 200
                result.checks = {str(k): str(v) for k, v in ready.get("checks", {}).items()}
            async with session.get(f"{endpoint.url}/metrics") as response:
                result.samples = parse_exposition(await response.text())
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        result.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return result


@dataclass(frozen=True, slots=True)
class Sample:
    """The cluster's figures at one moment (``at``: Unix seconds)."""

    at: float
    connections: int
    publish_received: float  # PUBLISH packets accepted, cumulative over the live processes
    publish_sent: float
    received_bytes: float
    sent_bytes: float
    lag: dict[str, float]  # stage → records behind
    msg_in_per_second: float = 0.0
    msg_out_per_second: float = 0.0


def sample_of(probes: Iterable[Probe], at: float) -> Sample:
    """The figures of one round of probes (rates left at 0: :func:`with_rates`)."""
    probes = [p for p in probes if p.error is None]
    lag: dict[str, float] = {}
    for p in probes:
        for labels, value in p.samples.get("cormorant_kafka_consumer_lag_records", ()):
            # A sample without a stage still gets a name, its topic's: no chart series
            # goes unnamed.
            stage = labels.get("stage") or f"topic {labels.get('topic') or 'unknown'}"
            lag[stage] = lag.get(stage, 0.0) + value
    return Sample(
        at=at,
        connections=int(sum(p.total("cormorant_mqtt_connections") for p in probes)),
        publish_received=sum(p.total("cormorant_mqtt_publish_received_total") for p in probes),
        publish_sent=sum(p.total("cormorant_mqtt_publish_sent_total") for p in probes),
        received_bytes=sum(p.total("cormorant_mqtt_received_bytes_total") for p in probes),
        sent_bytes=sum(p.total("cormorant_mqtt_sent_bytes_total") for p in probes),
        lag=lag,
    )


def with_rates(sample: Sample, previous: Sample | None) -> Sample:
    """``sample`` with its PUBLISH rates since ``previous`` (0 without one, or for a
    counter that went down: its process restarted)."""
    if previous is None or sample.at <= previous.at:
        return sample
    elapsed = sample.at - previous.at
    return Sample(
        at=sample.at,
        connections=sample.connections,
        publish_received=sample.publish_received,
        publish_sent=sample.publish_sent,
        received_bytes=sample.received_bytes,
        sent_bytes=sample.sent_bytes,
        lag=sample.lag,
        msg_in_per_second=max(0.0, sample.publish_received - previous.publish_received) / elapsed,
        msg_out_per_second=max(0.0, sample.publish_sent - previous.publish_sent) / elapsed,
    )


class StatsSampler:
    """Probes every process every ``interval`` seconds in the background; keeps the latest
    probes, the last :data:`HISTORY` samples and each process's CPU use between its last
    two probes (:attr:`cpu_percent`)."""

    def __init__(self, settings: Settings, interval: float) -> None:
        self.settings = settings
        self.interval = interval
        self.probes: list[Probe] = []
        self.history: deque[Sample] = deque(maxlen=HISTORY)
        self.cpu_percent: dict[str, float] = {}
        self._cpu_seen: dict[str, tuple[float, float]] = {}
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        """Take the first sample, then keep sampling in the background."""
        self._session = aiohttp.ClientSession()
        await self.sample()
        self._task = asyncio.create_task(self._run(), name="admin-stats-sampler")

    async def stop(self) -> None:
        """Stop sampling."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    async def sample(self) -> Sample:
        """Probe every process now; returns (and keeps) the new sample."""
        assert self._session is not None, "start() first"
        endpoints = await asyncio.to_thread(endpoints_from, self.settings)
        session = self._session
        self.probes = list(await asyncio.gather(*(probe(session, e) for e in endpoints)))
        now = time.time()
        self._note_cpu(now)
        previous = self.history[-1] if self.history else None
        sample = with_rates(sample_of(self.probes, now), previous)
        self.history.append(sample)
        return sample

    def _note_cpu(self, now: float) -> None:
        """Each answering process's CPU use since its previous probe (:attr:`cpu_percent`,
        by process name; percent of one core), from its ``process_cpu_seconds_total``."""
        seen: dict[str, tuple[float, float]] = {}
        for p in self.probes:
            if p.error is not None or "process_cpu_seconds_total" not in p.samples:
                continue
            name, seconds = p.endpoint.name, p.total("process_cpu_seconds_total")
            seen[name] = (now, seconds)
            before = self._cpu_seen.get(name)
            if before is not None and now > before[0] and seconds >= before[1]:
                self.cpu_percent[name] = 100.0 * (seconds - before[1]) / (now - before[0])
        self.cpu_percent = {name: v for name, v in self.cpu_percent.items() if name in seen}
        self._cpu_seen = seen

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.sample()
            except Exception:  # a bug: logged, and the next round tries again
                log.exception("sampling the cluster failed")
