"""The transport shell of one MQTT connection: moves bytes between a socket and a
:class:`ServerConnection`, over TCP, TLS or WebSocket (the listeners:
:mod:`services.ingest.listeners`).

Nothing here decides MQTT: each socket gets a :class:`ServerConnection` whose effects the
:class:`~services.ingest.node.IngestNode` carries out. What the shell adds is transport:
the WebSocket framing layer (:mod:`services.ingest.websocket`) when the listener speaks it,
the client's address (the PROXY header's, when the listener requires one) and verified
certificate, the connection limits decided when the socket opens, the per-client rate
limits (reading pauses), and how the socket closes.

A close decided by the server lingers (:meth:`MQTTServerProtocol.close`): after the
DISCONNECT or refusing CONNACK is written, nothing more is written, what the client still
sends is read and discarded for ``close_grace_seconds`` (or until it closes its side), and
only then is the socket closed. Closing with unread bytes, or while the client is still
sending, makes the kernel answer with a reset, and a reset can destroy the Reason Code
before the client has read it.

The keep-alive timer is a single ``call_later`` per connection, re-armed lazily, so idle
connections cost no wake-ups.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import cast

from services.common.auth.principal import Refused
from services.common.metrics import MQTT
from services.common.mqtt.errors import MQTTError
from services.common.mqtt.reason_codes import ReasonCode
from services.common.sessions import new_connection_id
from services.ingest import tls
from services.ingest.connection import ServerConnection
from services.ingest.effects import Authenticate, CreateAppTopic, Effect, StoreEffect, StorePublish
from services.ingest.limits import Refusal
from services.ingest.node import IngestNode
from services.ingest.rate_limits import ClientRate
from services.ingest.websocket import WebSocketFraming

log = logging.getLogger(__name__)

Address = tuple[str, int]
"""A peer as ``(host, port)``."""

_REFUSED_CONNECT = {
    Refusal.CONNECTIONS: (ReasonCode.QUOTA_EXCEEDED, "too many connections on this node"),
    Refusal.CONNECTION_RATE: (
        ReasonCode.CONNECTION_RATE_EXCEEDED,
        "too many new connections on this node",
    ),
    Refusal.ADDRESS_CONNECTION_RATE: (
        ReasonCode.CONNECTION_RATE_EXCEEDED,
        "too many new connections from this address",
    ),
}
"""The CONNACK Reason Code (and reason) of each connection limit."""

_BACKPRESSURE = "backpressure"
_RATE = "rate"


def format_address(address: object) -> str:
    """A peer as ``host:port`` (``[host]:port`` for IPv6); ``""`` when unknown."""
    if not isinstance(address, tuple) or len(address) < 2:
        return ""
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


class MQTTServerProtocol(asyncio.Protocol):
    """One client socket.

    ``websocket``: MQTT travels in WebSocket frames (ws, wss listeners); ``client``: the
    client's real address from a PROXY header (None: the socket's peer); ``listener``: the
    listener's kind (``mqtt``, ``mqtts``, ``ws``, ``wss``), its label in the metrics
    (``cormorant_mqtt_*{listener=...}``; bytes are counted as they cross the socket,
    WebSocket framing included).

    Bytes that arrive before the connection is past CONNECT wait until this node has read
    the state topics up to date (:meth:`IngestNode.sync_state`), so a client reconnecting
    from another node finds its session (Session Present) here. If that takes longer than
    ``kafka_request_timeout_seconds``, Kafka is taken as unavailable and the CONNECT is
    refused as the protocol says (CONNACK 0x88 Server unavailable, or 0x03 in v3.1.1).
    """

    __slots__ = (
        "_bytes",
        "_client",
        "_closing",
        "_held",
        "_loop",
        "_out",
        "_paused",
        "_rate",
        "_timer",
        "_timer_at",
        "_ws",
        "connection",
        "node",
        "transport",
    )

    def __init__(
        self,
        node: IngestNode,
        *,
        websocket: bool = False,
        client: Address | None = None,
        listener: str = "mqtt",
        origins: Sequence[str] = (),
    ) -> None:
        self.node = node
        self.connection = ServerConnection(node.context, new_connection_id())
        self.connection.state.listener = listener
        self._bytes = MQTT.listener(listener)
        self.transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._held: bytearray | None = None
        self._out: list[bytes] | None = None
        self._client = client
        self._ws = (
            WebSocketFraming(2 * node.settings.max_packet_size, origins) if websocket else None
        )
        self._paused: set[str] = set()
        self._closing: asyncio.TimerHandle | bool = False
        settings = node.settings
        self._rate = ClientRate(
            settings.client_max_messages_per_second,
            settings.client_max_bytes_per_second,
            self._loop.time(),
        )

    @property
    def who(self) -> str:
        """The client for the log: its client id once known, else its IP address."""
        address = self.connection.state.client_address
        return self.connection.client_id or address.rsplit(":", 1)[0].strip("[]")

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Note the client's address and certificate, apply the connection limits, and
        start the connect timeout (MQTT 3.1.4: close if no CONNECT arrives)."""
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        state = self.connection.state
        peer = self._client or transport.get_extra_info("peername")
        state.client_address = format_address(peer)
        state.certificate = tls.client_certificate(transport.get_extra_info("ssl_object"))
        host = str(peer[0]) if isinstance(peer, tuple) else ""
        refusal = self.node.admit(host)
        if refusal is not None:
            code, reason = _REFUSED_CONNECT[refusal]
            state.refusal = MQTTError(reason, code)
            self.node.refusals.note(refusal, host, reason)  # once a minute per address
        self._arm_timer()

    def data_received(self, data: bytes) -> None:
        """Feed the bytes (unframed, for WebSocket) to the protocol core and run its effects;
        discarded while the socket lingers before its close."""
        if self._closing:
            return
        self.connection.heard()  # WebSocket control frames and held bytes count too
        self._bytes.received_bytes += len(data)
        if self._ws is not None:
            received = self._ws.receive(data)
            if received.reply and self.transport is not None:
                self.transport.write(received.reply)
            if received.mqtt:
                self._deliver(received.mqtt)
            if received.close:
                if not self._ws.open and self.connection.awaiting_connect:
                    self.node.refusals.note(Refusal.WEBSOCKET_HANDSHAKE, self.who, received.reason)
                self._close_now()
            return
        self._deliver(data)

    def _deliver(self, data: bytes) -> None:
        if self._held is not None:
            self._held += data
        elif self.connection.awaiting_connect and self.connection.state.refusal is None:
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
        effects = self.connection.receive_data(data)
        if self._rate.limited:
            self._count(data, effects)
        self.node.run(self, effects)

    def _count(self, data: bytes, effects: list[Effect]) -> None:
        """Take what was read from the client's rate buckets; past them, stop reading
        until they refill (:mod:`services.ingest.rate_limits`)."""
        messages = sum(1 for effect in effects if isinstance(effect, StorePublish))
        pause, limit = self._rate.take(messages, len(data), self._loop.time())
        if limit is None or _RATE in self._paused:
            return
        self.node.refusals.note(limit, self.who, f"reading paused {pause:.2f} s")
        self._pause(_RATE)
        self._loop.call_later(pause, self._resume, _RATE)

    def connection_lost(self, exc: Exception | None) -> None:
        """Socket gone: forget the client, publish its Will Message and store the session's
        end records (as the connection decides)."""
        if self._timer is not None:
            self._timer.cancel()
        if isinstance(self._closing, asyncio.TimerHandle):
            self._closing.cancel()
        self.node.admission.closed()
        self.node.unregister(self)
        self.node.run(self, self.connection.connection_lost())

    def write(self, data: bytes) -> None:
        """Queue MQTT ``data`` on the socket (dropped once it is closing).

        Writes of one event-loop turn leave together in one system call (and one WebSocket
        frame): a send costs more than the Python around it on the hot path (a PUBACK per
        PUBLISH, a PUBLISH per delivery; bench/NOTES.md).
        """
        if not data or self._closing or self.transport is None or self.transport.is_closing():
            return
        if self._out is None:
            self._out = [data]
            self._loop.call_soon(self._flush)
        else:
            self._out.append(data)

    def _flush(self) -> None:
        out, self._out = self._out, None
        if not out or self.transport is None or self.transport.is_closing():
            return
        if self._ws is not None:
            framed = self._ws.frame(b"".join(out))
            self._bytes.sent_bytes += len(framed)
            self.transport.write(framed)
        else:
            self._bytes.sent_bytes += sum(map(len, out))
            self.transport.writelines(out)

    def write_buffer_size(self) -> int:
        """Bytes written and not sent yet: this turn's writes and the transport's buffer."""
        pending = sum(map(len, self._out)) if self._out else 0
        if self.transport is None or self.transport.is_closing():
            return pending
        return pending + self.transport.get_write_buffer_size()

    def close(self) -> None:
        """Close the socket after flushing what was written, lingering first.

        From now on nothing more is written; the client's bytes are read and discarded
        until it closes its side or ``close_grace_seconds`` pass, so that it reads the
        DISCONNECT or CONNACK written last instead of a reset.
        """
        if self._closing or self.transport is None or self.transport.is_closing():
            return
        self._flush()
        if self._ws is not None:
            self.transport.write(self._ws.close())
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            self._timer_at = None
        grace = self.node.settings.close_grace_seconds
        if grace <= 0:
            self._close_now()
            return
        self._closing = self._loop.call_later(grace, self._close_now)
        self._paused.clear()
        self.transport.resume_reading()  # read to drain, whatever paused it
        if self._ws is None and self.transport.can_write_eof():
            self.transport.write_eof()  # the client's read of the DISCONNECT then ends

    def _close_now(self) -> None:
        self._closing = True
        if self.transport is None or self.transport.is_closing():
            return
        self._flush()
        if self.transport.get_write_buffer_size():
            self.transport.abort()  # the client does not read: do not wait for it
        else:
            self.transport.close()

    def pause_reading(self) -> None:
        """Stop reading from the socket: the node's records wait for Kafka (backpressure)."""
        self._pause(_BACKPRESSURE)

    def resume_reading(self) -> None:
        """Read again; the time paused does not count against the client's keep alive."""
        self._resume(_BACKPRESSURE)

    def _pause(self, why: str) -> None:
        if self._closing:
            return
        self._paused.add(why)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()

    def _resume(self, why: str) -> None:
        self._paused.discard(why)
        self.connection.heard()
        if self._paused or self._closing:
            return
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def keep_alive_changed(self) -> None:
        """The connection sent its CONNACK: its deadline may now be earlier than the
        connect timeout the timer waits for (Keep Alive counts from the CONNACK)."""
        deadline = self.connection.keep_alive_deadline
        if deadline is not None and (self._timer_at is None or deadline < self._timer_at):
            self._arm_timer()

    def _arm_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = None
        deadline = self.connection.keep_alive_deadline
        if deadline is None or self._closing:
            return
        # The deadline is on the connection's clock: wait the time left on the loop's.
        delay = max(0.0, deadline - self.node.context.monotonic())
        self._timer = self._loop.call_later(delay, self._check_timeout)
        self._timer_at = deadline

    def _check_timeout(self) -> None:
        self._timer = None
        self._timer_at = None
        if self.connection.closed or self._held is not None:
            return  # a held CONNECT waits for the state sync, bounded by its own timeout
        if self._paused:
            # Paused for backpressure or a rate limit: the silence is the node's.
            self.connection.heard()
            self._arm_timer()
            return
        effects = self.connection.check_keep_alive()
        if effects:
            self.node.run(self, effects)
        else:
            self._arm_timer()
