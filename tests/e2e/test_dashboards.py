"""The monitoring files against the real test cluster, scraped by a real Prometheus (Debian's
``prometheus``, on loopback): ``monitoring/prometheus/local.yml`` with the test cluster's
ports finds every process, and every query of the Grafana dashboard
(``monitoring/grafana/cormorant.json``) is valid PromQL over series the services serve, with
numbers that match what the test clients did."""

from __future__ import annotations

import json
import socket
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.local import cluster as local_cluster
from services.local.settings import LocalSettings
from tests.e2e.admin import running
from tests.e2e.clients import PahoClient, unique
from tests.servers import LocalCluster
from tests.waiting import wait_until

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
LOCAL_CONFIG = ROOT / "monitoring" / "prometheus" / "local.yml"
DASHBOARD = ROOT / "monitoring" / "grafana" / "cormorant.json"

RATE_WINDOW = "30s"
"""What Grafana's ``$__rate_interval`` becomes here (a few 1 s scrapes)."""

MAY_BE_EMPTY = {
    "Produce errors / s": "Kafka stored every record",
}
"""Panels whose series exist only once something happened that these tests do not do."""


def processes_of(job: str, settings: LocalSettings) -> dict[str, int]:
    """The local cluster's processes of Prometheus job ``job`` → their HTTP ports."""
    ports = local_cluster.http_ports(settings)
    prefix = "ingest-node" if job == "ingest" else job
    return {name: port for name, port in ports.items() if name.startswith(prefix)}


def query(url: str, expr: str) -> list[dict[str, Any]]:
    """The instant vector of ``expr`` (AssertionError unless Prometheus accepts it)."""
    address = f"{url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    with urllib.request.urlopen(address, timeout=10) as response:
        answer = json.load(response)
    assert answer["status"] == "success", (expr, answer)
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


def value(url: str, expr: str) -> float:
    """The one value of ``expr``."""
    [sample] = query(url, expr)
    return float(sample["value"][1])


@pytest.fixture(scope="module")
def prometheus(settings: LocalSettings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Prometheus scraping the test cluster every second with ``local.yml``'s jobs (the
    targets moved to the test cluster's ports); its base URL."""
    running(settings)
    config = yaml.safe_load(LOCAL_CONFIG.read_text(encoding="utf-8"))
    config["global"] |= {"scrape_interval": "1s", "evaluation_interval": "1s"}
    for job in config["scrape_configs"]:
        ports = processes_of(job["job_name"], settings)
        assert ports, job["job_name"]
        job["static_configs"] = [{"targets": [f"127.0.0.1:{p}" for p in sorted(ports.values())]}]
    directory = tmp_path_factory.mktemp("prometheus")
    path = directory / "prometheus.yml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = (directory / "prometheus.log").open("w")
    server = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={path}",
            f"--storage.tsdb.path={directory / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            assert server.poll() is None, (directory / "prometheus.log").read_text()
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:
                    return bool(response.status == 200)
            except OSError:
                return False

        wait_until(ready, "Prometheus ready")
        yield url
    finally:
        server.terminate()
        server.wait(30)
        log.close()


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
        assert sorted(empty) == sorted(MAY_BE_EMPTY)
        # What the traffic moved, as the dashboard's panels compute it.
        received = f"sum(increase(cormorant_mqtt_publish_received_total{{qos='1'}}[{RATE_WINDOW}]))"
        assert value(prometheus, received) > 0
    finally:
        for client in clients:
            client.close()
        # End the away session (Clean Session 1 discards it, MQTT 3.1.2.4).
        ending = PahoClient(cluster.mqtt_port, away_id, version=4, clean_start=True)
        assert ending.connect() == 0
        ending.close()
