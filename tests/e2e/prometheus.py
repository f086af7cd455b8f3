"""A real Prometheus (Debian's ``prometheus``, on loopback) scraping the test cluster with
``monitoring/prometheus/local.yml``'s jobs, and the queries the tests ask it, for the
monitoring tests (tests/e2e/test_dashboards.py, tests/e2e/test_store_cap.py)."""

from __future__ import annotations

import json
import socket
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from services.local import cluster as local_cluster
from services.local.settings import LocalSettings
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
LOCAL_CONFIG = ROOT / "monitoring" / "prometheus" / "local.yml"
DASHBOARD = ROOT / "monitoring" / "grafana" / "cormorant.json"

RATE_WINDOW = "30s"
"""What Grafana's ``$__rate_interval`` becomes here (a few 1 s scrapes)."""


def processes_of(job: str, settings: LocalSettings) -> dict[str, int]:
    """The local cluster's processes of Prometheus job ``job`` → their HTTP ports."""
    ports = local_cluster.http_ports(settings)
    prefix = "ingest-node" if job == "ingest" else job
    return {name: port for name, port in ports.items() if name.startswith(prefix)}


def query(url: str, expr: str) -> list[dict[str, Any]]:
    """The instant vector of ``expr`` asked of the Prometheus at ``url`` (AssertionError
    unless Prometheus accepts it)."""
    address = f"{url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    with urllib.request.urlopen(address, timeout=10) as response:
        answer = json.load(response)
    assert answer["status"] == "success", (expr, answer)
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


def value(url: str, expr: str) -> float:
    """The one value of ``expr`` (AssertionError unless it has exactly one sample)."""
    [sample] = query(url, expr)
    return float(sample["value"][1])


def panel_expr(title: str) -> str:
    """The query of the dashboard's panel ``title`` (its one target), with
    ``$__rate_interval`` as :data:`RATE_WINDOW`."""
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    [panel] = [p for p in dashboard["panels"] if p["title"] == title]
    [target] = panel["targets"]
    expr: str = target["expr"]
    return expr.replace("$__rate_interval", RATE_WINDOW)


@contextmanager
def running_prometheus(settings: LocalSettings, directory: Path) -> Iterator[str]:
    """A Prometheus scraping the test cluster every second with ``local.yml``'s jobs (the
    targets moved to the test cluster's ports), its data and log in ``directory``; its base
    URL once it is ready. Stopped when the block ends."""
    config = yaml.safe_load(LOCAL_CONFIG.read_text(encoding="utf-8"))
    config["global"] |= {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(LOCAL_CONFIG.parent / name) for name in config["rule_files"]]
    for job in config["scrape_configs"]:
        ports = processes_of(job["job_name"], settings)
        assert ports, job["job_name"]
        job["static_configs"] = [{"targets": [f"127.0.0.1:{p}" for p in sorted(ports.values())]}]
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
