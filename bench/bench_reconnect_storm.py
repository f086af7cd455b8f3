"""Connection storms: how fast a fleet gets back in, against Cormorant and Mosquitto.

Every round runs four storms, alternating the brokers (Cormorant, Mosquitto, Cormorant,
Mosquitto; the next round starts with the other broker):

- **anonymous**: ``--clients`` raw MQTT 3.1.1 clients (Client Identifier only) connect;
- **secrets**: the same clients each present the User Name and generated secret of their own
  MQTT_BASIC credential. Cormorant: credentials made with
  :meth:`~services.common.auth.manage.CredentialAdmin.add_generated` (what
  ``cormorant credentials add --generate-secret`` does: salted HMAC-SHA-256); Mosquitto: a
  ``password_file`` of the same user names and secrets hashed by ``mosquitto_passwd -U``
  (Mosquitto 2.0's PBKDF2-SHA-512, 101 iterations).

A storm: ``--concurrency`` clients in flight at once, each opening a TCP connection through
the broker's listener (Cormorant: HAProxy's ``listen_port``), sending CONNECT (Clean
Session 1), reading CONNACK (refused: counted, the run fails), then DISCONNECT and close:
the local HAProxy holds at most about 9,950 connections (its open-file limit), so the
clients do not stay connected, and each broker pays a session's end besides its start.
Figure: connects/s = clients / (last CONNACK - first connection attempt); CONNACK latency
p50 / p99 from the connection attempt; for Cormorant, each process's CPU ms per connect
(user + system, psutil, over the storm). Each Cormorant storm is preceded by a warm-up of
``--concurrency`` clients (not counted); the nodes' verified-password memory plays no part
(generated secrets do not use it), and the ingest nodes are not restarted between storms.

The credentials are made once per cluster (``storm-<i>``, their secrets kept in
``<state_dir>/bench-storm-secrets.json``, mode 0600, as the fleet's provisioning would keep
them); the Mosquitto is started by the bench (``bench/brokers.py``) for each storm.
Results: one JSON line per storm in ``bench/results/reconnect_storm.jsonl``, medians per
broker and scenario printed with their ratios.

``--hash-costs`` measures instead what one verification of each password scheme costs on
one core (``services.common.auth.passwords.verify``: 5 passes of 20,000 HMAC-SHA-256 and of
20 argon2id verifications; median CPU µs of this process per verification, so that other
processes of a loaded machine count less), and exits.

``python bench/bench_reconnect_storm.py --clients 10000 --rounds 3``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path.cwd()))  # the checkout being measured, not an installed copy

from bench import brokers
from services.common.auth.credentials import CredentialType
from services.common.auth.manage import CredentialAdmin, CredentialSpec
from services.common.auth.passwords import generate_secret, hash_password, hash_secret, verify
from services.common.auth.store import CredentialStore
from services.local import layout, postgres
from services.local.settings import LocalSettings

RESULTS = Path("bench/results/reconnect_storm.jsonl")
PREFIX = "storm-"
CREATE_CONCURRENCY = 50
"""Credentials created at once (each is one INSERT, PostgreSQL commits them together)."""
MOSQUITTO_CONF_EXTRA = "password_file {path}\n"


@dataclass(frozen=True, slots=True)
class Client:
    """One client of the storm: Client Identifier, and User Name and Password (secrets)."""

    client_id: str
    username: str | None = None
    password: str | None = None


def _string(data: bytes) -> bytes:
    return len(data).to_bytes(2, "big") + data


def connect_packet(client: Client) -> bytes:
    """A v3.1.1 CONNECT (MQTT 3.1.1 3.1) of ``client``, Clean Session 1, Keep Alive 60 s."""
    flags = 0x02
    payload = _string(client.client_id.encode())
    if client.username is not None:
        flags |= 0x80
        payload += _string(client.username.encode())
    if client.password is not None:
        flags |= 0x40
        payload += _string(client.password.encode())
    body = _string(b"MQTT") + bytes([4, flags]) + (60).to_bytes(2, "big") + payload
    length = len(body)
    encoded = b""
    while True:
        byte, length = length % 128, length // 128
        encoded += bytes([byte | (0x80 if length else 0)])
        if not length:
            break
    return b"\x10" + encoded + body


async def _one(host: str, port: int, client: Client) -> tuple[float, float, int]:
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(connect_packet(client))
        connack = await reader.readexactly(4)
        done = time.perf_counter()
        writer.write(b"\xe0\x00")  # DISCONNECT
        await writer.drain()
    finally:
        writer.close()
        with suppress(OSError):
            await writer.wait_closed()
    return started, done, connack[3]


async def storm(host: str, port: int, clients: list[Client], concurrency: int) -> dict[str, Any]:
    """Connect every client of ``clients`` (``concurrency`` at once); the figures."""
    queue = iter(clients)
    results: list[tuple[float, float, int]] = []
    errors: list[str] = []

    async def worker() -> None:
        for client in queue:
            try:
                results.append(await _one(host, port, client))
            except (OSError, asyncio.IncompleteReadError) as exc:
                errors.append(f"{type(exc).__name__}: {exc}")

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    refused = sum(1 for _s, _d, code in results if code != 0)
    first = min(s for s, _d, _c in results)
    last = max(d for _s, d, _c in results)
    latencies = sorted((d - s) * 1000 for s, d, _c in results)
    return {
        "clients": len(clients),
        "connected": len(results) - refused,
        "refused": refused,
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "connects_per_s": (len(results) - refused) / (last - first),
        "connack_p50_ms": latencies[len(latencies) // 2],
        "connack_p99_ms": latencies[int(len(latencies) * 0.99)],
    }


async def _made(settings: LocalSettings, count: int) -> dict[str, str]:
    """``count`` credentials with generated secrets (user name → secret), made now (the
    earlier ones of the bench deleted first)."""
    dsn = postgres.dsn(settings)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("DELETE FROM mqtt_credentials WHERE name LIKE %s", (PREFIX + "%",))
    admin = CredentialAdmin(CredentialStore(dsn, pool_size=CREATE_CONCURRENCY))
    secrets: dict[str, str] = {}
    try:
        names = [f"{PREFIX}{i}" for i in range(count)]
        for start in range(0, count, CREATE_CONCURRENCY):
            chunk = names[start : start + CREATE_CONCURRENCY]
            specs = [
                CredentialSpec(name, CredentialType.MQTT_BASIC, username=name, client_id=name,
                               rules=["allow all #"])
                for name in chunk
            ]  # fmt: skip
            made = await asyncio.gather(*(admin.add_generated(spec) for spec in specs))
            for (credential, secret), name in zip(made, chunk, strict=True):
                assert credential.name == name
                secrets[name] = secret
    finally:
        await admin.close()
    return secrets


def fleet(settings: LocalSettings, count: int) -> dict[str, str]:
    """The storm's credentials (user name → secret), made on first use."""
    path = settings.state_dir / "bench-storm-secrets.json"
    if path.exists():
        kept: dict[str, str] = json.loads(path.read_text())
        if len(kept) >= count:
            return dict(list(kept.items())[:count])
    print(f"creating {count:,} credentials with generated secrets ...", flush=True)
    made = asyncio.run(_made(settings, count))
    path.touch(mode=0o600)
    path.write_text(json.dumps(made))
    return made


@contextmanager
def mosquitto_with(secrets: dict[str, str] | None) -> Iterator[brokers.Target]:
    """The bench's Mosquitto, with a password file of ``secrets`` when given."""
    if secrets is None:
        with brokers.mosquitto() as target:
            yield target
        return
    with tempfile.TemporaryDirectory(prefix="bench-storm-") as tmp:
        passwords = Path(tmp) / "passwords"
        passwords.write_text("".join(f"{u}:{p}\n" for u, p in secrets.items()))
        subprocess.run(["mosquitto_passwd", "-U", str(passwords)], check=True)
        os.chmod(tmp, 0o755)
        os.chmod(passwords, 0o644)
        original = brokers.MOSQUITTO_CONF
        brokers.MOSQUITTO_CONF = original + MOSQUITTO_CONF_EXTRA.format(path=passwords)
        try:
            with brokers.mosquitto() as target:
                yield target
        finally:
            brokers.MOSQUITTO_CONF = original


def hash_costs() -> dict[str, float]:
    """Median µs per verification of a right password, per scheme (see the module)."""
    secret = generate_secret().encode()
    costs: dict[str, float] = {}
    for scheme, encoded, count in (
        ("hmac-sha256", hash_secret(secret), 20_000),
        ("argon2id", hash_password(secret), 20),
    ):
        passes = []
        for _ in range(5):
            started = time.process_time()
            for _ in range(count):
                assert verify(encoded, secret)
            passes.append((time.process_time() - started) / count * 1e6)
        costs[scheme] = statistics.median(passes)
    return costs


def _load() -> float:
    return os.getloadavg()[0]


def main() -> None:
    """Run the rounds, print the medians, append every storm to :data:`RESULTS`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scenarios", default="anonymous,secrets")
    parser.add_argument("--hash-costs", action="store_true")
    args = parser.parse_args()
    if args.hash_costs:
        load = _load()
        costs = hash_costs()
        print(json.dumps({"hash_costs_us": costs, "load_before": load, "load_after": _load()}))
        return
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    settings = layout.current(LocalSettings())
    target = brokers.cormorant(settings=settings)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    figures: dict[tuple[str, str], list[dict[str, Any]]] = {}
    scenarios = args.scenarios.split(",")
    secrets = fleet(settings, args.clients) if "secrets" in scenarios else {}
    for number in range(args.rounds):
        order = ["cormorant", "mosquitto"] if number % 2 == 0 else ["mosquitto", "cormorant"]
        for scenario in scenarios:
            tag = f"{number}-{time.time_ns() % 10**6}"
            if scenario == "anonymous":
                clients = [Client(f"anon-{tag}-{i}") for i in range(args.clients)]
            else:
                clients = [Client(u, u, p) for u, p in secrets.items()]
            for broker in order:
                load = _load()
                if broker == "cormorant":
                    warm = [Client(f"warm-{tag}-{i}") for i in range(args.concurrency)]
                    asyncio.run(storm(target.host, target.port, warm, args.concurrency))
                    before = brokers.cpu_seconds(target.processes)
                    result = asyncio.run(storm(target.host, target.port, clients, args.concurrency))
                    after = brokers.cpu_seconds(target.processes)
                    result["cpu_ms_per_connect"] = {
                        name: round(1000 * (after[name] - before.get(name, 0.0)) / len(clients), 3)
                        for name in after
                    }
                else:
                    with mosquitto_with(secrets if scenario == "secrets" else None) as mosq:
                        result = asyncio.run(storm(mosq.host, mosq.port, clients, args.concurrency))
                result |= {
                    "broker": broker,
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
                with RESULTS.open("a") as out:
                    out.write(json.dumps(result) + "\n")
                figures.setdefault((scenario, broker), []).append(result)
                if result["refused"] or result["errors"]:
                    raise SystemExit(f"{broker} {scenario}: refused or failed connections")
    for scenario in scenarios:
        ours = statistics.median(r["connects_per_s"] for r in figures[(scenario, "cormorant")])
        theirs = statistics.median(r["connects_per_s"] for r in figures[(scenario, "mosquitto")])
        p50 = statistics.median(r["connack_p50_ms"] for r in figures[(scenario, "cormorant")])
        print(
            f"{scenario}: Cormorant {ours:,.0f} connects/s (CONNACK p50 {p50:.1f} ms), "
            f"Mosquitto {theirs:,.0f}/s, ratio {ours / theirs:.2f}"
        )


if __name__ == "__main__":
    main()
