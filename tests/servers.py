"""The test session's real servers: a Cormorant local cluster on test ports.

The cluster runs in a temporary state dir on its own ports, so a developer's cluster
(1883, 9092...) keeps running beside it; the Kafka jars come from the user's cache dir so
that they are downloaded once per machine, not once per session.

A session takes a block of ports (:mod:`services.local.ports`): its shared cluster in the
block's ``SESSION`` slot, and, should its tests start them, the secured cluster
(tests/integration/test_secured_cluster.py) in the ``SECURED`` slot and the
production-layout cluster (tests/topology/) in the ``PRODUCTION`` slot. All three are free
when the block is chosen, so another session on the same machine takes another block.
"""

from __future__ import annotations

import secrets
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.common.metrics import parse_exposition
from services.local import cluster, haproxy, kafka, ports, processes
from services.local.settings import LocalSettings

#: Delayed messages one client may have waiting in the test cluster.
DELAYED_PER_CLIENT = 5

#: Delayed messages to topics under this prefix have their publication held open
#: :data:`DELAYED_HOLD_SECONDS` before it commits (``delayed_hold_*``, for tests only).
DELAYED_HELD_PREFIX = "e2e/delayed-held/"
DELAYED_HOLD_SECONDS = 5.0

#: Seconds the test cluster lets a produce take before an MQTT PUBLISH is refused.
KAFKA_REQUEST_TIMEOUT = 5.0

#: Client ids of APPLICATION clients in the test cluster (``application_client_ids``).
APPLICATION_IDS = "app-*"


def make_test_settings(
    state_dir: Path,
    slot: ports.Slot = ports.SESSION,
    block: dict[str, int] | None = None,
    **overrides: Any,
) -> LocalSettings:
    """Settings of a test cluster in ``state_dir``: ``slot``'s ports of ``block`` (default:
    the first block whose test slots are all free, :func:`services.local.ports.free_block`),
    its layout and ingest nodes, a unique topic prefix; ``overrides`` (setting name →
    value) last."""
    if block is None:
        block = ports.free_block(ports.TEST_SLOTS)
    values: dict[str, Any] = {
        "state_dir": state_dir,
        "cache_dir": LocalSettings().cache_dir,
        "topic_prefix": f"test-{uuid.uuid4().hex[:8]}.",
        # Short enough that the Kafka outage test sees a refused PUBLISH quickly.
        "kafka_request_timeout_seconds": KAFKA_REQUEST_TIMEOUT,
        "application_client_ids": [APPLICATION_IDS],
        # The tests' clients connect from 127.0.0.1: their deliberate wrong passwords must
        # not delay or ban each other; the throttling tests connect from other loopback
        # addresses (127.x.y.z), with the shorter delays and ban threshold below.
        "auth_failure_exempt_networks": ["127.0.0.1/32"],
        "auth_failure_max_delay_seconds": 0.5,
        "auth_failure_ban_after": 40,
        # A bound a test reaches with a few PUBLISHes (tests/e2e/test_delayed_publish.py).
        "max_delayed_messages_per_client": DELAYED_PER_CLIENT,
        # A test cancels a delayed message while its publication is under way.
        "delayed_hold_topic_prefix": DELAYED_HELD_PREFIX,
        "delayed_hold_seconds": DELAYED_HOLD_SECONDS,
        # Admin passwords as argon2id of the least cost: at the production parameters (64 MiB,
        # 3 passes, 4 lanes) one check took 2.6 s of this loaded 2-core machine, and the admin
        # tests make and check a few hundred (logins, throttled guesses, fuzzed users).
        # tests/integration/test_admin_users.py proves the production defaults.
        "admin_password_time_cost": 1,
        "admin_password_memory_kib": 8,
        "admin_password_parallelism": 1,
        # Every node of the cluster shares it (as a deployment's secret would be).
        "scram_unknown_user_key": secrets.token_urlsafe(32),
        "ingest_nodes": slot.ingest_nodes,
        "kafka_brokers": slot.layout.kafka_brokers,
        "redis_replicas": slot.layout.redis_replicas,
        "redis_sentinel_count": slot.layout.redis_sentinel_count,
        **slot.ports(block),
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
