"""MQTT over WebSocket (MQTT 5.0 and 3.1.1 section 6), sans-IO: the framing layer between a
socket's bytes and the MQTT byte stream of a :class:`~services.ingest.connection.ServerConnection`.

The opening handshake is an HTTP/1.1 upgrade on :data:`PATH` whose client offers the
``mqtt`` subprotocol (MQTT 3.1 clients: ``mqttv3.1``); anything else gets an HTTP error
(404 for another path, 400 without the subprotocol) and the connection ends. After it, MQTT
Control Packets travel in binary data frames: a packet may span several frames and a frame
may carry several packets, so the frames' payloads are simply the MQTT byte stream. A text
frame is a protocol error: the connection is closed (MQTT-6.0.0-1). Pings are answered,
a close frame is answered and ends the connection. With ``origins`` (the listener's
``allowed_origins``), an upgrade whose ``Origin`` header names another origin gets HTTP 403:
a browser always sends the page's origin, so a page of another site cannot use a visitor's
browser (its network position, its client certificate) to reach the broker. An upgrade
without ``Origin`` (devices, non-browser libraries) is not concerned.

Built on the sans-IO protocol of the ``websockets`` package (its ``ServerProtocol``), which
costs a third of ``wsproto``'s per message on this machine (bench/bench_websocket.py:
2.2 µs against 6.7 µs to receive a 64-byte PUBLISH, 0.8 against 2.4 to send one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from websockets.exceptions import InvalidState
from websockets.frames import Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.typing import Origin, Subprotocol

PATH = "/mqtt"
"""The request path of MQTT over WebSocket (the path MQTT.js, paho and Mosquitto use)."""

SUBPROTOCOLS = (Subprotocol("mqtt"), Subprotocol("mqttv3.1"))
"""The subprotocols accepted, preferred first (MQTT 5.0 6.0; "mqttv3.1" for MQTT 3.1)."""

CLOSE_NORMAL = 1000
"""WebSocket close code after an MQTT DISCONNECT or a refused CONNECT (RFC 6455 7.4.1)."""


@dataclass(slots=True)
class Received:
    """What one read of the socket gave: ``mqtt`` bytes for the MQTT decoder, ``reply``
    bytes to write back (handshake response, pongs, a close frame), and ``close``: the
    WebSocket connection has ended (after ``reply`` the socket should close), with
    ``reason`` for the log."""

    mqtt: bytes = b""
    reply: bytes = b""
    close: bool = False
    reason: str = ""


class WebSocketFraming:
    """The server side of one WebSocket connection carrying MQTT.

    ``max_frame_size`` (bytes) bounds one frame (larger ones close the connection with
    1009); the MQTT decoder bounds each packet on its own. ``origins``: the ``Origin``
    values accepted (empty: any; see the module). :meth:`receive` takes socket
    bytes; :meth:`frame` wraps MQTT bytes for the socket; :meth:`close` gives the close
    frame. :attr:`open` is True from the accepted handshake until a close.
    """

    __slots__ = ("_protocol", "path")

    def __init__(self, max_frame_size: int, origins: Sequence[str] = ()) -> None:
        allowed: list[Origin | None] | None = None
        if origins:
            allowed = [*(Origin(o) for o in origins), None]  # None: no Origin header
        self._protocol = ServerProtocol(
            subprotocols=list(SUBPROTOCOLS), max_size=max_frame_size, origins=allowed
        )
        self.path = ""

    @property
    def open(self) -> bool:
        """True once the handshake is accepted and until the connection closes."""
        return self._protocol.state is State.OPEN

    def receive(self, data: bytes) -> Received:
        """Handle bytes read from the socket (b"" at end of file)."""
        protocol = self._protocol
        if data:
            protocol.receive_data(data)
        else:
            protocol.receive_eof()
        out = Received()
        chunks: list[bytes] = []
        for event in protocol.events_received():
            if isinstance(event, Request):
                out.reason = self._handshake(event)
            elif not isinstance(event, Frame):
                continue  # a server receives no Response
            elif event.opcode in (Opcode.BINARY, Opcode.CONT):
                chunks.append(bytes(event.data))
            elif event.opcode is Opcode.TEXT:
                # MQTT-6.0.0-1: a text frame closes the connection (1003: unsupported data).
                protocol.send_close(1003, "MQTT needs binary frames")
                out.reason = "text frame"
                break
        out.mqtt = b"".join(chunks)
        sent = protocol.data_to_send()
        out.reply = b"".join(sent)
        # websockets asks for the end of the stream with an empty chunk once it has ended.
        if out.reason or b"" in sent or protocol.state in (State.CLOSING, State.CLOSED):
            out.close = True
            if not out.reason:
                exc = getattr(protocol, "handshake_exc", None)
                if exc is None and protocol.state is State.CLOSED:
                    exc = protocol.close_exc
                out.reason = str(exc or "WebSocket closed")
        return out

    def _handshake(self, request: Request) -> str:
        """Answer the opening handshake; the reason it was refused, or "" if accepted."""
        protocol = self._protocol
        self.path = request.path
        if request.path.split("?", 1)[0] != PATH:
            response = protocol.reject(404, f"MQTT over WebSocket is served on {PATH}\n")
        else:
            response = protocol.accept(request)
        protocol.send_response(response)
        if response.status_code == 101:
            return ""
        return f"WebSocket handshake refused: HTTP {response.status_code} ({request.path!r})"

    def frame(self, mqtt: bytes) -> bytes:
        """``mqtt`` bytes as one binary frame (b"" once the connection is not open)."""
        if self._protocol.state is not State.OPEN:
            return b""
        self._protocol.send_binary(mqtt)
        return b"".join(self._protocol.data_to_send())

    def close(self, code: int = CLOSE_NORMAL, reason: str = "") -> bytes:
        """The close frame that ends the connection from the server's side (b"" if it is
        not open)."""
        if self._protocol.state is not State.OPEN:
            return b""
        try:
            self._protocol.send_close(code, reason[:120])
        except InvalidState:
            return b""
        return b"".join(c for c in self._protocol.data_to_send() if c)
