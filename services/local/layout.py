"""The local cluster's layout: how many Kafka brokers, Redis replicas and Sentinels it runs.

The layout comes from the settings (``kafka_brokers``, ``redis_replicas``,
``redis_sentinel_count``) or ``cormorant up --production``, and is recorded in the state dir
(``<state_dir>/run/layout.json``) when the cluster starts, until ``cormorant down``: later
commands (``status``, ``down``, a plain ``up`` bringing dead parts back) then act on the
cluster that runs, whatever their own settings say.

A layout changes the infrastructure only: every layout runs the same services
(:func:`services.local.cluster.services_of`), each with its HTTP port (``/health``,
``/ready``, ``/metrics``), HAProxy health-checking the ingest nodes' ``/ready``, and the
admin service; device_persist's readiness check reaches Redis through the Sentinels.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from services.local import processes
from services.local.settings import LocalSettings


@dataclass(frozen=True, slots=True)
class Layout:
    """How many of each process the cluster has (the fields of :class:`LocalSettings`)."""

    kafka_brokers: int = 1
    redis_replicas: int = 0
    redis_sentinel_count: int = 3

    def describe(self) -> str:
        """E.g. ``3 Kafka brokers, Redis with 2 replicas and 3 Sentinels``."""
        brokers = f"{self.kafka_brokers} Kafka broker{'s' if self.kafka_brokers > 1 else ''}"
        if not self.redis_replicas:
            return f"{brokers}, one Redis"
        replicas = f"{self.redis_replicas} replica{'s' if self.redis_replicas > 1 else ''}"
        return f"{brokers}, Redis with {replicas} and {self.redis_sentinel_count} Sentinels"


#: As in AWS: three MSK brokers (replication factor 3, min.insync.replicas 2) and a Redis
#: primary with two replicas it fails over to. Two, not one: device_persist counts a store
#: write done once a replica has it (Redis ``WAIT 1``), and a primary promoted from the only
#: replica has none until the dead one is back, so with one replica every write waited for
#: the killed node's return (docs/guarantees/production-failover.md).
PRODUCTION = Layout(kafka_brokers=3, redis_replicas=2, redis_sentinel_count=3)


def of(settings: LocalSettings) -> Layout:
    """The layout ``settings`` ask for."""
    return Layout(settings.kafka_brokers, settings.redis_replicas, settings.redis_sentinel_count)


def apply(settings: LocalSettings, layout: Layout) -> LocalSettings:
    """``settings`` with ``layout``'s counts."""
    return settings.model_copy(update=asdict(layout))


def _path(settings: LocalSettings) -> Path:
    return processes.run_dir(settings.state_dir) / "layout.json"


def recorded(settings: LocalSettings) -> Layout | None:
    """The layout recorded in ``settings``' state dir by the last start, or None (never
    started, or stopped with ``down``; an unreadable record counts as none)."""
    try:
        return Layout(**json.loads(_path(settings).read_text(encoding="utf-8")))
    except (FileNotFoundError, ValueError, TypeError):
        return None


def record(settings: LocalSettings) -> None:
    """Record ``settings``' layout as the one the cluster in their state dir runs."""
    path = _path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(of(settings))) + "\n", encoding="utf-8")


def forget(settings: LocalSettings) -> None:
    """Remove the record (the cluster is down)."""
    _path(settings).unlink(missing_ok=True)


def current(settings: LocalSettings) -> LocalSettings:
    """``settings`` with the layout recorded in their state dir, if any: the cluster that
    runs there (or last ran without ``down``)."""
    layout = recorded(settings)
    return settings if layout is None else apply(settings, layout)
