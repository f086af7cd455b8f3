"""The ingest node's sans-IO cost of one QoS 1 PUBLISH, without sockets or Kafka.

A :class:`~services.ingest.connection.ServerConnection` accepts a v3.1.1 CONNECT, then
``--messages`` QoS 1 PUBLISHes (64-byte payload) fed one by one, each reported stored at
once (its PUBACK is produced); the best of ``--repeats`` passes is printed in µs per
message. Deterministic enough to compare two commits on a busy machine, where end-to-end
runs cannot resolve a few percent: run it from each checkout's root.
``python bench/bench_ingest_publish.py``
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))  # the checkout being measured, not an installed copy

from services.common.mqtt.codec import encode
from services.common.mqtt.packets import Connect, Publish
from services.common.mqtt.properties import Properties
from services.common.settings import Settings
from services.ingest.connection import ServerConnection
from services.ingest.effects import StorePublish, StoreSession

NOW_MS = 1_700_000_000_000


def connected() -> ServerConnection:
    """A connection past CONNACK (its session record reported stored)."""
    settings = Settings()
    try:
        from services.ingest.limits import Limits
        from services.ingest.state import ServerContext
    except ImportError:  # the signature before the core took a ServerContext (issue 10)
        connection = ServerConnection(
            settings, "node1", bytes(16), lambda _: (None, []), lambda: NOW_MS
        )
    else:
        context = ServerContext(
            Limits.from_settings(settings), "node1", lambda _: (None, []), lambda: NOW_MS,
            lambda: "assigned",
        )  # fmt: skip
        connection = ServerConnection(context, bytes(16))
    effects = connection.receive_data(
        encode(Connect(4, "pub-1", True, 60, properties=Properties()), 4)
    )
    connection.stored(next(e.token for e in effects if isinstance(e, StoreSession)))
    return connection


def one_pass(messages: int) -> float:
    """Seconds to handle ``messages`` QoS 1 PUBLISHes and their store outcomes."""
    connection = connected()
    packets = [
        encode(Publish("bench/p2p/0", bytes(64), qos=1, packet_id=i % 60_000 + 1), 4)
        for i in range(messages)
    ]
    started = time.perf_counter()
    for data in packets:
        for effect in connection.receive_data(data):
            if isinstance(effect, StorePublish):
                connection.stored(effect.token)
    return time.perf_counter() - started


def main() -> None:
    """Parse the options and print the best pass in µs per PUBLISH."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    best = min(one_pass(args.messages) for _ in range(args.repeats))
    print(f"{best / args.messages * 1e6:.2f} µs per QoS 1 PUBLISH (best of {args.repeats})")


if __name__ == "__main__":
    main()
