"""The ingest node's sans-IO cost of one QoS 1 PUBLISH, without sockets or Kafka.

A :class:`~services.ingest.connection.ServerConnection` accepts a v3.1.1 CONNECT, then
``--messages`` QoS 1 PUBLISHes (64-byte payload) fed one by one, each reported stored at
once (its PUBACK is produced); the best of ``--repeats`` passes is printed in µs per
message. Deterministic enough to compare two commits on a busy machine, where end-to-end
runs cannot resolve a few percent: run it from each checkout's root.
``python bench/bench_ingest_publish.py``

``--rules N`` authenticates the client with N authorization rules (N-1 deny rules about
other topics under the same first level, then the allow rule that matches: every decision
walks them all), and
``--topics K`` spreads the PUBLISHes over K Topic Names (past 1,024 the per-connection
decision cache misses every time): the cost of authorization on the publish path.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, cast

sys.path.insert(0, str(Path.cwd()))  # the checkout being measured, not an installed copy

from services.common.mqtt.codec import encode
from services.common.mqtt.packets import Connect, Publish
from services.common.mqtt.properties import Properties
from services.common.settings import Settings
from services.ingest.connection import ServerConnection
from services.ingest.effects import StorePublish, StoreSession

if TYPE_CHECKING:  # imported where used at run time: older checkouts lack these modules
    from bench import legacy
    from services.common.auth.principal import Principal

NOW_MS = 1_700_000_000_000


def _principal(rules: int) -> Principal:
    """The principal of a client with ``rules`` rules (see the module)."""
    from services.common.auth.authorize import parse_rules
    from services.common.auth.principal import Principal

    texts = [f"deny publish bench/other{i}/${{client_id}}/#" for i in range(rules - 1)]
    texts += ["allow publish bench/#"] if rules else []
    return Principal(None, "bench", None, parse_rules(texts), "bench")


def connected(rules: int = 0) -> ServerConnection:
    """A connection past CONNACK (its session record reported stored), authenticated with
    ``rules`` authorization rules (code from before authentication: none asked)."""
    settings = Settings()
    try:
        from services.ingest.limits import Limits
        from services.ingest.state import ServerContext
    except ImportError:  # the signature before the core took a ServerContext
        construct = cast("legacy.ServerConnectionBeforeContext", ServerConnection)
        connection = construct(settings, "node1", bytes(16), lambda _: (None, []), lambda: NOW_MS)
    else:
        context = ServerContext(
            Limits.from_settings(settings), "node1", lambda _: (None, []), lambda: NOW_MS,
            lambda: "assigned",
        )  # fmt: skip
        connection = ServerConnection(context, bytes(16))
    effects = connection.receive_data(
        encode(Connect(4, "pub-1", True, 60, properties=Properties()), 4)
    )
    if not any(isinstance(e, StoreSession) for e in effects):
        from services.common.auth.principal import Accepted

        effects = connection.authenticated(Accepted(_principal(rules)))
    elif rules:
        raise SystemExit("this checkout has no authorization: run it without --rules")
    connection.stored(next(e.token for e in effects if isinstance(e, StoreSession)))
    return connection


def one_pass(messages: int, rules: int = 0, topics: int = 1) -> float:
    """Seconds to handle ``messages`` QoS 1 PUBLISHes (over ``topics`` Topic Names) and
    their store outcomes, on a connection with ``rules`` rules."""
    connection = connected(rules)
    packets = [
        encode(Publish(f"bench/p2p/{i % topics}", bytes(64), qos=1, packet_id=i % 60_000 + 1), 4)
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
    parser.add_argument("--rules", type=int, default=0, help="authorization rules (0: none)")
    parser.add_argument("--topics", type=int, default=1, help="distinct Topic Names")
    args = parser.parse_args()
    best = min(one_pass(args.messages, args.rules, args.topics) for _ in range(args.repeats))
    print(
        f"{best / args.messages * 1e6:.2f} µs per QoS 1 PUBLISH (best of {args.repeats}; "
        f"{args.rules} rules, {args.topics} topics)"
    )


if __name__ == "__main__":
    main()
