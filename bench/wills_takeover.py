"""How soon a killed ingest node's waiting Will Messages are published by another node.

Each round connects a client to ingest node 1 with a Will Message on a fresh topic and a
Will Delay Interval of ``--delay`` seconds (MQTT 5.0 3.1.3.2.2), loses its socket, waits
until the will is in ``client.wills``, kills node 1 with SIGKILL before the will is due,
and times the will's arrival at a subscriber connected to node 2. The figure,
``takeover``, is the arrival minus the later of the kill and the will's due time: how long
a due will waits once its node is gone (the consumer session timeout, a rebalance of the
ingest nodes' ``client.wills`` group, the new owner's fence and replay of the partition,
its transaction). Node 1 is started again after each round, and the groups are given
``--pause`` seconds to settle.

``python -m bench.wills_takeover [--own-cluster] [--rounds N] [--output FILE]``: against
the cluster ``cormorant up`` started (its ingest nodes' session timeout), or one of its own
(the local cluster's settings: a 3 s session timeout, 1 s heartbeats).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from aiokafka import AIOKafkaConsumer

from bench import chaos, results
from bench.loadgen.stats import median
from services.common.kafka.consumer import assign_whole_topics
from services.common.kafka.names import TopicNames
from services.common.kafka.partitioner import partition_of
from services.local import cluster, haproxy, kafka, layout
from services.local.settings import LocalSettings
from tests.e2e.clients import RawSocket, aio_client, collect, session_connect_packet

NODE = "ingest-node1"


@dataclass
class Round:
    """One kill. Seconds, from the client's socket loss: ``killed`` (node 1's SIGKILL
    sent), ``due`` (the Will Delay Interval), ``arrived`` (the will at the subscriber);
    ``takeover`` = ``arrived`` - max(``killed``, ``due``), ``after_kill`` = ``arrived`` -
    ``killed``."""

    killed: float
    due: float
    arrived: float
    takeover: float
    after_kill: float


def _node1_client_id(partitions: int) -> str:
    """A fresh client id whose ``client.wills`` partition node 1 owns while both nodes are
    in the group: an even one (aiokafka's round-robin assignor deals the partitions to the
    members sorted by member id, and node 1's, ``node1-…``, sorts first)."""
    while True:
        client_id = f"takeover-{uuid.uuid4().hex[:8]}"
        if partition_of(client_id, partitions) % 2 == 0:
            return client_id


async def _stored(consumer: AIOKafkaConsumer, client_id: str, timeout: float) -> None:
    """Wait until a ``client.wills`` record of ``client_id`` is read (key: client id, NUL,
    connection id)."""
    prefix = client_id.encode() + b"\0"
    async with asyncio.timeout(timeout):
        while True:
            record = await consumer.getone()
            if record.key is not None and record.key.startswith(prefix):
                return


async def measure_round(settings: LocalSettings, delay: int, timeout: float) -> Round:
    """Kill node 1 while a will of one of its former connections waits; see :class:`Round`.
    Raises ``TimeoutError`` if the will is not stored or does not arrive within
    ``timeout`` seconds, ``RuntimeError`` if node 1 could not be killed before it was due."""
    names = TopicNames.from_settings(settings)
    node1, node2 = haproxy.node_ports(settings)[:2]
    client_id = _node1_client_id(settings.state_topic_partitions)
    topic = f"bench/takeover/{client_id}"
    connect = session_connect_packet(
        client_id,
        level=5,
        clean_start=False,
        session_expiry=600,
        will=(topic, b"gone"),
        will_delay=delay,
    )
    wills = AIOKafkaConsumer(
        bootstrap_servers=kafka.bootstrap(settings), group_id=None, isolation_level="read_committed"
    )
    await wills.start()
    try:
        async with asyncio.timeout(timeout):
            await assign_whole_topics(wills, [names.client_wills], from_end=True)
        async with aio_client(node2, f"watch-{client_id}") as watcher:
            await watcher.subscribe(topic, qos=1)
            with RawSocket(node1) as raw:
                raw.connect_accepted(connect)
            lost = time.monotonic()  # closed without DISCONNECT: the will is armed
            await _stored(wills, client_id, timeout)
            cluster.kill_component(settings, NODE)
            killed = time.monotonic() - lost
            if killed >= delay:
                raise RuntimeError(f"node 1 killed {killed:.1f} s after the loss: not before due")
            await collect(watcher, 1, timeout=timeout)
            arrived = time.monotonic() - lost
    finally:
        await wills.stop()
    return Round(killed, float(delay), arrived, arrived - max(killed, delay), arrived - killed)


def main(argv: list[str] | None = None) -> None:
    """``python -m bench.wills_takeover``: ``--rounds`` kills of node 1, each round printed
    as JSON, then the medians."""
    parser = argparse.ArgumentParser(prog="python -m bench.wills_takeover", description=__doc__)
    parser.add_argument("--own-cluster", action="store_true", help="start a cluster of its own")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--delay", type=int, default=1, help="Will Delay Interval (seconds)")
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument(
        "--pause", type=float, default=15.0, help="seconds for the groups to settle per round"
    )
    parser.add_argument("--output", help="append each round as a JSON line to this file")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        if args.own_cluster:
            settings = stack.enter_context(chaos.own_cluster(production=False))
        else:
            settings = layout.current(LocalSettings())
        cluster.up(settings)
        rounds: list[Round] = []
        for number in range(1, args.rounds + 1):
            time.sleep(args.pause)  # node 1 (back) rejoins its groups: a rebalance
            try:
                measured = asyncio.run(measure_round(settings, args.delay, args.timeout))
            finally:
                cluster.start_component(settings, NODE)
            rounds.append(measured)
            result = {
                **asdict(measured),
                "round": number,
                "session_timeout": settings.consumer_session_timeout_seconds,
                "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                "machine": results.machine(),
                "git_commit": results.git_commit(results.RESULTS_DIR.parent.parent),
                "command": " ".join(["python -m bench.wills_takeover", *sys.argv[1:]]),
            }
            print(json.dumps(result), flush=True)
            if args.output:
                results.append(Path(args.output), result)
    for name in ("takeover", "after_kill"):
        values = [getattr(r, name) for r in rounds]
        print(
            f"{name} median {median(values) or 0.0:.1f} s (min {min(values):.1f}, "
            f"max {max(values):.1f}) over {len(rounds)} rounds",
            flush=True,
        )


if __name__ == "__main__":
    main()
