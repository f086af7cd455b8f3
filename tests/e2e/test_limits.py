"""The ingest node's limits, each triggered on a real node with low limits of its own, with
the reaction docs/operations/listeners.md documents; other clients keep full service while one
is limited (proved by their progress, with deadlines, never by timing).

The node (``ingest-limits``, started once for this module beside the shared cluster, on its
Kafka) listens on a direct port and on a PROXY protocol port; the tests that need distinct
client addresses write the PROXY v2 header themselves, as HAProxy would, with addresses
from the documentation ranges.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from services.ingest.proxy_protocol import encode_v2
from services.local import cluster as local_cluster
from services.local.settings import LocalSettings
from tests.e2e.clients import (
    HOST,
    TIMEOUT,
    PahoClient,
    RawSocket,
    connect_packet,
    publish_packet,
    unique,
)
from tests.servers import LocalCluster
from tests.waiting import wait_until

LIMITS = {
    "max_connections": 40,
    "max_connection_rate_per_address": 10,
    "max_subscriptions": 3,
    "max_topic_levels": 4,
    "max_inflight_qos2": 2,
    "client_max_messages_per_second": 40,
    "client_max_bytes_per_second": 64 * 1024,
    "max_keep_alive": 20,
}
"""The limited node's settings (everything else is the cluster's)."""


@dataclass(frozen=True)
class LimitedNode:
    """The limited ingest node: its direct port, its PROXY port, its log."""

    port: int
    proxy_port: int
    cluster: LocalCluster

    def log_text(self) -> str:
        return self.cluster.log("ingest-limits").read_text()


@pytest.fixture(scope="module")
def limited(settings: LocalSettings) -> Iterator[LimitedNode]:
    """The limited node, up for this module (the cluster's Kafka, router and others too)."""
    if not all(row.healthy for row in local_cluster.status(settings)):
        local_cluster.up(settings)
    cluster = LocalCluster(settings)
    # Two ports of this session's block that the cluster leaves free (its nodes use the
    # base + 1 .. base + 80).
    port, proxy_port = settings.ingest_base_port + 90, settings.ingest_base_port + 91
    listeners = [{"kind": "mqtt", "port": proxy_port, "proxy_protocol": True}]
    cluster.start_extra(
        "ingest-limits",
        "ingest",
        port,
        node_id="limits",
        mqtt_port=str(port),
        listeners=json.dumps(listeners),
        **{name: str(value) for name, value in LIMITS.items()},
    )
    yield LimitedNode(port, proxy_port, cluster)
    cluster.stop_extra("ingest-limits")


def _via_proxy(node: LimitedNode, address: str) -> RawSocket:
    """A connection to the PROXY port that claims to come from ``address``."""
    raw = RawSocket(node.proxy_port)
    raw.send(encode_v2((address, 40000), ("192.0.2.1", 1883)))
    return raw


def _connack(raw: RawSocket, client_id: str) -> int:
    """Send a v5 CONNECT; the CONNACK's Reason Code."""
    raw.send(connect_packet(client_id, level=5))
    first, body = raw.read_packet()
    assert first == 0x20
    return body[1]


def test_new_connections_per_address_beyond_the_rate_get_connack_0x9f(
    limited: LimitedNode,
) -> None:
    flood = [_via_proxy(limited, "198.51.100.7") for _ in range(30)]  # 10 per second allowed
    try:
        codes = [_connack(raw, unique("rate")) for raw in flood]
        assert 0x9F in codes, codes  # Connection rate exceeded
        assert codes.count(0) >= 10
        # Another address is served meanwhile.
        with _via_proxy(limited, "198.51.100.8") as other:
            assert _connack(other, unique("other-address")) == 0
    finally:
        for raw in flood:
            raw.close()
    assert "refused 198.51.100.7: address_connection_rate" in limited.log_text()


def test_connections_beyond_max_connections_get_connack_0x97_until_one_closes(
    limited: LimitedNode,
) -> None:
    opened: list[RawSocket] = []
    try:
        refused = None
        for i in range(LIMITS["max_connections"] + 5):
            raw = _via_proxy(limited, f"203.0.113.{i + 1}")  # one each: no rate limit
            opened.append(raw)
            code = _connack(raw, unique("many"))
            if code:
                refused = code
                break
        assert refused == 0x97  # Quota exceeded
        opened.pop().close()
        opened.pop().close()  # one accepted connection gone: room for one more
        wait_until(
            lambda: _connack(_keep(opened, _via_proxy(limited, "203.0.113.200")), "again") == 0,
            "a connection accepted again",
        )
    finally:
        for raw in opened:
            raw.close()


def _keep(opened: list[RawSocket], raw: RawSocket) -> RawSocket:
    opened.append(raw)
    return raw


def test_subscriptions_beyond_the_limits_get_suback_0x97(limited: LimitedNode) -> None:
    client = PahoClient(limited.port, unique("subs"))
    try:
        assert client.connect() == 0
        base = unique("e2e/subs")
        codes = [client.subscribe(f"{base}/{i}", 1)[0] for i in range(4)]
        assert [int(code.value) for code in codes] == [1, 1, 1, 0x97]
        deep = client.subscribe(f"{base}/a/b/c/d/e", 1)[0]  # 7 levels, over 4
        assert int(deep.value) == 0x97
    finally:
        client.close()
    v3 = PahoClient(limited.port, unique("subs-v3"), 4)
    try:
        assert v3.connect() == 0
        assert [int(c.value) for c in v3.subscribe("e2e/x/y/z/w/v", 1)] == [0x80]
    finally:
        v3.close()


def test_qos2_beyond_max_inflight_gets_pubrec_0x97_and_v3_is_closed(limited: LimitedNode) -> None:
    with RawSocket(limited.port) as raw:
        assert _connack(raw, unique("qos2")) == 0
        for packet_id in (1, 2, 3):
            raw.send(publish_packet(b"e2e/qos2", b"x", qos=2, packet_id=packet_id, v5=True))
        recs = [raw.read_packet() for _ in range(3)]
        assert [(first, body[:3]) for first, body in recs] == [
            (0x50, b"\x00\x01"),  # success (Reason Code 0 left out, 3.5.2.1)
            (0x50, b"\x00\x02"),
            (0x50, b"\x00\x03\x97"),  # PUBREC Quota exceeded
        ]
    with RawSocket(limited.port) as raw:
        raw.send(connect_packet(unique("qos2-v3"), level=4))
        assert raw.read_packet()[0] == 0x20
        for packet_id in (1, 2, 3):
            raw.send(publish_packet(b"e2e/qos2", b"x", qos=2, packet_id=packet_id))
        got = raw.read_until_closed()  # closed: v3.1.1 has no negative PUBREC
        assert b"\x50\x02\x00\x03" not in got  # the third was not acknowledged


@dataclass
class _Flooder:
    """A v3.1.1 client writing QoS 1 PUBLISHes as fast as its socket takes them."""

    raw: RawSocket
    count: int
    payload: bytes

    def run(self) -> None:
        data = b"".join(
            publish_packet(b"e2e/flood", self.payload, qos=1, packet_id=i % 65535 + 1)
            for i in range(self.count)
        )
        self.raw.send(data)


@pytest.mark.parametrize(
    ("count", "payload", "limit"),
    [(400, b"m", "message_rate"), (24, bytes(16 * 1024), "byte_rate")],
    ids=["messages", "bytes"],
)
def test_a_client_over_its_rate_is_slowed_and_others_keep_full_service(
    limited: LimitedNode, count: int, payload: bytes, limit: str
) -> None:
    """The flooder's 10 seconds of traffic (at the limit) are all acknowledged in the end,
    while a normal client's message goes through before the flooder is done."""
    client_id = unique("flooder")
    raw = RawSocket(limited.port)
    normal = PahoClient(limited.port, unique("normal"))
    try:
        raw.send(connect_packet(client_id, level=4))
        assert raw.read_packet()[0] == 0x20
        flooder = _Flooder(raw, count, payload)
        writer = threading.Thread(target=flooder.run, daemon=True)
        writer.start()
        wait_until(lambda: f"refused {client_id}: {limit}" in limited.log_text(), "the pause")
        assert normal.connect() == 0
        assert normal.subscribe(unique("e2e/normal"), 1) == [1]
        mid = normal.publish("e2e/normal", b"meanwhile", 1)
        wait_until(lambda: mid in normal.snapshot()[0], "the normal client's PUBACK")
        acked = 0
        raw.sock.settimeout(TIMEOUT)
        while acked < count:  # every PUBLISH of the flooder is acknowledged: nothing lost
            first, _ = raw.read_packet(timeout=60)
            acked += first == 0x40
        # The normal client's PUBACK came while the flooder still waited for some of its.
        writer.join(TIMEOUT)
    finally:
        raw.close()
        normal.close()


def test_a_lowered_keep_alive_is_told_to_v5_clients(limited: LimitedNode) -> None:
    client = PahoClient(limited.port, unique("keep-alive"), keep_alive=300)
    try:
        assert client.connect() == 0
        assert client.connack_properties is not None
        assert client.connack_properties.ServerKeepAlive == LIMITS["max_keep_alive"]
    finally:
        client.close()


def test_a_refused_connection_is_counted_once_per_minute_in_the_log(limited: LimitedNode) -> None:
    for _ in range(3):
        with socket.create_connection((HOST, limited.proxy_port), timeout=TIMEOUT) as sock:
            sock.sendall(connect_packet(unique("no-header"), level=5))
            sock.settimeout(TIMEOUT)
            # Closed with no CONNACK (a reset: the CONNECT was left unread).
            with contextlib.suppress(ConnectionResetError):
                assert sock.recv(16) == b""
    wait_until(lambda: "proxy_header" in limited.log_text(), "the refusal in the log")
    assert limited.log_text().count("proxy_header") == 1  # three refusals, one line
