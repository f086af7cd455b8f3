"""Listener hardening: WebSocket ``allowed_origins`` (sans-IO, then through a real listener),
``proxy_trusted_cidrs`` (a PROXY header only from the load balancers' networks) and the
settings that carry them. The listeners run in this process on loopback ports with a node
whose Kafka is test_ingest_node's :class:`Producer`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from pydantic import ValidationError
from test_ingest_node import Producer, WillCommits
from test_ingest_support import make_settings

from services.common.auth.authenticate import Authenticator, NoCredentials
from services.common.mqtt.codec import encode
from services.common.mqtt.packets import Connect
from services.common.settings import Listener
from services.ingest.limits import Refusal
from services.ingest.listeners import Listeners, start_listeners
from services.ingest.node import IngestNode
from services.ingest.websocket import WebSocketFraming
from tests.waiting import wait_for

KEY = "dGhlIHNhbXBsZSBub25jZQ=="
ORIGIN = "https://console.example.com"


def upgrade(origin: str | None) -> bytes:
    """An opening handshake on /mqtt, with ``origin`` as its Origin header (None: none,
    as a device's library sends it)."""
    lines = [
        "GET /mqtt HTTP/1.1",
        "Host: broker.example.com:8083",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {KEY}",
        "Sec-WebSocket-Version: 13",
        "Sec-WebSocket-Protocol: mqtt",
    ]
    if origin is not None:
        lines.append(f"Origin: {origin}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


# ---------------------------------------------------------------------- sans-IO


@pytest.mark.parametrize(
    ("origin", "status"),
    [
        (ORIGIN, b"101"),
        (None, b"101"),
        ("https://evil.example.net", b"403"),
        ("https://console.example.com.evil.example.net", b"403"),
        ("http://console.example.com", b"403"),  # another scheme is another origin
    ],
)
def test_only_allowed_origins_may_upgrade(origin: str | None, status: bytes) -> None:
    ws = WebSocketFraming(1024, origins=[ORIGIN])
    received = ws.receive(upgrade(origin))
    assert received.reply.split(b" ", 2)[1] == status
    assert received.close is (status != b"101")


def test_without_allowed_origins_any_origin_may_upgrade() -> None:
    reply = WebSocketFraming(1024).receive(upgrade("https://anywhere.example")).reply
    assert reply.startswith(b"HTTP/1.1 101 ")


def test_listener_settings_are_checked() -> None:
    with pytest.raises(ValidationError, match="not a CIDR network"):
        Listener(kind="mqtt", port=1, proxy_protocol=True, proxy_trusted_cidrs=("10.0.0.0/33",))
    with pytest.raises(ValidationError, match="not an origin"):
        Listener(kind="ws", port=1, allowed_origins=("https://a.example/path",))
    with pytest.raises(ValidationError, match="WebSocket listeners"):
        Listener(kind="mqtt", port=1, allowed_origins=(ORIGIN,))
    default = Listener(kind="mqtt", port=1, proxy_protocol=True)
    assert default.proxy_trusted("127.0.0.1") and default.proxy_trusted("10.40.3.4")
    assert not default.proxy_trusted("203.0.113.5")
    vpc = Listener(kind="mqtt", port=1, proxy_protocol=True, proxy_trusted_cidrs=("10.40.0.0/16",))
    assert vpc.proxy_trusted("::ffff:10.40.0.9") and not vpc.proxy_trusted("10.41.0.1")


# ---------------------------------------------------------------------- real listeners


@asynccontextmanager
async def serving(*listeners: Listener) -> AsyncIterator[tuple[IngestNode, Producer, Listeners]]:
    producer = Producer()

    async def synced() -> None:
        return None

    async def no_app_topics(client_id: str) -> None:
        raise AssertionError(client_id)

    settings = make_settings(
        node_id="n1",
        topic_prefix="t.",
        kafka_request_timeout_seconds=5.0,
        mqtt_host="127.0.0.1",
        mqtt_port=0,
        listeners=list(listeners),
    )
    node = IngestNode(
        settings,
        producer.send,
        synced,
        no_app_topics,
        commit_will=WillCommits(),
        commit_delayed=WillCommits(),
        authenticator=Authenticator(NoCredentials(), allow_anonymous=True),
        fetch_credential=NoCredentials().get,
    )
    opened = await start_listeners(node)
    try:
        yield node, producer, opened
    finally:
        opened.close()
        # a clean shutdown: Kafka (the test's producer) answers everything until it is done
        stopping = asyncio.create_task(node.shut_down())

        def stopped() -> bool:
            producer.answer()
            return stopping.done()

        await wait_for(stopped, "the node's shutdown")


PROXY_V1 = b"PROXY TCP4 192.0.2.7 127.0.0.1 40000 1883\r\n"


async def test_a_proxy_header_from_outside_the_trusted_networks_closes_the_connection() -> None:
    untrusted = Listener(
        kind="mqtt", port=0, proxy_protocol=True, proxy_trusted_cidrs=("10.0.0.0/8",)
    )
    async with serving(untrusted) as (node, _producer, opened):
        port = opened.ports["mqtt"][1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(PROXY_V1 + encode(Connect(4, "spoofer", True, 30), 4))
        assert await asyncio.wait_for(reader.read(), 10) == b""  # closed, no CONNACK
        writer.close()
        assert node.refusals.counts[Refusal.PROXY_HEADER] == 1


async def test_a_proxy_header_from_a_trusted_network_names_the_client() -> None:
    trusted = Listener(
        kind="mqtt", port=0, proxy_protocol=True, proxy_trusted_cidrs=("127.0.0.0/8",)
    )
    async with serving(trusted) as (node, producer, opened):
        port = opened.ports["mqtt"][1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(PROXY_V1 + encode(Connect(4, "behind-lb", True, 30), 4))
        await wait_for(lambda: producer.on(node.names.client_sessions), "the session record")
        producer.answer()
        assert await asyncio.wait_for(reader.readexactly(4), 10) == b"\x20\x02\x00\x00"
        client = node.registry.get("behind-lb")
        assert client is not None
        assert client.connection.state.client_address == "192.0.2.7:40000"
        writer.close()
        assert node.refusals.counts[Refusal.PROXY_HEADER] == 0


async def test_a_websocket_listener_refuses_a_foreign_origin_with_403() -> None:
    ws = Listener(kind="ws", port=0, allowed_origins=(ORIGIN,))
    async with serving(ws) as (node, _producer, opened):
        port = opened.ports["ws"][0]
        for origin, status in [("https://evil.example.net", b"403"), (ORIGIN, b"101")]:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(upgrade(origin))
            line = await asyncio.wait_for(reader.readline(), 10)
            assert line.split(b" ", 2)[1] == status, line
            writer.close()
        assert node.refusals.counts[Refusal.WEBSOCKET_HANDSHAKE] == 1
