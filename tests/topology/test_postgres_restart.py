"""PostgreSQL killed and restarted under device_persist's PostgreSQL store, under load:
nothing acknowledged is lost (the store's writes are committed transactions, and
device_persist re-reads what it could not store)."""

from __future__ import annotations

import time

import pytest

from services.local import cluster as local_cluster
from tests.servers import LocalCluster
from tests.topology.load import (
    RATE,
    finish,
    load,
    note,
    wait_for_delivery_since,
    wait_for_traffic,
)

pytestmark = [pytest.mark.cluster, pytest.mark.disruptive]


def test_postgres_restarted_under_the_postgres_store_loses_nothing(topology: LocalCluster) -> None:
    on_postgres = topology.settings.model_copy(update={"store_backend": "postgres"})
    assert topology.stop("device-persist")
    local_cluster.start_component(on_postgres, "device-persist")
    try:
        # Half the other tests' rate: the PostgreSQL store's commits are the bottleneck on
        # a busy 2-core machine, and the outage's backlog must drain within the test.
        with load(topology, rate=RATE / 2) as running:
            wait_for_traffic(running)
            killed_at = time.monotonic()
            assert topology.kill("postgres")
            topology.start("postgres")  # crash recovery from its write-ahead log
            note(
                "deliveries resumed after kill -9 of postgres",
                wait_for_delivery_since(running, killed_at),
            )
            report = finish(running)
    finally:
        topology.stop("device-persist")
        topology.start("device-persist")  # on the Redis store again
    assert report.lost == 0, report
