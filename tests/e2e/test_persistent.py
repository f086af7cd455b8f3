"""Persistent DEVICE sessions end to end: nothing acknowledged is lost, whatever stops.

A persistent subscriber (MQTT 3.1.1 Clean Session 0, or 5.0 with a Session Expiry Interval)
gets every QoS 1/2 message published to it while it was offline, in order, on whichever node
it reconnects to, also when ``kill -9`` hits the ingest node holding it, the router or
device_persist, or when Redis restarts. Third-party clients (paho-mqtt) throughout; raw
sockets where a test must control acknowledgements exactly.
"""

from __future__ import annotations

import struct
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.e2e.clients import HOST, TIMEOUT, RawSocket, packet, subscribe_packet, unique
from tests.servers import LocalCluster
from tests.waiting import wait_until

pytestmark = pytest.mark.cluster

#: Seconds a whole stream of messages may take to arrive after a disruption.
DRAIN = 90.0


@dataclass
class Subscriber:
    """A persistent paho subscriber that records what it receives and never reconnects by
    itself (each test says when and where)."""

    client_id: str
    version: int = 4
    received: list[tuple[bytes, bool]] = field(default_factory=list)  # (payload, DUP)
    session_present: list[bool] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _client: paho.Client | None = None
    _thread: threading.Thread | None = None

    def connect(self, port: int) -> bool:
        """Connect (persistent session) to ``port``; returns CONNACK's Session Present."""
        self.stop()
        if self.version == 5:
            client = paho.Client(
                CallbackAPIVersion.VERSION2, client_id=self.client_id, protocol=paho.MQTTv5
            )
        else:
            client = paho.Client(
                CallbackAPIVersion.VERSION2,
                client_id=self.client_id,
                protocol=paho.MQTTv311,
                clean_session=False,
            )
        connected = threading.Event()

        def on_connect(_c: object, _u: object, flags: object, rc: object, _p: object) -> None:
            with self._lock:
                self.session_present.append(bool(getattr(flags, "session_present", False)))
            connected.set()

        client.on_connect = on_connect
        client.on_message = self._on_message
        if self.version == 5:
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = 3600
            client.connect(HOST, port, keepalive=60, clean_start=False, properties=props)
        else:
            client.connect(HOST, port, keepalive=60)
        self._client = client
        self._thread = threading.Thread(target=self._network, args=(client,), daemon=True)
        self._thread.start()
        assert connected.wait(TIMEOUT), "no CONNACK"
        with self._lock:
            return self.session_present[-1]

    def _network(self, client: paho.Client) -> None:
        while client.loop(timeout=0.05) == paho.MQTT_ERR_SUCCESS:
            pass

    def _on_message(self, _c: object, _u: object, message: paho.MQTTMessage) -> None:
        with self._lock:
            self.received.append((bytes(message.payload), bool(message.dup)))

    def subscribe(self, topic_filter: str, qos: int) -> None:
        """Subscribe and wait until the broker granted it."""
        assert self._client is not None
        granted = threading.Event()
        self._client.on_subscribe = lambda *_args: granted.set()
        self._client.subscribe(topic_filter, qos)
        assert granted.wait(TIMEOUT), "no SUBACK"

    def connected(self) -> bool:
        """Whether the network thread still runs (the connection is up)."""
        return self._thread is not None and self._thread.is_alive()

    def payloads(self) -> list[bytes]:
        """Every payload received so far, in arrival order (duplicates included)."""
        with self._lock:
            return [payload for payload, _ in self.received]

    def first_copies(self) -> list[bytes]:
        """Payloads received, each at its first arrival, in arrival order."""
        seen: set[bytes] = set()
        out = []
        for payload in self.payloads():
            if payload not in seen:
                seen.add(payload)
                out.append(payload)
        return out

    def duplicates(self) -> list[tuple[bytes, bool]]:
        """Repeated arrivals (payload, DUP flag)."""
        seen: set[bytes] = set()
        out = []
        with self._lock:
            for payload, dup in self.received:
                if payload in seen:
                    out.append((payload, dup))
                seen.add(payload)
        return out

    def stop(self, clean: bool = True) -> None:
        """End the connection (with DISCONNECT if ``clean``) and its network thread."""
        if self._client is None:
            return
        if clean:
            self._client.disconnect()
        else:
            sock = self._client.socket()
            if sock is not None:
                sock.close()
        if self._thread is not None:
            self._thread.join(TIMEOUT)
        self._client = None


@dataclass
class Publisher:
    """A paho QoS 1 publisher on its own thread; ``acked`` holds the acknowledged payloads."""

    port: int
    sent: int = 0
    _acked: set[bytes] = field(default_factory=set)
    _acked_mids: deque[int] = field(default_factory=deque)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.client = paho.Client(
            CallbackAPIVersion.VERSION2, client_id=unique("pub"), protocol=paho.MQTTv311
        )
        self.client.max_inflight_messages_set(50)
        self.client.max_queued_messages_set(0)
        self._mids: dict[int, bytes] = {}
        self.client.on_publish = self._on_publish
        self.client.connect(HOST, self.port, keepalive=60)
        self.client.loop_start()

    def _on_publish(self, _c: object, _u: object, mid: int, rc: object, _p: object) -> None:
        # paho calls this holding its outgoing-message lock, which publish() takes while it
        # holds self._lock: taking self._lock here could deadlock, so the mid only waits.
        self._acked_mids.append(mid)

    def _resolve(self) -> None:
        """Turn acknowledged mids into payloads (with self._lock held)."""
        while self._acked_mids:
            payload = self._mids.pop(self._acked_mids.popleft(), None)
            if payload is not None:
                self._acked.add(payload)

    @property
    def acked(self) -> set[bytes]:
        """The payloads acknowledged so far (a copy)."""
        with self._lock:
            self._resolve()
            return set(self._acked)

    def publish(self, topic: str, payloads: list[bytes], pace: float = 0.0) -> None:
        """Publish ``payloads`` at QoS 1, ``pace`` seconds apart (0: as fast as allowed)."""
        for payload in payloads:
            with self._lock:
                self._resolve()  # before paho can hand out an acknowledged mid again
                info = self.client.publish(topic, payload, qos=1)
                self._mids[info.mid] = payload
                self.sent += 1
            if pace:
                time.sleep(pace)  # the publishing rate, not a synchronisation

    def wait_acked(self, count: int, timeout: float = DRAIN) -> None:
        """Wait until ``count`` PUBLISHes are acknowledged."""
        wait_until(lambda: len(self.acked) >= count, f"{count} PUBACKs", timeout)

    def close(self) -> None:
        """Disconnect and stop the network thread."""
        self.client.disconnect()
        self.client.loop_stop()


def _numbered(count: int, tag: str = "m") -> list[bytes]:
    return [f"{tag}{i:05d}".encode() for i in range(count)]


@pytest.mark.parametrize("version", [4, 5], ids=["v311", "v5"])
def test_an_offline_persistent_subscriber_gets_every_message_in_order(
    cluster: LocalCluster, version: int
) -> None:
    node1, node2 = cluster.node_ports
    topic = unique("e2e/persist")
    sub = Subscriber(unique("psub"), version)
    assert sub.connect(node1) is False
    sub.subscribe(topic, 1)
    sub.stop()
    publisher = Publisher(node2)
    try:
        payloads = _numbered(500)
        publisher.publish(topic, payloads)
        publisher.wait_acked(500)
    finally:
        publisher.close()
    # Back through HAProxy: either node; the session and its messages follow.
    assert sub.connect(cluster.mqtt_port) is True
    try:
        wait_until(lambda: len(sub.first_copies()) >= 500, "500 stored messages", DRAIN)
        assert sub.first_copies() == payloads
        assert all(dup for _, dup in sub.duplicates()), "a repeat without DUP"
    finally:
        sub.stop()


@pytest.mark.disruptive
@pytest.mark.parametrize("victim", ["ingest-node1", "router", "device-persist"])
def test_kill_9_of_any_stage_loses_no_acknowledged_message(
    cluster: LocalCluster, victim: str
) -> None:
    node1, node2 = cluster.node_ports
    topic = unique("e2e/kill")
    sub = Subscriber(unique("ksub"))
    sub.connect(node1)
    sub.subscribe(topic, 1)
    publisher = Publisher(node2)
    payloads = _numbered(600)
    try:
        publisher.publish(topic, payloads[:200], pace=0.002)
        wait_until(lambda: len(sub.first_copies()) >= 50, "the first deliveries", DRAIN)
        assert cluster.kill(victim)
        publisher.publish(topic, payloads[200:400], pace=0.002)  # while it is down
        cluster.start(victim)
        if not sub.connected():
            sub.connect(node2)  # its node died: the session goes on elsewhere
        publisher.publish(topic, payloads[400:], pace=0.002)
        publisher.wait_acked(len(payloads))
        acked = set(publisher.acked)
        wait_until(lambda: acked <= set(sub.payloads()), "every acknowledged message", DRAIN)
    finally:
        publisher.close()
        sub.stop()
    lost = acked - set(sub.payloads())
    assert lost == set(), f"{len(lost)} acknowledged messages lost"
    assert len(acked) == len(payloads)
    # Per-publisher order holds for first arrivals (MQTT 4.6).
    assert [p for p in sub.first_copies() if p in acked] == sorted(acked)


@pytest.mark.disruptive
def test_stored_messages_survive_a_redis_kill(cluster: LocalCluster) -> None:
    node1, node2 = cluster.node_ports
    topic = unique("e2e/redis")
    sub = Subscriber(unique("rsub"))
    sub.connect(node1)
    sub.subscribe(topic, 1)
    sub.stop()
    publisher = Publisher(node2)
    payloads = _numbered(50)
    try:
        publisher.publish(topic, payloads)
        publisher.wait_acked(len(payloads))
    finally:
        publisher.close()
    assert cluster.kill("redis")
    cluster.start("redis")  # loads the append-only file
    sub.connect(cluster.mqtt_port)
    try:
        wait_until(lambda: len(sub.first_copies()) >= 50, "50 stored messages", DRAIN)
    finally:
        sub.stop()
    assert sub.first_copies() == payloads


# ------------------------------------------------------------------ raw MQTT 5 subscriber


def _str(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">H", len(data)) + data


def _v5_connect(client_id: str, receive_maximum: int = 65535) -> bytes:
    """A v5 CONNECT, Clean Start 0, Session Expiry Interval 3600 s, ``receive_maximum``."""
    props = b"\x11" + struct.pack(">I", 3600) + b"\x21" + struct.pack(">H", receive_maximum)
    body = _str("MQTT") + bytes([5, 0x00]) + struct.pack(">H", 60)
    body += bytes([len(props)]) + props + _str(client_id)
    return packet(0x10, body)


def _ack(kind: int, packet_id: int) -> bytes:
    """A v5 PUBACK (0x40), PUBREC (0x50), PUBREL (0x62) or PUBCOMP (0x70), success."""
    return packet(kind, struct.pack(">H", packet_id))


@dataclass
class Received:
    """One packet read from the server: first byte and body."""

    first: int
    body: bytes

    @property
    def kind(self) -> int:
        """The packet type (3 PUBLISH, 6 PUBREL...)."""
        return self.first >> 4

    def publish(self) -> tuple[int, bool, bytes]:
        """(Packet Identifier, DUP, payload) of a v5 PUBLISH (Packet Identifier 0: QoS 0)."""
        (topic_len,) = struct.unpack_from(">H", self.body, 0)
        offset = 2 + topic_len
        packet_id = 0
        if self.first & 0x06:
            (packet_id,) = struct.unpack_from(">H", self.body, offset)
            offset += 2
        props_len = self.body[offset]  # < 128 here: one byte of Variable Byte Integer
        return packet_id, bool(self.first & 0x08), self.body[offset + 1 + props_len :]


def _read_packet(sock: RawSocket, timeout: float = TIMEOUT) -> Received | None:
    head = sock.read(1, timeout)
    if not head:
        return None
    length, shift = 0, 0
    while True:
        byte = sock.read(1, timeout)[0]
        length |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    return Received(head[0], sock.read(length, timeout))


def _expect(sock: RawSocket, kind: int, timeout: float = TIMEOUT) -> Received:
    """The next packet of type ``kind``, skipping none; AssertionError otherwise."""
    got = _read_packet(sock, timeout)
    assert got is not None and got.kind == kind, f"expected type {kind}, got {got}"
    return got


def _raw_subscriber(port: int, client_id: str, topic: str, qos: int, rm: int = 65535) -> RawSocket:
    sock = RawSocket(port)
    sock.send(_v5_connect(client_id, rm))
    _expect(sock, 2)  # CONNACK
    if topic:
        sock.send(subscribe_packet(topic, qos))
        _expect(sock, 9)  # SUBACK
    return sock


def test_qos2_delivery_is_exactly_once_across_a_reconnect_between_pubrec_and_pubrel(
    cluster: LocalCluster,
) -> None:
    node1, node2 = cluster.node_ports
    topic = unique("e2e/qos2")
    client_id = unique("q2sub")
    sock = _raw_subscriber(node1, client_id, topic, 2)
    publisher = paho.Client(CallbackAPIVersion.VERSION2, client_id=unique("q2pub"))
    publisher.connect(HOST, node2)
    publisher.loop_start()
    try:
        publisher.publish(topic, b"exactly once", qos=2).wait_for_publish(TIMEOUT)
        packet_id, dup, payload = _expect(sock, 3).publish()
        assert (dup, payload) == (False, b"exactly once")
        sock.send(_ack(0x50, packet_id))  # PUBREC ...
        sock.close()  # ... and gone before PUBREL
        sock = _raw_subscriber(node2, client_id, "", 2)
        # The server resumes the flow: PUBREL, or (if the PUBREC was not applied yet) the
        # same PUBLISH with DUP, which the receiver answers without delivering it again.
        while True:
            got = _read_packet(sock)
            assert got is not None, "connection closed"
            if got.kind == 6:
                assert struct.unpack(">H", got.body[:2])[0] == packet_id
                sock.send(_ack(0x70, packet_id))  # PUBCOMP
                break
            assert got.kind == 3, got
            again, again_dup, _ = got.publish()
            assert (again, again_dup) == (packet_id, True), "a second delivery"
            sock.send(_ack(0x50, packet_id))
        # And no other delivery of it: the publisher's next message is the next to come.
        publisher.publish(topic, b"marker", qos=2).wait_for_publish(TIMEOUT)
        marker_id, _, payload = _expect(sock, 3).publish()
        assert payload == b"marker" and marker_id != 0
    finally:
        publisher.loop_stop()
        publisher.disconnect()
        sock.close()


def test_stored_deliveries_respect_the_clients_receive_maximum(cluster: LocalCluster) -> None:
    node1, node2 = cluster.node_ports
    topic = unique("e2e/rmax")
    client_id = unique("rmsub")
    sock = _raw_subscriber(node1, client_id, topic, 1, rm=2)
    publisher = Publisher(node2)
    try:
        publisher.publish(topic, _numbered(5))
        publisher.wait_acked(5)
        first = [_expect(sock, 3).publish() for _ in range(2)]
        # Two in flight: the third waits for a PUBACK, while a QoS 0 message published
        # after all five (it takes no window slot) overtakes it.
        publisher.client.publish(topic, b"marker", qos=0)
        assert _expect(sock, 3).publish()[2] == b"marker"
        sock.send(_ack(0x40, first[0][0]))
        third = _expect(sock, 3).publish()
        got = [payload for _, _, payload in [*first, third]]
        assert got == _numbered(3)
    finally:
        publisher.close()
        sock.close()
