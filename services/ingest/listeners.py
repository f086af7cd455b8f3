"""An ingest node's listeners: plain MQTT on ``mqtt_port``, and the ``listeners`` setting's
MQTT over TCP, TLS, WebSocket and WebSocket over TLS, each optionally behind a PROXY header.

A listener without TLS or PROXY protocol is asyncio's own server. The others accept in a
loop of their own, because two things must happen between accept and the MQTT bytes: the
PROXY header is read off the socket exactly (:mod:`services.ingest.proxy_protocol`: the TLS
ClientHello that follows it stays in the socket), and the TLS handshake takes the node's
*current* server context (:class:`~services.ingest.tls.TlsContexts`), so that a certificate
reloaded on SIGHUP serves the next connection while open ones keep theirs. The socket is
then handed to the event loop (``connect_accepted_socket``, with TLS when the listener
speaks it) and becomes an :class:`~services.ingest.server.MQTTServerProtocol` like any.

A connection that sends no valid PROXY header where one is required, comes from outside
the listener's ``proxy_trusted_cidrs`` on a PROXY listener, or fails its TLS handshake, is
closed and counted (:class:`~services.ingest.limits.Refusal`); one closed
before sending anything (a load balancer's TCP health check) is not.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from dataclasses import dataclass, field
from functools import partial

from services.common.metrics import MQTT
from services.common.settings import Listener
from services.ingest import proxy_protocol
from services.ingest.limits import Refusal
from services.ingest.node import IngestNode
from services.ingest.server import MQTTServerProtocol
from services.ingest.tls import TlsContexts

log = logging.getLogger(__name__)

BACKLOG = 4096
"""Pending connections the kernel queues per listener."""


class _ClosedEarly(Exception):
    """The peer closed before sending a byte (a load balancer's health check)."""


async def read_proxy_header(sock: socket.socket) -> proxy_protocol.ProxyHeader:
    """Read a PROXY protocol header off ``sock`` (non-blocking), and not a byte more.

    Raises :class:`~services.ingest.proxy_protocol.ProxyProtocolError` for anything else,
    ``ConnectionError`` when the peer closes within the header.
    """
    loop = asyncio.get_running_loop()
    data = b""
    while need := proxy_protocol.wanted(data):
        chunk = await loop.sock_recv(sock, need)
        if not chunk:
            if not data:
                raise _ClosedEarly
            raise ConnectionError("closed within the PROXY header")
        data += chunk
    header = proxy_protocol.parse(data)
    assert header is not None, "wanted() said the header is complete"
    return header


@dataclass
class _Acceptor:
    """The accept loop of one listener that needs a PROXY header or TLS."""

    node: IngestNode
    listener: Listener
    sock: socket.socket
    contexts: TlsContexts | None
    opening: set[asyncio.Task[None]] = field(default_factory=set)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(self.sock)
            except OSError as exc:  # EMFILE and the like: wait, do not spin
                log.warning("accept on port %d failed: %r", self.listener.port, exc)
                await asyncio.sleep(0.1)
                continue
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            task = loop.create_task(self._open(conn))
            self.opening.add(task)
            task.add_done_callback(self.opening.discard)

    async def _open(self, sock: socket.socket) -> None:
        """PROXY header, TLS handshake, then the MQTT connection; or a counted refusal."""
        node, listener = self.node, self.listener
        loop = asyncio.get_running_loop()
        try:
            host = str(sock.getpeername()[0])  # refusals are logged per address
        except OSError:
            sock.close()
            return
        client: tuple[str, int] | None = None
        stage = Refusal.PROXY_HEADER
        if listener.proxy_protocol and not listener.proxy_trusted(host):
            # Only a load balancer may say where a client is: anyone else could claim any
            # address (and slip past address blocks and per-address limits).
            node.refusals.note(stage, host, "PROXY header from outside proxy_trusted_cidrs")
            sock.close()
            return
        try:
            async with asyncio.timeout(node.settings.connect_timeout_seconds):
                if listener.proxy_protocol:
                    header = await read_proxy_header(sock)
                    client = header.source
                    if client is not None:
                        host = client[0]
                stage = Refusal.TLS_HANDSHAKE
                context = None
                if listener.tls and self.contexts is not None:
                    context = self.contexts.current
                await loop.connect_accepted_socket(
                    lambda: MQTTServerProtocol(
                        node,
                        websocket=listener.websocket,
                        client=client,
                        listener=listener.kind,
                        origins=listener.allowed_origins,
                    ),
                    sock,
                    ssl=context,
                )
        except _ClosedEarly:
            sock.close()
        except (ssl.SSLEOFError, ConnectionResetError) as exc:
            log.debug("%s closed before its TLS handshake: %r", host, exc)
            sock.close()
        except (proxy_protocol.ProxyProtocolError, ssl.SSLError, OSError, TimeoutError) as exc:
            node.refusals.note(stage, host, str(exc) or type(exc).__name__)
            with contextlib.suppress(OSError):
                sock.close()


def _listening_socket(host: str, port: int) -> socket.socket:
    """A non-blocking listening TCP socket on ``host:port`` (``SO_REUSEADDR``, as asyncio's
    own servers). Raises ``OSError`` if the port is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=BACKLOG)
    sock.setblocking(False)
    return sock


class Listeners:
    """The node's open listeners: ``ports`` (kind → bound ports, ``mqtt_port`` first among
    the ``mqtt``), ``tls`` (the TLS contexts, None without a TLS listener)."""

    def __init__(self, tls: TlsContexts | None) -> None:
        self.tls = tls
        self.ports: dict[str, list[int]] = {}
        self._servers: list[asyncio.Server] = []
        self._acceptors: list[tuple[_Acceptor, asyncio.Task[None]]] = []

    def reload_tls(self) -> bool:
        """Re-read the TLS certificate files (SIGHUP): new connections get the new
        certificate, open ones keep theirs. False (logged) if it could not be loaded."""
        return self.tls.reload() if self.tls is not None else False

    def close(self) -> None:
        """Stop accepting (open connections stay until the node closes them)."""
        for server in self._servers:
            server.close()
        for acceptor, task in self._acceptors:
            task.cancel()
            for opening in list(acceptor.opening):
                opening.cancel()
            acceptor.sock.close()


async def start_listeners(node: IngestNode) -> Listeners:
    """Open every listener of ``node.settings`` on ``mqtt_host``. Raises ``OSError`` if a
    port is taken, ``ssl.SSLError``/``OSError`` if the TLS certificate does not load."""
    settings = node.settings
    loop = asyncio.get_running_loop()
    tls = TlsContexts(settings) if any(listener.tls for listener in settings.listeners) else None
    result = Listeners(tls)
    plain = Listener(kind="mqtt", port=settings.mqtt_port)
    try:
        for listener in [plain, *settings.listeners]:
            if listener.tls or listener.proxy_protocol:
                sock = _listening_socket(settings.mqtt_host, listener.port)
                port = sock.getsockname()[1]
                acceptor = _Acceptor(node, listener, sock, tls)
                result._acceptors.append((acceptor, loop.create_task(acceptor.run())))
            else:
                server = await loop.create_server(
                    partial(
                        MQTTServerProtocol,
                        node,
                        websocket=listener.websocket,
                        listener=listener.kind,
                        origins=listener.allowed_origins,
                    ),
                    settings.mqtt_host,
                    listener.port,
                    reuse_address=True,
                    backlog=BACKLOG,
                )
                result._servers.append(server)
                port = server.sockets[0].getsockname()[1]
            result.ports.setdefault(listener.kind, []).append(port)
            MQTT.listener(listener.kind)  # its connections count 0 until a client comes
            log.info(
                "node %s: %s listener on %s:%d%s",
                settings.node_id,
                listener.kind,
                settings.mqtt_host,
                port,
                " (PROXY protocol)" if listener.proxy_protocol else "",
            )
    except BaseException:
        result.close()
        raise
    return result
