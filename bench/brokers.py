"""The brokers under test: the local Cormorant cluster, a Mosquitto the bench starts, or
any other address; the transports each offers (plain TCP, TLS, MQTT over WebSocket with and
without TLS) and where; and the CPU / memory accounting of their processes.

CPU is ``psutil.Process.cpu_times()`` user + system of each process (all its threads,
children excluded), in seconds; memory is resident set size (RSS), in bytes.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import resource
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from bench.loadgen.transports import Endpoint

if TYPE_CHECKING:
    from services.local.settings import LocalSettings

#: Loopback ports of the Mosquitto the bench starts: plain MQTT, and MQTT over TLS.
MOSQUITTO_PORT = 18830
MOSQUITTO_TLS_PORT = 18831

#: What that Mosquitto serves: Debian's mosquitto 2.0 is built without WebSocket support.
MOSQUITTO_TRANSPORTS = ("tcp", "tls")

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
# MQTT over TLS (TLS 1.2 and 1.3, Mosquitto's default), certificate from a CA made per run.
listener {tls_port} 127.0.0.1
cafile {ca_file}
certfile {cert_file}
keyfile {key_file}
"""


class BrokerUnavailable(RuntimeError):
    """The broker under test is not running or not healthy; the message says what to do."""


@dataclass(slots=True)
class Target:
    """A broker to run against.

    ``port`` is the plain MQTT port; ``ports``: transport name → port of every transport
    offered (``tcp`` is ``port``); ``ca_file``: the CA certificate (PEM) that signed the
    broker's TLS certificate ("" for the system's CAs). ``processes``: name → process, for
    CPU accounting (empty for an external broker); ``memory``: the names whose RSS growth
    is reported per connection (the processes holding the client sockets: Cormorant's
    ingest nodes, Mosquitto itself).
    """

    name: str
    host: str
    port: int
    processes: dict[str, psutil.Process] = field(default_factory=dict)
    memory: tuple[str, ...] = ()
    ports: dict[str, int] = field(default_factory=dict)
    ca_file: str = ""

    def endpoint(self, transport: str) -> Endpoint:
        """Where to reach the broker over ``transport`` (see ``bench.loadgen.transports``).

        Raises:
            BrokerUnavailable: the broker does not offer ``transport``.
        """
        port = self.port if transport == "tcp" else self.ports.get(transport)
        if port is None:
            offered = ", ".join(["tcp", *(t for t in self.ports if t != "tcp")])
            raise BrokerUnavailable(f"{self.name} offers {offered}, not {transport}")
        return Endpoint(self.host, port, transport, self.ca_file)


def cormorant(
    host: str = "127.0.0.1", port: int | None = None, settings: LocalSettings | None = None
) -> Target:
    """The local cluster brought up with ``cormorant up``, checked healthy: HAProxy's
    plain (``port``, default the settings' ``listen_port``), TLS, WebSocket and WebSocket
    on TLS ports, and the local CA (``<state_dir>/tls/ca.pem``). ``settings``: the
    cluster's (default: read from the environment, as ``cormorant up`` does).

    Raises:
        BrokerUnavailable: a process of the cluster is down (run ``bash scripts/up.sh``).
    """
    from services.local import cluster, layout
    from services.local.settings import LocalSettings

    settings = layout.current(LocalSettings() if settings is None else settings)
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
        ports={
            "tls": settings.tls_listen_port,
            "ws": settings.ws_listen_port,
            "wss": settings.wss_listen_port,
        },
        ca_file=str(cluster.tls_dir(settings) / "ca.pem"),
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


def external(host: str, port: int, transport: str = "tcp", ca_file: str = "") -> Target:
    """Any broker at ``host:port`` over ``transport`` (``ca_file``: the CA that signed its
    certificate, "" for the system's), without process accounting."""
    ports = {} if transport == "tcp" else {transport: port}
    return Target(name="external", host=host, port=port, ports=ports, ca_file=ca_file)


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
def mosquitto(port: int = MOSQUITTO_PORT, tls_port: int = MOSQUITTO_TLS_PORT) -> Iterator[Target]:
    """Start ``mosquitto -c <generated conf>`` on 127.0.0.1:``port`` (plain MQTT) and
    ``tls_port`` (MQTT over TLS); stop it on exit.

    The TLS certificate (EC P-256, for ``localhost`` and ``127.0.0.1``) is signed by a CA
    made for this run in a temporary directory (``services.local.certificates``, as the
    local cluster's), which the Target names as its ``ca_file``. Its file descriptor limit
    is raised to the hard limit (it inherits ours), so the connections scenario is not
    capped at 1,024 sockets.

    Raises:
        BrokerUnavailable: no ``mosquitto`` binary, a port is taken, or it did not start.
    """
    from services.local import certificates

    binary = mosquitto_binary()
    for taken in (port, tls_port):
        if _port_open("127.0.0.1", taken):
            raise BrokerUnavailable(
                f"port {taken} is already in use; pass another --mosquitto-port"
            )
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with tempfile.TemporaryDirectory(prefix="bench-mosquitto-") as tmp:
        ca = certificates.make_ca(Path(tmp), "Cormorant bench CA")
        server = certificates.issue(
            ca,
            Path(tmp) / "server.pem",
            Path(tmp) / "server.key",
            "localhost",
            server_names=certificates.SERVER_NAMES,
        )
        log = Path(tmp) / "mosquitto.log"
        conf = Path(tmp) / "mosquitto.conf"
        conf.write_text(
            MOSQUITTO_CONF.format(
                port=port,
                log=log,
                tls_port=tls_port,
                ca_file=ca.cert,
                cert_file=server.cert,
                key_file=server.key,
            ),
            encoding="utf-8",
        )
        _hand_over(Path(tmp))
        proc = subprocess.Popen(
            [binary, "-c", str(conf)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            deadline = time.monotonic() + MOSQUITTO_TIMEOUT
            while not (_port_open("127.0.0.1", port) and _port_open("127.0.0.1", tls_port)):
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
                ports={"tls": tls_port},
                ca_file=str(ca.cert),
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


def _hand_over(directory: Path) -> None:
    """Started as root, Mosquitto drops to its ``mosquitto`` user before it opens its log
    and reads its certificates: give it ``directory`` and the files in it (keys stay 0600)."""
    if os.geteuid() != 0:
        return
    try:
        user = pwd.getpwnam("mosquitto")
    except KeyError:
        return
    for path in (directory, *directory.iterdir()):
        os.chown(path, user.pw_uid, user.pw_gid)


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
