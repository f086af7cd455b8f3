"""The test session's real servers: a Cormorant local cluster on test ports.

The cluster runs in a temporary state dir on its own ports, so a developer's cluster
(1883, 9092...) keeps running beside it; the Kafka jars come from the user's cache dir so
that they are downloaded once per machine, not once per session.
"""

from __future__ import annotations

import signal
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.common.readiness import clear_ready
from services.local import cluster, haproxy, kafka, layout, processes
from services.local.settings import LocalSettings

#: Default test ports; the whole block moves by PORT_STEP while any of them is taken.
TEST_PORTS = {
    "kafka_port": 19092,
    "kafka_controller_port": 19093,
    "redis_port": 16379,
    "redis_sentinel_port": 16389,
    "postgres_port": 15432,
    "listen_port": 21883,
    "ingest_base_port": 21900,
}
PORT_STEP = 100
PORT_TRIES = 20

#: The largest layout a test cluster runs (the production one): its ports are reserved too.
MAX_LAYOUT = layout.PRODUCTION

#: Seconds the test cluster lets a produce take before an MQTT PUBLISH is refused.
KAFKA_REQUEST_TIMEOUT = 5.0

#: Client ids of APPLICATION clients in the test cluster (``application_client_ids``).
APPLICATION_IDS = "app-*"


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        # As the servers do: a port whose old connections linger in TIME_WAIT is free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_test_ports(ingest_nodes: int) -> dict[str, int]:
    """The first block of TEST_PORTS (shifted by multiples of PORT_STEP) that is all free.

    Another test session on the same machine then gets its own block. Raises
    ``RuntimeError`` when no free block is found in PORT_TRIES attempts.
    """
    for attempt in range(PORT_TRIES):
        ports = {name: port + attempt * PORT_STEP for name, port in TEST_PORTS.items()}
        base = ports["ingest_base_port"]
        wanted = [ports["postgres_port"], ports["listen_port"]]
        wanted += [base + i for i in range(1, ingest_nodes + 1)]
        for i in range(MAX_LAYOUT.kafka_brokers):
            wanted += [ports["kafka_port"] + 2 * i, ports["kafka_controller_port"] + 2 * i]
        wanted += [ports["redis_port"] + i for i in range(MAX_LAYOUT.redis_replicas + 1)]
        wanted += [ports["redis_sentinel_port"] + j for j in range(MAX_LAYOUT.redis_sentinel_count)]
        if all(_bindable(port) for port in wanted):
            return ports
    raise RuntimeError(f"no free block of test ports near {TEST_PORTS}")


def make_test_settings(state_dir: Path, **overrides: Any) -> LocalSettings:
    """Settings of a test cluster in ``state_dir``: free test ports, a unique topic prefix;
    ``overrides`` (setting name → value) last, e.g. a layout."""
    defaults = LocalSettings()
    ports = free_test_ports(defaults.ingest_nodes)
    values: dict[str, Any] = {
        "state_dir": state_dir,
        "cache_dir": defaults.cache_dir,
        "topic_prefix": f"test-{uuid.uuid4().hex[:8]}.",
        # Short enough that the Kafka outage test sees a refused PUBLISH quickly.
        "kafka_request_timeout_seconds": KAFKA_REQUEST_TIMEOUT,
        "application_client_ids": [APPLICATION_IDS],
        **ports,
    }
    values.update(overrides)
    return LocalSettings(**values)


@dataclass(frozen=True)
class LocalCluster:
    """A running test cluster: where it listens, and control over each of its processes."""

    settings: LocalSettings

    @property
    def mqtt_port(self) -> int:
        """HAProxy's port: where MQTT clients connect."""
        return self.settings.listen_port

    @property
    def node_ports(self) -> list[int]:
        """Each ingest node's own MQTT port (node1 first)."""
        return haproxy.node_ports(self.settings)

    @property
    def kafka_bootstrap(self) -> str:
        """The Kafka bootstrap address (``127.0.0.1:<port>``)."""
        return kafka.bootstrap(self.settings)

    def names(self) -> list[str]:
        """The names of every process of the cluster, in start order."""
        return [part.name for part in cluster.components(self.settings)]

    def pid(self, name: str) -> int | None:
        """The pid of process ``name`` (e.g. ``ingest-node1``), or None if it is not running."""
        proc = processes.find(self.settings.state_dir, name)
        return None if proc is None else proc.pid

    def stop(self, name: str) -> bool:
        """Stop process ``name`` cleanly; True if it was running. KeyError if unknown."""
        return cluster.stop_component(self.settings, name)

    def kill(self, name: str) -> bool:
        """``kill -9`` process ``name`` (no clean shutdown); True if it was running."""
        killed = processes.stop(self.settings.state_dir, name, signal.SIGKILL, timeout=10.0)
        clear_ready(cluster.ready_file(self.settings, name))
        return killed

    def start(self, name: str) -> int:
        """Start process ``name`` and wait until it is ready; return its pid."""
        return cluster.start_component(self.settings, name)

    def start_app_delivery(self, name: str) -> int:
        """Start one more app_delivery instance as process ``name`` (stop it with
        :meth:`stop_app_delivery` or :meth:`kill`; ``down`` stops it too); return its pid."""
        return cluster.start_app_delivery(self.settings, name)

    def stop_app_delivery(self, name: str) -> bool:
        """Stop the extra app_delivery instance ``name`` cleanly; True if it was running."""
        return cluster.stop_app_delivery(self.settings, name)

    def log(self, name: str) -> Path:
        """The log file of process ``name``."""
        return processes.log_file(self.settings.state_dir, name)
