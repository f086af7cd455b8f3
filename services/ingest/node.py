"""The ingest node: the clients connected here, and the Kafka side of their effects.

:class:`IngestNode` keeps the registry of connected clients by id, carries out the
``Store*`` effects of every connection on Kafka (in order per connection, acknowledgements
pipelined), hands downlink records to the target clients, and applies ``client.sessions``
records from other nodes: a newer connection of one of its clients elsewhere takes the
session over (MQTT 3.1.4-3); a stale "disconnected" record written after this node's own
connect record is corrected by writing the connect record again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from services.common.kafka.names import TopicNames
from services.common.mqtt.codec import encode
from services.common.mqtt.packets import PacketType, Publish
from services.common.mqtt.properties import Properties, decode_properties
from services.common.records import (
    HEADER_META,
    PublishMeta,
    SessionRecord,
    Target,
    decode_session,
    decode_subscriptions,
    encode_meta,
    encode_session,
    encode_subscriptions,
)
from services.common.settings import Settings
from services.common.topics.trie import Subscription
from services.ingest.connection import ServerConnection
from services.ingest.effects import (
    Close,
    Connected,
    Effect,
    Send,
    StorePublish,
    StoreSession,
    StoreSubscriptions,
)
from services.ingest.handle_connect import session_record

log = logging.getLogger(__name__)

Headers = list[tuple[str, bytes]]
SendRecord = Callable[[str, bytes, bytes | None, Headers | None], Awaitable[Awaitable[object]]]
"""``await send(topic, key, value, headers)`` queues a record and returns a future that
resolves with the record's metadata (it has an ``offset``) once Kafka acknowledged it."""


class Client(Protocol):
    """What the node needs of a connected client's transport shell."""

    connection: ServerConnection
    connect_offset: int | None

    def write(self, data: bytes) -> None:
        """Queue ``data`` on the socket."""

    def close(self) -> None:
        """Close the socket after the queued data."""


@dataclass
class _StoreQueue:
    """Store effects of one connection, sent to Kafka one by one in order."""

    items: deque[tuple[Client, Effect]] = field(default_factory=deque)
    task: asyncio.Task[None] | None = None


class IngestNode:
    """Registry of this node's clients plus the Kafka side of their effects.

    ``send`` produces a record (see :data:`SendRecord`); ``sync_state`` returns once the
    state topics have been applied up to their current end; ``settings`` gives the node id,
    topic names and the Kafka request timeout (seconds).
    """

    def __init__(
        self, settings: Settings, send: SendRecord, sync_state: Callable[[], Awaitable[None]]
    ) -> None:
        self.settings = settings
        self.sync_state = sync_state
        self.names = TopicNames.from_settings(settings)
        self._send = send
        self.clients: dict[str, Client] = {}
        self.sessions: dict[str, SessionRecord] = {}
        self.subscriptions: dict[str, list[Subscription]] = {}
        self._queues: dict[int, _StoreQueue] = {}
        self._background: set[asyncio.Task[None]] = set()

    # ----------------------------------------------------------------------------------------
    # state topics

    def previous_session(self, client_id: str) -> tuple[SessionRecord | None, list[Subscription]]:
        """The latest session record and subscriptions of ``client_id`` known to this node."""
        return self.sessions.get(client_id), self.subscriptions.get(client_id, [])

    def apply_state(
        self, topic: str, key: bytes, value: bytes | None, offset: int, headers: object = ()
    ) -> None:
        """Apply one ``client.sessions`` / ``client.subscriptions`` record (the state reader).

        Raises ``RecordError`` / ``UnicodeDecodeError`` on garbage (the reader skips it).
        """
        client_id = key.decode("utf-8")
        if topic == self.names.client_subscriptions:
            if value is None:
                self.subscriptions.pop(client_id, None)
            else:
                self.subscriptions[client_id] = decode_subscriptions(client_id, value)
            return
        record = None if value is None else decode_session(value)
        if record is None:
            self.sessions.pop(client_id, None)
        else:
            self.sessions[client_id] = record
        self._check_ownership(client_id, record, offset)

    def _check_ownership(self, client_id: str, record: SessionRecord | None, offset: int) -> None:
        client = self.clients.get(client_id)
        if client is None or client.connect_offset is None or offset <= client.connect_offset:
            return  # not ours, or older than our own connect record
        if record is not None and record.connection_id == client.connection.state.connection_id:
            return
        if record is not None and record.connected:
            log.info(
                "client %r connected elsewhere (node %s): taking over", client_id, record.node_id
            )
            self.clients.pop(client_id, None)
            self.run(client, client.connection.taken_over())
        else:
            # An older connection's end record landed after ours: say again who holds it.
            state = client.connection.state
            self.run(client, [StoreSession(state.new_token(), session_record(state, True))])

    # ----------------------------------------------------------------------------------------
    # effects

    def run(self, client: Client, effects: list[Effect]) -> None:
        """Carry out ``effects`` of ``client``'s connection, in order."""
        for effect in effects:
            if isinstance(effect, Send):
                client.write(effect.data)
            elif isinstance(effect, Close):
                log.debug("closing %r: %s", client.connection.client_id, effect.reason)
                client.close()
            elif isinstance(effect, Connected):
                self._register(client, effect.client_id)
            else:
                self._enqueue_store(client, effect)

    def _register(self, client: Client, client_id: str) -> None:
        old = self.clients.get(client_id)
        self.clients[client_id] = client
        if old is not None and old is not client:
            log.info("client %r reconnected on this node: taking over", client_id)
            self.run(old, old.connection.taken_over())

    def unregister(self, client: Client) -> None:
        """Forget ``client`` (its socket closed) unless a newer connection replaced it."""
        client_id = client.connection.client_id
        if self.clients.get(client_id) is client:
            del self.clients[client_id]

    def _enqueue_store(self, client: Client, effect: Effect) -> None:
        queue = self._queues.setdefault(id(client), _StoreQueue())
        queue.items.append((client, effect))
        if queue.task is None:
            queue.task = asyncio.create_task(self._drain(id(client), queue))

    async def _drain(self, key: int, queue: _StoreQueue) -> None:
        """Send queued store effects in order; their acknowledgements complete concurrently."""
        try:
            while queue.items:
                client, effect = queue.items.popleft()
                topic, record_key, value, headers = self._record_of(client, effect)
                token = effect.token  # type: ignore[union-attr]
                try:
                    pending = await self._send(topic, record_key, value, headers)
                except Exception as exc:  # Kafka unreachable or the record refused
                    log.warning("could not queue a record for %s: %r", topic, exc)
                    self.run(client, client.connection.store_failed(token))
                    continue
                task = asyncio.create_task(self._await_ack(client, effect, token, pending))
                self._background.add(task)
                task.add_done_callback(self._background.discard)
        finally:
            queue.task = None
            if not queue.items:
                self._queues.pop(key, None)

    async def _await_ack(
        self, client: Client, effect: Effect, token: int, pending: Awaitable[object]
    ) -> None:
        try:
            metadata = await asyncio.wait_for(pending, self.settings.kafka_request_timeout_seconds)
        except Exception as exc:
            log.warning("Kafka did not store a record of %r: %r", client.connection.client_id, exc)
            self.run(client, client.connection.store_failed(token))
            return
        if isinstance(effect, StoreSession) and effect.record is not None:
            offset = getattr(metadata, "offset", None)
            if effect.record.connected and isinstance(offset, int):
                client.connect_offset = max(client.connect_offset or -1, offset)
        self.run(client, client.connection.stored(token))

    def _record_of(
        self, client: Client, effect: Effect
    ) -> tuple[str, bytes, bytes | None, Headers | None]:
        key = client.connection.client_id.encode("utf-8")
        if isinstance(effect, StorePublish):
            return (
                self.names.msg_all,
                key,
                effect.payload,
                [(HEADER_META, encode_meta(effect.meta))],
            )
        if isinstance(effect, StoreSubscriptions):
            value = encode_subscriptions(effect.subscriptions) if effect.subscriptions else None
            return self.names.client_subscriptions, key, value, None
        if isinstance(effect, StoreSession):
            value = None if effect.record is None else encode_session(effect.record)
            return self.names.client_sessions, key, value, None
        raise TypeError(f"not a store effect: {effect!r}")

    # ----------------------------------------------------------------------------------------
    # downlink

    def deliver(self, meta: PublishMeta, payload: bytes, targets: list[Target]) -> int:
        """Send one downlink record to its targets connected here; returns how many got it.

        QoS 0 packets are encoded once per variant (protocol version, RETAIN, Subscription
        Identifiers) and the same bytes go to every socket (DESIGN.md: encode-once fan-out).
        """
        shared_props: Properties | None = None
        encoded: dict[tuple[int, bool, tuple[int, ...]], bytes] = {}
        delivered = 0
        for target in targets:
            client = self.clients.get(target.client_id)
            if client is None:
                continue
            version = client.connection.state.protocol_version
            retain = meta.retain and target.retain_as_published
            props = Properties()
            if version == 5:
                if shared_props is None:
                    shared_props = _forwarded(meta)
                props = dataclasses.replace(
                    shared_props, subscription_identifiers=list(target.subscription_identifiers)
                )
            packet = Publish(meta.topic, payload, target.qos, retain, False, None, props)
            ready = None
            if target.qos == 0:
                variant = (version, retain, target.subscription_identifiers if version == 5 else ())
                ready = encoded.get(variant)
                if ready is None:
                    ready = encoded[variant] = encode(packet, version)
            self.run(client, client.connection.deliver(packet, ready))
            delivered += 1
        return delivered


def _forwarded(meta: PublishMeta) -> Properties:
    """The publisher's forwarded MQTT 5 properties, decoded (empty when there are none)."""
    if not meta.properties:
        return Properties()
    props, _ = decode_properties(meta.properties, 0, PacketType.PUBLISH)
    return props
