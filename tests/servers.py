"""The test session's real servers: a Cormorant local cluster on test ports.

The cluster runs in a temporary state dir on its own ports, so a developer's cluster
(1883, 9092...) keeps running beside it; the Kafka jars come from the user's cache dir so
that they are downloaded once per machine, not once per session.
"""

from __future__ import annotations

import socket
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

from services.common.metrics import parse_exposition
from services.local import cluster, haproxy, kafka, processes
from services.local.settings import LocalSettings

#: Default test ports; the whole block moves by PORT_STEP while any of them is taken. The
#: services' HTTP ports have a range of their own (ingest node i on http_base + i, the
#: stages' instances from http_base + 17, 33, 49; :func:`services.local.cluster.http_ports`),
#: above every other port of the PORT_TRIES blocks, with the admin service after them.
TEST_PORTS = {
    "kafka_port": 19092,
    "kafka_controller_port": 19093,
    "redis_port": 16379,
    "postgres_port": 15432,
    "listen_port": 21883,
    "tls_listen_port": 21884,
    "ws_listen_port": 21885,
    "wss_listen_port": 21886,
    "ingest_base_port": 21900,
    "http_base_port": 24000,
    "admin_port": 24080,
}
PORT_STEP = 100
PORT_TRIES = 20

#: Seconds the test cluster lets a produce take before an MQTT PUBLISH is refused.
KAFKA_REQUEST_TIMEOUT = 5.0

#: Client ids of APPLICATION clients in the test cluster (``application_client_ids``).
APPLICATION_IDS = "app-*"


#: The secured cluster's ports (tests/integration/test_secured_cluster.py): the session's
#: block moved by this much, into the gaps between the session cluster's own ports (its
#: ingest nodes' listeners are ``haproxy.PORT_BLOCK`` apart from ``ingest_base_port + 1``).
SECURED_PORT_OFFSET = 8

#: Ingest nodes of the secured cluster.
SECURED_INGEST_NODES = 1


def cluster_ports(ports: dict[str, int], ingest_nodes: int) -> list[int]:
    """Every port a test cluster of ``ports`` (TEST_PORTS' names) and ``ingest_nodes``
    listens on: its servers', HAProxy's, each ingest node's direct and listener ports, and
    every service's HTTP port (the admin service's included)."""
    layout = LocalSettings(ingest_nodes=ingest_nodes, **ports)
    bases = ("ingest_base_port", "http_base_port", "admin_port")
    return (
        [p for n, p in ports.items() if n not in bases]
        + haproxy.all_node_ports(layout)
        + list(cluster.http_ports(layout).values())
    )


def secured_ports(ports: dict[str, int]) -> dict[str, int]:
    """The secured cluster's TEST_PORTS beside the session cluster of ``ports``."""
    return {name: port + SECURED_PORT_OFFSET for name, port in ports.items()}


def bindable(port: int) -> bool:
    """Whether a server could listen on 127.0.0.1:``port`` now."""
    with socket.socket() as sock:
        # As the servers do: a port whose old connections linger in TIME_WAIT is free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_test_ports(ingest_nodes: int) -> dict[str, int]:
    """The first block of TEST_PORTS (shifted by multiples of PORT_STEP) that is all free,
    with the ports of the secured cluster beside it (:func:`secured_ports`).

    Another test session on the same machine then gets its own block. Raises
    ``RuntimeError`` when no free block is found in PORT_TRIES attempts.
    """
    for attempt in range(PORT_TRIES):
        ports = {name: port + attempt * PORT_STEP for name, port in TEST_PORTS.items()}
        wanted = cluster_ports(ports, ingest_nodes)
        wanted += cluster_ports(secured_ports(ports), SECURED_INGEST_NODES)
        if all(bindable(port) for port in wanted):
            return ports
    raise RuntimeError(f"no free block of test ports near {TEST_PORTS}")


def make_test_settings(state_dir: Path) -> LocalSettings:
    """Settings of a test cluster in ``state_dir``: free test ports, a unique topic prefix."""
    defaults = LocalSettings()
    ports = free_test_ports(defaults.ingest_nodes)
    return LocalSettings(
        state_dir=state_dir,
        cache_dir=defaults.cache_dir,
        kafka_bootstrap=f"127.0.0.1:{ports['kafka_port']}",
        topic_prefix=f"test-{uuid.uuid4().hex[:8]}.",
        # Short enough that the Kafka outage test sees a refused PUBLISH quickly.
        kafka_request_timeout_seconds=KAFKA_REQUEST_TIMEOUT,
        application_client_ids=[APPLICATION_IDS],
        **ports,
    )


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
        return cluster.kill_component(self.settings, name)

    def start(self, name: str) -> int:
        """Start process ``name`` and wait until it is ready; return its pid."""
        return cluster.start_component(self.settings, name)

    def start_instance(self, stage: str, name: str) -> int:
        """Start one more instance of ``stage`` (``router``, ``device-persist``,
        ``app-delivery``) as process ``name`` (stop it with :meth:`stop_extra` or
        :meth:`kill`; ``down`` stops it too); return its pid."""
        return cluster.start_instance(self.settings, stage, name)

    def start_extra(
        self, name: str, command: str, port: int | None = None, **overrides: str
    ) -> int:
        """Start one more process ``name`` (``cormorant <command>``, the cluster's settings
        and ``overrides``) and wait until it is ready; return its pid. Stop it with
        :meth:`stop_extra` or :meth:`kill`; ``down`` stops it too."""
        return cluster.start_extra(self.settings, name, command, port, **overrides)

    def stop_extra(self, name: str) -> bool:
        """Stop the extra process ``name`` cleanly; True if it was running."""
        return cluster.stop_extra(self.settings, name)

    def log(self, name: str) -> Path:
        """The log file of process ``name``."""
        return processes.log_file(self.settings.state_dir, name)

    def connections(self) -> int:
        """Connected MQTT clients, as the ingest nodes' own ``/metrics`` count them."""
        total = 0.0
        for name, port in cluster.http_ports(self.settings).items():
            if not name.startswith("ingest-node"):
                continue
            address = f"http://127.0.0.1:{port}/metrics"
            with urllib.request.urlopen(address, timeout=10) as response:
                samples = parse_exposition(response.read().decode())
            total += sum(value for _, value in samples.get("cormorant_mqtt_connections", ()))
        return int(total)
