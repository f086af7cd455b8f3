"""Benchmark an ingest node's QoS 0 fan-out: one downlink record to many connections.

``IngestNode.deliver`` hands one message to every target connected to the node; a QoS 0
PUBLISH has no Packet Identifier, so connections that need the same bytes share one
encoding (docs/design.md: encode-once fan-out). Server-assigned Topic Aliases (MQTT 5.0
3.3.2.3.4) make the bytes depend on each connection's alias for the topic, so this measures
what they cost, per kind of subscriber:

  - ``v311``: MQTT 3.1.1 subscribers (one encoding for all);
  - ``v5``: MQTT 5.0 subscribers whose CONNECT allows no Topic Alias (one encoding);
  - ``v5-alias``: v5 subscribers that allow aliases and all got the same alias for the topic
    (two encodings: the first message sets the alias, the others share the alias-only one);
  - ``v5-alias-distinct``: the same, but each connection's alias for the topic differs (it
    saw a different number of other topics first): one encoding per connection, the worst
    case;
  - ``v311-rules``: v3.1.1 subscribers whose credential has rules (``deny subscribe
    admin/#``, ``allow all #``: a ``#`` subscriber whose denied topics are withheld at
    delivery), every message on one topic: each delivery asks the subscriber's cached
    decision for the topic;
  - ``v311-rules-topics``: the same, each message on another of 4,096 topics, more than a
    connection's decision cache holds: every delivery walks the rules (the worst case).

Connections are sans-IO (no sockets, no Kafka): the figure is the node's own CPU per
delivery. Prints and appends one JSON line per kind to ``bench/results/ingest_fan_out.jsonl``.
Run from the repository root: ``python bench/bench_fan_out.py``. It also runs on code from
before Topic Aliases (the node's older ``deliver(meta, payload, targets)``), for a before /
after comparison on one machine.
"""

from __future__ import annotations

import argparse
import inspect
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, cast

REPO_ROOT = Path(__file__).resolve().parent.parent
# The script is run by path from a plain checkout, where the package is not installed.
sys.path.insert(0, str(REPO_ROOT))

from bench.bench_trie import cpu_model  # noqa: E402
from services.common.mqtt.codec import encode  # noqa: E402
from services.common.mqtt.packets import Connect, Publish  # noqa: E402
from services.common.mqtt.properties import Properties  # noqa: E402
from services.common.records import PublishMeta, Target  # noqa: E402
from services.common.settings import Settings  # noqa: E402
from services.ingest import node as ingest_node  # noqa: E402
from services.ingest.connection import ServerConnection  # noqa: E402

if TYPE_CHECKING:  # type checking only: an older checkout's bench/ may lack it
    from bench import legacy

RESULTS = REPO_ROOT / "bench" / "results" / "ingest_fan_out.jsonl"
KINDS = ("v311", "v5", "v5-alias", "v5-alias-distinct", "v311-rules", "v311-rules-topics")
RULES = ("deny subscribe admin/#", "allow all #")
"""The rules of the ``v311-rules*`` subscribers."""
TOPICS = 4096
"""Topics the ``v311-rules-topics`` messages go round."""
NOW_MS = 1_700_000_000_000

#: ``deliver(meta, payload, targets)``: one QoS 0 message to its targets on the node.
Deliver = Callable[[PublishMeta, bytes, list[Target]], object]


class Shell:
    """A connection's transport: counts the bytes written."""

    def __init__(self, connection: ServerConnection) -> None:
        self.connection = connection
        self.written = 0

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def close(self) -> None:
        raise AssertionError("no connection closes in this benchmark")

    def pause_reading(self) -> None:
        return None

    def resume_reading(self) -> None:
        return None

    def keep_alive_changed(self) -> None:
        return None

    def write_buffer_size(self) -> int:
        return 0


async def _never(*args: object) -> NoReturn:
    raise AssertionError("no Kafka in this benchmark")


def _node() -> ingest_node.IngestNode:
    settings = Settings.model_construct(node_id="bench", topic_prefix="bench.")
    try:
        from services.common.auth.authenticate import Authenticator, NoCredentials
        from services.common.auth.authorize import ALLOW_ALL_RULE
    except ImportError:  # code from before authentication
        construct = cast("legacy.IngestNodeBeforeAuthentication", ingest_node.IngestNode)
        return construct(settings, _never, _never, _never)
    return ingest_node.IngestNode(
        settings,
        _never,
        _never,
        _never,
        commit_will=_never,
        commit_delayed=_never,
        authenticator=Authenticator(
            NoCredentials(), allow_anonymous=True, anonymous_rules=(ALLOW_ALL_RULE,)
        ),
        fetch_credential=NoCredentials().get,
    )


def _connection(node: ingest_node.IngestNode, index: int) -> ServerConnection:
    connection_id = index.to_bytes(16, "big")
    if hasattr(node, "context"):
        return ServerConnection(node.context, connection_id)
    construct = cast("legacy.ServerConnectionBeforeContext", ServerConnection)
    return construct(node.settings, "bench", connection_id, node.previous_session, lambda: NOW_MS)


def _connect(node: ingest_node.IngestNode, index: int, kind: str) -> Shell:
    """A connected subscriber of ``kind`` registered with ``node``."""
    version = 4 if kind.startswith("v311") else 5
    props = Properties(topic_alias_maximum=50) if "alias" in kind else Properties()
    shell = Shell(_connection(node, index))
    client_id = f"sub-{index}"
    effects = shell.connection.receive_data(
        encode(Connect(version, client_id, True, 0, properties=props), version)
    )
    if hasattr(shell.connection, "authenticated"):  # the credential check of an anonymous client
        from services.common.auth.principal import Accepted, Principal

        rules: tuple[Any, ...] = ()
        if "rules" in kind:
            from services.common.auth.authorize import parse_rules

            rules = parse_rules(RULES)
        principal = Principal(None, None, None, rules, None)
        effects = shell.connection.authenticated(Accepted(principal))
    [store] = [e for e in effects if hasattr(e, "token")]
    shell.connection.stored(store.token)
    if hasattr(node, "registry"):
        node.registry.register(shell, client_id)
    else:
        cast("legacy.IngestNodeBeforeRegistry", node).clients[client_id] = shell
    if kind == "v5-alias-distinct":
        for other in range(index % 40):  # a different alias for the measured topic each
            shell.connection.deliver(Publish(f"warm/{other}", b""))
    return shell


def _deliver(node: ingest_node.IngestNode) -> Deliver:
    """``deliver(meta, payload, targets)`` on this code, whichever signature it has."""
    if "downlink" in inspect.signature(node.deliver).parameters:
        from services.common.records import Downlink

        return lambda meta, payload, targets: node.deliver(Downlink(meta, payload, targets))
    return cast(Deliver, node.deliver)  # code from before Downlink records


def run(kind: str, subscribers: int, messages: int, repeats: int) -> dict[str, Any]:
    """Deliver ``messages`` QoS 0 messages to ``subscribers`` connections of ``kind``,
    ``repeats`` times; the median deliveries per second."""
    node = _node()
    shells = [_connect(node, i, kind) for i in range(subscribers)]
    deliver = _deliver(node)
    targets = [Target(f"sub-{i}", 0) for i in range(subscribers)]
    count = TOPICS if kind == "v311-rules-topics" else 1
    metas = [PublishMeta(f"fan/out/topic{i or ''}", 0, False, NOW_MS, 5) for i in range(count)]
    payload = b"x" * 64
    deliver(metas[0], payload, targets)  # warm-up; sets the aliases up
    rates = []
    sent = 1
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(messages):
            deliver(metas[sent % count], payload, targets)
            sent += 1
        rates.append(messages * subscribers / (time.perf_counter() - started))
    median = statistics.median(rates)
    return {
        "benchmark": "ingest.fan_out",
        "kind": kind,
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "subscribers": subscribers,
        "messages": messages,
        "repeats": repeats,
        "topic_aliases": hasattr(node, "registry"),
        "deliveries_per_s_median": round(median),
        "deliveries_per_s_min": round(min(rates)),
        "deliveries_per_s_max": round(max(rates)),
        "us_per_delivery_median": round(1e6 / median, 3),
        "bytes_per_delivery": round(
            sum(s.written for s in shells) / (subscribers * (messages * repeats + 1)), 1
        ),
    }


def main() -> None:
    """Parse the command line, run every kind, print the records and append them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subscribers", type=int, default=1000)
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--kinds", nargs="*", default=list(KINDS), choices=KINDS)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    records = [run(k, args.subscribers, args.messages, args.repeats) for k in args.kinds]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with args.output.open("a", encoding="utf-8") as out:
        for record in records:
            print(json.dumps(record))
            out.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
