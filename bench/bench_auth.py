"""What authentication and authorization cost, end to end, on a running local cluster.

Two comparisons, each over ``--rounds`` rounds run alternately (A, B, A, B...), reported
as medians and the ratio B / A:

- **connects**: ``python -m bench run connections`` with anonymous clients (A) vs clients
  that present the User Name and Password of an MQTT_BASIC credential (B, argon2id checked
  by the ingest nodes' password threads);
- **publish**: ``python -m bench run p2p`` with clients that have no rules (A) vs 20 rules
  each (B: the ingest nodes restarted with ``CORMORANT_ANONYMOUS_RULES`` of 19 deny rules
  under the benchmark's topic level, then ``allow all #``, so every new Topic Name walks all
  20 once per connection).

The cluster is the one ``LocalSettings`` names (``CORMORANT_*`` variables: state dir, ports),
brought up with ``cormorant up``; the credential ``bench-basic`` is created if missing, and
the ingest nodes are left without rules at the end. Every run's record goes to
``bench/results/auth.jsonl``, the summary to ``bench/results/auth.md``.
``python bench/bench_auth.py --rounds 3``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path.cwd()))  # the checkout being measured, not an installed copy

from services.common.auth.credentials import CredentialType
from services.common.auth.manage import CredentialAdmin, CredentialNotFound, CredentialSpec
from services.common.auth.store import CredentialStore
from services.local import cluster, haproxy, postgres
from services.local.settings import LocalSettings

RESULTS = Path("bench/results")
USERNAME, PASSWORD = "bench-basic", "bench-basic-password"
RULES = [f"deny publish bench/other{i}/#" for i in range(19)] + ["allow all #"]


async def _ensure_credential(settings: LocalSettings) -> None:
    admin = CredentialAdmin(CredentialStore(postgres.dsn(settings)))
    try:
        await admin.get(USERNAME)
    except CredentialNotFound:
        await admin.add(
            CredentialSpec(
                USERNAME, CredentialType.MQTT_BASIC, username=USERNAME, password=PASSWORD.encode()
            )
        )
    finally:
        await admin.close()


def _restart_ingest(rules: list[str]) -> None:
    """Restart the ingest nodes with ``rules`` as the anonymous clients' rules."""
    settings = LocalSettings(anonymous_rules=rules)
    for port_index in range(len(haproxy.node_ports(settings))):
        name = f"ingest-node{port_index + 1}"
        cluster.stop_component(settings, name)
        cluster.start_component(settings, name)


def _run(args: list[str], output: Path) -> dict[str, Any]:
    command = [sys.executable, "-m", "bench", "run", *args, "--output", str(output)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    record: dict[str, Any] = json.loads(done.stdout)
    record["command"] = "python -m bench run " + " ".join(args)
    return record


def main() -> None:
    """Run the comparisons and write the summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument("--duration", type=float, default=10.0)
    args = parser.parse_args()
    settings = LocalSettings()
    asyncio.run(_ensure_credential(settings))
    output = RESULTS / "auth.jsonl"
    connect = ["connections", "--connections", str(args.connections), "--setup", "120"]
    p2p = ["p2p", "--warmup", "2", "--duration", str(args.duration), "--drain", "15"]
    figures: dict[str, list[float]] = {k: [] for k in ("anon", "basic", "none", "rules")}
    for round_ in range(1, args.rounds + 1):
        for key, extra in (
            ("anon", []),
            ("basic", ["--username", USERNAME, "--password", PASSWORD]),
        ):
            record = _run([*connect, *extra], output)
            figures[key].append(record["report"]["connects_per_s"] or 0.0)
            print(f"round {round_} connects {key}: {figures[key][-1]:,.0f}/s", flush=True)
        for key, rules in (("none", []), ("rules", RULES)):
            _restart_ingest(rules)
            record = _run(p2p, output)
            figures[key].append(record["report"]["delivered_per_s"])
            print(f"round {round_} p2p {key}: {figures[key][-1]:,.0f} msg/s", flush=True)
    _restart_ingest([])
    medians = {k: statistics.median(v) for k, v in figures.items()}
    lines = [
        f"# Authentication cost ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        f"Machine: {platform.machine()} {os.cpu_count()} CPUs, {platform.platform()}, "
        f"Python {platform.python_version()}; command: `python bench/bench_auth.py "
        f"--rounds {args.rounds} --connections {args.connections} --duration {args.duration}`",
        "",
        "| figure | A | B | every round (A / B) | B / A |",
        "|---|---:|---:|---|---:|",
        _row("connects/s: anonymous (A) vs MQTT_BASIC (B)", figures, "anon", "basic"),
        _row("p2p delivered msg/s: no rules (A) vs 20 rules (B)", figures, "none", "rules"),
    ]
    (RESULTS / "auth.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(json.dumps(medians))


def _row(title: str, figures: dict[str, list[float]], a: str, b: str) -> str:
    ma, mb = statistics.median(figures[a]), statistics.median(figures[b])
    rounds = ", ".join(f"{x:,.0f} / {y:,.0f}" for x, y in zip(figures[a], figures[b], strict=True))
    return f"| {title} | {ma:,.0f} | {mb:,.0f} | {rounds} | {mb / ma:.2f} |"


if __name__ == "__main__":
    main()
