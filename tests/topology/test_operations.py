"""The production layout runs the same operable services as the normal one: every service
process answers ``/ready`` with each check passing (device_persist's store check reaches
Redis through the Sentinels), and the admin service sees every process alive and ready."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from services.local import cluster as local_cluster
from tests.e2e.admin import admin_api
from tests.servers import LocalCluster
from tests.waiting import wait_until

pytestmark = pytest.mark.cluster


def _ready(port: int) -> dict[str, str] | None:
    """The checks of a process whose ``/ready`` answers 200, else None."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=10) as response:
            checks: dict[str, str] = json.loads(response.read())["checks"]
            return checks
    except (urllib.error.URLError, OSError):
        return None


def test_every_service_is_ready_and_the_admin_service_sees_it(topology: LocalCluster) -> None:
    ports = local_cluster.http_ports(topology.settings)
    checks: dict[str, dict[str, str] | None] = {}

    def all_ready() -> bool:
        checks.update((name, _ready(port)) for name, port in ports.items())
        return all(found is not None for found in checks.values())

    wait_until(all_ready, "every service's /ready answering 200")
    assert all(set(found.values()) == {"ok"} for found in checks.values() if found), checks
    assert checks["device-persist"] is not None and checks["device-persist"]["store"] == "ok"

    services = {s["name"]: s for s in admin_api(topology.settings).get("/api/cluster")["services"]}
    assert set(services) == set(ports) - {local_cluster.ADMIN}
    for name, service in services.items():
        assert service["alive"] and service["ready"], (name, service)
