"""The monitoring files in the repository (``monitoring/``): Prometheus accepts the scrape
configurations (its own ``promtool``), the local one names the local cluster's processes
where the launcher puts them, and the Grafana dashboard is well formed. What the queries
return is tested against the real cluster (tests/e2e/test_dashboards.py)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.command_names import SERVICE_COMMANDS
from services.common.integrations.status import RunnerState
from services.integrations.stage import IntegrationCounters, integration_families
from services.local import cluster as local_cluster
from services.local.settings import LocalSettings

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "monitoring" / "prometheus"
DASHBOARD = ROOT / "monitoring" / "grafana" / "cormorant.json"


def jobs(name: str) -> dict[str, dict[str, Any]]:
    """The scrape jobs of ``monitoring/prometheus/<name>.yml`` by job name."""
    config = yaml.safe_load((PROMETHEUS / f"{name}.yml").read_text(encoding="utf-8"))
    return {job["job_name"]: job for job in config["scrape_configs"]}


@pytest.mark.parametrize("name", ["local", "ecs"])
def test_prometheus_accepts_the_configuration(name: str) -> None:
    result = subprocess.run(
        ["promtool", "check", "config", str(PROMETHEUS / f"{name}.yml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # One job per service, named as its command.
    assert sorted(jobs(name)) == sorted(SERVICE_COMMANDS)


def test_the_local_configuration_scrapes_every_process_of_the_local_cluster() -> None:
    ports = local_cluster.http_ports(LocalSettings(_env_file=None))  # type: ignore[call-arg]
    scraped = {
        job: sorted(t for group in config["static_configs"] for t in group["targets"])
        for job, config in jobs("local").items()
    }
    expected: dict[str, list[str]] = {}
    for process, port in ports.items():
        job = "ingest" if process.startswith("ingest-node") else process
        expected.setdefault(job, []).append(f"127.0.0.1:{port}")
    assert scraped == {job: sorted(targets) for job, targets in expected.items()}


def test_the_dashboard_is_well_formed() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert dashboard["uid"] == "cormorant"
    [variable] = dashboard["templating"]["list"]
    assert (variable["name"], variable["type"], variable["query"]) == (
        "datasource",
        "datasource",
        "prometheus",
    )
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        mine = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not mine & cells, f"{panel['title']} overlaps another panel"
        cells |= mine
        if panel["type"] == "row":
            continue
        assert panel["description"], panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"] and all(t["expr"] for t in panel["targets"]), panel["title"]


def test_the_integration_panels_ask_for_what_the_stage_serves() -> None:
    counters = IntegrationCounters()
    counters.error("KafkaConnectionError")
    counters.state = RunnerState.RESTARTING
    served = {
        sample.name for family in integration_families({"x": counters}) for sample in family.samples
    }
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    asked: dict[str, set[str]] = {}
    for panel in dashboard["panels"]:
        for target in panel.get("targets", ()):
            names = set(re.findall(r"cormorant_integration_\w+", target["expr"]))
            if names:
                asked.setdefault(panel["title"], set()).update(names)
    # Rates sent, failed and retried; lag; the last error's age; the runners restarting.
    assert {
        "cormorant_integration_messages_sent_total",
        "cormorant_integration_messages_failed_total",
        "cormorant_integration_messages_retried_total",
        "cormorant_integration_lag_records",
        "cormorant_integration_last_error_timestamp_seconds",
        "cormorant_integration_state",
    } <= set().union(*asked.values())
    for title, names in asked.items():
        assert names <= served, (title, names - served)
