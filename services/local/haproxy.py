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

One HAProxy process holds two open files per connection, so a hard open-file limit the
cluster cannot raise (services/local/open_files.py) caps it near half that limit. Several
processes (:func:`process_count`, setting ``haproxy_processes``) then share the listen
ports: HAProxy binds them with SO_REUSEPORT, and the kernel spreads new connections over
the processes. Each has its own configuration file and stats socket; the ceiling is the sum
of their ``maxconn``.
"""

from __future__ import annotations

import csv
import io
import math
import resource
import shutil
import socket
from pathlib import Path

from services.common.settings import Listener, ListenerKind
from services.local import open_files, processes
from services.local.settings import LocalSettings

NAME = "haproxy"

#: Seconds HAProxy may take to bind its port and put every ready node in rotation (it
#: checks each node every :data:`CHECK_INTERVAL_SECONDS` and needs one passed check).
START_TIMEOUT = 30.0

#: Seconds between two health checks (``GET /ready``) of a node (HAProxy's ``inter``).
CHECK_INTERVAL_SECONDS = 2.0

#: Seconds between the checks of a node whose check just failed (``fastinter``): a
#: draining node is out of rotation soon after its ``/ready`` fails.
FAST_CHECK_INTERVAL_SECONDS = 0.5

#: Failed checks in a row that take a node out of rotation (``fall``): one slow answer of a
#: loaded node does not.
CHECK_FALL = 2

OUT_OF_ROTATION_SECONDS = math.ceil(
    CHECK_INTERVAL_SECONDS + (CHECK_FALL - 1) * FAST_CHECK_INTERVAL_SECONDS + 0.5
)
"""The longest HAProxy takes to stop sending new connections to a node whose ``/ready``
fails (the next check, then ``fall - 1`` fast ones, each answered at once by a stopping
node), rounded up with half a second to spare: the local ingest nodes'
``drain_notice_seconds``."""

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


def process_count(settings: LocalSettings) -> int:
    """How many HAProxy processes the cluster runs: ``haproxy_processes``, or (0) as many as
    the connections the ingest nodes take need: ``ingest_nodes`` x ``max_connections``,
    each node capped by its own open-file limit, over one process's ``maxconn``.

    The open-file limit counted is this process's, raised first as ``cormorant up`` raises
    it (:func:`~services.local.open_files.raise_limit`): every command then counts alike.
    """
    if settings.haproxy_processes:
        return settings.haproxy_processes
    soft = open_files.raise_limit(
        open_files.target_open_files(settings.ingest_nodes, settings.max_connections)
    )
    per_node = min(settings.max_connections, max(1, soft - open_files.RESERVED_DESCRIPTORS))
    return max(1, math.ceil(settings.ingest_nodes * per_node / open_files.haproxy_maxconn(soft)))


def process_names(settings: LocalSettings) -> list[str]:
    """The process names of the HAProxy processes: ``haproxy``, ``haproxy-2``..."""
    return [process_name(i) for i in range(1, process_count(settings) + 1)]


def process_name(index: int) -> str:
    """The process name of HAProxy process ``index`` (from 1)."""
    return NAME if index == 1 else f"{NAME}-{index}"


def render_config(settings: LocalSettings, index: int = 1) -> str:
    """haproxy.cfg of HAProxy process ``index`` (from 1) for ``settings`` (listen ports and
    ingest nodes); the processes differ in their stats socket only."""
    sections = []
    for kind, port in frontend_ports(settings).items():
        servers = "\n".join(
            f"    server {_server(node)} 127.0.0.1:{listener.port} send-proxy-v2 "
            f"check port {http} inter {CHECK_INTERVAL_SECONDS * 1000:.0f}ms "
            f"fastinter {FAST_CHECK_INTERVAL_SECONDS * 1000:.0f}ms fall {CHECK_FALL} rise 1"
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

    stats socket {stats_socket(settings, index)} mode 600 level user

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
    """The connections the HAProxy processes take at most: the sum of their ``Maxconn``,
    from each stats socket's ``show info`` (HAProxy's management guide, section 9.3); None
    when none answers."""
    found = None
    for index in range(1, process_count(settings) + 1):
        try:
            answer = _ask(settings, "show info", index)
        except OSError:
            continue
        for line in answer.splitlines():
            name, _, value = line.partition(":")
            if name.strip() == "Maxconn" and value.strip().isdigit():
                found = (found or 0) + int(value)
    return found


def _suffix(index: int) -> str:
    return "" if index == 1 else f"-{index}"


def write_config(settings: LocalSettings, index: int = 1) -> Path:
    """Write HAProxy process ``index``'s configuration, ``<state_dir>/haproxy/haproxy.cfg``
    (``haproxy-<index>.cfg`` after the first), and return its path."""
    path = settings.state_dir / "haproxy" / f"haproxy{_suffix(index)}.cfg"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_config(settings, index), encoding="utf-8")
    return path


def stats_socket(settings: LocalSettings, index: int = 1) -> Path:
    """HAProxy process ``index``'s stats socket (a Unix socket, owner only):
    ``<state_dir>/haproxy/stats.sock`` (``stats-<index>.sock`` after the first)."""
    return settings.state_dir / "haproxy" / f"stats{_suffix(index)}.sock"


def _ask(settings: LocalSettings, command: str, index: int = 1) -> str:
    """HAProxy process ``index``'s answer to one stats socket ``command``. Raises
    ``OSError`` if it does not answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(STATS_TIMEOUT)
        sock.connect(str(stats_socket(settings, index)))
        sock.sendall(command.encode() + b"\n")
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", errors="replace")


def out_of_rotation(settings: LocalSettings, index: int | None = None) -> list[str]:
    """The servers HAProxy process ``index`` (None: any of them) gives no new connection
    now, as ``<backend>/<server>`` (e.g. ``ingest_mqtts/node2``): those its health check
    holds DOWN, or in maintenance.

    Asks the stats socket (``show stat``, HAProxy's management guide, section 9.3).
    Raises ``OSError`` if a process asked does not answer there.
    """
    indexes = range(1, process_count(settings) + 1) if index is None else [index]
    out: list[str] = []
    for asked in indexes:
        # A CSV table whose header line starts with "# ".
        table = _ask(settings, "show stat", asked).removeprefix("# ")
        out += [
            f"{row['pxname']}/{row['svname']}"
            for row in csv.DictReader(io.StringIO(table))
            if row["svname"] not in ("FRONTEND", "BACKEND")
            and not row["status"].startswith("UP")
            and f"{row['pxname']}/{row['svname']}" not in out
        ]
    return out


def in_rotation(settings: LocalSettings, index: int = 1) -> bool:
    """Whether HAProxy process ``index`` listens and routes new connections of every
    listener to every ready ingest node (one whose ready file exists: HAProxy rightly holds
    the others out). False while it cannot be asked."""
    if not processes.port_open(settings.listen_port):
        return False
    try:
        out = out_of_rotation(settings, index)
    except OSError:
        return False
    ready = {
        server_name(kind, node)
        for kind in KINDS
        for node in range(1, settings.ingest_nodes + 1)
        if processes.ready_file(settings.state_dir, node_name(node)).exists()
    }
    return not ready.intersection(out)


def start(settings: LocalSettings, index: int = 1) -> int:
    """Start HAProxy process ``index`` (from 1) in the foreground (tracked by pid) unless it
    runs; return its pid once every ready ingest node is in rotation (:func:`in_rotation`;
    also when it was running: a node ready again a moment ago may still be out). Only the
    first process must find the listen port free: the others join it (SO_REUSEPORT).

    Raises :class:`~services.local.processes.StartError` (quoting ``haproxy.log``, whose
    health check lines name the nodes out) if the configuration is refused, the port is
    taken or it is not ready within ``START_TIMEOUT`` seconds, and ``FileNotFoundError`` if
    haproxy is not installed.
    """
    # Debian installs it in /usr/sbin, which is not on an ordinary user's PATH.
    binary = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/sbin")
    if binary is None:
        raise FileNotFoundError("haproxy is not installed: run scripts/bootstrap.sh")
    config = write_config(settings, index)
    # -db: stay in the foreground, so the recorded pid is the proxy and its log is stdout.
    argv = [binary, "-db", "-f", str(config)]
    return processes.ensure_started(
        settings.state_dir,
        process_name(index),
        argv,
        lambda: in_rotation(settings, index),
        START_TIMEOUT,
        port=settings.listen_port if index == 1 else None,
    )
