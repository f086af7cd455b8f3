"""Benchmark the server side of MQTT over WebSocket: cost per message of two sans-IO libraries.

An ingest node's WebSocket listener sits between the socket and the sans-IO
``ServerConnection`` (MQTT 5.0 section 6): it unmasks the client's binary frames into the
MQTT byte stream and wraps the node's MQTT bytes into unmasked binary frames. Both sides are
measured, per message, for the two maintained sans-IO WebSocket libraries on PyPI:

  - ``wsproto`` (python-hyper, pure Python; events per frame);
  - ``websockets`` (its sans-IO ``ServerProtocol``; unmasking in its C extension).

``receive``: client frames (masked, one MQTT PUBLISH of ``--size`` bytes each), fed to the
server ``--batch`` frames per read, the payloads taken out; ``send``: one server frame per
message. One untimed warm-up pass, then ``--repeats`` timed passes of ``--messages``
messages; reported: the median µs per message. Appends one JSON line per library and size
to ``bench/results/websocket.jsonl``. Run from the repository root:
``python bench/bench_websocket.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import websockets.frames
import websockets.server
import wsproto
import wsproto.events
from websockets.http11 import Request

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench.bench_trie import cpu_model  # noqa: E402

RESULTS = REPO_ROOT / "bench" / "results" / "websocket.jsonl"

HANDSHAKE = (
    b"GET /mqtt HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
    b"Sec-WebSocket-Protocol: mqtt\r\n\r\n"
)

Receive = Callable[[bytes], int]
Send = Callable[[bytes], bytes]


def client_frames(payload: bytes, count: int) -> bytes:
    """``count`` masked binary frames carrying ``payload`` (as a browser sends them)."""
    frame = websockets.frames.Frame(websockets.frames.Opcode.BINARY, payload)
    return b"".join(frame.serialize(mask=True) for _ in range(count))


def wsproto_server() -> tuple[Receive, Send]:
    """A wsproto server past its handshake: (feed bytes → payload bytes out, wrap bytes)."""
    conn = wsproto.WSConnection(wsproto.ConnectionType.SERVER)
    conn.receive_data(HANDSHAKE)
    for event in conn.events():
        if isinstance(event, wsproto.events.Request):
            conn.send(wsproto.events.AcceptConnection(subprotocol="mqtt"))

    def receive(data: bytes) -> int:
        conn.receive_data(data)
        got = 0
        for event in conn.events():
            if isinstance(event, wsproto.events.BytesMessage):
                got += len(event.data)
        return got

    def send(data: bytes) -> bytes:
        return conn.send(wsproto.events.BytesMessage(data=data))

    return receive, send


def websockets_server() -> tuple[Receive, Send]:
    """A websockets sans-IO server past its handshake, the same two operations."""
    proto = websockets.server.ServerProtocol(subprotocols=[websockets.Subprotocol("mqtt")])
    proto.receive_data(HANDSHAKE)
    request = proto.events_received()[0]
    assert isinstance(request, Request)
    proto.send_response(proto.accept(request))
    proto.data_to_send()

    def receive(data: bytes) -> int:
        proto.receive_data(data)
        got = 0
        for event in proto.events_received():
            if isinstance(event, websockets.frames.Frame):
                got += len(event.data)
        return got

    def send(data: bytes) -> bytes:
        proto.send_binary(data)
        return b"".join(proto.data_to_send())

    return receive, send


LIBRARIES: dict[str, Callable[[], tuple[Receive, Send]]] = {
    "wsproto": wsproto_server,
    "websockets": websockets_server,
}


def measure(
    make: Callable[[], tuple[Receive, Send]], size: int, batch: int, messages: int, repeats: int
) -> dict[str, float]:
    """Median µs per message received and sent over ``repeats`` passes (after a warm-up)."""
    payload = bytes(size)
    reads = client_frames(payload, batch)
    rounds = messages // batch
    receive_us: list[float] = []
    send_us: list[float] = []
    for attempt in range(repeats + 1):
        receive, send = make()
        start = time.perf_counter()
        for _ in range(rounds):
            if receive(reads) != size * batch:
                raise AssertionError("a frame was lost")
        received = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(rounds * batch):
            send(payload)
        sent = time.perf_counter() - start
        if attempt:  # the first pass warms up
            receive_us.append(received / (rounds * batch) * 1e6)
            send_us.append(sent / (rounds * batch) * 1e6)
    return {"receive_us": statistics.median(receive_us), "send_us": statistics.median(send_us)}


def main() -> None:
    """Measure each library at each size and print and record the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 1024, 16384])
    parser.add_argument("--batch", type=int, default=10, help="frames per read")
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    stamp = datetime.now(UTC).isoformat(timespec="seconds")
    lines = []
    for size in args.sizes:
        for name, make in LIBRARIES.items():
            figures = measure(make, size, args.batch, args.messages, args.repeats)
            line = {
                "bench": "websocket",
                "library": name,
                "size": size,
                "batch": args.batch,
                "messages": args.messages,
                "repeats": args.repeats,
                **{k: round(v, 3) for k, v in figures.items()},
                "date": stamp,
                "python": platform.python_version(),
                "cpu": cpu_model(),
                "cpus": os.cpu_count(),
            }
            lines.append(line)
            print(
                f"{name:>10} {size:>6} B: receive {figures['receive_us']:7.2f} µs/msg, "
                f"send {figures['send_us']:7.2f} µs/msg"
            )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with args.output.open("a", encoding="utf-8") as out:
        for line in lines:
            out.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
