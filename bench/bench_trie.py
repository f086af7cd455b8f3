"""Benchmark SubscriptionTrie.match, the router's per-message hot path.

Builds a trie of 100,000 subscriptions shaped like a device fleet, then times ``match`` over a
fixed random set of topic names, several times, and prints and appends (as one JSON line to
``bench/results/trie.jsonl``) the median, min and max matches per second with the Python
version and the machine. Run from the repository root: ``python bench/bench_trie.py``.

Subscription mix (fixed seed, so every run builds the same trie):
  - 90 %  exact     ``devices/d<i>/telemetry``   one per device, the device's own client;
  - 4.5 % one ``+``  ``devices/d<j>/+``           a monitor watching all of one device's metrics;
  - 4.5 % one ``+``  ``+/d<j>/telemetry``         the same at the first level (a root branch
                                                  every topic walks through);
  - 1 %   ``#``      ``devices/d<j>/#``           a monitor watching one device's subtree.
Topics are ``devices/d<k>/<metric>`` with k uniform over the 100,000 device ids and metric
telemetry (80 %), status (15 %) or alerts (5 %).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
# The script is run by path from a plain checkout, where the package is not installed.
sys.path.insert(0, str(REPO_ROOT))

from services.common.subscription import Subscription  # noqa: E402
from services.common.topics.trie import SubscriptionTrie  # noqa: E402

RESULTS = REPO_ROOT / "bench" / "results" / "trie.jsonl"


def build_subscriptions(count: int, rng: random.Random) -> list[Subscription]:
    """The subscription mix described in the module docstring, ``count`` subscriptions."""
    exact = count * 90 // 100
    plus_leaf = count * 45 // 1000
    plus_root = count * 45 // 1000
    hash_count = count - exact - plus_leaf - plus_root
    subs = [Subscription(f"dev-{i}", f"devices/d{i}/telemetry", 1) for i in range(exact)]
    for k in range(plus_leaf):
        device = rng.randrange(count)
        subs.append(Subscription(f"mon-{k}", f"devices/d{device}/+", 1))
    for k in range(plus_root):
        device = rng.randrange(count)
        subs.append(Subscription(f"rmon-{k}", f"+/d{device}/telemetry", 0))
    for k in range(hash_count):
        device = rng.randrange(count)
        subs.append(Subscription(f"tree-{k}", f"devices/d{device}/#", 2))
    return subs


def build_topics(count: int, devices: int, rng: random.Random) -> list[str]:
    """``count`` topic names ``devices/d<k>/<metric>`` as described in the module docstring."""
    metrics = rng.choices(["telemetry", "status", "alerts"], weights=[80, 15, 5], k=count)
    return [f"devices/d{rng.randrange(devices)}/{metric}" for metric in metrics]


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (``platform.processor()`` is empty on Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor()


def run(subscriptions: int, topics: int, repeats: int, seed: int) -> dict[str, Any]:
    """Build the trie, time ``repeats`` passes of ``match`` over the topics; return the record."""
    rng = random.Random(seed)
    subs = build_subscriptions(subscriptions, rng)
    topic_names = build_topics(topics, subscriptions, rng)

    trie = SubscriptionTrie()
    started = time.perf_counter()
    for sub in subs:
        trie.add(sub)
    build_s = time.perf_counter() - started

    match = trie.match
    # Untimed pass: warms caches and counts the work one pass does.
    matched_clients = sum(len(match(topic).clients) for topic in topic_names)

    rates: list[float] = []
    for _ in range(repeats):
        started = time.perf_counter()
        for topic in topic_names:
            match(topic)
        rates.append(len(topic_names) / (time.perf_counter() - started))

    median = statistics.median(rates)
    return {
        "benchmark": "trie.match",
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "subscriptions": len(trie),
        "trie_nodes": trie.node_count(),
        "topics": len(topic_names),
        "repeats": repeats,
        "seed": seed,
        "build_s": round(build_s, 3),
        "adds_per_s": round(len(subs) / build_s),
        "avg_clients_per_match": round(matched_clients / len(topic_names), 3),
        "matches_per_s_median": round(median),
        "matches_per_s_min": round(min(rates)),
        "matches_per_s_max": round(max(rates)),
        "us_per_match_median": round(1e6 / median, 3),
        # ru_maxrss is KiB on Linux: the whole process's peak, trie and topic list included.
        "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def main() -> None:
    """Parse the command line, run the benchmark, print the record and append it to RESULTS."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subscriptions", type=int, default=100_000)
    parser.add_argument("--topics", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()

    record = run(args.subscriptions, args.topics, args.repeats, args.seed)
    print(json.dumps(record, indent=2))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with args.output.open("a", encoding="utf-8") as out:
        out.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
