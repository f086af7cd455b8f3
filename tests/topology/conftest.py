"""The production-topology test cluster: 3 KRaft brokers and Redis with two replicas and
Sentinels (the production layout of :mod:`services.local.layout`), started once for the
session on the first test that needs it, beside the shared test cluster (in the session's
block of ports, its PRODUCTION slot: :mod:`services.local.ports`; its own state dir), and
stopped at the end.

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
from services.local import ports, processes
from services.local.settings import LocalSettings
from tests.servers import LocalCluster, make_test_settings

#: Stored messages per persistent client in the production-topology test cluster.
MAX_STORED = 65_534


def _settings(state_dir: Path, block: dict[str, int] | None) -> LocalSettings:
    return make_test_settings(state_dir, ports.PRODUCTION, block, persisted_max_messages=MAX_STORED)


@pytest.fixture(scope="session")
def production(settings: LocalSettings) -> Iterator[LocalCluster]:
    """The production-layout cluster, whole (a test that stopped part of it restores it).

    Its tests run after every other (tests/conftest.py), so the session's ordinary cluster
    is stopped first: it would only load the machine beside this one (a test that needs it
    later starts it again, as the ``cluster`` fixture does after ``cormorant down``).

    Its state dir is a directory of its own, not under pytest's base temporary directory:
    pytest deletes old base directories when other sessions start, and a cluster whose pid
    files are gone could not be stopped. Its ports were free when the session chose its
    block, but a port another program takes meanwhile makes the start fail: then the
    production slot of a new free block is taken, once.
    """
    local_cluster.down(settings)
    with tempfile.TemporaryDirectory(prefix="cormorant-production-") as state_dir:
        value = _settings(Path(state_dir), ports.SESSION.block(settings))
        try:
            try:
                local_cluster.up(value)
            except processes.StartError as exc:
                if "already in use" not in str(exc):
                    raise
                local_cluster.down(value)
                value = _settings(Path(state_dir), None)
                local_cluster.up(value)
            yield LocalCluster(value)
        finally:
            local_cluster.down(value)


@pytest.fixture
def topology(production: LocalCluster) -> LocalCluster:
    """The production-layout cluster, with whatever an earlier test left down brought back."""
    if not all(row.healthy for row in local_cluster.status(production.settings)):
        local_cluster.up(production.settings)
    return production
