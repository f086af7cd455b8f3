"""The monitoring files against the real test cluster, scraped by a real Prometheus (Debian's
``prometheus``, on loopback): ``monitoring/prometheus/local.yml`` with the test cluster's
ports finds every process, and every query of the Grafana dashboard
(``monitoring/grafana/cormorant.json``) is valid PromQL over series the services serve, with
numbers that match what the test clients did."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import yaml

from services.local.settings import LocalSettings
from tests.e2e.admin import running
from tests.e2e.clients import PahoClient, unique
from tests.e2e.prometheus import (
    DASHBOARD,
    LOCAL_CONFIG,
    RATE_WINDOW,
    panel_expr,
    processes_of,
    query,
    running_prometheus,
    value,
)
from tests.servers import LocalCluster
from tests.waiting import wait_until

pytestmark = pytest.mark.cluster

MAY_BE_EMPTY = {
    "Produce errors / s": "Kafka stored every record",
}
"""Panels whose series exist only once something happened that these tests do not do."""

WHILE_AN_INTEGRATION_RUNS = {
    "Integration messages / s",
    "Integration lag (records)",
    "Integration: time since the last error",
    "Integrations restarting",
}
"""Panels with series only while the integrations stage runs an integration (other tests'
come and go; tests/unit/test_monitoring_files.py checks they ask for what the stage
serves): empty or not, Prometheus still checks each query."""


@pytest.fixture(scope="module")
def prometheus(settings: LocalSettings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Prometheus scraping the test cluster every second (:func:`running_prometheus`);
    its base URL."""
    running(settings)
    with running_prometheus(settings, tmp_path_factory.mktemp("prometheus")) as url:
        yield url


def test_every_process_is_scraped(prometheus: str, settings: LocalSettings) -> None:
    expected = {
        job["job_name"]: len(processes_of(job["job_name"], settings))
        for job in yaml.safe_load(LOCAL_CONFIG.read_text(encoding="utf-8"))["scrape_configs"]
    }
    assert expected == {
        "ingest": 2,
        "router": 1,
        "device-persist": 1,
        "app-delivery": 1,
        "integrations-stage": 1,
        "admin": 1,
    }

    def all_up() -> bool:
        found = {
            s["metric"]["job"]: float(s["value"][1]) for s in query(prometheus, "sum by (job) (up)")
        }
        return found == {job: float(count) for job, count in expected.items()}

    wait_until(all_up, "every process up in Prometheus")
    services = query(prometheus, "cormorant_service_info")
    assert {s["metric"]["job"] for s in services} == set(expected)


def test_every_dashboard_query_answers_with_the_clusters_numbers(
    cluster: LocalCluster, prometheus: str
) -> None:
    topic = unique("dashboard") + "/temp"
    # A persistent DEVICE session that is away, so the DEVICE store holds its messages.
    away_id = unique("dashboard-away")
    away = PahoClient(cluster.mqtt_port, away_id, version=4, clean_start=False)
    assert away.connect() == 0
    away.subscribe(topic, 1)
    away.close()
    clients = [PahoClient(cluster.mqtt_port, unique("dashboard")) for _ in range(3)]
    try:
        for client in clients:
            assert client.connect() == 0
        clients[0].subscribe(topic, 1)
        mids = [clients[1].publish(topic, b"21.5", 1) for _ in range(20)]
        wait_until(lambda: set(mids) <= set(clients[1].snapshot()[0]), "PUBACKs")
        wait_until(lambda: clients[0].messages.qsize() == 20, "the 20 messages delivered")
        connected = cluster.connections()
        wait_until(
            lambda: value(prometheus, "sum(cormorant_mqtt_connections)") == connected,
            f"Prometheus counting {connected} connections",
        )
        wait_until(
            lambda: value(prometheus, "sum(cormorant_device_store_messages)") >= 20,
            "the away session's 20 messages in the DEVICE store",
        )
        dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
        empty = []
        for panel in dashboard["panels"]:
            if panel["type"] == "row":
                continue
            results = [
                query(prometheus, target["expr"].replace("$__rate_interval", RATE_WINDOW))
                for target in panel["targets"]
            ]
            if not any(results):
                empty.append(panel["title"])
        assert sorted(set(empty) - WHILE_AN_INTEGRATION_RUNS) == sorted(MAY_BE_EMPTY)
        # What the traffic moved, as the dashboard's panels compute it.
        received = f"sum(increase(cormorant_mqtt_publish_received_total{{qos='1'}}[{RATE_WINDOW}]))"
        assert value(prometheus, received) > 0
        # No session came near the DEVICE store's cap: the drop panel says 0, not nothing
        # (tests/e2e/test_store_cap.py makes it rise).
        assert value(prometheus, panel_expr("DEVICE store: dropped by the cap / s")) == 0
    finally:
        for client in clients:
            client.close()
        # End the away session (Clean Session 1 discards it, MQTT 3.1.2.4).
        ending = PahoClient(cluster.mqtt_port, away_id, version=4, clean_start=True)
        assert ending.connect() == 0
        ending.close()
