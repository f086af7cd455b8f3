"""How the generator's clients reach a broker: plain TCP, TLS, MQTT over WebSocket (``ws``)
and MQTT over WebSocket on TLS (``wss``).

The MQTT logic is one code path (:class:`bench.loadgen.clients.Connection`) for all four;
this module adds only what differs underneath it:

- TLS (``tls``, ``wss``): an :class:`ssl.SSLContext` trusting the CA file that signed the
  broker's certificate, TLS 1.2 or later, host name checked (asyncio's SSL transport does
  the rest);
- WebSocket (``ws``, ``wss``): :class:`WebSocketFraming`, the client side of RFC 6455 from
  the sans-IO ``ClientProtocol`` of the ``websockets`` package (the package the ingest
  node's listener uses): the opening handshake on path :data:`PATH` offering subprotocol
  :data:`SUBPROTOCOL` (MQTT 5.0 section 6, MQTT 3.1.1 section 6), every MQTT write as one
  binary frame, masked as RFC 6455 section 5.3 requires of a client (the package masks with
  its C speedups), and the incoming frames' payloads handed on as the MQTT byte stream
  (a packet may span frames, a frame may hold several packets).
"""

from __future__ import annotations

import functools
import ssl
from dataclasses import dataclass

from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.protocol import State
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

#: The transports a plan may use.
TRANSPORTS: tuple[str, ...] = ("tcp", "tls", "ws", "wss")

#: Request path of MQTT over WebSocket (what Cormorant, Mosquitto, paho and MQTT.js use).
PATH = "/mqtt"

#: The WebSocket subprotocol of MQTT 3.1.1 and 5.0 (section 6).
SUBPROTOCOL = Subprotocol("mqtt")

#: WebSocket close code sent when the generator ends a connection (RFC 6455 7.4.1).
CLOSE_NORMAL = 1000


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where and how a client connects (picklable: workers build their own SSL context).

    ``transport`` is one of :data:`TRANSPORTS`; ``ca_file`` is the path of the PEM CA
    certificate that signed the broker's certificate ("" for ``tcp`` and ``ws``, and then
    the system's CAs for ``tls``/``wss``).
    """

    host: str
    port: int
    transport: str = "tcp"
    ca_file: str = ""

    def __post_init__(self) -> None:
        """Check the transport name.

        Raises:
            ValueError: ``transport`` is not one of :data:`TRANSPORTS`.
        """
        if self.transport not in TRANSPORTS:
            raise ValueError(
                f"unknown transport {self.transport!r}; choose one of {', '.join(TRANSPORTS)}"
            )

    @property
    def secure(self) -> bool:
        """True for ``tls`` and ``wss``: the socket carries TLS."""
        return self.transport in ("tls", "wss")

    @property
    def websocket(self) -> bool:
        """True for ``ws`` and ``wss``: MQTT travels in WebSocket frames."""
        return self.transport in ("ws", "wss")

    def ssl_context(self) -> ssl.SSLContext | None:
        """The client context of a ``tls``/``wss`` endpoint (one per CA file and process),
        None for ``tcp``/``ws``.

        Raises:
            OSError: ``ca_file`` cannot be read.
            ssl.SSLError: it holds no certificate.
        """
        return _context(self.ca_file) if self.secure else None


@functools.cache
def _context(ca_file: str) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=ca_file or None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


class WebSocketFraming:
    """The client side of one WebSocket connection carrying MQTT (sans-IO).

    :meth:`handshake` gives the opening request to write once the socket is connected;
    :meth:`receive` takes the socket's bytes and returns the MQTT bytes they carried;
    :meth:`frame` wraps MQTT bytes as one masked binary frame; :meth:`close` gives the close
    frame. :attr:`open` is True from the server's accepting response until a close.
    """

    __slots__ = ("_protocol", "replies")

    def __init__(self, endpoint: Endpoint) -> None:
        """A connection to ``endpoint`` (its host and port go into the Host header)."""
        scheme = "wss" if endpoint.secure else "ws"
        host = f"[{endpoint.host}]" if ":" in endpoint.host else endpoint.host
        uri = parse_uri(f"{scheme}://{host}:{endpoint.port}{PATH}")
        # No size limit on incoming messages: the MQTT framing bounds nothing here either.
        self._protocol = ClientProtocol(uri, subprotocols=[SUBPROTOCOL], max_size=None)
        self.replies = b""  # bytes the protocol owes the server (pongs, a close reply)

    @property
    def open(self) -> bool:
        """True once the handshake is accepted and until the connection closes."""
        return self._protocol.state is State.OPEN

    def handshake(self) -> bytes:
        """The HTTP/1.1 upgrade request (RFC 6455 4.1) to write first."""
        protocol = self._protocol
        protocol.send_request(protocol.connect())
        return b"".join(protocol.data_to_send())

    def receive(self, data: bytes) -> tuple[bytes, str | None]:
        """Handle ``data`` read from the socket (b"" at end of file).

        Returns the MQTT bytes carried by binary frames, and None while the connection
        goes on or why it ended (a refused handshake: the server's status; a close frame;
        end of file). Bytes to write back are left in :attr:`replies`.
        """
        protocol = self._protocol
        if data:
            protocol.receive_data(data)
        else:
            protocol.receive_eof()
        chunks: list[bytes] = []
        for event in protocol.events_received():
            if isinstance(event, Frame):
                if event.opcode in (Opcode.BINARY, Opcode.CONT):
                    chunks.append(bytes(event.data))
            elif isinstance(event, Response) and protocol.handshake_exc is not None:
                return b"", f"WebSocket handshake refused: {protocol.handshake_exc}"
        self.replies = b"".join(protocol.data_to_send())
        ended = None
        if protocol.state in (State.CLOSING, State.CLOSED):
            close = protocol.close_rcvd or protocol.close_sent
            ended = "WebSocket closed" + (f": {close}" if close else " without a close frame")
        return b"".join(chunks), ended

    def frame(self, mqtt: bytes) -> bytes:
        """``mqtt`` as one masked binary frame (b"" once the connection is not open)."""
        protocol = self._protocol
        if protocol.state is not State.OPEN:
            return b""
        protocol.send_binary(mqtt)
        return b"".join(protocol.data_to_send())

    def close(self) -> bytes:
        """The close frame (code 1000) that ends the connection (b"" if it is not open)."""
        protocol = self._protocol
        if protocol.state is not State.OPEN:
            return b""
        protocol.send_close(CLOSE_NORMAL)
        return b"".join(chunk for chunk in protocol.data_to_send() if chunk)
