"""The ports a local cluster listens on, and a free block of them for one more cluster.

A second cluster on the same machine (a test session, a benchmark's own cluster) shifts
every port of a base block by multiples of a step until all of them are free, so it runs
beside a developer's cluster and beside other sessions.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping

from services.local import kafka, redis
from services.local.layout import Layout, apply
from services.local.settings import LocalSettings


def listening_ports(settings: LocalSettings) -> list[int]:
    """Every port the cluster of ``settings`` (its layout included) listens on."""
    ports = [settings.postgres_port, settings.listen_port]
    ports += [settings.ingest_base_port + i for i in range(1, settings.ingest_nodes + 1)]
    for node in kafka.broker_ids(settings):
        ports.append(kafka.client_port(settings, node))
        ports.append(kafka.controller_port(settings, node))
    ports += [redis.node_port(settings, node) for node in redis.node_ids(settings)]
    ports += [redis.sentinel_port(settings, j) for j in redis.sentinel_ids(settings)]
    return ports


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


def free_block(
    base: Mapping[str, int], layout: Layout, *, step: int = 100, tries: int = 20
) -> dict[str, int]:
    """The first of ``base``'s port settings (``kafka_port`` ...: every port setting of
    :class:`LocalSettings`), shifted by a multiple of ``step``, whose cluster of ``layout``
    finds all its ports free. Raises ``RuntimeError`` when none of ``tries`` shifts is."""
    for attempt in range(tries):
        ports = {name: port + attempt * step for name, port in base.items()}
        wanted = listening_ports(apply(LocalSettings().model_copy(update=ports), layout))
        if all(bindable(port) for port in wanted):
            return ports
    raise RuntimeError(f"no free block of ports near {dict(base)}")
