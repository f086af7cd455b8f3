"""The generator's MQTT clients: one asyncio Protocol per socket, plus publisher and
subscriber behaviour on top of it.

The MQTT logic is the same over every transport (``bench.loadgen.transports``): TLS is
asyncio's SSL transport under the same :class:`Connection`, and MQTT over WebSocket is
:class:`WebSocketConnection`, which unwraps frames before and wraps them after it.

Times are wall-clock nanoseconds (``time.time_ns()``) so that sender and receiver in
different worker processes agree. Every client of one worker records into one
``Recorder``.
"""

from __future__ import annotations

import asyncio
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

from bench.loadgen import payload, wire
from bench.loadgen.plan import PublisherSpec, SubscriberSpec
from bench.loadgen.stats import SeqTracker
from bench.loadgen.transports import Endpoint, WebSocketFraming

#: Bytes of one PINGREQ.
PINGREQ = b"\xc0\x00"

#: PUBLISHes written in one go by an unpaced QoS 0 publisher before it yields.
QOS0_BURST = 32


class ClientError(RuntimeError):
    """The broker refused or closed a client during setup."""


@dataclass(slots=True)
class Recorder:
    """A worker's counts; window bounds in epoch nanoseconds ([start, end))."""

    window_start: int = 0
    window_end: int = 0
    published: int = 0  # PUBLISHes sent inside the window
    delivered: int = 0  # new (not duplicate) PUBLISHes received inside the window
    e2e: array[int] = field(default_factory=lambda: array("q"))  # ns, messages sent in window
    ack: array[int] = field(default_factory=lambda: array("q"))  # ns, PUBACK after send in window
    disconnects: int = 0  # connections the broker closed while the run was going
    tls: str = ""  # TLS version and cipher suite of the first TLS connection ("" without)


class Connection(asyncio.Protocol):
    """One MQTT client socket: frames incoming bytes and hands packets to callbacks."""

    def __init__(self, version: int, recorder: Recorder) -> None:
        """A connection speaking Protocol Level ``version`` (4 or 5)."""
        loop = asyncio.get_running_loop()
        self.version = version
        self.recorder = recorder
        self.transport: asyncio.Transport | None = None
        self.reader = wire.FrameReader()
        self.replies: asyncio.Queue[tuple[int, bytes]] = asyncio.Queue()  # CONNACK, SUBACK
        self.closed: asyncio.Future[None] = loop.create_future()
        self.expected_close = False
        self.on_publish: Callable[[int, bytes, int], int] | None = None
        self.on_puback: Callable[[int, int], None] | None = None
        self.after_read: Callable[[], None] | None = None
        self._writable: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Keep the transport."""
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        """Dispatch every complete packet; PUBACKs for QoS 1 deliveries go out in one write."""
        now = time.time_ns()
        acks: list[bytes] = []
        for first, body in self.reader.feed(data):
            kind = first >> 4
            if kind == wire.PUBLISH:
                if self.on_publish is not None:
                    packet_id = self.on_publish(first, body, now)
                    if packet_id:
                        acks.append(wire.puback(packet_id))
            elif kind == wire.PUBACK:
                if self.on_puback is not None:
                    self.on_puback((body[0] << 8) | body[1], now)
            elif kind in (wire.CONNACK, wire.SUBACK):
                self.replies.put_nowait((kind, body))
            elif kind == wire.DISCONNECT:
                self.close()
        if acks:
            self.write(b"".join(acks))
        if self.after_read is not None:
            self.after_read()

    def pause_writing(self) -> None:
        """The socket buffer is full: writers wait in ``writable``."""
        if self._writable is None:
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        """The socket buffer drained."""
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    async def writable(self) -> None:
        """Return once the transport accepts more data without buffering further."""
        if self._writable is not None:
            await self._writable

    def connection_lost(self, exc: Exception | None) -> None:
        """Mark the connection closed; count it if the run did not ask for it."""
        if not self.expected_close:
            self.recorder.disconnects += 1
        if not self.closed.done():
            self.closed.set_result(None)
        self.resume_writing()

    def write(self, data: bytes) -> None:
        """Write ``data`` if the socket is open (a closed one is already counted)."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def close(self) -> None:
        """Close the socket (idempotent)."""
        if self.transport is not None:
            self.transport.close()

    async def opened(self, timeout: float) -> None:
        """Return once MQTT bytes may be written: at once on a plain or TLS socket."""

    async def expect(self, kind: int, timeout: float) -> bytes:
        """The body of the next CONNACK or SUBACK (``kind``); ``timeout`` in seconds.

        Raises:
            ClientError: another packet came, the socket closed, or the deadline passed.
        """
        getter = asyncio.ensure_future(self.replies.get())
        done, _ = await asyncio.wait(
            (getter, self.closed), timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
        if getter not in done:
            getter.cancel()
            raise ClientError("closed by the broker" if done else f"no reply in {timeout:g}s")
        got, body = getter.result()
        if got != kind:
            raise ClientError(f"expected packet type {kind}, got {got}")
        return body


class WebSocketConnection(Connection):
    """A :class:`Connection` whose MQTT bytes travel in WebSocket frames (``ws``, ``wss``)."""

    def __init__(self, version: int, recorder: Recorder, framing: WebSocketFraming) -> None:
        """As :class:`Connection`, framed by ``framing`` (a fresh one per connection)."""
        super().__init__(version, recorder)
        self.framing = framing
        self.handshaken: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Send the opening handshake (RFC 6455 4.1): MQTT waits for its answer."""
        super().connection_made(transport)
        cast(asyncio.Transport, transport).write(self.framing.handshake())

    def data_received(self, data: bytes) -> None:
        """Unwrap the frames and hand their payloads on as the MQTT byte stream."""
        mqtt, ended = self.framing.receive(data)
        if self.framing.replies and self.transport is not None:
            self.transport.write(self.framing.replies)
        if not self.handshaken.done():
            if ended is not None:
                self.handshaken.set_exception(ClientError(ended))
            elif self.framing.open:
                self.handshaken.set_result(None)
        if mqtt:
            super().data_received(mqtt)
        if ended is not None and self.transport is not None:
            self.transport.close()

    def write(self, data: bytes) -> None:
        """Write ``data`` as one binary frame."""
        super().write(self.framing.frame(data))

    def close(self) -> None:
        """Send a close frame (if open) and close the socket (idempotent)."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(self.framing.close())
        super().close()

    def connection_lost(self, exc: Exception | None) -> None:
        """As :class:`Connection`; a handshake still awaited fails."""
        if not self.handshaken.done():
            self.handshaken.set_exception(ClientError("closed during the WebSocket handshake"))
        super().connection_lost(exc)

    async def opened(self, timeout: float) -> None:
        """Return once the server accepted the handshake; ``timeout`` in seconds.

        Raises:
            ClientError: the handshake was refused, the socket closed, or the deadline passed.
        """
        try:
            await asyncio.wait_for(self.handshaken, timeout)
        except TimeoutError:
            raise ClientError(f"no WebSocket handshake response in {timeout:g}s") from None


async def open_client(
    endpoint: Endpoint,
    connect_packet: bytes,
    version: int,
    recorder: Recorder,
    timeout: float,
) -> Connection:
    """Connect to ``endpoint`` over its transport, send ``connect_packet`` and wait for a
    successful CONNACK; ``timeout`` (seconds) bounds each step.

    Raises:
        ClientError: handshake or CONNACK refused (the code is in the message), no reply.
        OSError: the TCP connection failed (``ssl.SSLError``: the TLS handshake did).
    """
    loop = asyncio.get_running_loop()

    def factory() -> Connection:
        if endpoint.websocket:
            return WebSocketConnection(version, recorder, WebSocketFraming(endpoint))
        return Connection(version, recorder)

    context = endpoint.ssl_context()
    transport, conn = await asyncio.wait_for(
        loop.create_connection(
            factory,
            endpoint.host,
            endpoint.port,
            ssl=context,
            server_hostname=endpoint.host if context else None,
        ),
        timeout,
    )
    if context is not None and not recorder.tls:
        tls = transport.get_extra_info("ssl_object")
        if tls is not None:
            recorder.tls = f"{tls.version()} {tls.cipher()[0]}"
    try:
        await conn.opened(timeout)
        conn.write(connect_packet)
        body = await conn.expect(wire.CONNACK, timeout)
        if len(body) < 2 or body[1] != 0:
            raise ClientError(f"CONNACK refused with code {body[1] if len(body) > 1 else '?'}")
    except BaseException:
        conn.expected_close = True
        conn.close()
        raise
    return conn


class Subscriber:
    """A subscribing client: tracks sequences, latency and which probes arrived."""

    def __init__(self, spec: SubscriberSpec, conn: Connection) -> None:
        """Wrap an open connection; ``subscribe`` must follow."""
        self.spec = spec
        self.conn = conn
        self.tracker = SeqTracker()
        self.received = 0  # every non-probe PUBLISH, duplicates included
        self.new = 0  # distinct non-probe PUBLISHes
        self.target = -1  # distinct messages that complete the drain; -1 until known
        self.probes: set[int] = set()
        loop = asyncio.get_running_loop()
        self.routed: asyncio.Future[None] = loop.create_future()
        self.drained: asyncio.Future[None] = loop.create_future()
        self._missing_probes = set(spec.expected)
        self._publishers = frozenset(spec.expected)
        conn.on_publish = self._on_publish
        if not self._missing_probes:
            self.routed.set_result(None)

    async def subscribe(self, timeout: float) -> None:
        """SUBSCRIBE and wait for a SUBACK granting a QoS (not a failure code).

        Raises:
            ClientError: refused, or no SUBACK within ``timeout`` seconds.
        """
        self.conn.write(wire.subscribe(1, self.spec.topic_filter, self.spec.qos, self.conn.version))
        body = await self.conn.expect(wire.SUBACK, timeout)
        if body[-1] >= 0x80:
            raise ClientError(f"SUBSCRIBE {self.spec.topic_filter!r} refused: {body[-1]:#x}")

    def expect_total(self, sent: dict[int, int]) -> None:
        """Set the drain target from the publishers' sent counts."""
        self.target = sum(sent.get(p, 0) for p in self.spec.expected)
        self._check_drained()

    def _check_drained(self) -> None:
        if 0 <= self.target <= self.new and not self.drained.done():
            self.drained.set_result(None)

    def _on_publish(self, first: int, body: bytes, now: int) -> int:
        """Count one PUBLISH and return its Packet Identifier (to acknowledge). A message
        that is not this run's (a ``#`` subscriber also gets the broker's retained
        messages) is acknowledged and left out."""
        packet_id, offset = wire.publish_fields(first, body, self.conn.version)
        if len(body) - offset < payload.MIN_SIZE:
            return packet_id
        publisher_id, seq, sent = payload.decode(body, offset)
        if publisher_id not in self._publishers:
            return packet_id
        if seq == payload.PROBE_SEQ:
            if publisher_id in self._missing_probes:
                self._missing_probes.discard(publisher_id)
                if not self._missing_probes and not self.routed.done():
                    self.routed.set_result(None)
            return packet_id
        self.received += 1
        if self.tracker.add(publisher_id, seq):
            self.new += 1
            rec = self.conn.recorder
            if rec.window_start <= sent < rec.window_end:
                rec.e2e.append(now - sent)
            if rec.window_start <= now < rec.window_end:
                rec.delivered += 1
            if self.target >= 0:
                self._check_drained()
        return packet_id


class Publisher:
    """A publishing client: probes the route, then publishes paced or as fast as allowed."""

    def __init__(self, spec: PublisherSpec, conn: Connection, inflight: int, version: int) -> None:
        """Wrap an open connection; ``inflight`` caps PUBLISHes awaiting PUBACK (QoS 1)."""
        self.spec = spec
        self.conn = conn
        self.inflight = inflight
        self.template = wire.PublishTemplate(spec.topic, spec.qos, spec.size, version)
        self.seq = 0  # measured messages sent so far (the last sequence number used)
        self.pending: dict[int, int] = {}  # packet id → send time (0 for a probe)
        self._next_id = 0
        self._end = 0
        self._pumping = False
        self._finished = False
        self.acked: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        conn.on_puback = self._on_puback

    def _packet_id(self) -> int:
        pid = self._next_id
        while True:
            pid = pid % 0xFFFF + 1
            if pid not in self.pending:
                self._next_id = pid
                return pid

    def probe(self) -> None:
        """Send one route probe (sequence number 0) at the publisher's QoS."""
        pid = self._packet_id() if self.spec.qos else 0
        if pid:
            self.pending[pid] = 0
        self.conn.write(self.template.packet(pid, self.spec.publisher_id, payload.PROBE_SEQ, 0))

    def _send(self, count: int) -> None:
        now = time.time_ns()
        rec = self.conn.recorder
        qos = self.spec.qos
        pub_id = self.spec.publisher_id
        packet = self.template.packet
        out = []
        for _ in range(count):
            self.seq += 1
            pid = 0
            if qos:
                pid = self._packet_id()
                self.pending[pid] = now
            out.append(packet(pid, pub_id, self.seq, now))
        if rec.window_start <= now < rec.window_end:
            rec.published += count
        self.conn.write(b"".join(out))

    def _pump(self) -> None:
        if not self._pumping:
            return
        if time.time_ns() >= self._end:
            self._pumping = False
            return
        room = self.inflight - len(self.pending)
        if room > 0:
            self._send(room)

    def _on_puback(self, packet_id: int, now: int) -> None:
        sent = self.pending.pop(packet_id, None)
        if sent is None:
            return
        rec = self.conn.recorder
        if sent and rec.window_start <= sent < rec.window_end:
            rec.ack.append(now - sent)
        if not self.pending and self._finished and not self.acked.done():
            self.acked.set_result(None)

    async def run(self, start: int, end: int) -> None:
        """Publish from ``start`` to ``end`` (epoch ns); return when sending is over."""
        await asyncio.sleep(max(start - time.time_ns(), 0) / 1e9)
        self._end = end
        rate = self.spec.rate
        if self.spec.qos and not rate:
            self._pumping = True
            self.conn.after_read = self._pump
            self._pump()
            while self._pumping and not self.conn.closed.done():
                await asyncio.sleep(min(max(end - time.time_ns(), 0) / 1e9, 0.05))
                self._pump()  # also restarts a window emptied before the first PUBACK
        else:
            while not self.conn.closed.done():
                now = time.time_ns()
                if now >= end:
                    break
                if rate:
                    due = int((now - start) * rate / 1e9) + 1 - self.seq
                else:
                    due = QOS0_BURST
                if self.spec.qos:
                    due = min(due, self.inflight - len(self.pending))
                if due > 0:
                    self._send(due)
                if rate:
                    next_due = start + int(self.seq * 1e9 / rate)
                    await asyncio.sleep(max(next_due - time.time_ns(), 0) / 1e9)
                else:
                    await self.conn.writable()
                    await asyncio.sleep(0)
        self.conn.after_read = None
        self._pumping = False
        self._finished = True
        if not self.pending and not self.acked.done():
            self.acked.set_result(None)
