"""An ingest node's drain end to end: on SIGTERM, and by hand (``cormorant drain``).

Each test starts an ingest node of its own beside the cluster's (its clients connect to it
directly and no load balancer routes to it, so it needs no notice: ``drain_notice_seconds``
0), with a drain rate low enough that a handful of clients leave over seconds. The clients
(paho-mqtt, MQTT 5 and 3.1.1, persistent sessions) come back through HAProxy to the
cluster's own nodes, the survivors, where their sessions resume.
"""

from __future__ import annotations

import contextlib
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from services.local import cluster as local_cluster
from services.local.settings import LocalSettings
from tests.e2e.admin import PASSWORD, admin_api, running
from tests.e2e.clients import TIMEOUT, PahoClient, unique
from tests.e2e.test_ops_cli import Cli
from tests.servers import LocalCluster
from tests.waiting import wait_until

pytestmark = pytest.mark.cluster

NAME = "ingest-drain"
NODE_ID = "drainer"
RATE = 4.0
"""Clients per second the node disconnects (``drain_rate``)."""

SESSION_EXPIRY = 600
USE_ANOTHER_SERVER = 0x9C
SERVER_SHUTTING_DOWN = 0x8B


@dataclass(frozen=True)
class DrainNode:
    """The test's own ingest node: its MQTT port and its HTTP port (``/ready``)."""

    port: int
    http_port: int


@pytest.fixture
def node(settings: LocalSettings, cluster: LocalCluster) -> Iterator[DrainNode]:
    """An ingest node that drains ``RATE`` clients a second, within 30 s, with no notice."""
    # A port of this session's block that the cluster leaves free (its nodes use the
    # base + 1 .. base + 80; tests/e2e/test_limits.py the base + 90 and 91).
    port, http_port = settings.ingest_base_port + 93, local_cluster.free_port()
    cluster.start_extra(
        NAME,
        "ingest",
        port,
        node_id=NODE_ID,
        mqtt_port=str(port),
        http_port=str(http_port),
        drain_notice_seconds="0",
        drain_rate=str(RATE),
        drain_seconds="30",
    )
    yield DrainNode(port, http_port)
    cluster.stop_extra(NAME)


def _subscriber(port: int, client_id: str, version: int, *, manual_ack: bool) -> PahoClient:
    return PahoClient(
        port,
        client_id,
        version=version,
        clean_start=False,
        session_expiry=SESSION_EXPIRY,
        manual_ack=manual_ack,
    )


def _payloads(client: PahoClient) -> list[bytes]:
    found = []
    while not client.messages.empty():
        found.append(client.messages.get_nowait().payload)
    return found


def test_a_stopped_node_drains_its_clients_over_time_to_the_survivors_losing_nothing(
    cluster: LocalCluster, node: DrainNode
) -> None:
    topic = unique("e2e/drain")
    count = 8
    # Persistent sessions that leave the messages they get before the drain unacknowledged:
    # QoS 1 deliveries in flight when their connection ends.
    first = [
        _subscriber(node.port, unique(f"drained{i}"), 5 if i % 2 else 4, manual_ack=True)
        for i in range(count)
    ]
    publisher = PahoClient(cluster.mqtt_port, unique("publisher"))
    again: dict[int, PahoClient] = {}
    received: dict[int, list[bytes]] = {i: [] for i in range(count)}
    stopping = threading.Thread(target=cluster.stop_extra, args=(NAME,))
    try:
        for client in first:
            assert client.connect() == 0
            assert client.subscribe(f"{topic}/#", 1)[0] == 1
        assert publisher.connect() == 0
        sent: dict[int, bytes] = {}

        def publish(payload: bytes) -> None:
            sent[publisher.publish(f"{topic}/m", payload, 1)] = payload

        for k in range(3):
            publish(b"before-%d" % k)

        def got_the_first_three() -> bool:
            for i, client in enumerate(first):
                received[i] += _payloads(client)
            return all(len(r) == 3 for r in received.values())

        wait_until(got_the_first_three, "the messages before the drain", TIMEOUT)

        stopping.start()  # SIGTERM; returns once the node exited

        def drained_and_back() -> bool:
            """One more PUBLISH on each look while the node drains; each client
            disconnected comes back through HAProxy with its session."""
            if stopping.is_alive() and len(sent) < 100:
                publish(b"during-%d" % len(sent))
            for i, client in enumerate(first):
                if i not in again and client.disconnects:
                    received[i] += _payloads(client)
                    again[i] = _subscriber(
                        cluster.mqtt_port, client.client_id, client.version, manual_ack=False
                    )
                    assert again[i].connect() == 0
            return len(again) == count and not stopping.is_alive()

        wait_until(drained_and_back, "the drain and every reconnect", 90)
        publish(b"end")

        def all_acknowledged() -> bool:
            return set(publisher.snapshot()[0]) == set(sent)

        wait_until(all_acknowledged, "every PUBACK", TIMEOUT)
        pubacks, _ = publisher.snapshot()
        acknowledged = {sent[mid] for mid, code in pubacks.items() if code == 0}
        assert b"end" in acknowledged and len(acknowledged) > 4  # some during the drain

        def every_one_has_every_message() -> bool:
            for i, client in again.items():
                received[i] += _payloads(client)
            return all(acknowledged <= set(r) for r in received.values())

        with contextlib.suppress(AssertionError):  # what is missing is named below
            wait_until(every_one_has_every_message, "every acknowledged message", 60)
        for i in range(count):
            missing = acknowledged - set(received[i])
            assert not missing, (first[i].client_id, sorted(missing))

        # The disconnects were spread over the drain, not at once: at RATE a second, the
        # last of them (count - 1) / RATE = 1.75 s after the first.
        when = sorted(client.disconnected_at[0] for client in first)
        assert when[-1] - when[0] >= 1.0, when
        assert {int(client.disconnects[0].value) for client in first if client.version == 5} == {
            SERVER_SHUTTING_DOWN
        }
    finally:
        if stopping.is_alive():
            stopping.join(90)
        for client in [*first, *again.values(), publisher]:
            client.close()


def test_cormorant_drain_empties_a_running_node_and_takes_it_out_of_rotation(
    settings: LocalSettings, node: DrainNode, tmp_path_factory: pytest.TempPathFactory
) -> None:
    api = admin_api(running(settings))
    cli = Cli(tmp_path_factory.mktemp("config"))
    cli("login", api.url, "--username", api.username, "--password-file", "-", input=PASSWORD)
    clients = [_subscriber(node.port, unique("kept"), 5, manual_ack=False) for _ in range(3)]
    try:
        for client in clients:
            assert client.connect() == 0

        def listed() -> int:
            page = cli.json("clients", "list", "--node", NODE_ID)
            return len(page["items"])

        wait_until(lambda: listed() == 3, "the node's clients listed", 30)
        assert "draining drainer" in cli("drain", NODE_ID, "--window", "5").stdout
        wait_until(lambda: all(c.disconnects for c in clients), "every disconnect", 30)
        assert {int(c.disconnects[0].value) for c in clients} == {USE_ANOTHER_SERVER}
        wait_until(lambda: listed() == 0, "the node's client list empty", 30)
        # Out of rotation: its /ready fails while it stays up.
        url = f"http://127.0.0.1:{node.http_port}/ready"
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(url, timeout=10)
        assert answer.value.code == 503
        with urllib.request.urlopen(f"http://127.0.0.1:{node.http_port}/health", timeout=10):
            pass
        refused = cli("drain", "no-such-node", code=1)
        assert "no ingest node 'no-such-node'" in refused.stderr
    finally:
        for client in clients:
            client.close()
        cli("logout")
