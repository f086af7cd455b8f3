"""The admin service's ``/health`` latency alone and during a storm of wrong logins, for the
code being measured and a checkout of an earlier commit (``--before``, default the commit
before the admin login defences).

For each code version, the admin API runs alone (uvicorn, its own process, the admin users in
a PostgreSQL this benchmark starts in a temporary state dir; no Kafka: ``/health`` and
``POST /api/login`` need none). One prober sends ``GET /health`` one after another for
``--seconds`` seconds; its latencies' p50 and p99 are taken:

- **alone**: nothing else;
- **one address**: ``--storm`` parallel loops post wrong logins from 127.0.0.1;
- **many addresses**: the same loops, each login from a new loopback address 127.x.y.z and
  a new user name, so no throttle applies and every login is checked (argon2id).

Rounds alternate the versions (before, after, before...); medians of the rounds' figures
are reported (this machine is shared and noisy). Writes ``bench/results/admin_login.md``.
``python bench/bench_admin_login.py --rounds 3``
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path.cwd()))  # the checkout being measured, not an installed copy

from services.local import cluster as local_cluster
from services.local import postgres
from tests.servers import make_test_settings

RESULTS = Path("bench/results")

SERVER = """
import sys
sys.path.insert(0, ".")
import uvicorn
from services.admin.api import AdminContext, create_app
from services.admin.main import users_of
from services.common.settings import Settings
from services.common.web import Readiness

settings = Settings(postgres_dsn=sys.argv[1])
users = users_of(settings)
context = AdminContext(settings, None, None, users, None, None, Readiness(None), None)
uvicorn.run(create_app(context), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
"""
"""The admin API alone: ``python -c SERVER <postgres dsn> <port>`` in a checkout."""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _checkout(ref: str, into: Path) -> Path:
    """The files of commit ``ref`` under ``into`` (``git archive``: no worktree made)."""
    archive = subprocess.run(["git", "archive", ref], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


async def _wait_up(url: str, deadline: float) -> None:
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            try:
                async with session.get(url + "/health") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
    raise SystemExit(f"the admin API at {url} did not start")


def _address() -> str:
    return f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(2, 254)}"


async def _storm(url: str, many: bool, stop: asyncio.Event) -> None:
    """Post wrong logins until ``stop``: from 127.0.0.1, or each from a new address."""
    while not stop.is_set():
        connector = aiohttp.TCPConnector(local_addr=(_address(), 0) if many else None)
        async with aiohttp.ClientSession(connector=connector) as session:
            body = {"username": f"nobody-{random.randrange(10**9)}", "password": "wrong guess!"}
            async with session.post(url + "/api/login", json=body) as response:
                await response.read()


async def _probe(url: str, seconds: float) -> list[float]:
    """Latencies (ms) of back-to-back ``GET /health`` for ``seconds``."""
    latencies: list[float] = []
    async with aiohttp.ClientSession() as session:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            start = time.perf_counter()
            async with session.get(url + "/health") as response:
                await response.read()
            latencies.append((time.perf_counter() - start) * 1000)
    return latencies


async def _measure(url: str, storm: int, many: bool | None, seconds: float) -> tuple[float, float]:
    """(p50, p99) of ``/health`` in ms, with ``storm`` loops (``many is None``: none)."""
    stop = asyncio.Event()
    loops = (
        [] if many is None else [asyncio.create_task(_storm(url, many, stop)) for _ in range(storm)]
    )
    await asyncio.sleep(1.0 if loops else 0)  # let the storm fill the queue first
    latencies = await _probe(url, seconds)
    stop.set()
    await asyncio.gather(*loops, return_exceptions=True)
    ranked = sorted(latencies)
    return ranked[len(ranked) // 2], ranked[min(len(ranked) - 1, len(ranked) * 99 // 100)]


def _round(checkout: Path, dsn: str, storm: int, seconds: float) -> dict[str, tuple[float, float]]:
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, dsn, str(port)],
        cwd=checkout,
        env={**os.environ, "CORMORANT_SETTINGS_FILE": "/nonexistent"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        asyncio.run(_wait_up(url, time.monotonic() + 60))
        return {
            name: asyncio.run(_measure(url, storm, many, seconds))
            for name, many in (("alone", None), ("one address", False), ("many addresses", True))
        }
    finally:
        server.terminate()
        server.wait(30)


def main() -> None:
    """Run the rounds and write the summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--storm", type=int, default=4, help="parallel wrong-login loops")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--before", default="642465f", help="git ref of the 'before' code")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temp:
        settings = make_test_settings(Path(temp) / "state")
        local_cluster.start_component(settings, postgres.NAME)
        try:
            before = _checkout(args.before, Path(temp) / "before")
            versions = {"before": before, "after": Path.cwd()}
            figures: dict[tuple[str, str], list[tuple[float, float]]] = {}
            for round_ in range(1, args.rounds + 1):
                for version, checkout in versions.items():
                    found = _round(checkout, postgres.dsn(settings), args.storm, args.seconds)
                    for case, value in found.items():
                        figures.setdefault((version, case), []).append(value)
                        print(
                            f"round {round_} {version} {case}: p50 {value[0]:.1f} ms, "
                            f"p99 {value[1]:.1f} ms",
                            flush=True,
                        )
        finally:
            local_cluster.down(settings)
    lines = [
        f"# Admin /health during a wrong-login storm "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        f"Machine: {platform.machine()} {os.cpu_count()} CPUs, {platform.platform()}, "
        f"Python {platform.python_version()} (shared, noisy); command: `python "
        f"bench/bench_admin_login.py --rounds {args.rounds} --storm {args.storm} "
        f"--seconds {args.seconds} --before {args.before}`; medians of {args.rounds} rounds.",
        "",
        "| storm | before p50 ms | before p99 ms | after p50 ms | after p99 ms |",
        "|---|---:|---:|---:|---:|",
    ]
    for case in ("alone", "one address", "many addresses"):
        cells = []
        for version in ("before", "after"):
            rounds = figures[(version, case)]
            cells += [
                statistics.median(r[0] for r in rounds),
                statistics.median(r[1] for r in rounds),
            ]
        lines.append(f"| {case} | " + " | ".join(f"{c:.1f}" for c in cells) + " |")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "admin_login.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
