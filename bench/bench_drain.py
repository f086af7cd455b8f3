"""A draining ingest node: the reconnect rate its clients put on the survivors, paced or not.

The bench runs a cluster of its own (``bench.chaos.own_cluster``: free ports, a temporary
state dir; two ingest nodes behind HAProxy: the survivors). Each storm starts one more
ingest node beside them (``drain_notice_seconds`` 0: no load balancer sends it clients,
they connect to it directly), connects ``--clients`` raw MQTT 3.1.1 clients to it
(``--concurrency`` at a time; Clean Session 1, Keep Alive 60 s), then sends it SIGTERM:

- **unpaced**: ``drain_seconds`` 0, every client at once (what every stop did before
  the drain);
- **paced**: ``drain_rate`` ``--rate`` clients per second (``drain_seconds`` 60).

Each client, once its connection ends (the socket closes: a 3.1.1 client gets no
DISCONNECT), connects again at once through HAProxy to a survivor, with the same
credentials, and leaves (DISCONNECT) once its CONNACK came. Scenarios: **anonymous**
(Client Identifier only) and **secrets** (each client the User Name and generated secret
of its own MQTT_BASIC credential, ``cormorant credentials add --generate-secret``'s kind;
``bench_reconnect_storm.fleet`` makes them once).

Figures per storm: the survivors' peak connect rate (CONNACKs of the reconnects per
1-second bucket, counted from the SIGTERM, the highest bucket), the spread of the
disconnects (last - first), the time until every client is back (last CONNACK - SIGTERM),
CONNACK p50 / p99 of the reconnects, refused reconnects (by CONNACK return code: a
refused client would come back later, on its own back-off) and failed ones.
One JSON line per storm in ``bench/results/drain.jsonl``; medians per scenario and mode
printed at the end.

``python bench/bench_drain.py --clients 2000 --rounds 3``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path.cwd()))  # the checkout being measured, not an installed copy

from bench.bench_reconnect_storm import Client, connect_packet, fleet
from bench.chaos import own_cluster
from services.local import cluster
from services.local.settings import LocalSettings

RESULTS = Path("bench/results/drain.jsonl")
HOST = "127.0.0.1"
NAME = "ingest-bench-drain"
MODES = ("unpaced", "paced")


class _Connected:
    """How many clients the draining node accepted so far."""

    def __init__(self) -> None:
        self.count = 0


async def _session(
    client: Client, node_port: int, lb_port: int, gate: asyncio.Semaphore, seen: _Connected
) -> tuple[float, float, float, int]:
    """Connect ``client`` to the draining node, wait for the node to end the connection,
    connect again through the load balancer: (gone, reconnect started, CONNACK, code)."""
    async with gate:
        reader, writer = await asyncio.open_connection(HOST, node_port)
        writer.write(connect_packet(client))
        connack = await reader.readexactly(4)
    if connack[3] != 0:
        raise RuntimeError(f"{client.client_id}: CONNACK {connack[3]} from the draining node")
    seen.count += 1
    while await reader.read(4096):
        pass  # until the node closes the connection
    gone = time.monotonic()
    writer.close()
    started = time.monotonic()
    reader, writer = await asyncio.open_connection(HOST, lb_port)
    try:
        writer.write(connect_packet(client))
        connack = await reader.readexactly(4)
        back = time.monotonic()
        writer.write(b"\xe0\x00")  # DISCONNECT
        await writer.drain()
    finally:
        writer.close()
    return gone, started, back, connack[3]


async def storm(
    settings: LocalSettings, clients: list[Client], concurrency: int, mode: str, rate: float
) -> dict[str, Any]:
    """One storm (see the module) with a node drained in ``mode``; its figures."""
    port = cluster.free_port()  # the kernel's pick: clear of every cluster's ports
    window = "0" if mode == "unpaced" else "60"
    await asyncio.to_thread(
        cluster.start_extra,
        settings,
        NAME,
        "ingest",
        port,
        node_id="bench-drain",
        mqtt_port=str(port),
        drain_notice_seconds="0",
        drain_rate=str(rate),
        drain_seconds=window,
    )
    gate, seen = asyncio.Semaphore(concurrency), _Connected()
    tasks = [
        asyncio.create_task(_session(c, port, settings.listen_port, gate, seen)) for c in clients
    ]
    deadline = time.monotonic() + 300
    while seen.count < len(clients):
        failed = [t for t in tasks if t.done() and t.exception() is not None]
        if failed or time.monotonic() > deadline:
            cluster.stop_extra(settings, NAME)
            raise RuntimeError(f"{seen.count} of {len(clients)} connected: {failed[:1]}")
        await asyncio.sleep(0.1)  # the bench's pace of looking, not a synchronization
    sigterm = time.monotonic()
    stopping = asyncio.create_task(asyncio.to_thread(cluster.stop_extra, settings, NAME))
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    await stopping
    errors = [repr(o) for o in outcomes if isinstance(o, BaseException)]
    done = [o for o in outcomes if not isinstance(o, BaseException)]
    refused = sum(1 for *_, code in done if code != 0)
    buckets = Counter(math.floor(back - sigterm) for _g, _s, back, _c in done)
    latencies = sorted((back - started) * 1000 for _g, started, back, _c in done)
    gone = [g for g, *_ in done]
    return {
        "clients": len(clients),
        "mode": mode,
        "drain_rate": rate if mode == "paced" else None,
        "back": len(done) - refused,
        "refused": refused,
        "refused_codes": dict(Counter(code for *_, code in done if code != 0)),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "peak_connects_per_s": max(buckets.values()) if buckets else 0,
        "connects_per_s_buckets": [buckets.get(k, 0) for k in range(max(buckets) + 1)]
        if buckets
        else [],
        "disconnect_spread_s": round(max(gone) - min(gone), 3) if gone else None,
        "all_back_s": round(max(b for _g, _s, b, _c in done) - sigterm, 3) if done else None,
        "connack_p50_ms": round(latencies[len(latencies) // 2], 1) if latencies else None,
        "connack_p99_ms": round(latencies[int(len(latencies) * 0.99)], 1) if latencies else None,
    }


def _load() -> float:
    return os.getloadavg()[0]


def main() -> None:
    """Run the rounds on a cluster of the bench's own; print the medians; append every
    storm to :data:`RESULTS`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--rate", type=float, default=200.0, help="drain_rate when paced")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scenarios", default="anonymous,secrets")
    args = parser.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    scenarios = args.scenarios.split(",")
    figures: dict[tuple[str, str], list[dict[str, Any]]] = {}
    # Every client comes from 127.0.0.1: no per-node or per-address connection rate limit.
    with own_cluster(
        production=False, max_connection_rate=0, max_connection_rate_per_address=0
    ) as settings:
        cluster.up(settings)
        secrets = fleet(settings, args.clients) if "secrets" in scenarios else {}
        for number in range(args.rounds):
            modes = MODES if number % 2 == 0 else MODES[::-1]
            for scenario in scenarios:
                for mode in modes:
                    tag = f"{number}-{time.time_ns() % 10**6}"
                    if scenario == "anonymous":
                        clients = [Client(f"drain-{tag}-{i}") for i in range(args.clients)]
                    else:
                        clients = [Client(u, u, p) for u, p in secrets.items()]
                    load = _load()
                    result = asyncio.run(
                        storm(settings, clients, args.concurrency, mode, args.rate)
                    )
                    result |= {
                        "scenario": scenario,
                        "round": number,
                        "load_before": load,
                        "load_after": _load(),
                        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        "commit": commit,
                        "machine": f"{platform.machine()} {os.cpu_count()} CPUs",
                        "python": platform.python_version(),
                        "command": " ".join(sys.argv),
                    }
                    print(json.dumps(result), flush=True)
                    RESULTS.parent.mkdir(parents=True, exist_ok=True)
                    with RESULTS.open("a") as out:
                        out.write(json.dumps(result) + "\n")
                    figures.setdefault((scenario, mode), []).append(result)
    for (scenario, mode), runs in sorted(figures.items()):
        peak = statistics.median(r["peak_connects_per_s"] for r in runs)
        back = statistics.median(r["all_back_s"] for r in runs)
        spread = statistics.median(r["disconnect_spread_s"] for r in runs)
        refused = statistics.median(r["refused"] for r in runs)
        print(
            f"{scenario} {mode}: survivors' peak {peak:,.0f} connects/s, disconnects over "
            f"{spread:.1f} s, last CONNACK {back:.1f} s after SIGTERM, {refused:g} refused "
            f"(medians of {len(runs)})"
        )


if __name__ == "__main__":
    main()
