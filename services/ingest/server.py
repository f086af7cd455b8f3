"""The asyncio TCP listener: moves bytes between sockets and :class:`ServerConnection`.

Nothing here knows MQTT: each socket gets a :class:`ServerConnection` whose effects the
:class:`~services.ingest.node.IngestNode` carries out. The keep-alive timer is a single
``call_later`` per connection, re-armed lazily, so idle connections cost no wake-ups.
"""

from __future__ import annotations

import asyncio
import logging
from typing import cast

from services.common.auth.principal import Refused
from services.common.mqtt.reason_codes import ReasonCode
from services.common.sessions import new_connection_id
from services.ingest.connection import ServerConnection
from services.ingest.effects import Authenticate, CreateAppTopic, Effect, StoreEffect
from services.ingest.node import IngestNode


def peer_address(peername: object) -> str:
    """A socket's peer as ``host:port`` (``[host]:port`` for IPv6); ``""`` when unknown."""
    if not isinstance(peername, tuple) or len(peername) < 2:
        return ""
    host, port = peername[0], peername[1]
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


log = logging.getLogger(__name__)


class MQTTServerProtocol(asyncio.Protocol):
    """One client socket.

    Bytes that arrive before the connection is past CONNECT wait until this node has read
    the state topics up to date (:meth:`IngestNode.sync_state`), so a client reconnecting
    from another node finds its session (Session Present) here. If that takes longer than
    ``kafka_request_timeout_seconds``, Kafka is taken as unavailable and the CONNECT is
    refused as the protocol says (CONNACK 0x88 Server unavailable, or 0x03 in v3.1.1).
    """

    __slots__ = (
        "_held",
        "_last_read",
        "_loop",
        "_out",
        "_timer",
        "connection",
        "node",
        "transport",
    )

    def __init__(self, node: IngestNode) -> None:
        self.node = node
        self.connection = ServerConnection(node.context, new_connection_id())
        self.transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self._last_read = self._loop.time()
        self._timer: asyncio.TimerHandle | None = None
        self._held: bytearray | None = None
        self._out: list[bytes] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Start the connect timeout (MQTT 3.1.4: close if no CONNECT arrives)."""
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.connection.state.client_address = peer_address(transport.get_extra_info("peername"))
        self._arm_timer()

    def data_received(self, data: bytes) -> None:
        """Feed the bytes to the protocol core and run its effects."""
        self._last_read = self._loop.time()
        if self._held is not None:
            self._held += data
        elif self.connection.awaiting_connect:
            self._held = bytearray(data)
            self._loop.create_task(self._feed_after_sync())
        else:
            self._feed(data)

    async def _feed_after_sync(self) -> None:
        timeout = self.node.settings.kafka_request_timeout_seconds
        try:
            await asyncio.wait_for(self.node.sync_state(), timeout)
        except Exception as exc:  # state topics unreachable: refuse rather than guess
            log.warning("state topics not readable, refusing a connection: %r", exc)
            available = False
        else:
            available = True
        held, self._held = self._held, None
        if held is None or self.transport is None or self.transport.is_closing():
            return
        if available:
            self._feed(bytes(held))
        else:
            self._feed_unavailable(bytes(held))
        self._arm_timer()  # paused while the state was synced: a partial CONNECT times out

    def _feed_unavailable(self, data: bytes) -> None:
        """Handle ``data`` as if every record it asks to store was refused by Kafka.

        Without the state topics nothing may be stored, and the sans-IO connection already
        knows the answer to a refused store of its session record: CONNACK Server unavailable
        (and a malformed CONNECT still gets its own reaction). The credentials are not
        checked: the answer is Server unavailable whatever they are.
        """
        pending: list[Effect] = self.connection.receive_data(data)
        while pending:
            effect = pending.pop(0)
            if isinstance(effect, StoreEffect | CreateAppTopic):
                pending[:0] = self.connection.store_failed(effect.token)
            elif isinstance(effect, Authenticate):
                unavailable = Refused(ReasonCode.SERVER_UNAVAILABLE, "state topics not readable")
                pending[:0] = self.connection.authenticated(unavailable)
            else:
                self.node.run(self, [effect])

    def _feed(self, data: bytes) -> None:
        had_timeout = self.connection.keep_alive_timeout
        self.node.run(self, self.connection.receive_data(data))
        if self.connection.keep_alive_timeout != had_timeout:
            self._arm_timer()  # CONNECT replaced the connect timeout with keep alive

    def connection_lost(self, exc: Exception | None) -> None:
        """Socket gone: forget the client, publish its Will Message and store the session's
        end records (as the connection decides)."""
        if self._timer is not None:
            self._timer.cancel()
        self.node.unregister(self)
        self.node.run(self, self.connection.connection_lost())

    def write(self, data: bytes) -> None:
        """Queue ``data`` on the socket (dropped once it is closing).

        Writes of one event-loop turn leave together in one system call: a send costs more
        than the Python around it on the hot path (a PUBACK per PUBLISH, a PUBLISH per
        delivery; bench/NOTES.md).
        """
        if not data or self.transport is None or self.transport.is_closing():
            return
        if self._out is None:
            self._out = [data]
            self._loop.call_soon(self._flush)
        else:
            self._out.append(data)

    def _flush(self) -> None:
        out, self._out = self._out, None
        if out and self.transport is not None and not self.transport.is_closing():
            self.transport.writelines(out)

    def close(self) -> None:
        """Close the socket after flushing what was written."""
        if self.transport is not None:
            self._flush()
            self.transport.close()

    def pause_reading(self) -> None:
        """Stop reading from the socket: the node's records wait for Kafka (backpressure)."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        """Read again; the time paused does not count against the client's keep alive."""
        self._last_read = self._loop.time()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def _arm_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        timeout = self.connection.keep_alive_timeout
        if timeout is not None and not self.connection.closed:
            self._timer = self._loop.call_at(self._last_read + timeout, self._check_timeout)

    def _check_timeout(self) -> None:
        self._timer = None
        timeout = self.connection.keep_alive_timeout
        if timeout is None or self.connection.closed or self._held is not None:
            return  # a held CONNECT waits for the state sync, bounded by its own timeout
        if self.transport is not None and not self.transport.is_reading():
            # Paused for backpressure: the silence is the node's, not the client's.
            self._last_read = self._loop.time()
            self._arm_timer()
            return
        if self._loop.time() - self._last_read >= timeout:
            self.node.run(self, self.connection.keep_alive_expired())
        else:
            self._arm_timer()


async def start_server(node: IngestNode) -> asyncio.Server:
    """Listen on ``settings.mqtt_host:mqtt_port`` for MQTT clients. Raises ``OSError``."""
    settings = node.settings
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: MQTTServerProtocol(node),
        settings.mqtt_host,
        settings.mqtt_port,
        reuse_address=True,
        backlog=4096,
    )
    log.info(
        "node %s: MQTT listener on %s:%d", settings.node_id, settings.mqtt_host, settings.mqtt_port
    )
    return server
