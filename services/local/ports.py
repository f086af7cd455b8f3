"""Every port a local cluster listens on, and where more clusters go on the same machine.

A cluster's ports follow from its port settings (:data:`PORT_SETTINGS`), its layout
(:mod:`services.local.layout`) and its ingest nodes: :func:`listening_ports` lists them all.
A developer's cluster uses the settings' defaults. Any other cluster on the machine takes a
**block**: :data:`BASE` moved by a multiple of :data:`STEP`, the first of :data:`TRIES`
blocks whose ports are all free (:func:`free_block`), so clusters of test sessions and
benchmarks run beside a developer's and beside each other.

A block holds four clusters, each in its **slot**: the block moved by a few ports
(:class:`Slot`), into the gaps of the others (an ingest node's listeners are
``haproxy.PORT_BLOCK`` apart, and so are the stages' HTTP ports):

- :data:`SESSION` (+0): a test session's shared cluster;
- :data:`SECURED` (+8): the test session's secured cluster (TLS, SASL, passwords);
- :data:`PRODUCTION` (+12): the test session's production-layout cluster (3 Kafka brokers,
  Redis with two replicas and Sentinels);
- :data:`BENCH` (+38): a benchmark's own cluster (``python -m bench chaos --own-cluster``).

A test session takes the first block whose three slots are free; a benchmark the first
whose :data:`BENCH` slot is. tests/unit/test_ports.py proves that no port of any slot of
any block is another's or the developer's cluster's, and that all lie below the kernel's
ephemeral range.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

from services.local import cluster, haproxy, kafka, redis
from services.local.layout import PRODUCTION as PRODUCTION_LAYOUT
from services.local.layout import Layout, apply
from services.local.settings import LocalSettings

#: The settings a block moves: every port of :class:`LocalSettings` the cluster's ports are
#: derived from (``mqtt_port`` and ``http_port`` are a service process's own, set by the
#: launcher from these).
PORT_SETTINGS = (
    "kafka_port",
    "kafka_controller_port",
    "redis_port",
    "redis_sentinel_port",
    "postgres_port",
    "listen_port",
    "tls_listen_port",
    "ws_listen_port",
    "wss_listen_port",
    "ingest_base_port",
    "http_base_port",
    "admin_port",
)

#: Ports between two blocks of one base.
STEP = 100

#: Blocks of one base tried before giving up.
TRIES = 20

#: The first block.
BASE: dict[str, int] = {
    "kafka_port": 19092,
    "kafka_controller_port": 19093,
    "redis_port": 16379,
    "redis_sentinel_port": 16389,
    "postgres_port": 15432,
    "listen_port": 21883,
    "tls_listen_port": 21884,
    "ws_listen_port": 21885,
    "wss_listen_port": 21886,
    "ingest_base_port": 21900,
    "http_base_port": 24000,
    "admin_port": 24080,
}


@dataclass(frozen=True, slots=True)
class Slot:
    """A cluster's place in a block: the block's ports moved by ``offset``, with the
    ``layout`` and ``ingest_nodes`` whose ports it reserves (a cluster of that size or
    smaller fits)."""

    offset: int = 0
    layout: Layout = field(default_factory=Layout)
    ingest_nodes: int = 2

    def ports(self, block: Mapping[str, int]) -> dict[str, int]:
        """The port settings of this slot of ``block`` (:data:`PORT_SETTINGS` → port)."""
        return {name: port + self.offset for name, port in block.items()}

    def settings(self, block: Mapping[str, int]) -> LocalSettings:
        """Default settings with this slot's ports of ``block``, layout and ingest nodes."""
        values = LocalSettings().model_copy(
            update={**self.ports(block), "ingest_nodes": self.ingest_nodes}
        )
        return apply(values, self.layout)

    def block(self, settings: LocalSettings) -> dict[str, int]:
        """The block of which ``settings`` hold this slot's ports."""
        return {name: getattr(settings, name) - self.offset for name in PORT_SETTINGS}


SESSION = Slot(0, Layout(), ingest_nodes=2)
SECURED = Slot(8, Layout(), ingest_nodes=1)
PRODUCTION = Slot(12, PRODUCTION_LAYOUT, ingest_nodes=2)
#: Any layout up to the production one.
BENCH = Slot(38, PRODUCTION_LAYOUT, ingest_nodes=2)

#: The slots a test session reserves in its block.
TEST_SLOTS = (SESSION, SECURED, PRODUCTION)

#: Every slot of a block.
SLOTS = (*TEST_SLOTS, BENCH)


def listening_ports(settings: LocalSettings) -> list[int]:
    """Every port the cluster of ``settings`` (its layout included) listens on: Kafka's
    brokers and controllers, Redis' nodes and Sentinels, PostgreSQL, HAProxy's frontends,
    each ingest node's direct and listener ports, and every service process's HTTP port
    (``/health``, ``/ready``, ``/metrics``; the admin service's included)."""
    found = [settings.postgres_port, *haproxy.frontend_ports(settings).values()]
    for node in kafka.broker_ids(settings):
        found += [kafka.client_port(settings, node), kafka.controller_port(settings, node)]
    found += [redis.node_port(settings, node) for node in redis.node_ids(settings)]
    found += [redis.sentinel_port(settings, j) for j in redis.sentinel_ids(settings)]
    found += haproxy.all_node_ports(settings)
    found += cluster.http_ports(settings).values()
    return found


def bindable(port: int) -> bool:
    """Whether ``port`` can be bound on 127.0.0.1 now (one whose old connections linger in
    TIME_WAIT counts as free, as the servers bind with SO_REUSEADDR)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def blocks() -> list[dict[str, int]]:
    """Every block, in the order they are tried: :data:`BASE` moved by 0, STEP, 2 STEP..."""
    return [{name: port + k * STEP for name, port in BASE.items()} for k in range(TRIES)]


def free_block(slots: tuple[Slot, ...]) -> dict[str, int]:
    """The first of :func:`blocks` where every port of every one of ``slots`` is free: a
    session or benchmark started later on the same machine then takes another. Raises
    ``RuntimeError`` when none is."""
    for block in blocks():
        wanted = [port for slot in slots for port in listening_ports(slot.settings(block))]
        if all(bindable(port) for port in wanted):
            return block
    raise RuntimeError(f"no block of ports near {BASE} is free for {slots}")
