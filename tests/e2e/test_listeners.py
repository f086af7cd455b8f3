"""The MQTT listeners through the real HAProxy of the test cluster: TLS with the generated CA,
mutual TLS, MQTT over WebSocket and WSS (paho, hand-made frames, MQTT.js in Chromium), the
clients' real addresses from PROXY protocol v2, a Reason Code that reaches a client still
sending, and a certificate reloaded on SIGHUP.

HAProxy forwards 1883, 8883, 8083 and 8084 (test ports here) in TCP mode with
``send-proxy-v2`` to each node's listeners, which require the header; TLS passes through
to the nodes.
"""

from __future__ import annotations

import asyncio
import functools
import http.server
import os
import signal
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

from services.common.kafka.names import TopicNames
from services.common.records import EventKind, decode_event
from services.local import certificates, postgres
from services.local import cluster as local_cluster
from tests.commands import run_cormorant
from tests.e2e.clients import (
    HOST,
    TIMEOUT,
    MosquittoSub,
    PahoClient,
    RawSocket,
    RawWebSocket,
    connect_packet,
    mosquitto_pub,
    publish_packet,
    pubrel_packet,
    subscribe_packet,
    unique,
)
from tests.e2e.kafka_view import TopicTail
from tests.pki import issue_client, make_pki
from tests.servers import LocalCluster
from tests.serving import serving
from tests.waiting import wait_until

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip

MQTTJS = (
    Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    / "cormorant/npm/node_modules/mqtt/dist/mqtt.min.js"
)
"""MQTT.js's browser bundle, fetched by scripts/bootstrap.sh."""


def _tls(cluster: LocalCluster) -> Path:
    return local_cluster.tls_dir(local_cluster.local_settings(cluster.settings))


def _ca(cluster: LocalCluster) -> Path:
    return _tls(cluster) / "ca.pem"


def _ca_args(cluster: LocalCluster, *more: str) -> tuple[str, ...]:
    return ("--cafile", str(_ca(cluster)), *more)


def test_mosquitto_over_tls_with_the_generated_ca(cluster: LocalCluster) -> None:
    port, topic = cluster.settings.tls_listen_port, unique("e2e/tls")
    sub = MosquittoSub(port, topic, qos=1, count=1, extra=_ca_args(cluster))
    result = mosquitto_pub(port, topic, "over tls", qos=1, extra=_ca_args(cluster))
    assert result.returncode == 0, result.stdout + result.stderr
    assert sub.messages() == [f"{topic} over tls"]


def test_tls_without_the_ca_is_refused_by_the_client(cluster: LocalCluster) -> None:
    other = make_pki(cluster.settings.state_dir / "other-ca")
    port, topic = cluster.settings.tls_listen_port, unique("e2e/tls")
    result = mosquitto_pub(port, topic, "x", qos=1, extra=("--cafile", str(other.ca)))
    assert result.returncode != 0
    assert "certificate verify failed" in (result.stdout + result.stderr)


def test_mutual_tls_accepts_a_good_client_certificate_and_refuses_a_wrong_one(
    cluster: LocalCluster,
) -> None:
    port, topic = cluster.settings.tls_listen_port, unique("e2e/mtls")
    tls = _tls(cluster)
    # A client certificate is an identity: it needs an X509 credential
    # (docs/getting-started/tls.md shows one).
    env = {**os.environ, "CORMORANT_POSTGRES_DSN": postgres.dsn(cluster.settings)}
    name = unique("local-client")
    added = run_cormorant("credentials", "add", name, "--type", "x509", "--allow-all",
                          "--cert-file", str(tls / "client.pem"), env=env)  # fmt: skip
    assert added.returncode == 0, added.stderr
    try:
        sub = MosquittoSub(port, topic, qos=1, count=1, extra=_ca_args(cluster))
        good = _ca_args(
            cluster, "--cert", str(tls / "client.pem"), "--key", str(tls / "client.key")
        )
        result = mosquitto_pub(port, topic, "with a certificate", qos=1, extra=good)
        assert result.returncode == 0, result.stdout + result.stderr
        assert sub.messages() == [f"{topic} with a certificate"]
    finally:
        assert run_cormorant("credentials", "delete", name, env=env).returncode == 0

    other = cluster.settings.state_dir / "stranger-ca"
    make_pki(other, ca_name="Stranger CA")
    stranger = issue_client(other, "stranger")
    wrong = _ca_args(cluster, "--cert", str(stranger.cert), "--key", str(stranger.key))
    refused = mosquitto_pub(port, unique("e2e/mtls"), "refused", qos=1, extra=wrong)
    assert refused.returncode != 0
    assert "received PUBACK" not in refused.stdout
    logs = [cluster.log(f"ingest-node{i}") for i in (1, 2)]
    wait_until(
        lambda: any("tls_handshake" in log.read_text() for log in logs),
        "the refused handshake in a node's log",
    )


@pytest.mark.parametrize("secure", [False, True], ids=["ws", "wss"])
def test_paho_over_websocket(cluster: LocalCluster, secure: bool) -> None:
    settings = cluster.settings
    port = settings.wss_listen_port if secure else settings.ws_listen_port
    ca = _ca(cluster) if secure else None
    topic = unique("e2e/ws")
    sub = PahoClient(port, unique("ws-sub"), transport="websockets", ca_file=ca, host="localhost")
    pub = PahoClient(port, unique("ws-pub"), 4, transport="websockets", ca_file=ca)
    try:
        assert sub.connect() == 0 and pub.connect() == 0
        assert sub.subscribe(topic, 1) == [1]
        pub.publish(topic, b"x" * 4000, 1)
        pub.publish(topic, b"over websocket", 1)
        msgs = [sub.messages.get(timeout=TIMEOUT) for _ in range(2)]
        seen = [(m.mid, m.dup, len(m.payload)) for m in msgs]
        assert [m.payload for m in msgs] == [b"x" * 4000, b"over websocket"], seen
    finally:
        sub.close()
        pub.close()


def test_mqtt_split_across_frames_and_several_packets_in_one_frame(
    cluster: LocalCluster,
) -> None:
    topic = unique("e2e/frames")
    ws = RawWebSocket(socket.create_connection((HOST, cluster.settings.ws_listen_port)))
    try:
        assert ws.response.startswith(b"HTTP/1.1 101 ")
        assert b"Sec-WebSocket-Protocol: mqtt" in ws.response
        connect = connect_packet(unique("frames"), level=5)
        ws.send_frames(connect[:3], connect[3:9], connect[9:])  # one CONNECT, three frames
        first, body = ws.read_packet()
        assert (first, body[1]) == (0x20, 0)  # CONNACK, success
        subscribe = subscribe_packet(topic, 1, packet_id=1)
        publish = publish_packet(topic.encode(), b"one frame", qos=1, packet_id=2, v5=True)
        ws.send_frames(subscribe + publish[:4])  # SUBSCRIBE and half a PUBLISH in one frame
        assert ws.read_packet()[0] == 0x90  # SUBACK
        ws.send_frames(publish[4:] + b"\xc0\x00")  # the rest, and a PINGREQ
        seen = {ws.read_packet()[0] for _ in range(3)}
        assert seen == {0x40, 0x30 | 1 << 1, 0xD0}  # PUBACK, the PUBLISH back, PINGRESP
        # A 200 KB PUBLISH in 50 frames, back in frames of the server's choosing.
        big = publish_packet(topic.encode(), os.urandom(200_000), qos=1, packet_id=3, v5=True)
        ws.send_frames(*(big[i : i + 4096] for i in range(0, len(big), 4096)))
        back = {}
        for _ in range(2):
            first, body = ws.read_packet()
            back[first] = body
        assert back[0x40][:2] == b"\x00\x03"  # PUBACK of packet 3
        assert back[0x30 | 1 << 1].endswith(big[-1000:])  # the payload came back whole
    finally:
        ws.close()


def _connected_address(cluster: LocalCluster, kind: str) -> tuple[str, str]:
    """Connect through HAProxy's ``kind`` port; returns (the client's own address as it sees
    it, the address the node recorded in client.events for the connection)."""
    names = TopicNames.from_settings(cluster.settings)
    client_id = unique(f"addr-{kind}")
    ports = {
        "mqtt": cluster.settings.listen_port,
        "mqtts": cluster.settings.tls_listen_port,
        "ws": cluster.settings.ws_listen_port,
    }

    async def run() -> tuple[str, str]:
        async with TopicTail.open(cluster.kafka_bootstrap, names.client_events) as tail:
            raw = socket.create_connection((HOST, ports[kind]), timeout=TIMEOUT)
            local = raw.getsockname()
            sock: socket.socket = raw
            if kind == "mqtts":
                context = ssl.create_default_context(cafile=str(_ca(cluster)))
                sock = context.wrap_socket(raw, server_hostname="localhost")
            try:
                connect = connect_packet(client_id, level=5)
                if kind == "ws":
                    ws = RawWebSocket(sock)
                    ws.send_frames(connect)
                    assert ws.read_packet()[0] == 0x20
                else:
                    sock.sendall(connect)
                    assert sock.recv(1) == b"\x20"
                while True:
                    record = await tail.next_with_key(client_id.encode())
                    event = decode_event(record.value)
                    if event.kind is EventKind.CONNECTED:
                        return f"{local[0]}:{local[1]}", event.client_address
            finally:
                sock.close()

    return asyncio.run(run())


@pytest.mark.parametrize("kind", ["mqtt", "mqtts", "ws"])
def test_the_node_sees_the_clients_own_address_through_haproxy(
    cluster: LocalCluster, kind: str
) -> None:
    own, recorded = _connected_address(cluster, kind)
    assert recorded == own  # HAProxy's PROXY v2 header, not HAProxy's own address


def test_a_node_listener_behind_haproxy_closes_a_connection_without_proxy_header(
    cluster: LocalCluster,
) -> None:
    proxied = next(
        listener.port
        for listener in local_cluster.haproxy.node_listeners(cluster.settings, 1)
        if listener.kind == "mqtt"
    )
    with RawSocket(proxied) as raw:
        raw.send(connect_packet(unique("no-header"), level=5))
        assert raw.read_until_closed() == b""  # no CONNACK: closed
    wait_until(
        lambda: "proxy_header" in cluster.log("ingest-node1").read_text(),
        "the refusal in the node's log",
    )


def _flood(raw: RawSocket, stop: threading.Event) -> None:
    """Write QoS 2 PUBLISHes that are never released, then their PUBRELs, again and again
    (far over the server's Receive Maximum of 100), until ``stop`` or the socket fails."""
    data = b"".join(
        publish_packet(b"e2e/greedy", b"p", qos=2, packet_id=i, v5=True) for i in range(1, 300)
    ) + b"".join(pubrel_packet(i) for i in range(1, 300))
    try:
        while not stop.is_set():
            raw.send(data)
    except OSError:
        return  # the server closed after its grace period


def test_a_disconnect_reason_code_reaches_a_client_that_keeps_sending(
    cluster: LocalCluster,
) -> None:
    """A v5 client over its Receive Maximum with QoS 2 PUBLISHes gets
    DISCONNECT 0x93 while it is still writing; the server reads and discards what it keeps
    sending before closing, so the client reads the Reason Code instead of a reset."""
    node = cluster.node_ports[0]
    for attempt in range(5):
        with RawSocket(node) as raw:
            raw.send(connect_packet(unique(f"greedy-{attempt}"), level=5))
            assert raw.read_packet()[0] == 0x20
            stop = threading.Event()
            writer = threading.Thread(target=_flood, args=(raw, stop), daemon=True)
            writer.start()
            try:
                reason = None
                while reason is None:  # a reset here fails the test
                    first, body = raw.read_packet()
                    if first == 0xE0:
                        reason = body[0]
            finally:
                stop.set()
                writer.join(TIMEOUT)
            assert reason == 0x93  # Receive Maximum exceeded


def test_mqttjs_in_chromium_publishes_and_receives_over_websocket(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    assert MQTTJS.exists(), f"{MQTTJS} is missing: run scripts/bootstrap.sh"
    topic = unique("e2e/browser")
    (tmp_path / "mqtt.min.js").write_bytes(MQTTJS.read_bytes())
    (tmp_path / "index.html").write_text(
        BROWSER_PAGE.replace("@PORT@", str(cluster.settings.ws_listen_port))
        .replace("@TOPIC@", topic)
        .replace("@CLIENT@", unique("browser")),
        encoding="utf-8",
    )
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer((HOST, 0), handler)
    with serving(server) as port:
        listener = PahoClient(cluster.mqtt_port, unique("browser-peer"))
        try:
            assert listener.connect() == 0
            assert listener.subscribe(topic + "/from-browser", 1) == [1]
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(
                    executable_path="/usr/bin/chromium", args=CHROMIUM_FLAGS
                )
                page = browser.new_page()
                page.goto(f"http://{HOST}:{port}/index.html")
                page.wait_for_function("document.title === 'subscribed'", timeout=TIMEOUT * 1000)
                listener.publish(topic + "/to-browser", b"hello browser", 1)
                page.wait_for_function(
                    "document.getElementById('got').textContent.includes('hello browser')",
                    timeout=TIMEOUT * 1000,
                )
                page.evaluate("publishIt('hello python')")
                assert listener.messages.get(timeout=TIMEOUT).payload == b"hello python"
                browser.close()
        finally:
            listener.close()


BROWSER_PAGE = """<!doctype html>
<html><head><title>connecting</title><script src="mqtt.min.js"></script></head>
<body><ul id="got"></ul><script>
const client = mqtt.connect("ws://localhost:@PORT@/mqtt",
  {clientId: "@CLIENT@", protocolVersion: 5, reconnectPeriod: 0});
client.on("connect", () => client.subscribe("@TOPIC@/to-browser", {qos: 1},
  () => { document.title = "subscribed"; }));
client.on("message", (topic, payload) => {
  const item = document.createElement("li");
  item.textContent = payload.toString();
  document.getElementById("got").appendChild(item);
});
window.publishIt = (text) => client.publish("@TOPIC@/from-browser", text, {qos: 1});
</script></body></html>
"""


def _served_certificate(port: int) -> str:
    return ssl.get_server_certificate((HOST, port), timeout=TIMEOUT)


@pytest.fixture
def original_certificate(cluster: LocalCluster) -> Iterator[tuple[Path, Path]]:
    """The nodes' certificate files; put back (and reloaded) after the test."""
    tls = _tls(cluster)
    cert, key = tls / "server.pem", tls / "server.key"
    saved = cert.read_bytes(), key.read_bytes()
    yield cert, key
    cert.write_bytes(saved[0])
    key.write_bytes(saved[1])
    _reload(cluster)
    wanted = ssl.DER_cert_to_PEM_cert(ssl.PEM_cert_to_DER_cert(saved[0].decode()))
    wait_until(
        lambda: all(
            _served_certificate(cluster.settings.tls_listen_port) == wanted for _ in range(4)
        ),
        "the original certificate served again",
    )


def _reload(cluster: LocalCluster) -> None:
    for name in ("ingest-node1", "ingest-node2"):
        pid = cluster.pid(name)
        assert pid is not None, f"{name} is not running"
        os.kill(pid, signal.SIGHUP)


@pytest.mark.disruptive
def test_sighup_reloads_the_certificate_and_keeps_open_tls_connections(
    cluster: LocalCluster, original_certificate: tuple[Path, Path], tmp_path: Path
) -> None:
    port, topic = cluster.settings.tls_listen_port, unique("e2e/reload")
    old_ca = _ca(cluster)
    clients = [
        PahoClient(port, unique("before-reload"), ca_file=old_ca, host="localhost")
        for _ in range(2)  # round robin: one on each node
    ]
    renewed_ca = certificates.make_ca(tmp_path, "Renewed CA")
    cert, key = original_certificate
    certificates.issue(renewed_ca, cert, key, "localhost", server_names=certificates.SERVER_NAMES)
    wanted = ssl.DER_cert_to_PEM_cert(ssl.PEM_cert_to_DER_cert(cert.read_text()))
    try:
        for client in clients:
            assert client.connect() == 0
            assert client.subscribe(topic, 1) == [1]
        _reload(cluster)
        wait_until(
            lambda: all(_served_certificate(port) == wanted for _ in range(4)),
            "every node serving the new certificate",
        )
        fresh = PahoClient(port, unique("after-reload"), ca_file=renewed_ca.cert)
        assert fresh.connect() == 0
        fresh.publish(topic, b"after the reload", 1)
        for client in clients:  # the connections opened before are still served
            assert client.messages.get(timeout=TIMEOUT).payload == b"after the reload"
            assert client.snapshot()[1] == []
        fresh.close()
    finally:
        for client in clients:
            client.close()


def test_v5_server_keep_alive_is_advertised_when_lowered(cluster: LocalCluster) -> None:
    """The cluster's nodes grant at most max_keep_alive; asked for more, a v5 client is told
    the lower value in CONNACK (3.2.2.3.14). The test cluster keeps the default 65535, so a
    CONNECT with Keep Alive 0 (none) is what it lowers."""
    client = PahoClient(cluster.mqtt_port, unique("keep-alive"), keep_alive=0)
    try:
        assert client.connect() == 0
        props = client.connack_properties
        assert props is not None
        assert props.ServerKeepAlive == cluster.settings.max_keep_alive
    finally:
        client.close()
