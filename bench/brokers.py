"""The brokers under test: the local Cormorant cluster, a Mosquitto the bench starts, or
any other address; and the CPU / memory accounting of their processes.

CPU is ``psutil.Process.cpu_times()`` user + system of each process (all its threads,
children excluded), in seconds; memory is resident set size (RSS), in bytes.
"""

from __future__ import annotations

import contextlib
import json
import resource
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

#: Loopback port of the Mosquitto the bench starts.
MOSQUITTO_PORT = 18830

#: Seconds Mosquitto may take to accept connections, and to exit after SIGTERM.
MOSQUITTO_TIMEOUT = 10.0

MOSQUITTO_CONF = """\
# Written by bench/brokers.py for one benchmark run; nothing durable, generous queues.
listener {port} 127.0.0.1
allow_anonymous true
persistence false
max_inflight_messages 1000
max_queued_messages 100000
max_queued_bytes 0
# asyncio (Cormorant, the generator) sets TCP_NODELAY on every socket; do the same here.
set_tcp_nodelay true
log_dest file {log}
log_type error
log_type warning
"""


class BrokerUnavailable(RuntimeError):
    """The broker under test is not running or not healthy; the message says what to do."""


@dataclass(slots=True)
class Target:
    """A broker to run against.

    ``processes``: name → process, for CPU accounting (empty for an external broker);
    ``memory``: the names whose RSS growth is reported per connection (the processes
    holding the client sockets: Cormorant's ingest nodes, Mosquitto itself).
    """

    name: str
    host: str
    port: int
    processes: dict[str, psutil.Process] = field(default_factory=dict)
    memory: tuple[str, ...] = ()


def cormorant(host: str = "127.0.0.1", port: int | None = None) -> Target:
    """The local cluster brought up with ``cormorant up``, checked healthy.

    Raises:
        BrokerUnavailable: a process of the cluster is down (run ``bash scripts/up.sh``).
    """
    from services.local import cluster, layout
    from services.local.settings import LocalSettings

    settings = layout.current(LocalSettings())
    rows = cluster.status(settings)
    down = [f"{r.name}: {r.health}" for r in rows if not r.healthy]
    if down:
        raise BrokerUnavailable(
            "the local Cormorant cluster is not healthy ("
            + "; ".join(down)
            + "); start it with `bash scripts/up.sh` (or `cormorant up`)"
        )
    procs = {r.name: psutil.Process(r.pid) for r in rows if r.pid is not None}
    return Target(
        name="cormorant",
        host=host,
        port=settings.listen_port if port is None else port,
        processes=procs,
        memory=tuple(n for n in procs if n.startswith("ingest")),
    )


def require_application(target: Target, client_ids: list[str]) -> None:
    """Check that the cluster's ingest nodes treat every id in ``client_ids`` as APPLICATION.

    Reads ``CORMORANT_APPLICATION_CLIENT_IDS`` (a JSON list of fnmatch patterns, as the
    launcher passes every setting) from each ingest process's environment. A cluster
    started without it would make the subscriber a persistent DEVICE, and the run would
    measure device_persist instead. Brokers without process accounting are not checked.

    Raises:
        BrokerUnavailable: an ingest node does not match one of ``client_ids``.
    """
    from services.common.records import ClientKind
    from services.common.sessions import client_kind

    for name, proc in target.processes.items():
        if not name.startswith("ingest"):
            continue
        try:
            patterns = json.loads(proc.environ().get("CORMORANT_APPLICATION_CLIENT_IDS", "[]"))
        except (psutil.Error, ValueError) as exc:
            raise BrokerUnavailable(f"cannot read the settings of {name}: {exc}") from exc
        missing = [c for c in client_ids if client_kind(c, patterns) is not ClientKind.APPLICATION]
        if missing:
            raise BrokerUnavailable(
                f"{name} treats {missing[0]} as a DEVICE (application_client_ids={patterns}); "
                "restart the cluster with APPLICATION subscribers enabled: cormorant down && "
                "CORMORANT_APPLICATION_CLIENT_IDS='[\"app-*\"]' cormorant up"
            )


def external(host: str, port: int) -> Target:
    """Any broker at ``host:port``, without process accounting."""
    return Target(name="external", host=host, port=port)


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def mosquitto_binary() -> str:
    """The path of the ``mosquitto`` program (PATH, then /usr/sbin).

    Raises:
        BrokerUnavailable: it is not installed.
    """
    binary = shutil.which("mosquitto") or (
        "/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None
    )
    if binary is None:
        raise BrokerUnavailable("mosquitto is not installed (Debian: apt-get install mosquitto)")
    return binary


@contextlib.contextmanager
def mosquitto(port: int = MOSQUITTO_PORT) -> Iterator[Target]:
    """Start ``mosquitto -c <generated conf>`` on 127.0.0.1:``port``; stop it on exit.

    Its file descriptor limit is raised to the hard limit (it inherits ours), so the
    connections scenario is not capped at 1,024 sockets.

    Raises:
        BrokerUnavailable: no ``mosquitto`` binary, the port is taken, or it did not start.
    """
    binary = mosquitto_binary()
    if _port_open("127.0.0.1", port):
        raise BrokerUnavailable(f"port {port} is already in use; pass another --mosquitto-port")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with tempfile.TemporaryDirectory(prefix="bench-mosquitto-") as tmp:
        log = Path(tmp) / "mosquitto.log"
        conf = Path(tmp) / "mosquitto.conf"
        conf.write_text(MOSQUITTO_CONF.format(port=port, log=log), encoding="utf-8")
        proc = subprocess.Popen(
            [binary, "-c", str(conf)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            deadline = time.monotonic() + MOSQUITTO_TIMEOUT
            while not _port_open("127.0.0.1", port):
                if proc.poll() is not None or time.monotonic() > deadline:
                    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                    raise BrokerUnavailable(f"mosquitto did not start: {err.strip()}")
                time.sleep(0.05)
            yield Target(
                name="mosquitto",
                host="127.0.0.1",
                port=port,
                processes={"mosquitto": psutil.Process(proc.pid)},
                memory=("mosquitto",),
            )
        finally:
            proc.terminate()
            try:
                proc.wait(MOSQUITTO_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stderr is not None:
                proc.stderr.close()


def cpu_seconds(processes: dict[str, psutil.Process]) -> dict[str, float]:
    """Name → user + system CPU seconds so far (children excluded); gone processes: NaN."""
    out: dict[str, float] = {}
    for name, proc in processes.items():
        try:
            times = proc.cpu_times()
            out[name] = times.user + times.system
        except psutil.Error:
            out[name] = float("nan")
    return out


def rss_bytes(processes: dict[str, psutil.Process], names: tuple[str, ...]) -> dict[str, int]:
    """Name → resident set size in bytes, for ``names``; gone processes are left out."""
    out: dict[str, int] = {}
    for name in names:
        with contextlib.suppress(psutil.Error, KeyError):
            out[name] = processes[name].memory_info().rss
    return out


def assert_alive(target: Target) -> None:
    """Raise ``BrokerUnavailable`` if a process of ``target`` has exited."""
    for name, proc in target.processes.items():
        if not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE:
            raise BrokerUnavailable(f"{target.name}: process {name} ({proc.pid}) has exited")
