"""What authentication and authorization cost, end to end, on a running local cluster.

Two comparisons, each over ``--rounds`` rounds run alternately (A, B, A, B...), reported
as medians and the ratio B / A:

- **connects**: ``python -m bench run connections`` with anonymous clients (A) vs clients
  that present the User Name and Password of an MQTT_BASIC credential (B, argon2id checked
  by the ingest nodes' password threads);
- **publish**: ``python -m bench run p2p`` with clients that have no rules (A) vs 20 rules
  each (B: the ingest nodes restarted with ``CORMORANT_ANONYMOUS_RULES`` of 19 deny rules
  under the benchmark's topic level, then ``allow all #``, so every new Topic Name walks all
  20 once per connection);
- **storm** (``--storm N``, then the two comparisons above are skipped): MQTT_BASIC
  connects alone (A) vs during a wrong-password storm (B): ``N`` parallel loops, from the
  one source address 127.0.0.2 straight to the ingest nodes (HAProxy's maxconn would hold
  most of it back: a storm from inside the load balancer's reach), each sending CONNECTs
  with the user name of another credential and a new wrong password each time (more loops
  than ``auth_max_pending`` fill the queue), the nodes' verified-password cache off so that
  every legitimate CONNECT is checked. Run with the ingest nodes' defences (per-address
  share of the hashing queue, throttling) and without them (:data:`NO_DEFENCES`: as before
  issue 21).

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
import threading
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
VICTIM = "bench-victim"
STORM_ADDRESS = "127.0.0.2"
NO_CACHE = {"auth_verified_cache_entries": 0}
"""Every legitimate CONNECT verifies its password (as each device's first one after a
restart does), so it needs a place in the hashing queue."""
NO_DEFENCES = {
    **NO_CACHE,
    "auth_max_pending_per_address": 1000,
    "auth_failure_exempt_networks": ["127.0.0.0/8"],
}
"""Ingest settings that switch the defences of issue 21 off (the default queue is 1000)."""
RULES = [f"deny publish bench/other{i}/#" for i in range(19)] + ["allow all #"]


async def _ensure_credential(settings: LocalSettings) -> None:
    admin = CredentialAdmin(CredentialStore(postgres.dsn(settings)))
    try:
        for name in (USERNAME, VICTIM):
            try:
                await admin.get(name)
            except CredentialNotFound:
                await admin.add(
                    CredentialSpec(
                        name,
                        CredentialType.MQTT_BASIC,
                        username=name,
                        password=PASSWORD.encode(),
                        rules=["allow all #"],
                    )
                )
    finally:
        await admin.close()


def _restart_ingest(rules: list[str], **overrides: Any) -> None:
    """Restart the ingest nodes with ``rules`` as the anonymous clients' rules."""
    settings = LocalSettings(anonymous_rules=rules, **overrides)
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


def _connect_packet(client_id: str, username: str, password: bytes) -> bytes:
    """An MQTT 3.1.1 CONNECT (3.1) with User Name and Password, keep alive 60."""

    def field(data: bytes) -> bytes:
        return len(data).to_bytes(2, "big") + data

    body = field(b"MQTT") + bytes([4, 0xC2]) + (60).to_bytes(2, "big")
    body += field(client_id.encode()) + field(username.encode()) + field(password)
    assert len(body) < 128
    return bytes([0x10, len(body)]) + body


async def _storm_loop(port: int, stop: threading.Event, answers: dict[int, int]) -> None:
    while not stop.is_set():
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", port, local_addr=(STORM_ADDRESS, 0)), 10
            )
        except (OSError, TimeoutError):
            answers[-2] = answers.get(-2, 0) + 1  # not even connected
            await asyncio.sleep(0.1)
            continue
        try:
            guess = os.urandom(8).hex().encode()
            writer.write(_connect_packet(f"storm-{guess.decode()}", VICTIM, guess))
            head = await asyncio.wait_for(reader.readexactly(4), 60)
            answers[head[3]] = answers.get(head[3], 0) + 1
        except (OSError, asyncio.IncompleteReadError, TimeoutError):
            answers[-1] = answers.get(-1, 0) + 1
        finally:
            writer.close()


def _storm(ports: list[int], loops: int, stop: threading.Event, answers: dict[int, int]) -> None:
    async def all_loops() -> None:
        await asyncio.gather(
            *(_storm_loop(ports[i % len(ports)], stop, answers) for i in range(loops))
        )

    asyncio.run(all_loops())


def _storm_comparison(args: argparse.Namespace, settings: LocalSettings) -> None:
    """Legitimate MQTT_BASIC connects alone vs during a storm, defences on and off."""
    output = RESULTS / "auth_storm.jsonl"
    connect = ["connections", "--connections", str(args.connections), "--setup", "120",
               "--username", USERNAME, "--password", PASSWORD]  # fmt: skip
    figures: dict[str, list[float]] = {}
    storm_answers: dict[str, dict[int, int]] = {}
    for round_ in range(1, args.rounds + 1):
        for defences in ("on", "off"):
            _restart_ingest([], **(NO_CACHE if defences == "on" else NO_DEFENCES))
            for storm in (False, True):
                stop, answers = threading.Event(), storm_answers.setdefault(defences, {})
                thread = threading.Thread(
                    target=_storm,
                    args=(haproxy.node_ports(settings), args.storm, stop, answers),
                )
                if storm:
                    thread.start()
                    time.sleep(2)  # the storm fills the queue before the legitimate clients
                try:
                    record = _run(connect, output)
                finally:
                    stop.set()
                    if storm:
                        thread.join(120)
                key = f"{defences}-{'storm' if storm else 'alone'}"
                figures.setdefault(key, []).append(record["report"]["connects_per_s"] or 0.0)
                report = record["report"]
                print(f"round {round_} defences {defences} {key}: "
                      f"{figures[key][-1]:,.0f} connects/s, failed {report['failed']} "
                      f"{report['errors'][:2]}", flush=True)  # fmt: skip
    _restart_ingest([])
    lines = [
        f"# Legitimate connects during a wrong-password storm "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        f"Machine: {platform.machine()} {os.cpu_count()} CPUs, {platform.platform()}, "
        f"Python {platform.python_version()} (shared, noisy); command: `python "
        f"bench/bench_auth.py --storm {args.storm} --rounds {args.rounds} --connections "
        f"{args.connections}`; medians of {args.rounds} rounds.",
        "",
        "| figure | A | B | every round (A / B) | B / A |",
        "|---|---:|---:|---|---:|",
        _row("MQTT_BASIC connects/s, defences on: alone (A) vs storm (B)", figures,
             "on-alone", "on-storm"),
        _row("MQTT_BASIC connects/s, defences off: alone (A) vs storm (B)", figures,
             "off-alone", "off-storm"),
        "",
        "Storm CONNACK return codes (count; -1: no answer, -2: not connected): "
        + "; ".join(f"defences {k}: {dict(sorted(v.items()))}" for k, v in storm_answers.items()),
    ]  # fmt: skip
    (RESULTS / "auth_storm.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    """Run the comparisons and write the summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--storm", type=int, default=0, help="wrong-password loops (0: none)")
    args = parser.parse_args()
    settings = LocalSettings()
    asyncio.run(_ensure_credential(settings))
    if args.storm:
        _storm_comparison(args, settings)
        return
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
