"""Bad input from one client gets the MQTT-mandated reaction and harms no other client.

Each test keeps a healthy subscriber connected to the same node and checks afterwards that
it still receives, so a crashed or wedged node fails the test.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from tests.e2e.clients import (
    RawSocket,
    aio_client,
    collect,
    connect_packet,
    packet,
    publish_packet,
    unique,
)
from tests.servers import LocalCluster

pytestmark = pytest.mark.cluster

CONNACK_ACCEPTED = b"\x20\x02\x00\x00"
CONNACK_UNACCEPTABLE_PROTOCOL_VERSION = b"\x20\x02\x00\x01"


@pytest.fixture(params=[0, 1], ids=["node1", "node2"])
def node_port(request: pytest.FixtureRequest, cluster: LocalCluster) -> int:
    """The port of one ingest node (each test runs against both)."""
    return cluster.node_ports[request.param]


@asynccontextmanager
async def bystander(node_port: int) -> AsyncIterator[str]:
    """A healthy subscriber on the node under test during the block; yields its topic.

    On leaving the block it checks that the subscriber still receives and that the node
    still accepts new connections.
    """
    topic = unique("e2e/bystander")
    async with aio_client(node_port, unique("bystander")) as client:
        await client.subscribe(topic, qos=1)
        yield topic
        async with aio_client(node_port, unique("pub"), 4) as pub:
            await pub.publish(topic, b"still here", qos=1)
        [message] = await collect(client, 1)
        assert (str(message.topic), message.payload) == (topic, b"still here")


@pytest.mark.parametrize(
    "data",
    [
        # Reserved flag (bit 0) of the Connect Flags set: malformed (MQTT 3.1.2-3).
        connect_packet("bad-flags", flags=0x03),
        # The first packet is not a CONNECT (MQTT 3.1.0-1).
        packet(0xC0, b""),
        # Remaining Length longer than the bytes that follow, then a close from this side
        # is not sent: a CONNECT whose client id length runs past the packet.
        packet(0x10, b"\x00\x04MQTT\x04\x02\x00\x3c\x00\x40abc"),
        # Variable Byte Integer of five bytes (MQTT 1.5.5: at most four).
        b"\x10\xff\xff\xff\xff\x01",
    ],
    ids=["reserved-flag", "not-connect", "short-client-id", "long-vbi"],
)
async def test_a_malformed_v311_connect_is_closed_without_connack(
    node_port: int, data: bytes
) -> None:
    def exchange() -> bytes:
        with RawSocket(node_port) as raw:
            raw.send(data)
            return raw.read_until_closed()

    async with bystander(node_port):
        assert await asyncio.to_thread(exchange) == b""


@pytest.mark.parametrize("level", [2, 6, 255])
async def test_an_unsupported_protocol_level_gets_connack_0x01(node_port: int, level: int) -> None:
    def exchange() -> bytes:
        with RawSocket(node_port) as raw:
            raw.send(connect_packet(unique("level"), level=level))
            return raw.read_until_closed()

    async with bystander(node_port):
        # MQTT 3.1.2-2: CONNACK return code 0x01, then the connection is closed.
        assert await asyncio.to_thread(exchange) == CONNACK_UNACCEPTABLE_PROTOCOL_VERSION


async def test_a_connect_with_another_protocol_name_is_refused(node_port: int) -> None:
    def exchange() -> bytes:
        with RawSocket(node_port) as raw:
            raw.send(connect_packet(unique("name"), name=b"MQTX"))
            return raw.read_until_closed()

    async with bystander(node_port):
        # MQTT 3.1.2-1 lets the server close at once or answer by another specification:
        # Cormorant answers "unacceptable protocol version", as for an unknown level.
        assert await asyncio.to_thread(exchange) in (b"", CONNACK_UNACCEPTABLE_PROTOCOL_VERSION)


@pytest.mark.parametrize("qos", [0, 1])
async def test_a_v311_publish_with_invalid_utf8_topic_closes_the_connection(
    node_port: int, qos: int
) -> None:
    def exchange(topic: str) -> tuple[bytes, bytes]:
        with RawSocket(node_port) as raw:
            raw.send(connect_packet(unique("badtopic")))
            connack = raw.read(4)
            # The bystander's own topic plus an invalid UTF-8 byte: nobody may get it.
            raw.send(publish_packet(topic.encode() + b"\xff", b"poison", qos=qos))
            return connack, raw.read_until_closed()

    async with bystander(node_port) as topic:
        connack, answer = await asyncio.to_thread(exchange, topic)
        assert connack == CONNACK_ACCEPTED
        assert answer == b""  # no PUBACK: closed (MQTT 1.5.3-1, 4.8)


async def test_a_v5_publish_with_invalid_utf8_topic_gets_disconnect_0x81(node_port: int) -> None:
    def exchange() -> tuple[bytes, bytes]:
        with RawSocket(node_port) as raw:
            raw.send(connect_packet(unique("badtopic5"), level=5))
            head = raw.read(2)
            connack = head + raw.read(head[1])
            raw.send(publish_packet(b"a/\xc3\x28", b"poison", qos=1, v5=True))
            return connack, raw.read_until_closed()

    async with bystander(node_port):
        connack, answer = await asyncio.to_thread(exchange)
        assert connack[:4] == b"\x20" + bytes([len(connack) - 2]) + b"\x00\x00", connack
        # DISCONNECT with Reason Code 0x81 Malformed Packet (MQTT 5.0 1.5.4-1, 4.13.1).
        assert answer[:1] == b"\xe0" and answer[2:3] == b"\x81", answer
