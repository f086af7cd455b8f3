"""Fuzz targets over the sans-IO MQTT core: each takes bytes and raises on a bug.

Three targets, one per part of the core a hostile client reaches:

- :func:`decoder`: the stream decoder (:class:`~services.common.mqtt.codec.StreamDecoder`,
  server side), fed in slices. It may refuse input only with an ``MQTTError`` (MQTT 4.13);
  every packet it returns must survive ``encode`` and decode again to an equal packet.
- :func:`connect`: a whole connection (:class:`~services.ingest.connection.ServerConnection`)
  fed the bytes as one client stream, every Kafka write acknowledged at once: CONNECT
  (every flag, property and version), AUTH, and whatever follows.
- :func:`connection`: the connection's state machine driven by the input, after a
  well-formed CONNECT of the version the input picks: client bytes,
  Kafka writes acknowledged or failed in any order, routed messages, keep-alive expiry,
  session takeover, the socket lost, the node shutting down.

Oracles, beyond "no exception escapes" (the core turns bad input into effects): every byte
the server sends decodes as valid MQTT for the connection's version, and nothing is sent
after the connection said to close. :func:`check` runs a target on one input; the atheris
runner is ``python -m tests.fuzz`` (tests/fuzz/__main__.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable

import atheris

from services.common.mqtt.codec import StreamDecoder, encode
from services.common.mqtt.errors import MQTTError
from services.common.mqtt.packets import Connect, Packet, PingReq, Subscribe, Unsubscribe
from services.common.mqtt.properties import Properties
from services.common.records import PublishMeta, SessionRecord, Target
from services.common.settings import Settings
from services.common.subscription import Subscription
from services.ingest.connection import ServerConnection
from services.ingest.effects import Close, CreateAppTopic, Effect, Send, StoreEffect, SyncState
from services.ingest.fan_out import FanOut
from services.ingest.limits import Limits
from services.ingest.state import ServerContext

NOW_MS = 1_700_000_000_000
CONNECTION_ID = bytes(range(16))

#: Largest slice of input fed to the decoder at once (bytes).
MAX_SLICE = 64


class FuzzFinding(AssertionError):
    """An input broke an oracle (the message says which)."""


def decoder(data: bytes) -> None:
    """Feed ``data[1:]`` to a server-side decoder in slices of ``data[0] % MAX_SLICE + 1``
    bytes; check each decoded packet's round trip through ``encode``."""
    if not data:
        return
    size = data[0] % MAX_SLICE + 1
    stream = StreamDecoder()
    for start in range(1, len(data), size):
        try:
            packets = stream.feed(data[start : start + size])
        except MQTTError:
            return  # refused as the spec requires: the connection closes
        version = stream.protocol_version or 5
        for packet in packets:
            _round_trip(packet, version)


def _round_trip(packet: Packet, version: int) -> None:
    try:
        encoded = encode(packet, version)
    except ValueError as exc:
        raise FuzzFinding(f"decoded but not encodable: {packet!r}: {exc}") from exc
    again = StreamDecoder(protocol_version=None if isinstance(packet, Connect) else version)
    [copy] = again.feed(encoded)
    if copy != packet:
        raise FuzzFinding(f"round trip changed {packet!r} into {copy!r}")


class _Harness:
    """One :class:`ServerConnection` and a client-side view of what it sends."""

    def __init__(self) -> None:
        self.now = NOW_MS
        ids = itertools.count(1)
        context = ServerContext(
            Limits.from_settings(Settings.model_construct()),
            "node-a",
            self._previous,
            lambda: self.now,
            lambda: f"assigned-{next(ids)}",
        )
        self.conn = ServerConnection(context, CONNECTION_ID)
        self.pending: list[int] = []  # tokens of store effects not answered yet
        self.sent = bytearray()
        self.closed = False

    @staticmethod
    def _previous(client_id: str) -> tuple[SessionRecord | None, list[Subscription]]:
        return None, []

    def apply(self, effects: Iterable[Effect]) -> None:
        """Check and keep what the connection asked for."""
        for effect in effects:
            if isinstance(effect, Send):
                if self.closed:
                    raise FuzzFinding(f"sent {effect.data!r} after Close")
                self.sent += effect.data
            elif isinstance(effect, Close):
                self.closed = True
            elif isinstance(effect, StoreEffect | CreateAppTopic | SyncState):
                self.pending.append(effect.token)

    def check_output(self) -> None:
        """Everything sent decodes as server-to-client MQTT of the connection's version."""
        if not self.sent:
            return
        version = self.conn.state.protocol_version
        view = StreamDecoder(protocol_version=version if version in (3, 4, 5) else 4)
        try:
            packets = view.feed(bytes(self.sent))
        except MQTTError as exc:
            sent = bytes(self.sent)
            raise FuzzFinding(f"the server sent invalid MQTT {sent!r}: {exc!r}") from exc
        for packet in packets:
            if isinstance(packet, _CLIENT_TO_SERVER):
                raise FuzzFinding(f"the server sent a client's packet {packet!r}")


#: Packets only a client sends.
_CLIENT_TO_SERVER = (Connect, Subscribe, Unsubscribe, PingReq)


def connect(data: bytes) -> None:
    """Feed ``data`` to a connection as one client stream, in slices as :func:`decoder`
    does, acknowledging every Kafka write at once."""
    if not data:
        return
    size = data[0] % MAX_SLICE + 1
    harness = _Harness()
    for start in range(1, len(data), size):
        harness.apply(harness.conn.receive_data(data[start : start + size]))
        while harness.pending and not harness.conn.closed:
            harness.apply(harness.conn.stored(harness.pending.pop(0)))
        if harness.conn.closed:
            break
    harness.check_output()


#: What :func:`connection` can do next, chosen by one byte of the input each time.
_OPERATIONS = 10


def connection(data: bytes) -> None:
    """Drive a connection's state machine with the operations the input chooses."""
    fdp = atheris.FuzzedDataProvider(data)
    harness = _Harness()
    conn = harness.conn
    # A well-formed CONNECT first: the operations start at the states after it.
    version = fdp.PickValueInList([3, 4, 5])
    properties = Properties()
    if version == 5:
        properties.session_expiry_interval = fdp.PickValueInList([None, 0, 60])
        properties.receive_maximum = fdp.PickValueInList([None, 1, 2, 100])
    first = Connect(
        version, "c1", fdp.ConsumeBool(), fdp.ConsumeIntInRange(0, 60), properties=properties
    )
    harness.apply(conn.receive_data(encode(first, version)))
    for _ in range(64):
        if fdp.remaining_bytes() == 0 or conn.closed:
            break
        operation = fdp.ConsumeIntInRange(0, _OPERATIONS - 1)
        effects: list[Effect] = []
        if operation <= 3:  # the client sends bytes (most of the time)
            effects = conn.receive_data(fdp.ConsumeBytes(fdp.ConsumeIntInRange(1, 256)))
        elif operation == 4 and harness.pending:  # Kafka answers one write, in any order
            token = harness.pending.pop(fdp.ConsumeIntInRange(0, len(harness.pending) - 1))
            effects = conn.stored(token)
        elif operation == 5 and harness.pending:
            token = harness.pending.pop(fdp.ConsumeIntInRange(0, len(harness.pending) - 1))
            effects = conn.store_failed(token)
        elif operation == 6:  # a routed message for this client
            effects = _deliver(conn, fdp)
        elif operation == 7:
            harness.now += fdp.ConsumeIntInRange(0, 120_000)
            effects = conn.keep_alive_expired()
        elif operation == 8:
            effects = conn.taken_over(fdp.ConsumeBool())
        else:
            ending: Callable[[], list[Effect]] = (
                conn.connection_lost if fdp.ConsumeBool() else conn.shutting_down
            )
            effects = ending()
        harness.apply(effects)
    harness.check_output()


#: Topic Names of routed messages: valid ones, as the router only routes what ingest took.
_TOPICS = ["t", "a/b/c", "a/b-c/d", "é/ü/✓", "x" * 300]


def _deliver(conn: ServerConnection, fdp: atheris.FuzzedDataProvider) -> list[Effect]:
    qos = fdp.ConsumeIntInRange(0, 2)
    meta = PublishMeta(
        fdp.PickValueInList(_TOPICS),
        qos,
        fdp.ConsumeBool(),
        NOW_MS - fdp.ConsumeIntInRange(0, 10_000),
        5,
    )
    target = Target(
        conn.client_id or "c",
        qos,
        fdp.ConsumeBool(),
        tuple(fdp.ConsumeIntInRange(1, 268_435_455) for _ in range(fdp.ConsumeIntInRange(0, 2))),
        fdp.ConsumeIntInRange(0, 65_535) if qos else 0,
        fdp.ConsumeBool() if qos else False,
    )
    return conn.deliver_routed(FanOut(meta, fdp.ConsumeBytes(16), NOW_MS), target)


#: Every target by name (the corpus directory of each is tests/fuzz/corpus/<name>).
TARGETS: dict[str, Callable[[bytes], None]] = {
    "decoder": decoder,
    "connect": connect,
    "connection": connection,
}


def check(name: str, data: bytes) -> None:
    """Run target ``name`` on ``data``; raises what the target raises."""
    TARGETS[name](data)
