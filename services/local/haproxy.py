"""The local load balancer: HAProxy in TCP mode on 127.0.0.1 before the ingest nodes.

It plays the part of the cloud's Network Load Balancer: TCP pass-through on the MQTT
ports (``listen_port`` 1883, ``tls_listen_port`` 8883, ``ws_listen_port`` 8083,
``wss_listen_port`` 8084; TLS passes through to the nodes, so mutual TLS works), round
robin over the ingest nodes, each connection opened with a PROXY protocol v2 header
(``send-proxy-v2``, as an NLB target group with ``proxy_protocol_v2``) so the nodes see the
clients' real addresses, and health checks (``GET /ready`` on each node's HTTP port) that
take a node out of rotation when it is dead or not ready (Kafka unreachable, still
starting). HAProxy counts as ready once every ready node is in rotation on every listener
(its stats socket says so): a client connecting then is never turned away for want of a
node.
"""

from __future__ import annotations

import csv
import io
import resource
import shutil
import socket
from pathlib import Path

from services.common.settings import Listener, ListenerKind
from services.local import open_files, processes
from services.local.settings import LocalSettings

NAME = "haproxy"

#: Seconds HAProxy may take to bind its port and put every ready node in rotation (it
#: checks each node every 2 s and needs one passed check).
START_TIMEOUT = 30.0

#: Seconds a question to HAProxy's stats socket may take.
STATS_TIMEOUT = 5.0


KINDS: tuple[ListenerKind, ...] = ("mqtt", "mqtts", "ws", "wss")
"""The listeners HAProxy fronts, in the order of their node port blocks."""

PORT_BLOCK = 16
"""Node listener ports of one kind are ``PORT_BLOCK`` apart (16 nodes at most)."""


def node_name(node: int) -> str:
    """The process name of ingest node ``node`` (from 1): ``ingest-node<node>``."""
    return f"ingest-node{node}"


def _backend(kind: ListenerKind) -> str:
    return f"ingest_{kind}"


def _server(node: int) -> str:
    return f"node{node}"


def server_name(kind: ListenerKind, node: int) -> str:
    """How HAProxy names ingest node ``node``'s server of listener ``kind``:
    ``<backend>/<server>``, e.g. ``ingest_mqtts/node2``."""
    return f"{_backend(kind)}/{_server(node)}"


def node_ports(settings: LocalSettings) -> list[int]:
    """The direct MQTT port of each ingest node (plain, no PROXY header): node i (from 1) on
    ``ingest_base_port + i``. Tools and tests reach one given node there."""
    return [settings.ingest_base_port + i for i in range(1, settings.ingest_nodes + 1)]


def node_http_ports(settings: LocalSettings) -> list[int]:
    """The HTTP port (``/ready``) of each ingest node: node i on ``http_base_port + i``."""
    return [settings.http_base_port + i for i in range(1, settings.ingest_nodes + 1)]


def node_listeners(settings: LocalSettings, node: int) -> list[Listener]:
    """The listeners of node ``node`` (from 1) that HAProxy forwards to, PROXY protocol
    required: MQTT, TLS, WebSocket, WebSocket on TLS, ``PORT_BLOCK`` ports apart."""
    base = settings.ingest_base_port + node
    return [
        Listener(kind=kind, port=base + PORT_BLOCK * (k + 1), proxy_protocol=True)
        for k, kind in enumerate(KINDS)
    ]


def all_node_ports(settings: LocalSettings) -> list[int]:
    """Every port the ingest nodes listen on (direct ones and those behind HAProxy)."""
    nodes = range(1, settings.ingest_nodes + 1)
    return node_ports(settings) + [
        listener.port for node in nodes for listener in node_listeners(settings, node)
    ]


def frontend_ports(settings: LocalSettings) -> dict[ListenerKind, int]:
    """HAProxy's port for each kind of listener."""
    return {
        "mqtt": settings.listen_port,
        "mqtts": settings.tls_listen_port,
        "ws": settings.ws_listen_port,
        "wss": settings.wss_listen_port,
    }


def render_config(settings: LocalSettings) -> str:
    """haproxy.cfg for ``settings`` (listen ports and ingest nodes)."""
    sections = []
    for kind, port in frontend_ports(settings).items():
        servers = "\n".join(
            f"    server {_server(node)} 127.0.0.1:{listener.port} send-proxy-v2 "
            f"check port {http} inter 2s fall 2 rise 1"
            for node, http in enumerate(node_http_ports(settings), start=1)
            for listener in node_listeners(settings, node)
            if listener.kind == kind
        )
        sections.append(
            f"frontend {kind}\n    bind 127.0.0.1:{port}\n    default_backend {_backend(kind)}\n\n"
            f"backend {_backend(kind)}\n    balance roundrobin\n"
            # A node takes clients while its /ready says 200 (Kafka answers, state replayed).
            "    option httpchk\n    http-check send meth GET uri /ready\n"
            f"    http-check expect status 200\n{servers}\n"
        )
    body = "\n".join(sections)
    return f"""\
global
    log stdout format raw local0 info
    # Two descriptors per connection, from the open-file limit HAProxy starts with
    # (services/local/open_files.py): a cap reached is then the one `cormorant status` shows.
    maxconn {open_files.haproxy_maxconn(open_file_limit())}

    stats socket {stats_socket(settings)} mode 600 level user

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

{body}"""


def open_file_limit() -> int:
    """The soft open-file limit processes started now inherit (this process's)."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def max_connections(settings: LocalSettings) -> int | None:
    """The connections HAProxy takes at most (its ``Maxconn``, from the stats socket's
    ``show info``, HAProxy's management guide, section 9.3); None when it does not answer."""
    try:
        answer = _ask(settings, "show info")
    except OSError:
        return None
    for line in answer.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "Maxconn" and value.strip().isdigit():
            return int(value)
    return None


def write_config(settings: LocalSettings) -> Path:
    """Write ``<state_dir>/haproxy/haproxy.cfg`` and return its path."""
    path = settings.state_dir / "haproxy" / "haproxy.cfg"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_config(settings), encoding="utf-8")
    return path


def stats_socket(settings: LocalSettings) -> Path:
    """HAProxy's stats socket (a Unix socket, owner only): ``<state_dir>/haproxy/stats.sock``."""
    return settings.state_dir / "haproxy" / "stats.sock"


def _ask(settings: LocalSettings, command: str) -> str:
    """HAProxy's answer to one stats socket ``command``. Raises ``OSError`` if HAProxy
    does not answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(STATS_TIMEOUT)
        sock.connect(str(stats_socket(settings)))
        sock.sendall(command.encode() + b"\n")
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", errors="replace")


def out_of_rotation(settings: LocalSettings) -> list[str]:
    """The servers HAProxy gives no new connection now, as ``<backend>/<server>`` (e.g.
    ``ingest_mqtts/node2``): those its health check holds DOWN, or in maintenance.

    Asks the stats socket (``show stat``, HAProxy's management guide, section 9.3).
    Raises ``OSError`` if HAProxy does not answer there.
    """
    # A CSV table whose header line starts with "# ".
    table = _ask(settings, "show stat").removeprefix("# ")
    return [
        f"{row['pxname']}/{row['svname']}"
        for row in csv.DictReader(io.StringIO(table))
        if row["svname"] not in ("FRONTEND", "BACKEND") and not row["status"].startswith("UP")
    ]


def in_rotation(settings: LocalSettings) -> bool:
    """Whether HAProxy listens and routes new connections of every listener to every ready
    ingest node (one whose ready file exists: HAProxy rightly holds the others out).
    False while HAProxy cannot be asked."""
    if not processes.port_open(settings.listen_port):
        return False
    try:
        out = out_of_rotation(settings)
    except OSError:
        return False
    ready = {
        server_name(kind, node)
        for kind in KINDS
        for node in range(1, settings.ingest_nodes + 1)
        if processes.ready_file(settings.state_dir, node_name(node)).exists()
    }
    return not ready.intersection(out)


def start(settings: LocalSettings) -> int:
    """Start HAProxy in the foreground (tracked by pid) unless it runs; return its pid once
    every ready ingest node is in rotation (:func:`in_rotation`; also when it was running:
    a node ready again a moment ago may still be out).

    Raises :class:`~services.local.processes.StartError` (quoting ``haproxy.log``, whose
    health check lines name the nodes out) if the configuration is refused, the port is
    taken or it is not ready within ``START_TIMEOUT`` seconds, and ``FileNotFoundError`` if
    haproxy is not installed.
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
        lambda: in_rotation(settings),
        START_TIMEOUT,
        port=settings.listen_port,
    )
