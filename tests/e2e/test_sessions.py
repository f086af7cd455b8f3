"""Session takeover (MQTT 3.1.4-3): a client id connecting again, on any node, wins."""

from __future__ import annotations

import pytest

from tests.e2e.clients import TIMEOUT, PahoClient, RawSocket, connect_packet, unique
from tests.servers import LocalCluster
from tests.waiting import wait_until

pytestmark = pytest.mark.cluster

SESSION_TAKEN_OVER = 0x8E


@pytest.mark.parametrize(("old", "new"), [(0, 1), (1, 0), (0, 0)], ids=["1to2", "2to1", "same"])
def test_a_v5_client_taken_over_gets_disconnect_0x8E(
    cluster: LocalCluster, old: int, new: int
) -> None:
    ports = cluster.node_ports
    client_id = unique("takeover")
    topic = unique("e2e/takeover")
    first = PahoClient(ports[old], client_id)
    second = PahoClient(ports[new], client_id)
    publisher = PahoClient(cluster.mqtt_port, unique("pub"), version=4)
    try:
        assert first.connect() == 0
        assert second.connect() == 0
        wait_until(lambda: bool(first.snapshot()[1]), "the first client's disconnect", TIMEOUT)
        assert [rc.value for rc in first.snapshot()[1]] == [SESSION_TAKEN_OVER]
        # The new connection holds the session: it subscribes and receives.
        assert [rc.value for rc in second.subscribe(topic, 1)] == [1]
        assert publisher.connect() == 0
        publisher.publish(topic, b"to the new one", 1)
        message = second.messages.get(timeout=TIMEOUT)
        assert message.payload == b"to the new one"
        assert second.snapshot()[1] == []
    finally:
        for client in (first, second, publisher):
            client.close()


def test_a_v311_client_taken_over_is_closed(cluster: LocalCluster) -> None:
    node1, node2 = cluster.node_ports
    client_id = unique("takeover311")
    new = PahoClient(node2, client_id, version=4)
    with RawSocket(node1) as old:
        old.send(connect_packet(client_id))
        assert old.read(4) == b"\x20\x02\x00\x00"
        try:
            assert new.connect() == 0
            # MQTT 3.1.1 has no DISCONNECT from the server: the socket just closes.
            assert old.read_until_closed() == b""
            assert new.snapshot()[1] == []
        finally:
            new.close()
