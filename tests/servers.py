"""The test session's real servers: a Cormorant local cluster on test ports.

The cluster runs in a temporary state dir on its own ports, so a developer's cluster
(1883, 9092...) keeps running beside it; the Kafka jars come from the user's cache dir so
that they are downloaded once per machine, not once per session.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.local import cluster, haproxy, kafka, layout, ports, processes
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

#: A module may start a second cluster on the session's ports moved by this much (the
#: secured cluster, tests/integration/test_secured_cluster.py): a block is taken only
#: when those are free too, so that another session's servers cannot hold them.
SECOND_CLUSTER_OFFSET = 50

#: Seconds the test cluster lets a produce take before an MQTT PUBLISH is refused.
KAFKA_REQUEST_TIMEOUT = 5.0

#: Client ids of APPLICATION clients in the test cluster (``application_client_ids``).
APPLICATION_IDS = "app-*"


#: The production-layout test cluster's ports: TEST_PORTS shifted by a quarter step, so that
#: it runs beside the shared test cluster and its second cluster (SECOND_CLUSTER_OFFSET),
#: and all of them beside other sessions' blocks.
PRODUCTION_TEST_PORTS = {name: port + PORT_STEP // 4 for name, port in TEST_PORTS.items()}


def free_test_ports(base: dict[str, int] = TEST_PORTS, *, second: bool = True) -> dict[str, int]:
    """The first block of ``base`` (shifted by multiples of PORT_STEP) free for a cluster
    of MAX_LAYOUT, and with ``second`` free again SECOND_CLUSTER_OFFSET higher: another
    test session on the same machine then gets its own block. Raises ``RuntimeError`` when
    none of PORT_TRIES blocks is free."""
    for attempt in range(PORT_TRIES):
        block = {name: port + attempt * PORT_STEP for name, port in base.items()}
        wanted = ports.listening_ports(
            layout.apply(LocalSettings().model_copy(update=block), MAX_LAYOUT)
        )
        if second:
            wanted += [port + SECOND_CLUSTER_OFFSET for port in wanted]
        if all(ports.bindable(port) for port in wanted):
            return block
    raise RuntimeError(f"no free block of test ports near {base}")


def make_test_settings(
    state_dir: Path,
    ports_base: dict[str, int] = TEST_PORTS,
    *,
    second: bool = True,
    **overrides: Any,
) -> LocalSettings:
    """Settings of a test cluster in ``state_dir``: free ports of ``ports_base``'s blocks
    (with ``second``, room for a second cluster beside it: :func:`free_test_ports`), a
    unique topic prefix; ``overrides`` (setting name → value) last, e.g. a layout."""
    defaults = LocalSettings()
    values: dict[str, Any] = {
        "state_dir": state_dir,
        "cache_dir": defaults.cache_dir,
        "topic_prefix": f"test-{uuid.uuid4().hex[:8]}.",
        # Short enough that the Kafka outage test sees a refused PUBLISH quickly.
        "kafka_request_timeout_seconds": KAFKA_REQUEST_TIMEOUT,
        "application_client_ids": [APPLICATION_IDS],
        **free_test_ports(ports_base, second=second),
    }
    values.update(overrides)
    settings = LocalSettings(**values)
    # Every broker's address: a test may hand the settings to a Kafka client directly.
    return settings.model_copy(update={"kafka_bootstrap": kafka.bootstrap(settings)})


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
        ``app-delivery``) as process ``name`` (stop it with :meth:`stop_instance` or
        :meth:`kill`; ``down`` stops it too); return its pid."""
        return cluster.start_instance(self.settings, stage, name)

    def stop_instance(self, name: str) -> bool:
        """Stop the extra instance ``name`` cleanly; True if it was running."""
        return cluster.stop_instance(self.settings, name)

    def log(self, name: str) -> Path:
        """The log file of process ``name``."""
        return processes.log_file(self.settings.state_dir, name)
