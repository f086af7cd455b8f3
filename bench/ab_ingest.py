"""Two (or more) versions of the ingest node, alternately, on one running local cluster.

For a change confined to the ingest node (its CONNECT path, authentication), the fairest
comparison on a shared machine is rounds in which every version runs the same load in
turn, A B A B …: before each version's runs its ingest nodes are stopped and started
again from that version's source tree (an export of a commit: ``git archive <commit> |
tar -x -C <dir>``), the rest of the cluster keeps running. Each run is
``python -m bench run <scenario> …`` (this checkout's load generator), with the
``bench-basic`` MQTT_BASIC credential of ``bench_auth.py`` available to runs that name
it. The ingest nodes are left on the last tree given.

``python bench/ab_ingest.py --tree base=/tmp/base --tree head=. --rounds 3
--run "connections --connections 2000 --setup 120"
--run "connections --connections 2000 --setup 120 --username bench-basic
--password bench-basic-password"`` writes every run's record (its ``tree`` added) to
``--output`` (default ``bench/results/ab-ingest.jsonl``) and prints, per run and tree,
every round's figure and the median, with the load average before each run.

``--components ingest,router`` restarts the routers from each tree too (a change of the
message path that both run: the MQTT codec, the records, the Kafka client settings). The
table then also gives each process's CPU µs per delivered message (the report's
``broker_cpu_us_per_delivered``), the fairer A/B figure on a machine whose other load
moves the rates: ``python bench/ab_ingest.py --components ingest,router --tree
before=/tmp/base --tree after=. --rounds 5 --run "p2p --pairs 50 --inflight 10 --warmup
2 --duration 10 --drain 15 --setup 90"``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout

from bench.bench_auth import _ensure_credential
from services.local.settings import LocalSettings

#: The figure each scenario is compared by (a key of its report).
FIGURES = {"connections": "connects_per_s"}

#: The components ``--components`` may name.
COMPONENTS = ("ingest", "router")

RESTART = """
import sys
import time
from services.local import cluster, haproxy, processes
from services.local.settings import LocalSettings
settings = LocalSettings()
names = []
if "ingest" in sys.argv[1:]:
    names += [f"ingest-node{index + 1}" for index in range(len(haproxy.node_ports(settings)))]
if "router" in sys.argv[1:]:
    names += cluster.instance_names(cluster.ROUTER, settings.router_instances)
for name in names:
    cluster.stop_component(settings, name)
    for attempt in range(5):  # the old process's sockets may linger a while on a busy VM
        try:
            cluster.start_component(settings, name)
            break
        except processes.StartError:
            if attempt == 4:
                raise
            time.sleep(5)
"""


def restart_ingest(tree: Path, components: Sequence[str] = ("ingest",)) -> None:
    """Stop every ingest node of the cluster (and every router, with ``"router"`` among
    ``components``) and start them again from ``tree``'s sources.

    Raises ``subprocess.CalledProcessError`` when one does not start.
    """
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, "-c", RESTART, *components]
    subprocess.run(command, cwd=tree, env=env, check=True)


def run_once(args: list[str]) -> dict[str, Any]:
    """``python -m bench run <args>``'s result record. Raises ``SystemExit`` if it failed."""
    command = [sys.executable, "-m", "bench", "run", *args]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{shlex.join(command)} failed:\n{done.stderr[-2000:]}")
    record: dict[str, Any] = json.loads(done.stdout)
    return record


def figure(record: dict[str, Any]) -> float:
    """The compared figure of a run (:data:`FIGURES`; delivered msg/s otherwise)."""
    key = FIGURES.get(record["scenario"], "delivered_per_s")
    return float(record["report"].get(key) or 0.0)


def cpu_per_message(record: dict[str, Any]) -> dict[str, float]:
    """Each process's CPU µs per delivered message in a run (empty for a report without
    them, e.g. ``connections``)."""
    per: dict[str, Any] = record["report"].get("broker_cpu_us_per_delivered") or {}
    return {name: float(value) for name, value in per.items() if value is not None}


def main() -> None:
    """Run the rounds and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", required=True, help="label=source tree")
    parser.add_argument("--run", action="append", required=True, help="python -m bench run …")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--components",
        default="ingest",
        help=f"comma-separated, restarted from each tree: {', '.join(COMPONENTS)}",
    )
    parser.add_argument("--output", type=Path, default=Path("bench/results/ab-ingest.jsonl"))
    args = parser.parse_args()
    components = [c for c in args.components.split(",") if c]
    if not components or set(components) - set(COMPONENTS):
        parser.error(f"--components takes {', '.join(COMPONENTS)}")
    trees = [(t.split("=", 1)[0], Path(t.split("=", 1)[1]).resolve()) for t in args.tree]
    asyncio.run(_ensure_credential(LocalSettings()))
    runs = [shlex.split(r) for r in args.run]
    figures: dict[tuple[int, str], list[tuple[float, float]]] = {}
    cpu: dict[tuple[int, str], list[dict[str, float]]] = {}
    for round_ in range(1, args.rounds + 1):
        for label, tree in trees:
            restart_ingest(tree, components)
            for index, run in enumerate(runs):
                load = os.getloadavg()[0]
                record = run_once(run)
                record.update(tree=label, tree_path=str(tree), ab_round=round_)
                args.output.parent.mkdir(parents=True, exist_ok=True)
                with args.output.open("a", encoding="utf-8") as out:
                    out.write(json.dumps(record, sort_keys=True, default=str) + "\n")
                value = figure(record)
                figures.setdefault((index, label), []).append((value, load))
                per = cpu_per_message(record)
                cpu.setdefault((index, label), []).append(per)
                shown = ", ".join(f"{name} {us:.1f}" for name, us in sorted(per.items()))
                print(f"[{time.strftime('%H:%M:%S')}] round {round_} {label} "
                      f"run {index + 1}: {value:,.0f} (load {load:.1f}); "
                      f"CPU µs per delivered: {shown or '-'}", flush=True)  # fmt: skip
    restart_ingest(trees[-1][1], components)
    for index, run in enumerate(runs):
        print(f"\n`python -m bench run {shlex.join(run)}`")
        for label, _tree in trees:
            values = figures[(index, label)]
            rounds = ", ".join(f"{v:,.0f} (load {load:.1f})" for v, load in values)
            median = statistics.median(v for v, _ in values)
            print(f"- {label}: median {median:,.0f}; rounds {rounds}")
        names = sorted({name for label, _ in trees for per in cpu[(index, label)] for name in per})
        if not names:
            continue
        labels = " | ".join(label for label, _tree in trees)
        print(f"\n| CPU µs per delivered message (median) | {labels} |")
        print("|---|" + "---:|" * len(trees))
        for name in [*names, "stack"]:
            cells = []
            for label, _tree in trees:
                if name == "stack":
                    sums = [sum(per.values()) for per in cpu[(index, label)] if per]
                else:
                    sums = [per[name] for per in cpu[(index, label)] if name in per]
                cells.append(f"{statistics.median(sums):.1f}" if sums else "-")
            print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
