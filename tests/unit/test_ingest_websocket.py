"""The WebSocket framing layer of MQTT over WebSocket (MQTT 5.0 / 3.1.1 section 6; RFC 6455).

Client frames are built by hand here (masked, as RFC 6455 5.3 requires of a client), so the
layer is checked against the wire format, including MQTT packets split across frames and
several packets in one frame: the layer must hand the MQTT decoder one byte stream.
"""

from __future__ import annotations

import os
import struct

import pytest

from services.common.mqtt.codec import StreamDecoder, encode
from services.common.mqtt.packets import Connect, PingReq, Publish
from services.ingest.websocket import WebSocketFraming

KEY = "dGhlIHNhbXBsZSBub25jZQ=="
ACCEPT = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="  # RFC 6455 1.3's example


def upgrade(path: str = "/mqtt", protocols: str | None = "mqtt") -> bytes:
    """A browser's opening handshake."""
    lines = [
        f"GET {path} HTTP/1.1",
        "Host: localhost:8083",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {KEY}",
        "Sec-WebSocket-Version: 13",
        "Origin: http://localhost:8000",
    ]
    if protocols is not None:
        lines.append(f"Sec-WebSocket-Protocol: {protocols}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def frame(payload: bytes, opcode: int = 0x2, fin: bool = True) -> bytes:
    """One masked client frame (RFC 6455 5.2)."""
    head = bytes([(0x80 if fin else 0) | opcode])
    size = len(payload)
    if size < 126:
        head += bytes([0x80 | size])
    elif size < 65536:
        head += bytes([0x80 | 126]) + struct.pack(">H", size)
    else:
        head += bytes([0x80 | 127]) + struct.pack(">Q", size)
    mask = os.urandom(4)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def opened() -> WebSocketFraming:
    ws = WebSocketFraming(max_frame_size=1 << 20)
    received = ws.receive(upgrade())
    assert received.reply.startswith(b"HTTP/1.1 101 ")
    assert ws.open and not received.close
    return ws


CONNECT = encode(Connect(5, "ws-client", True, 30), 5)
PUBLISH = encode(Publish("a/b", b"x" * 300, qos=1, packet_id=7), 5)


def test_the_handshake_selects_the_mqtt_subprotocol() -> None:
    ws = WebSocketFraming(max_frame_size=1024)
    reply = ws.receive(upgrade(protocols="mqttv3.1, mqtt")).reply.decode()
    assert f"Sec-WebSocket-Accept: {ACCEPT}" in reply
    assert "Sec-WebSocket-Protocol: mqtt\r\n" in reply


def test_an_mqtt_3_1_client_gets_its_own_subprotocol() -> None:
    reply = WebSocketFraming(1024).receive(upgrade(protocols="mqttv3.1")).reply.decode()
    assert "Sec-WebSocket-Protocol: mqttv3.1\r\n" in reply


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (upgrade(path="/"), b"404"),
        (upgrade(path="/other"), b"404"),
        (upgrade(protocols=None), b"400"),
        (upgrade(protocols="chat"), b"400"),
    ],
)
def test_other_paths_and_subprotocols_are_refused(request_bytes: bytes, status: bytes) -> None:
    ws = WebSocketFraming(1024)
    received = ws.receive(request_bytes)
    assert received.reply.startswith(b"HTTP/1.1 " + status)
    assert received.close and not ws.open and received.reason


def test_a_query_string_on_the_path_is_accepted() -> None:
    assert (
        WebSocketFraming(1024)
        .receive(upgrade(path="/mqtt?token=1"))
        .reply.startswith(b"HTTP/1.1 101 ")
    )


def test_a_packet_split_across_frames_is_one_stream() -> None:
    ws = opened()
    cut = 5
    first = ws.receive(frame(CONNECT[:cut]))
    second = ws.receive(frame(CONNECT[cut:]))
    assert first.mqtt + second.mqtt == CONNECT
    decoder = StreamDecoder()
    assert decoder.feed(first.mqtt) == []
    (connect,) = decoder.feed(second.mqtt)
    assert isinstance(connect, Connect) and connect.client_id == "ws-client"


def test_a_packet_in_a_fragmented_message_is_one_stream() -> None:
    ws = opened()
    data = frame(PUBLISH[:10], fin=False) + frame(PUBLISH[10:], opcode=0x0)
    assert ws.receive(data).mqtt == PUBLISH


def test_several_packets_in_one_frame_and_frames_split_across_reads() -> None:
    ws = opened()
    stream = frame(CONNECT + PUBLISH + encode(PingReq(), 5))
    got = b"".join(ws.receive(stream[i : i + 7]).mqtt for i in range(0, len(stream), 7))
    packets = StreamDecoder().feed(got)
    assert [type(p) for p in packets] == [Connect, Publish, PingReq]


def test_the_servers_bytes_leave_in_one_unmasked_binary_frame() -> None:
    ws = opened()
    out = ws.frame(PUBLISH)
    assert out[0] == 0x82  # FIN, binary
    assert out[1] == 126 and struct.unpack(">H", out[2:4])[0] == len(PUBLISH)  # no mask bit
    assert out[4:] == PUBLISH


def test_a_text_frame_closes_the_connection() -> None:
    ws = opened()
    received = ws.receive(frame(b"hello", opcode=0x1))
    assert received.close and received.mqtt == b""
    assert received.reply[0] == 0x88  # a close frame
    assert struct.unpack(">H", received.reply[2:4])[0] == 1003


def test_a_ping_is_answered_and_a_close_is_echoed() -> None:
    ws = opened()
    pong = ws.receive(frame(b"p", opcode=0x9))
    assert pong.reply == b"\x8a\x01p" and not pong.close
    closing = ws.receive(frame(struct.pack(">H", 1000), opcode=0x8))
    assert closing.close and closing.reply[0] == 0x88


def test_the_server_closes_with_a_close_frame() -> None:
    ws = opened()
    assert ws.close() == b"\x88\x02\x03\xe8"
    assert ws.frame(PUBLISH) == b""  # nothing more once closing
    assert ws.close() == b""


def test_an_unmasked_client_frame_or_an_oversized_frame_closes() -> None:
    ws = opened()
    assert ws.receive(b"\x82\x01x").close  # clients must mask (RFC 6455 5.1)
    small = WebSocketFraming(max_frame_size=16)
    small.receive(upgrade())
    assert small.receive(frame(bytes(17))).close


def test_bytes_that_are_not_http_close() -> None:
    received = WebSocketFraming(1024).receive(CONNECT + b"\r\n\r\n")
    assert received.close and received.mqtt == b""
