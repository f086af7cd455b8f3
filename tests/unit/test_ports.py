"""The port scheme of the machine's local clusters (:mod:`services.local.ports`): a
developer's cluster, every test session's clusters (shared, secured, production layout)
and a benchmark's own cluster never want the same port, whichever blocks they take."""

from __future__ import annotations

import socket
from collections import Counter

from services.local import cluster, haproxy, kafka, layout, ports, redis
from services.local.settings import LocalSettings

#: The first port of Linux's default ephemeral range (net.ipv4.ip_local_port_range): the
#: kernel hands these out as the source ports of outgoing connections.
EPHEMERAL_START = 32768


def _developer_cluster() -> LocalSettings:
    """The defaults, in the largest layout ``cormorant up`` starts."""
    return layout.apply(LocalSettings(), layout.PRODUCTION)


def test_no_two_clusters_of_the_machine_want_the_same_port() -> None:
    wanted: Counter[int] = Counter(ports.listening_ports(_developer_cluster()))
    for block in ports.blocks():
        for slot in ports.SLOTS:
            wanted.update(ports.listening_ports(slot.settings(block)))
    shared = sorted(port for port, count in wanted.items() if count > 1)
    assert not shared
    assert min(wanted) > 1024 and max(wanted) < EPHEMERAL_START


def test_a_cluster_lists_every_port_it_listens_on() -> None:
    settings = ports.PRODUCTION.settings(ports.BASE)
    found = ports.listening_ports(settings)
    assert len(set(found)) == len(found)
    expected = {settings.postgres_port, settings.admin_port}
    expected |= set(haproxy.frontend_ports(settings).values())  # MQTT, TLS, WS, WSS
    expected |= set(haproxy.all_node_ports(settings))  # direct and behind HAProxy
    expected |= set(cluster.http_ports(settings).values())  # /health /ready /metrics
    for node in (1, 2, 3):
        expected |= {kafka.client_port(settings, node), kafka.controller_port(settings, node)}
    expected |= {redis.node_port(settings, node) for node in (1, 2, 3)}
    expected |= {redis.sentinel_port(settings, j) for j in (1, 2, 3)}
    assert set(found) == expected


def test_a_block_moves_every_port_setting() -> None:
    # The launcher sets these from the others (the bridge publishes through HAProxy's port).
    per_process = {"mqtt_port", "http_port", "integrations_mqtt_port"}
    port_fields = {name for name in LocalSettings.model_fields if name.endswith("_port")}
    assert set(ports.PORT_SETTINGS) == port_fields - per_process
    assert set(ports.BASE) == set(ports.PORT_SETTINGS)
    for slot in ports.SLOTS:
        settings = slot.settings(ports.BASE)
        assert slot.block(settings) == ports.BASE
        assert layout.of(settings) == slot.layout
        assert settings.ingest_nodes == slot.ingest_nodes


def _hold_a_free_blocks_port() -> tuple[dict[str, int], int, socket.socket]:
    """(block offsets, port, listening socket) for the first port of a free block; another test
    session may take a block between the search and the bind, so search again then."""
    for _ in range(20):
        first = ports.free_block((ports.SESSION,))
        taken = ports.listening_ports(ports.SESSION.settings(first))[0]
        holder = socket.socket()
        # As the servers bind (and ports.bindable checks): a port whose old connections
        # linger in TIME_WAIT is free.
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            holder.bind(("127.0.0.1", taken))
        except OSError:
            holder.close()
            continue
        holder.listen()
        return first, taken, holder
    raise AssertionError("every free block found was taken before its first port could be bound")


def test_a_block_with_a_taken_port_is_passed_over() -> None:
    first, taken, holder = _hold_a_free_blocks_port()
    with holder:
        assert not ports.bindable(taken)
        later = ports.free_block((ports.SESSION,))
    assert later != first
    assert taken not in ports.listening_ports(ports.SESSION.settings(later))
