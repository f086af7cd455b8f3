"""Third-party MQTT clients for the end-to-end tests, with deadlines instead of sleeps.

- :func:`aio_client` / :func:`collect`: aiomqtt (asyncio);
- :class:`PahoClient`: paho-mqtt on its network thread, for what aiomqtt hides (PUBACK and
  DISCONNECT reason codes);
- :class:`MosquittoSub` / :func:`mosquitto_pub`: the mosquitto command-line clients;
- :class:`RawSocket` and the packet builders: hand-made bytes, for malformed input.

The packet builders spell MQTT by hand on purpose: they must not share the broker's codec.
"""

from __future__ import annotations

import asyncio
import queue
import shutil
import socket
import struct
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiomqtt
import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

HOST = "127.0.0.1"

#: Seconds any single expected event (CONNACK, a message, a close) may take.
TIMEOUT = 15.0


def unique(prefix: str) -> str:
    """``prefix`` plus a random suffix: client ids and topics no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


# --------------------------------------------------------------------------------------------
# aiomqtt


def aio_client(
    port: int,
    identifier: str,
    version: int = 5,
    max_inflight_messages: int | None = None,
    *,
    username: str | None = None,
    password: str | None = None,
) -> aiomqtt.Client:
    """An aiomqtt client of MQTT ``version`` (4 = 3.1.1, 5) for ``127.0.0.1:port``, with a
    User Name and Password when given."""
    protocol = aiomqtt.ProtocolVersion.V5 if version == 5 else aiomqtt.ProtocolVersion.V311
    return aiomqtt.Client(
        HOST,
        port,
        identifier=identifier,
        protocol=protocol,
        timeout=TIMEOUT,
        max_inflight_messages=max_inflight_messages,
        username=username,
        password=password,
    )


async def collect(
    client: aiomqtt.Client, count: int, timeout: float = TIMEOUT
) -> list[aiomqtt.Message]:
    """The next ``count`` messages of ``client``; ``TimeoutError`` names how many came."""
    received: list[aiomqtt.Message] = []
    try:
        async with asyncio.timeout(timeout):
            async for message in client.messages:
                received.append(message)
                if len(received) == count:
                    break
    except TimeoutError:
        got = [(str(m.topic), m.payload) for m in received[-5:]]
        raise TimeoutError(
            f"{len(received)} of {count} messages in {timeout}s; last {got}"
        ) from None
    return received


async def until_marker(
    client: aiomqtt.Client, marker: bytes, timeout: float = TIMEOUT
) -> list[aiomqtt.Message]:
    """The messages ``client`` receives before the one whose payload is ``marker``.

    Absence proven by order: publish the marker after what must not arrive (from the same
    client id, so that MQTT 4.6 orders them), then check what came before it. ``TimeoutError``
    if the marker does not come.
    """
    before: list[aiomqtt.Message] = []
    async with asyncio.timeout(timeout):
        async for message in client.messages:
            if message.payload == marker:
                return before
            before.append(message)
    raise AssertionError("unreachable: the message stream ended")


# --------------------------------------------------------------------------------------------
# paho


@dataclass
class PahoClient:
    """A paho-mqtt client on its own network thread, recording what the broker sent.

    ``pubacks`` maps message ids to the PUBACK reason code; ``disconnects`` lists the reason
    codes of the connection's ends (a v5 DISCONNECT's, or "Unspecified error" for a lost
    socket), ``disconnected_at`` when each was seen (``time.monotonic``); ``messages``
    queues received messages. It never reconnects by itself.
    ``clean_start`` and ``session_expiry`` (seconds, v5) go into CONNECT, as do
    ``receive_maximum`` and ``topic_alias_maximum`` (v5), and ``username`` / ``password``
    (bytes: any) when set; with ``manual_ack`` received QoS
    1/2 messages are acknowledged only by :meth:`ack`. (paho does not resolve the Topic
    Aliases it receives: a message sent with an alias alone has the topic "".)
    ``transport`` ``"websockets"`` speaks MQTT over WebSocket (path /mqtt); ``ca_file``
    turns TLS on (the host name checked against ``host``), ``cert`` adds a client
    certificate (PEM certificate and key); ``keep_alive`` is asked for in CONNECT and
    :attr:`connack_properties` keeps the CONNACK's (v5).
    """

    port: int
    client_id: str
    version: int = 5
    clean_start: bool = True
    session_expiry: int | None = None
    receive_maximum: int | None = None
    topic_alias_maximum: int | None = None
    manual_ack: bool = False
    username: str | None = None
    password: bytes | None = None
    transport: str = "tcp"
    host: str = HOST
    ca_file: Path | None = None
    cert: tuple[Path, Path] | None = None
    keep_alive: int = 60
    connack_properties: Properties | None = None
    connack: queue.Queue[ReasonCode] = field(default_factory=queue.Queue)
    pubacks: dict[int, ReasonCode] = field(default_factory=dict)
    disconnects: list[ReasonCode] = field(default_factory=list)
    disconnected_at: list[float] = field(default_factory=list)
    messages: queue.Queue[paho.MQTTMessage] = field(default_factory=queue.Queue)
    subacks: queue.Queue[list[ReasonCode]] = field(default_factory=queue.Queue)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        protocol = paho.MQTTv5 if self.version == 5 else paho.MQTTv311
        self.client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            protocol=protocol,
            clean_session=None if self.version == 5 else self.clean_start,
            transport=self.transport,  # type: ignore[arg-type]
        )
        if self.ca_file is not None:
            certfile, keyfile = self.cert if self.cert is not None else (None, None)
            self.client.tls_set(
                ca_certs=str(self.ca_file),
                certfile=None if certfile is None else str(certfile),
                keyfile=None if keyfile is None else str(keyfile),
            )
        self.client.on_connect = self._on_connect
        self.client.on_publish = self._on_publish
        self.client.on_disconnect = self._on_disconnect
        self.client.on_message = lambda _c, _u, message: self.messages.put(message)
        self.client.on_subscribe = lambda _c, _u, _mid, codes, _p: self.subacks.put(codes)
        self.client.manual_ack_set(self.manual_ack)
        # Every write on the network thread: without an "external event loop" registered,
        # paho writes from the caller's thread too, concurrently with the network thread's
        # loop(), and its writes are not thread-safe (over WebSocket a frame went out twice).
        self.client.on_socket_register_write = lambda _client, _userdata, _sock: None
        if self.username is not None or self.password is not None:
            self.client.username_pw_set(self.username, self.password)  # type: ignore[arg-type]

    def _on_connect(
        self, _c: object, _u: object, _f: object, rc: ReasonCode, props: Properties | None
    ) -> None:
        self.connack_properties = props
        self.connack.put(rc)

    def _on_publish(self, _c: object, _u: object, mid: int, rc: ReasonCode, _p: object) -> None:
        with self._lock:
            self.pubacks[mid] = rc

    def _on_disconnect(
        self, _c: object, _u: object, _f: object, rc: ReasonCode, _p: object
    ) -> None:
        with self._lock:
            self.disconnects.append(rc)
            self.disconnected_at.append(time.monotonic())

    def connect(self) -> ReasonCode:
        """Connect, start the network thread, and return CONNACK's reason code."""
        if self.version == 5:
            props = Properties(PacketTypes.CONNECT)
            if self.session_expiry is not None:
                props.SessionExpiryInterval = self.session_expiry
            if self.receive_maximum is not None:
                props.ReceiveMaximum = self.receive_maximum
            if self.topic_alias_maximum is not None:
                props.TopicAliasMaximum = self.topic_alias_maximum
            self.client.connect(
                self.host,
                self.port,
                keepalive=self.keep_alive,
                clean_start=self.clean_start,
                properties=props,
            )
        else:
            self.client.connect(self.host, self.port, keepalive=self.keep_alive)
        self._thread = threading.Thread(target=self._network, daemon=True)
        self._thread.start()
        return self.connack.get(timeout=TIMEOUT)

    def _network(self) -> None:
        # Not paho's loop_start(): that one reconnects by itself, and a reconnect with the
        # same client id would take the session over again behind the test's back.
        while self.client.loop(timeout=0.05) == paho.MQTT_ERR_SUCCESS:
            pass

    def subscribe(self, topic_filter: str, qos: int) -> list[ReasonCode]:
        """Subscribe and wait for SUBACK; returns its reason codes."""
        self.client.subscribe(topic_filter, qos)
        return self.subacks.get(timeout=TIMEOUT)

    def publish(
        self, topic: str, payload: bytes, qos: int, properties: Properties | None = None
    ) -> int:
        """Queue a PUBLISH (v5 ``properties`` optional); returns its message id (key of
        :attr:`pubacks`)."""
        return self.client.publish(topic, payload, qos, properties=properties).mid

    def will_set(
        self, topic: str, payload: bytes, qos: int, properties: Properties | None = None
    ) -> None:
        """Set the Will Message CONNECT will carry (before :meth:`connect`)."""
        self.client.will_set(topic, payload, qos, properties=properties)

    def ack(self, message: paho.MQTTMessage) -> None:
        """Acknowledge ``message`` (with ``manual_ack``)."""
        self.client.ack(message.mid, message.qos)

    def disconnect(self, reason_code: int) -> None:
        """Send a v5 DISCONNECT with ``reason_code`` and wait for the network thread to end."""
        reason = ReasonCode(PacketTypes.DISCONNECT, identifier=reason_code)
        self.client.disconnect(reasoncode=reason)
        if self._thread is not None:
            self._thread.join(TIMEOUT)

    def snapshot(self) -> tuple[dict[int, ReasonCode], list[ReasonCode]]:
        """Copies of (pubacks, disconnects), taken together."""
        with self._lock:
            return dict(self.pubacks), list(self.disconnects)

    def close(self) -> None:
        """Disconnect (if still connected) and wait for the network thread to end."""
        self.client.disconnect()
        if self._thread is not None:
            self._thread.join(TIMEOUT)


# --------------------------------------------------------------------------------------------
# mosquitto command-line clients


def _mosquitto(name: str) -> str:
    path = shutil.which(name)
    assert path is not None, f"{name} is not installed (mosquitto-clients, coreutils)"
    return path


class MosquittoSub:
    """``mosquitto_sub -d -v`` in the background, started once its SUBACK arrived.

    Its debug lines (``-d``) tell when it is subscribed; the other output lines are the
    received messages as ``topic payload``.
    """

    def __init__(
        self,
        port: int,
        topic_filter: str,
        *,
        qos: int,
        count: int,
        version: int = 4,
        extra: tuple[str, ...] = (),
    ) -> None:
        self.output: list[str] = []
        self._subscribed = threading.Event()
        # stdbuf: line-buffered stdout, or the SUBACK line would wait in a pipe buffer.
        argv = [
            _mosquitto("stdbuf"), "-oL",
            _mosquitto("mosquitto_sub"), "-h", HOST, "-p", str(port), "-t", topic_filter,
            "-q", str(qos), "-C", str(count), "-W", str(int(TIMEOUT * 2)), "-d", "-v",
            "-i", unique("mosq-sub"), "-V", "mqttv5" if version == 5 else "mqttv311", *extra,
        ]  # fmt: skip
        self.process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._subscribed.wait(TIMEOUT):
            self.process.kill()
            self._reader.join()
            raise AssertionError(f"mosquitto_sub got no SUBACK: {self.output}")

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line.rstrip("\n"))
            if "received SUBACK" in line:
                self._subscribed.set()

    def messages(self) -> list[str]:
        """Wait for the process to exit (count reached, or -W) and return its message lines."""
        try:
            self.process.wait(TIMEOUT * 3)
        finally:
            self.process.kill()
            self._reader.join()
        debug = ("Client ", "Subscribed (mid")
        return [line for line in self.output if not line.startswith(debug)]


def mosquitto_pub(
    port: int,
    topic: str,
    message: str,
    *,
    qos: int,
    version: int = 4,
    client_id: str | None = None,
    extra: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    """Run ``mosquitto_pub`` once (debug output captured); returns the finished process.
    ``extra`` are more options (``-u``, ``-P``, ``--will-topic``, ``--cafile``,
    ``--cert``...)."""
    argv = [
        _mosquitto("mosquitto_pub"), "-h", HOST, "-p", str(port), "-t", topic, "-m", message,
        "-q", str(qos), "-d", "-i", client_id or unique("mosq-pub"),
        "-V", "mqttv5" if version == 5 else "mqttv311", *extra,
    ]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT * 2, check=False)


# --------------------------------------------------------------------------------------------
# raw bytes


def _vbi(value: int) -> bytes:
    out = bytearray()
    while True:
        value, digit = divmod(value, 128)
        out.append(digit | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _utf8(data: bytes) -> bytes:
    return struct.pack(">H", len(data)) + data


def packet(first_byte: int, body: bytes) -> bytes:
    """One control packet: fixed header byte, Remaining Length, ``body``."""
    return bytes([first_byte]) + _vbi(len(body)) + body


def connect_packet(
    client_id: str,
    *,
    level: int = 4,
    flags: int = 0x02,
    name: bytes = b"MQTT",
    username: bytes | None = None,
    password: bytes | None = None,
) -> bytes:
    """A CONNECT (keep alive 60): protocol ``name`` and ``level`` (4 = 3.1.1, 5), ``flags``,
    and the raw User Name and Password bytes when given (their flags are set)."""
    flags |= (0x80 if username is not None else 0) | (0x40 if password is not None else 0)
    props = b"\x00" if level == 5 else b""
    body = _utf8(name) + bytes([level, flags]) + struct.pack(">H", 60) + props
    body += _utf8(client_id.encode())
    body += b"".join(_utf8(field) for field in (username, password) if field is not None)
    return packet(0x10, body)


def session_connect_packet(
    client_id: str,
    *,
    level: int,
    clean_start: bool,
    keep_alive: int = 60,
    session_expiry: int = 0,
    will: tuple[str, bytes] | None = None,
    will_delay: int = 0,
) -> bytes:
    """A CONNECT of protocol ``level`` (4 = 3.1.1, 5) with session options and an optional
    QoS 0 Will Message (topic, payload); v5 carries ``session_expiry`` and ``will_delay``
    (seconds) when they are not 0."""
    flags = (0x02 if clean_start else 0) | (0x04 if will else 0)
    body = _utf8(b"MQTT") + bytes([level, flags]) + struct.pack(">H", keep_alive)
    if level == 5:
        props = b"\x11" + struct.pack(">I", session_expiry) if session_expiry else b""
        body += _vbi(len(props)) + props
    body += _utf8(client_id.encode())
    if will is not None:
        if level == 5:
            will_props = b"\x18" + struct.pack(">I", will_delay) if will_delay else b""
            body += _vbi(len(will_props)) + will_props
        body += _utf8(will[0].encode()) + _utf8(will[1])
    return packet(0x10, body)


def publish_packet(
    topic: bytes,
    payload: bytes,
    *,
    qos: int,
    packet_id: int = 1,
    v5: bool = False,
    dup: bool = False,
) -> bytes:
    """A PUBLISH whose Topic Name is the raw ``topic`` bytes (they may be invalid UTF-8)."""
    body = _utf8(topic) + (struct.pack(">H", packet_id) if qos else b"")
    body += b"\x00" if v5 else b""
    return packet(0x30 | qos << 1 | (0x08 if dup else 0), body + payload)


def pubrel_packet(packet_id: int) -> bytes:
    """A PUBREL (its fixed header flags are 0b0010, MQTT 3.6.1)."""
    return packet(0x62, struct.pack(">H", packet_id))


def subscribe_packet(topic_filter: str, qos: int, *, packet_id: int = 1, v5: bool = True) -> bytes:
    """A SUBSCRIBE of one Topic Filter (v5: no properties, options = ``qos``)."""
    body = struct.pack(">H", packet_id) + (b"\x00" if v5 else b"")
    return packet(0x82, body + _utf8(topic_filter.encode()) + bytes([qos]))


def disconnect_packet(session_expiry: int | None = None) -> bytes:
    """A v5 DISCONNECT, Reason Code 0x00, with a Session Expiry Interval when given."""
    if session_expiry is None:
        return b"\xe0\x00"
    props = b"\x11" + struct.pack(">I", session_expiry)
    return packet(0xE0, b"\x00" + _vbi(len(props)) + props)


def enhanced_connect_packet(client_id: str, method: str, data: bytes) -> bytes:
    """A v5 CONNECT (Clean Start, keep alive 60) starting enhanced authentication (MQTT 5.0
    4.12) with Authentication ``method`` and ``data`` (properties encoded by paho)."""
    props = Properties(PacketTypes.CONNECT)
    props.AuthenticationMethod = method
    props.AuthenticationData = data
    body = _utf8(b"MQTT") + bytes([5, 0x02]) + struct.pack(">H", 60) + props.pack()
    return packet(0x10, body + _utf8(client_id.encode()))


def auth_packet(reason_code: int, method: str, data: bytes | None = None) -> bytes:
    """A v5 AUTH (MQTT 5.0 3.15) with ``reason_code``, Authentication ``method`` and ``data``."""
    props = Properties(PacketTypes.AUTH)
    props.AuthenticationMethod = method
    if data is not None:
        props.AuthenticationData = data
    return packet(0xF0, bytes([reason_code]) + props.pack())


def reason_and_properties(first: int, body: bytes) -> tuple[int, Properties]:
    """The Reason Code and properties (decoded by paho) of a v5 CONNACK, AUTH or DISCONNECT
    whose first byte and body :meth:`RawSocket.read_packet` returned."""
    kind = first >> 4
    if kind == 2:
        code, rest, packet_type = body[1], body[2:], PacketTypes.CONNACK
    elif kind == 15:
        code, rest, packet_type = body[0], body[1:], PacketTypes.AUTH
    else:
        assert kind == 14, f"not a CONNACK, AUTH or DISCONNECT: {first:#x}"
        code, rest, packet_type = (body[0] if body else 0), body[1:], PacketTypes.DISCONNECT
    props = Properties(packet_type)
    if rest:
        props.unpack(rest)
    return code, props


def publish_topic(body: bytes) -> str:
    """The Topic Name of a PUBLISH whose body (after the fixed header) is ``body``."""
    (length,) = struct.unpack_from(">H", body, 0)
    return body[2 : 2 + length].decode()


class RawSocket:
    """A plain TCP connection to a node, reading with deadlines."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection((HOST, port), timeout=TIMEOUT)

    def send(self, data: bytes) -> None:
        """Write ``data``."""
        self.sock.sendall(data)

    def connect_accepted(self, connect: bytes) -> bool:
        """Send a hand-made CONNECT, assert the CONNACK accepts it (Reason Code / return code
        0, MQTT 3.2.2.2 / 3.2.2.3) and return its Session Present flag."""
        self.send(connect)
        kind, body = self.read_packet()
        assert kind == 0x20 and body[1] == 0, (kind, body)
        return bool(body[0] & 0x01)

    def read(self, size: int, timeout: float = TIMEOUT) -> bytes:
        """Read exactly ``size`` bytes (fewer only if the server closed)."""
        self.sock.settimeout(timeout)
        data = b""
        while len(data) < size:
            chunk = self.sock.recv(size - len(data))
            if not chunk:
                break
            data += chunk
        return data

    def read_packet(self, timeout: float = TIMEOUT) -> tuple[int, bytes]:
        """The next control packet: its first byte and its body. ``AssertionError`` if the
        server closes first."""
        head = self.read(1, timeout)
        assert head, "the server closed the connection"
        length, multiplier = 0, 1
        while True:
            digit = self.read(1, timeout)
            assert digit, "the server closed the connection"
            length += (digit[0] & 0x7F) * multiplier
            multiplier *= 128
            if not digit[0] & 0x80:
                break
        body = self.read(length, timeout)
        assert len(body) == length, "the server closed the connection"
        return head[0], body

    def read_until_closed(self, timeout: float = TIMEOUT) -> bytes:
        """Everything the server sends until it closes; ``TimeoutError`` if it keeps it open."""
        self.sock.settimeout(timeout)
        deadline = time.monotonic() + timeout
        data = b""
        while True:
            try:
                chunk = self.sock.recv(4096)
            except ConnectionResetError:
                return data
            if not chunk:
                return data
            data += chunk
            if time.monotonic() > deadline:
                raise TimeoutError(f"connection still open after {timeout}s; got {data!r}")

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()

    def __enter__(self) -> RawSocket:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def log_excerpt(path: Path, needle: str) -> list[str]:
    """The lines of log file ``path`` containing ``needle`` (for failure messages)."""
    try:
        return [line for line in path.read_text(errors="replace").splitlines() if needle in line]
    except FileNotFoundError:
        return []


# --------------------------------------------------------------------------------------------
# many light publishers


class RawPublishers:
    """``count`` MQTT 3.1.1 QoS 1 publishers on raw sockets, all driven by one asyncio loop
    on one thread: hundreds of them cost little CPU, which a 2-core machine leaves to the
    broker.

    Publisher ``i`` sends ``messages`` PUBLISHes to ``topic_of(i)``, at most ``inflight``
    awaiting their PUBACK; payload ``<tag>/<i>/<seq>`` (zero-padded to ``size`` bytes).
    :attr:`acked` holds the payloads acknowledged (PUBACK received); :attr:`sent` counts
    PUBLISHes written. A publisher whose connection fails stops (its unacknowledged
    messages are not in ``acked``): it does not reconnect.
    """

    def __init__(
        self,
        port: int,
        count: int,
        messages: int,
        topic_of: Callable[[int], str],
        *,
        tag: str,
        inflight: int = 10,
        size: int = 64,
    ) -> None:
        self.port = port
        self.count = count
        self.messages = messages
        self.topic_of = topic_of
        self.tag = tag
        self.inflight = inflight
        self.size = size
        self.acked: set[bytes] = set()
        self.sent = 0
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def payload(self, publisher: int, seq: int) -> bytes:
        """The payload of message ``seq`` of ``publisher``."""
        return f"{self.tag}/{publisher:03d}/{seq:06d}".encode().ljust(self.size, b"\0")

    def start(self) -> None:
        """Connect every publisher and start publishing, in the background."""
        self._thread.start()

    def join(self, timeout: float) -> None:
        """Wait until every publisher is done (all acknowledged, or failed)."""
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"publishers still running after {timeout}s"

    def acked_count(self) -> int:
        """How many PUBLISHes were acknowledged so far."""
        with self._lock:
            return len(self.acked)

    def _run(self) -> None:
        asyncio.run(self._all())

    async def _all(self) -> None:
        await asyncio.gather(*(self._one(i) for i in range(self.count)))

    async def _one(self, index: int) -> None:
        try:
            reader, writer = await asyncio.open_connection(HOST, self.port)
        except OSError as exc:
            self.errors.append(f"publisher {index}: {exc!r}")
            return
        try:
            writer.write(connect_packet(f"rawpub-{self.tag}-{index}"))
            head = await asyncio.wait_for(reader.readexactly(4), TIMEOUT)
            assert head[0] == 0x20 and head[3] == 0, f"CONNACK refused: {head!r}"
            topic = self.topic_of(index).encode()
            pending: dict[int, bytes] = {}
            window = asyncio.Semaphore(self.inflight)
            done = asyncio.Event()

            async def read_acks() -> None:
                while pending or not done.is_set():
                    first = await asyncio.wait_for(reader.readexactly(4), TIMEOUT * 4)
                    assert first[0] == 0x40, f"expected PUBACK, got {first!r}"
                    payload = pending.pop(struct.unpack(">H", first[2:])[0])
                    with self._lock:
                        self.acked.add(payload)
                    window.release()

            acks = asyncio.create_task(read_acks())
            for seq in range(self.messages):
                await window.acquire()
                packet_id = seq % 65535 + 1
                payload = self.payload(index, seq)
                pending[packet_id] = payload
                writer.write(publish_packet(topic, payload, qos=1, packet_id=packet_id))
                with self._lock:
                    self.sent += 1
                if acks.done():
                    break
            done.set()
            await acks
            writer.write(b"\xe0\x00")  # DISCONNECT
            await writer.drain()
        except (OSError, AssertionError, asyncio.IncompleteReadError, TimeoutError) as exc:
            self.errors.append(f"publisher {index}: {exc!r}")
        finally:
            writer.close()


# --------------------------------------------------------------------------------------------
# WebSocket by hand (RFC 6455), for MQTT split across frames and several packets per frame


def ws_frame(payload: bytes, opcode: int = 0x2) -> bytes:
    """One final, masked client frame (RFC 6455 5.2)."""
    size = len(payload)
    if size < 126:
        head = bytes([0x80 | opcode, 0x80 | size])
    elif size < 65536:
        head = bytes([0x80 | opcode, 0x80 | 126]) + struct.pack(">H", size)
    else:
        head = bytes([0x80 | opcode, 0x80 | 127]) + struct.pack(">Q", size)
    mask = uuid.uuid4().bytes[:4]
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


class RawWebSocket:
    """MQTT over WebSocket on a plain (or given) socket: the opening handshake on /mqtt with
    subprotocol mqtt, then frames written as the test wants and MQTT packets read back
    across whatever frames the server used."""

    def __init__(self, sock: socket.socket, host: str = "localhost") -> None:
        self.sock = sock
        self.sock.settimeout(TIMEOUT)
        key = "dGhlIHNhbXBsZSBub25jZQ=="
        self.sock.sendall(
            (
                f"GET /mqtt HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n"
            ).encode()
        )
        response = b""
        while b"\r\n\r\n" not in response:
            chunk = self.sock.recv(4096)
            assert chunk, f"closed during the handshake: {response!r}"
            response += chunk
        self.response, self._raw = response.split(b"\r\n\r\n", 1)
        self._mqtt = b""

    def send_frames(self, *payloads: bytes) -> None:
        """Each of ``payloads`` as one binary frame, all in one write."""
        self.sock.sendall(b"".join(ws_frame(p) for p in payloads))

    def _frame(self) -> bool:
        """Take one complete server frame off the bytes read, if there is one."""
        raw = self._raw
        if len(raw) < 2:
            return False
        size, at = raw[1] & 0x7F, 2
        if size == 126:
            if len(raw) < 4:
                return False
            size, at = struct.unpack(">H", raw[2:4])[0], 4
        elif size == 127:
            if len(raw) < 10:
                return False
            size, at = struct.unpack(">Q", raw[2:10])[0], 10
        if len(raw) < at + size:
            return False
        opcode, payload = raw[0] & 0x0F, raw[at : at + size]
        assert opcode in (0x0, 0x2), f"server sent opcode {opcode}: {payload!r}"
        self._raw = raw[at + size :]
        self._mqtt += payload
        return True

    def _more(self) -> None:
        """Read until one more server frame is complete; its payload joins the MQTT stream."""
        while not self._frame():
            chunk = self.sock.recv(65536)
            assert chunk, "the server closed the connection"
            self._raw += chunk

    def read_packet(self) -> tuple[int, bytes]:
        """The next MQTT control packet: its first byte and its body."""
        while True:
            data = self._mqtt
            if len(data) >= 2:
                length, multiplier, at = 0, 1, 1
                while at < len(data):
                    length += (data[at] & 0x7F) * multiplier
                    multiplier *= 128
                    at += 1
                    if not data[at - 1] & 0x80:
                        break
                else:
                    at = -1
                if at > 0 and len(data) >= at + length:
                    self._mqtt = data[at + length :]
                    return data[0], data[at : at + length]
            self._more()

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()
