"""The local load balancer: HAProxy in TCP mode on 127.0.0.1:<listen_port> before the nodes.

It plays the part of the cloud's Network Load Balancer: plain TCP pass-through, round robin
over the ingest nodes, health checks (``GET /ready`` on each node's HTTP port) that take a
node out of rotation when it is dead or not ready (Kafka unreachable, still starting).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from services.local import processes
from services.local.settings import LocalSettings

NAME = "haproxy"

#: Seconds HAProxy may take to bind its port.
START_TIMEOUT = 30.0


def node_ports(settings: LocalSettings) -> list[int]:
    """The MQTT port of each ingest node: node i (from 1) on ``ingest_base_port + i``."""
    return [settings.ingest_base_port + i for i in range(1, settings.ingest_nodes + 1)]


def node_http_ports(settings: LocalSettings) -> list[int]:
    """The HTTP port (``/ready``) of each ingest node: node i on ``http_base_port + i``."""
    return [settings.http_base_port + i for i in range(1, settings.ingest_nodes + 1)]


def render_config(settings: LocalSettings) -> str:
    """haproxy.cfg for ``settings`` (listen port and ingest nodes)."""
    servers = "\n".join(
        f"    server node{i} 127.0.0.1:{port} check port {http} inter 2s fall 2 rise 1"
        for i, (port, http) in enumerate(
            zip(node_ports(settings), node_http_ports(settings), strict=True), start=1
        )
    )
    return f"""\
global
    log stdout format raw local0 info

defaults
    mode tcp
    log global
    option tcplog
    # An MQTT connection may stay idle for its keep alive (up to 65535 s, about 18 h):
    # the keep alive PINGs reset these timers, so 2 h only ends truly dead connections.
    timeout connect 5s
    timeout client 2h
    timeout server 2h
    # A node that refuses a new connection is tried again, then another node is picked.
    retries 2
    option redispatch

frontend mqtt
    bind 127.0.0.1:{settings.listen_port}
    default_backend ingest_nodes

backend ingest_nodes
    balance roundrobin
    # A node takes clients while its /ready says 200 (Kafka answers, state replayed).
    option httpchk
    http-check send meth GET uri /ready
    http-check expect status 200
{servers}
"""


def write_config(settings: LocalSettings) -> Path:
    """Write ``<state_dir>/haproxy/haproxy.cfg`` and return its path."""
    path = settings.state_dir / "haproxy" / "haproxy.cfg"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_config(settings), encoding="utf-8")
    return path


def start(settings: LocalSettings) -> int:
    """Start HAProxy in the foreground (tracked by pid) unless it runs; return its pid.

    Raises :class:`~services.local.processes.StartError` (quoting ``haproxy.log``) if the
    configuration is refused, the port is taken or it does not listen within
    ``START_TIMEOUT`` seconds, and ``FileNotFoundError`` if haproxy is not installed.
    """
    # Debian installs it in /usr/sbin, which is not on an ordinary user's PATH.
    binary = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/sbin")
    if binary is None:
        raise FileNotFoundError("haproxy is not installed: run scripts/bootstrap.sh")
    config = write_config(settings)
    # -db: stay in the foreground, so the recorded pid is the proxy and its log is stdout.
    argv = [binary, "-db", "-f", str(config)]
    return processes.ensure_started(
        settings.state_dir,
        NAME,
        argv,
        lambda: processes.port_open(settings.listen_port),
        START_TIMEOUT,
        port=settings.listen_port,
    )
