"""Benchmark the message store of persistent DEVICE sessions on Redis and on PostgreSQL.

One round trip is what device_persist does per message in the steady state: ``append`` one
message, read the client's ``window`` (limit 10), ``acknowledge`` it with PUBACK. Measured
for one client (round trips one after the other) and for 100 clients (one asyncio task per
client, all at once, each doing its own round trips), on each backend; each case is run
``--runs`` times and the median, min and max round trips per second are printed as a table
and appended as JSON lines to ``bench/results/stores.jsonl``.

Servers: by default the ones the settings name (``CORMORANT_REDIS_URL``,
``CORMORANT_POSTGRES_DSN``; the local cluster of ``cormorant up`` by default). With
``--own-servers`` the script starts a private Redis and PostgreSQL through the local
cluster launcher in a temporary directory on free ports, and stops them at the end.
Run from the repository root: ``python bench/bench_stores.py --own-servers``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
# The script is run by path from a plain checkout, where the package is not installed.
sys.path.insert(0, str(REPO_ROOT))

from bench.bench_trie import cpu_model  # noqa: E402
from services.common.stores import (  # noqa: E402
    AckKind,
    MessageStore,
    PostgresMessageStore,
    RedisMessageStore,
)
from services.local import cluster  # noqa: E402
from services.local.settings import LocalSettings  # noqa: E402

RESULTS = REPO_ROOT / "bench" / "results" / "stores.jsonl"

#: Expiry of the benchmark's messages (Unix ms): one hour from the start.
EXPIRES_AT_MS = int(time.time() * 1000) + 3_600_000


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@contextmanager
def own_servers() -> Iterator[LocalSettings]:
    """Start a private Redis and PostgreSQL in a temporary directory; yield their settings."""
    with tempfile.TemporaryDirectory(prefix="bench-stores-") as state_dir:
        settings = cluster.local_settings(
            LocalSettings(
                state_dir=Path(state_dir), redis_port=free_port(), postgres_port=free_port()
            )
        )
        try:
            cluster.start_component(settings, "redis")
            cluster.start_component(settings, "postgres")
            yield settings
        finally:
            cluster.stop_component(settings, "postgres")
            cluster.stop_component(settings, "redis")


async def client_loop(store: MessageStore, client: str, round_trips: int, payload: bytes) -> None:
    """``round_trips`` times: append one message, read the window, PUBACK the message."""
    for offset in range(round_trips):
        result = await store.append(client, offset, 1, EXPIRES_AT_MS, payload)
        window = await store.window(client, 10, now_ms=int(time.time() * 1000))
        assert result.packet_id is not None and window, "the message must be stored"
        assert await store.acknowledge(client, result.packet_id, AckKind.PUBACK)


async def one_run(store: MessageStore, clients: int, round_trips: int, payload: bytes) -> float:
    """Round trips per second of ``clients`` concurrent clients, ``round_trips`` in total."""
    tag = uuid.uuid4().hex[:8]
    names = [f"bench-{tag}-{i}" for i in range(clients)]
    each = max(1, round_trips // clients)
    started = time.perf_counter()
    await asyncio.gather(*(client_loop(store, name, each, payload) for name in names))
    elapsed = time.perf_counter() - started
    await asyncio.gather(*(store.clear(name) for name in names))
    return each * clients / elapsed


async def run_case(
    backend: str, settings: LocalSettings, clients: int, round_trips: int, runs: int, payload: int
) -> dict[str, Any]:
    """Time ``runs`` runs of one case after an untimed warm-up run; return its record."""
    store: MessageStore
    if backend == "redis":
        prefix = f"bench-{uuid.uuid4().hex[:8]}:"
        store = RedisMessageStore(settings.redis_url, key_prefix=prefix, timeout=30.0)
    else:
        # As many connections as concurrent clients would use, up to 20.
        store = PostgresMessageStore(
            settings.postgres_dsn, timeout=30.0, pool_size=min(20, clients)
        )
    data = os.urandom(payload)
    try:
        await one_run(store, clients, min(round_trips, 200), data)  # connect, migrate, warm
        rates = [await one_run(store, clients, round_trips, data) for _ in range(runs)]
    finally:
        await store.close()
    median = statistics.median(rates)
    return {
        "benchmark": "stores.round_trip",
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "backend": backend,
        "clients": clients,
        "round_trips_per_run": round_trips // clients * clients,
        "payload_bytes": payload,
        "runs": runs,
        "round_trips_per_s_median": round(median),
        "round_trips_per_s_min": round(min(rates)),
        "round_trips_per_s_max": round(max(rates)),
        "ms_per_round_trip_median": round(1000 * clients / median, 3),
    }


def table(records: list[dict[str, Any]]) -> str:
    """The records as a Markdown table."""
    lines = [
        "| backend | clients | round trips/s median | min | max | ms per round trip, per client |",
        "|---|---|---|---|---|---|",
    ]
    for r in records:
        lines.append(
            f"| {r['backend']} | {r['clients']} | {r['round_trips_per_s_median']:,} | "
            f"{r['round_trips_per_s_min']:,} | {r['round_trips_per_s_max']:,} | "
            f"{r['ms_per_round_trip_median']} |"
        )
    return "\n".join(lines)


async def run_all(args: argparse.Namespace, settings: LocalSettings) -> list[dict[str, Any]]:
    """Every case: each backend with each client count."""
    records = []
    for backend in args.backends:
        for clients in args.clients:
            records.append(
                await run_case(
                    backend, settings, clients, args.round_trips, args.runs, args.payload
                )
            )
    return records


def main() -> None:
    """Parse the command line, run the cases, print the table and append the records."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["redis", "postgres"])
    parser.add_argument("--clients", nargs="+", type=int, default=[1, 100])
    parser.add_argument("--round-trips", type=int, default=2000, help="per run, all clients")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--payload", type=int, default=256, help="bytes per message")
    parser.add_argument("--own-servers", action="store_true")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()

    if args.own_servers:
        with own_servers() as settings:
            records = asyncio.run(run_all(args, settings))
    else:
        records = asyncio.run(run_all(args, LocalSettings()))
    print(table(records))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with args.output.open("a", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
