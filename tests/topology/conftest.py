"""The production-topology test cluster: 3 KRaft brokers and Redis with a replica and
Sentinels (the production layout of :mod:`services.local.layout`), started once for the
session on the first test that needs it, beside the shared test cluster (own ports, own
state dir), and stopped at the end.

Its tests stop and kill its processes (``disruptive``: they run after all others) and
leave it whole again. Its persistent clients may keep up to 65,534 stored messages each
(the most the store allows): an outage's backlog is never cut by the cap.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from services.local import cluster as local_cluster
from services.local import layout
from tests.servers import PRODUCTION_TEST_PORTS, LocalCluster, make_test_settings

#: Stored messages per persistent client in the production-topology test cluster.
MAX_STORED = 65_534


@pytest.fixture(scope="session")
def production(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """The production-layout cluster, whole (a test that stopped part of it restores it)."""
    settings = make_test_settings(
        tmp_path_factory.mktemp("production"),
        PRODUCTION_TEST_PORTS,
        persisted_max_messages=MAX_STORED,
        kafka_brokers=layout.PRODUCTION.kafka_brokers,
        redis_replicas=layout.PRODUCTION.redis_replicas,
        redis_sentinel_count=layout.PRODUCTION.redis_sentinel_count,
    )
    try:
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
