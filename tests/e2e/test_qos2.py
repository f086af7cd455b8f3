"""QoS 2 through the whole cluster: exactly once to subscribers, and exactly once inbound
when a publisher resends after reconnecting to the other node (MQTT 4.3.3, 4.4)."""

from __future__ import annotations

import struct

import pytest

from tests.e2e.clients import (
    MosquittoSub,
    RawSocket,
    aio_client,
    collect,
    mosquitto_pub,
    publish_packet,
    pubrel_packet,
    session_connect_packet,
    unique,
    until_marker,
)
from tests.servers import LocalCluster

pytestmark = pytest.mark.cluster

PUBREC = 0x50
PUBCOMP = 0x70


@pytest.mark.parametrize("sub_version", [4, 5], ids=["sub-v311", "sub-v5"])
async def test_a_qos2_subscriber_receives_every_message_exactly_once(
    cluster: LocalCluster, sub_version: int
) -> None:
    node1, node2 = cluster.node_ports
    topic = unique("e2e/qos2")
    count = 200
    async with (
        aio_client(node1, unique("sub"), sub_version) as sub,
        aio_client(node2, unique("pub"), max_inflight_messages=20) as pub,
    ):
        [granted] = await sub.subscribe(topic, qos=2)
        assert getattr(granted, "value", granted) == 2
        for i in range(count):
            await pub.publish(topic, str(i).encode(), qos=2)
        messages = await collect(sub, count, timeout=60)
        # And nothing twice: the publisher's next message is the next one to come (MQTT 4.6).
        await pub.publish(topic, b"marker", qos=2)
        assert await until_marker(sub, b"marker") == []
    assert sorted(int(m.payload) for m in messages) == list(range(count))  # type: ignore[arg-type]
    assert {m.qos for m in messages} == {2}


def test_mosquitto_clients_exchange_qos2_across_nodes(cluster: LocalCluster) -> None:
    node1, node2 = cluster.node_ports
    topic = unique("e2e/mosq2")
    sub = MosquittoSub(node1, topic, qos=2, count=2, version=5)
    for text in ("one", "two"):
        result = mosquitto_pub(node2, topic, text, qos=2, version=5)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "received PUBCOMP" in result.stdout + result.stderr
    assert sub.messages() == [f"{topic} one", f"{topic} two"]
    output = "\n".join(sub.output)
    assert output.count("received PUBREL") == 2  # delivered with QoS 2, to the end
    assert sub.process.returncode == 0


def _connack(raw: RawSocket) -> tuple[bool, int]:
    """Read CONNACK: (Session Present, reason / return code)."""
    kind, body = raw.read_packet()
    assert kind == 0x20, (kind, body)
    return bool(body[0] & 0x01), body[1]


def _ack(raw: RawSocket, kind: int, packet_id: int) -> int:
    """Read a PUBREC/PUBCOMP for ``packet_id``; its Reason Code (0 when absent)."""
    got, body = raw.read_packet()
    assert got == kind, (hex(got), body)
    assert struct.unpack(">H", body[:2])[0] == packet_id
    return body[2] if len(body) > 2 else 0


@pytest.mark.parametrize("level", [4, 5], ids=["v311", "v5"])
async def test_a_qos2_resend_after_a_reconnect_to_the_other_node_is_published_once(
    cluster: LocalCluster, level: int
) -> None:
    """PUBREC received, connection lost before PUBREL: the client reconnects to the other
    node, resumes its session, resends the PUBLISH with DUP, and completes with PUBREL. The
    message is published once, because the resumed session knows the Packet Identifier."""
    node1, node2 = cluster.node_ports
    client_id = unique("qos2-pub")
    topic = unique("e2e/qos2-resend")
    connect = session_connect_packet(client_id, level=level, clean_start=False, session_expiry=300)
    v5 = level == 5
    async with aio_client(node2, unique("sub")) as sub:
        await sub.subscribe(topic, qos=2)
        with RawSocket(node1) as first:
            first.send(connect)
            assert _connack(first) == (False, 0)
            first.send(publish_packet(topic.encode(), b"once", qos=2, packet_id=7, v5=v5))
            assert _ack(first, PUBREC, 7) == 0
        # The socket is gone before PUBREL: a forced reconnect, to the other node.
        with RawSocket(node2) as second:
            second.send(connect)
            assert _connack(second) == (True, 0)
            second.send(
                publish_packet(topic.encode(), b"once", qos=2, packet_id=7, v5=v5, dup=True)
            )
            assert _ack(second, PUBREC, 7) == 0
            second.send(pubrel_packet(7))
            assert _ack(second, PUBCOMP, 7) == 0  # not 0x92: the id was known
            # QoS 2 as well: the subscriber's client hands a QoS 2 message over at PUBREL,
            # so a QoS 1 message sent right after could overtake it in the client (MQTT
            # 4.6 orders the messages of one QoS).
            second.send(publish_packet(topic.encode(), b"after", qos=2, packet_id=8, v5=v5))
            assert _ack(second, PUBREC, 8) == 0
            second.send(pubrel_packet(8))
            assert _ack(second, PUBCOMP, 8) == 0
            messages = await collect(sub, 2)
            second.send(publish_packet(topic.encode(), b"marker", qos=1, packet_id=9, v5=v5))
            kind, _ = second.read_packet()
            assert kind == 0x40
            assert await until_marker(sub, b"marker") == []  # nothing more came before it
    assert [m.payload for m in messages] == [b"once", b"after"]
