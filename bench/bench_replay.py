"""Replay subscriptions: how fast a replay goes, and what it costs other clients' live p99.

On a cluster of its own (test ports and a temporary state dir, like the test session's:
:func:`tests.servers.make_test_settings`; brought down at the end), or with ``--running``
on the running local cluster (``cormorant up``). Once per run the script writes
``--history`` PUBLISH records to ``msg.all`` directly (12 made-up publishers, as an ingest
node writes them, so the history is cheap to make), under ``bench/replay/<run>/``. Then,
for ``--rounds`` rounds, two phases of ``--duration`` seconds each, A then B:

- A, live only: ``--pairs`` aiomqtt publisher/subscriber pairs through HAProxy, QoS 0
  (paced by the clock, not by acknowledgements; every PUBLISH is stored in Kafka all the
  same), ``--rate`` messages/s in all; the end-to-end latency of every message (a
  timestamp in its payload), p50 / p99 in ms;
- B, the same live load while a MQTT 5 client (QoS 1, aiomqtt, in a process of its own, so
  that it takes no CPU from the live clients' loop) replays the whole history with
  ``$replay/1h/bench/replay/<run>/#``: the live latencies measured while the replay
  runs, and the replay's rate (history messages received per second until the last one).

Every phase is appended to ``--output`` (JSON lines, with the machine, load average, date
and command); the medians over the rounds are printed.

```
python bench/bench_replay.py --history 100000 --rate 200 --pairs 4 --duration 15 --rounds 3
```
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import statistics
import struct
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path.cwd()))  # the checkout being run, not an installed copy

import aiomqtt
from aiokafka import AIOKafkaProducer

from bench import results
from services.common.kafka.names import TopicNames
from services.common.records import HEADER_META, PublishMeta, encode_meta
from services.local import cluster as local_cluster
from services.local.settings import LocalSettings
from tests.servers import make_test_settings

PUBLISHERS = 12
PAYLOAD = 64


async def write_history(settings: LocalSettings, prefix: str, count: int) -> None:
    """``count`` QoS 1 PUBLISH records of 12 publishers under ``prefix`` in ``msg.all``."""
    names = TopicNames.from_settings(settings)
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        now = int(time.time() * 1000)
        meta = [encode_meta(PublishMeta(f"{prefix}/p{p}", 1, False, now, 5)) for p in range(12)]
        pending = []
        for seq in range(count):
            p = seq % PUBLISHERS
            value = struct.pack(">Q", seq) + bytes(PAYLOAD - 8)
            pending.append(
                await producer.send(
                    names.msg_all,
                    value,
                    key=f"replay-pub-{p}".encode(),
                    headers=[(HEADER_META, meta[p])],
                )
            )
            if len(pending) >= 5000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await producer.stop()


def _pct(values: list[float], q: float) -> float | None:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else None


async def live_phase(
    port: int, run: str, pairs: int, rate: float, duration: float, replay_prefix: str | None
) -> dict[str, Any]:
    """One phase: live pairs for ``duration`` s, with a replay of ``replay_prefix`` if
    given; returns its figures."""
    latencies: list[float] = []
    base = f"bench/live/{run}/{uuid.uuid4().hex[:6]}"
    measuring = True
    seq = 0

    async def subscriber(i: int, ready: asyncio.Event) -> None:
        async with aiomqtt.Client("127.0.0.1", port, identifier=f"{base}-s{i}".replace("/", "-"),
                                  protocol=aiomqtt.ProtocolVersion.V5) as client:  # fmt: skip
            await client.subscribe(f"{base}/{i}", qos=0)
            ready.set()
            async for message in client.messages:
                (sent,) = struct.unpack_from(">d", bytes(message.payload))
                if measuring:
                    latencies.append((time.perf_counter() - sent) * 1000)

    readies = [asyncio.Event() for _ in range(pairs)]
    tasks = [asyncio.create_task(subscriber(i, readies[i])) for i in range(pairs)]
    replaying = None
    results_queue: multiprocessing.Queue[tuple[int, float]] = multiprocessing.Queue()
    if replay_prefix is not None:
        # Its own process: the replayed messages must not take the live clients' CPU here.
        replaying = multiprocessing.Process(
            target=_replay_client,
            args=(port, f"replay-{run}-{uuid.uuid4().hex[:6]}", replay_prefix, duration + 5),
            kwargs={"out": results_queue},
        )
        replaying.start()
    try:
        await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), 30)
        async with aiomqtt.Client("127.0.0.1", port, identifier=f"pub-{run}-{os.getpid()}",
                                  protocol=aiomqtt.ProtocolVersion.V5) as pub:  # fmt: skip
            start = time.perf_counter()
            seq = 0
            while time.perf_counter() < start + duration:
                due = start + seq / rate
                if due > time.perf_counter():
                    await asyncio.sleep(due - time.perf_counter())
                payload = struct.pack(">d", time.perf_counter()) + bytes(PAYLOAD - 8)
                await pub.publish(f"{base}/{seq % pairs}", payload, qos=0)
                seq += 1
            # The window's stragglers count too: up to 30 s more for them to arrive.
            deadline = time.perf_counter() + 30
            while len(latencies) < seq and time.perf_counter() < deadline:
                await asyncio.sleep(0.1)
        measuring = False
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    figures: dict[str, Any] = {
        "live_published": seq,
        "live_messages": len(latencies),
        "live_p50_ms": _pct(latencies, 0.50),
        "live_p99_ms": _pct(latencies, 0.99),
    }
    if replaying is not None:
        replay_count, span = results_queue.get(timeout=120)
        replaying.join(30)
        figures["replayed"] = replay_count
        figures["replay_per_s"] = replay_count / span if span > 0 else None
    return figures


def _replay_client(
    port: int,
    identifier: str,
    prefix: str,
    seconds: float,
    out: multiprocessing.Queue[tuple[int, float]],
) -> None:
    """A MQTT 5 client replaying ``prefix``'s history for ``seconds`` (a process of its
    own); puts (messages received, seconds from the first to the last) on ``out``."""

    async def replay() -> tuple[int, float]:
        count = 0
        first = last = 0.0
        async with aiomqtt.Client("127.0.0.1", port, identifier=identifier,
                                  protocol=aiomqtt.ProtocolVersion.V5) as client:  # fmt: skip
            await client.subscribe(f"$replay/1h/{prefix}/#", qos=1)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    async for _message in client.messages:
                        last = time.perf_counter()
                        first = first or last
                        count += 1
        return count, last - first

    out.put(asyncio.run(replay()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--history", type=int, default=200_000, help="messages to replay")
    parser.add_argument("--pairs", type=int, default=4, help="live publisher/subscriber pairs")
    parser.add_argument("--rate", type=float, default=200.0, help="live msg/s in all")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per phase")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path, default=results.RESULTS_DIR / "replay.jsonl")
    parser.add_argument("--running", action="store_true", help="use the running local cluster")
    args = parser.parse_args()
    if args.running:
        measure(LocalSettings(), args)
        return
    with tempfile.TemporaryDirectory(prefix="bench-replay-") as temp:
        settings = make_test_settings(Path(temp) / "state")
        local_cluster.up(settings)
        try:
            measure(settings, args)
        finally:
            local_cluster.down(settings)


def measure(settings: LocalSettings, args: argparse.Namespace) -> None:
    """The rounds of phases A and B (see the module) on the cluster of ``settings``."""
    run = uuid.uuid4().hex[:8]
    prefix = f"bench/replay/{run}"
    asyncio.run(write_history(settings, prefix, args.history))
    rows: dict[str, list[dict[str, Any]]] = {"A": [], "B": []}
    for round_ in range(1, args.rounds + 1):
        for phase in ("A", "B"):
            figures = asyncio.run(
                live_phase(
                    settings.listen_port,
                    run,
                    args.pairs,
                    args.rate,
                    args.duration,
                    prefix if phase == "B" else None,
                )
            )
            rows[phase].append(figures)
            print(f"round {round_} {phase}: {figures}", flush=True)
            results.append(
                args.output,
                {
                    "label": f"replay-{'with' if phase == 'B' else 'without'}",
                    "round": round_,
                    "history": args.history,
                    "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "command": " ".join(sys.argv),
                    "machine": results.machine(),
                    "loadavg": os.getloadavg(),
                    **figures,
                },
            )
    for phase, runs in rows.items():
        keys = ["live_p50_ms", "live_p99_ms"] + (["replay_per_s"] if phase == "B" else [])
        summary = {
            key: statistics.median(v for run_ in runs if (v := run_.get(key)) is not None)
            for key in keys
            if any(run_.get(key) is not None for run_ in runs)
        }
        print(f"{phase}: medians of {len(runs)} rounds {summary}")


if __name__ == "__main__":
    main()
