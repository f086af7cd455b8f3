"""The load generator's transports (bench/loadgen/transports.py): the client side of MQTT over
WebSocket against the ingest node's own sans-IO server framing, bytes only; endpoints and
plans; the transports table; and a short run over TLS against a real Mosquitto started by
the bench with a CA made for the run.
"""

from __future__ import annotations

import json
import socket
import subprocess
from array import array
from pathlib import Path
from typing import Any

import pytest

from bench import brokers, results, summary
from bench.loadgen import runner, transports, wire
from bench.loadgen.plan import Options, Timing, build
from bench.loadgen.transports import Endpoint, WebSocketFraming
from bench.loadgen.worker import WorkerResult
from services.ingest import websocket as server_websocket

ENDPOINT = Endpoint("127.0.0.1", 8083, "ws")


def _opened() -> tuple[WebSocketFraming, server_websocket.WebSocketFraming]:
    client = WebSocketFraming(ENDPOINT)
    server = server_websocket.WebSocketFraming(max_frame_size=1 << 20)
    got = server.receive(client.handshake())
    assert not got.close, got.reason
    assert server.path == "/mqtt"
    assert b"Sec-WebSocket-Protocol: mqtt\r\n" in got.reply
    assert client.receive(got.reply) == (b"", None)
    assert client.open and server.open
    return client, server


def test_the_handshake_asks_for_mqtt_on_the_mqtt_path() -> None:
    request = WebSocketFraming(Endpoint("localhost", 8084, "wss")).handshake()
    assert request.startswith(b"GET /mqtt HTTP/1.1\r\n")
    assert b"\r\nHost: localhost:8084\r\n" in request
    assert b"\r\nSec-WebSocket-Protocol: mqtt\r\n" in request
    assert b"permessage-deflate" not in request  # no compression: the bytes are the bench's


def test_client_frames_are_masked_binary_frames_the_server_reads_as_mqtt() -> None:
    client, server = _opened()
    connect = wire.connect("bench-client", 4)
    frame = client.frame(connect)
    assert frame[0] == 0x82  # FIN, binary
    assert frame[1] & 0x80  # masked (RFC 6455 5.3)
    assert connect not in frame  # the mask changed the bytes on the wire
    assert server.receive(frame).mqtt == connect


def test_frames_from_the_server_are_one_mqtt_stream() -> None:
    client, server = _opened()
    one = wire.PublishTemplate("a/b", 1, 300, 4).packet(7, 1, 1, 0)
    two = wire.puback(7)
    # A packet split across two frames, then two packets in one frame; one socket read.
    data = server.frame(one[:100]) + server.frame(one[100:] + two)
    mqtt, ended = client.receive(data[:7])
    assert (mqtt, ended) == (b"", None)
    mqtt, ended = client.receive(data[7:])
    assert (mqtt, ended) == (one + two, None)


def test_a_ping_is_answered_with_a_pong() -> None:
    client, _ = _opened()
    assert client.receive(b"\x89\x02hi") == (b"", None)
    assert client.replies[:1] == b"\x8a" and client.replies[1] & 0x80  # masked pong


def test_a_refused_handshake_says_why() -> None:
    client = WebSocketFraming(ENDPOINT)
    client.handshake()
    mqtt, ended = client.receive(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
    assert mqtt == b"" and ended is not None and "404" in ended
    assert not client.open


def test_the_client_closes_with_a_close_frame_and_sees_the_answer() -> None:
    client, server = _opened()
    close = client.close()
    assert close[0] == 0x88 and close[1] & 0x80
    answer = server.receive(close)
    assert answer.close
    mqtt, ended = client.receive(answer.reply)
    assert mqtt == b"" and ended is not None and "1000" in ended
    assert client.frame(b"late") == b"" and client.close() == b""


def test_a_close_from_the_server_ends_the_connection() -> None:
    client, server = _opened()
    mqtt, ended = client.receive(server.close(1001, "going away"))
    assert ended is not None and "1001" in ended
    assert mqtt == b""
    assert client.replies[:1] == b"\x88" and client.replies[1] & 0x80  # echoed, masked


def test_endpoints_and_plans_name_their_transport() -> None:
    assert Endpoint("h", 1, "wss").secure and Endpoint("h", 1, "wss").websocket
    assert not Endpoint("h", 1).secure and Endpoint("h", 1).ssl_context() is None
    with pytest.raises(ValueError, match="unknown transport"):
        Endpoint("h", 1, "quic")
    plan = build("p2p", Options(rate=500, transport="tls", ca_file="/ca.pem", port=8883), Timing())
    assert plan.label == "p2p-rate500-tls"
    assert plan.endpoint == Endpoint("127.0.0.1", 8883, "tls", "/ca.pem")
    with pytest.raises(ValueError, match="unknown transport"):
        build("p2p", Options(transport="udp"), Timing())
    assert set(transports.TRANSPORTS) == {"tcp", "tls", "ws", "wss"}


def test_a_broker_names_the_transports_it_offers() -> None:
    target = brokers.Target("mosquitto", "127.0.0.1", 18830, ports={"tls": 18831}, ca_file="c")
    assert target.endpoint("tcp") == Endpoint("127.0.0.1", 18830, "tcp", "c")
    assert target.endpoint("tls").port == 18831
    with pytest.raises(brokers.BrokerUnavailable, match="offers tcp, tls, not ws"):
        target.endpoint("ws")


def _rec(broker: str, transport: str, delivered: float, p99: float) -> dict[str, Any]:
    return {
        "label": "p2p-tcp-tls", "scenario": "p2p", "broker": broker, "transport": transport,
        "round": 1, "date": "d", "machine": {"platform": "p", "cpu_count": 2, "python": "3.11"},
        "git_commit": "c", "command": "python -m bench compare p2p --transports tcp,tls",
        "report": {"delivered_per_s": delivered, "latency_ms": {"p99": p99},
                   "tls": "TLSv1.3 TLS_AES_256_GCM_SHA384" if transport == "tls" else "",
                   "broker_cpu_s": {"kafka": 1.0}},
    }  # fmt: skip


def test_the_transports_table_gives_ratios_to_cormorant_tcp_and_mosquitto_tls(
    tmp_path: Path,
) -> None:
    records = [
        _rec("cormorant", "tcp", 100.0, 10.0),
        _rec("mosquitto", "tcp", 400.0, 1.0),
        _rec("cormorant", "tls", 80.0, 20.0),
        _rec("mosquitto", "tls", 320.0, 2.0),
    ]
    text = results.transports_markdown(records)
    head = "| metric | cormorant tcp | mosquitto tcp | cormorant tls | mosquitto tls |"
    assert head in text
    assert "| delivered msg/s | 100 | 400 | 80 | 320 |" in text
    assert "| delivered msg/s ÷ cormorant tcp | 1.00 | 4.00 | 0.80 | 3.20 |" in text
    assert "| end-to-end p99 ÷ mosquitto tls | 5.00 | 0.50 | 10.00 | 1.00 |" in text
    assert "cormorant tls: TLSv1.3 TLS_AES_256_GCM_SHA384" in text
    # A comparison over several transports is not mixed into the summary of plain TCP ones.
    path = tmp_path / "p2p-tcp-tls.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert summary.latest_comparison(path) == []


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_a_run_over_tls_against_mosquitto_delivers_every_message() -> None:
    timing = Timing(warmup=0.3, duration=1.0, drain=10.0, setup=20.0)
    with brokers.mosquitto(_free_port(), _free_port()) as target:
        end = target.endpoint("tls")
        options = Options(
            pairs=2, rate=200, host=end.host, port=end.port, transport="tls", ca_file=end.ca_file
        )
        report = runner.run(build("p2p", options, timing), target, 1, lambda _: None)
    assert report["transport"] == "tls"
    assert report["tls"].startswith("TLSv1.")
    assert report["sent"] > 100
    assert report["received"] == report["expected_deliveries"] == report["sent"]
    assert (report["lost"], report["duplicates"], report["unacked"]) == (0, 0, 0)
    assert report["disconnects"] == 0
    assert report["socket_holders_cpu_s"] is not None  # Mosquitto's own CPU


def test_the_socket_holders_cpu_is_reported_per_delivered_message() -> None:
    plan = build("p2p", Options(pairs=1), Timing(duration=2.0))
    part = WorkerResult(2000, 2000, array("q"), array("q"), {0: 2000}, 0, 0)
    cpu = {"ingest-node1": 0.03, "ingest-node2": 0.01, "kafka": 1.0}
    report = runner.summarize(
        plan, [part], {0: 2000}, broker_cpu=cpu, generator_cpu=0.1, generator_cpu_total=0.2,
        route_seconds=0.0, socket_holders=("ingest-node1", "ingest-node2"),
    )  # fmt: skip
    assert report["socket_holders_cpu_s"] == pytest.approx(0.04)
    assert report["socket_holders_us_per_delivered"] == pytest.approx(20.0)
    bare = runner.summarize(
        plan, [part], {0: 2000}, broker_cpu={}, generator_cpu=0.1, generator_cpu_total=0.2,
        route_seconds=0.0,
    )  # fmt: skip
    assert bare["socket_holders_us_per_delivered"] is None


def test_a_subscriber_on_hash_leaves_the_brokers_retained_messages_out() -> None:
    """fan-out-tbmq's subscribers are on '#': another client's retained message (shorter
    than the bench payload, or not one of the run's publishers) reaches them first."""
    timing = Timing(warmup=0.3, duration=1.0, drain=10.0, setup=20.0)
    with brokers.mosquitto(_free_port(), _free_port()) as target:
        end = target.endpoint("tcp")
        for topic, message in (("building/room1/status", "online"), ("other/t", "x" * 40)):
            subprocess.run(
                ["mosquitto_pub", "-h", end.host, "-p", str(end.port), "-t", topic, "-m",
                 message, "-r", "-q", "1"],
                check=True, timeout=10,
            )  # fmt: skip
        options = Options(publishers=2, subscribers=2, host=end.host, port=end.port)
        report = runner.run(build("fan-out-tbmq", options, timing), target, 1, lambda _: None)
    assert report["sent"] > 0
    assert report["received"] == report["expected_deliveries"]
    assert (report["lost"], report["duplicates"], report["unacked"]) == (0, 0, 0)
