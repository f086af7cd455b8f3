"""The production-topology test cluster: 3 KRaft brokers and Redis with a replica and
Sentinels (the production layout of :mod:`services.local.layout`), started once for the
session on the first test that needs it, beside the shared test cluster (own ports, own
state dir), and stopped at the end.

Its tests stop and kill its processes (``disruptive``: they run after all others) and
leave it whole again. Its persistent clients may keep up to 65,534 stored messages each
(the most the store allows): an outage's backlog is never cut by the cap.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.local import cluster as local_cluster
from services.local import layout, processes
from services.local.settings import LocalSettings
from tests.servers import PRODUCTION_TEST_PORTS, LocalCluster, make_test_settings

#: Stored messages per persistent client in the production-topology test cluster.
MAX_STORED = 65_534


def _settings(state_dir: Path) -> LocalSettings:
    return make_test_settings(
        state_dir,
        PRODUCTION_TEST_PORTS,
        second=False,
        persisted_max_messages=MAX_STORED,
        kafka_brokers=layout.PRODUCTION.kafka_brokers,
        redis_replicas=layout.PRODUCTION.redis_replicas,
        redis_sentinel_count=layout.PRODUCTION.redis_sentinel_count,
    )


@pytest.fixture(scope="session")
def production() -> Iterator[LocalCluster]:
    """The production-layout cluster, whole (a test that stopped part of it restores it).

    Its state dir is a directory of its own, not under pytest's base temporary directory:
    pytest deletes old base directories when other sessions start, and a cluster whose pid
    files are gone could not be stopped. Its ports are chosen free, but a port another
    program takes while the cluster starts (a minute on a busy machine) makes the start
    fail: then a new block is chosen once.
    """
    with tempfile.TemporaryDirectory(prefix="cormorant-production-") as state_dir:
        settings = _settings(Path(state_dir))
        try:
            try:
                local_cluster.up(settings)
            except processes.StartError as exc:
                if "already in use" not in str(exc):
                    raise
                local_cluster.down(settings)
                settings = _settings(Path(state_dir))
                local_cluster.up(settings)
            yield LocalCluster(settings)
        finally:
            local_cluster.down(settings)


@pytest.fixture
def topology(production: LocalCluster) -> LocalCluster:
    """The production-layout cluster, with whatever an earlier test left down brought back."""
    if not all(row.healthy for row in local_cluster.status(production.settings)):
        local_cluster.up(production.settings)
    return production
