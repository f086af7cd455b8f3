"""Sessions across nodes: takeover (MQTT 3.1.4-3: a client id connecting again, on any node,
wins) and a DISCONNECT that ends the session at once (MQTT 5.0 3.14.2.2.2)."""

from __future__ import annotations

import pytest

from tests.e2e.clients import (
    TIMEOUT,
    PahoClient,
    RawSocket,
    aio_client,
    connect_packet,
    disconnect_packet,
    publish_topic,
    session_connect_packet,
    subscribe_packet,
    unique,
)
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


@pytest.mark.parametrize("same_node", [True, False], ids=["same-node", "other-node"])
@pytest.mark.parametrize(
    ("clean_start", "expiry"),
    [(True, 300), (False, 0)],
    ids=["expiry-300", "clean-start-0-no-expiry"],
)
async def test_a_disconnect_with_session_expiry_0_ends_the_session_at_once(
    cluster: LocalCluster, same_node: bool, clean_start: bool, expiry: int
) -> None:
    """MQTT 5.0 3.14.2.2.2, 3.1.2.11.2: a DISCONNECT saying Session Expiry Interval 0 ends
    the session when the connection closes, so a reconnect with Clean Start 0 right after
    it, on either node, gets Session Present 0 and none of the old subscriptions."""
    node1, node2 = cluster.node_ports
    client_id = unique("sei0")
    topic = unique("e2e/sei0")
    with RawSocket(node1) as first:
        first.send(
            session_connect_packet(
                client_id, level=5, clean_start=clean_start, session_expiry=expiry
            )
        )
        assert first.read_packet()[0] == 0x20
        first.send(subscribe_packet(topic, 1))
        assert first.read_packet()[0] == 0x90  # SUBACK: the session has a subscription
        first.send(disconnect_packet(session_expiry=0))
        assert first.read_until_closed() == b""
    with RawSocket(node1 if same_node else node2) as again:
        again.send(
            session_connect_packet(client_id, level=5, clean_start=False, session_expiry=300)
        )
        kind, body = again.read_packet()
        assert (kind, body[0] & 0x01, body[1]) == (0x20, 0, 0)  # CONNACK, Session Present 0
        # No old subscription: the publisher's message to the old topic would come before
        # its next one, to a topic the new session subscribes to (MQTT 4.6).
        again.send(subscribe_packet(f"{topic}-marker", 1, packet_id=2))
        assert again.read_packet()[0] == 0x90
        async with aio_client(cluster.mqtt_port, unique("pub")) as publisher:
            await publisher.publish(topic, b"old subscription", qos=1)
            await publisher.publish(f"{topic}-marker", b"marker", qos=1)
        kind, body = again.read_packet()
        assert kind & 0xF0 == 0x30 and publish_topic(body) == f"{topic}-marker"
