"""The ingest node: the clients connected here, and the Kafka side of their effects.

:class:`IngestNode` keeps the registry of connected clients by id, carries out the
``Store*`` effects of every connection on Kafka (in order per connection, acknowledgements
pipelined), hands downlink records to the target clients, and applies ``client.sessions``
records from other nodes: a newer connection of one of its clients elsewhere takes the
session over (MQTT 3.1.4-3); a record of an older connection written after this node's own
connect record is corrected by writing the connection's record again.

It also holds the timers of Will Messages waiting out their Will Delay Interval: a new
connection of the client, here (registration) or on another node (its connected session
record), settles such a will as :func:`services.ingest.will.published_on_new_connection`
says; at shutdown the waiting ones are published at once, before the producer stops.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Protocol

from services.common.faust_app import Headers, SendRecord
from services.common.kafka.names import TopicNames
from services.common.mqtt.codec import encode
from services.common.mqtt.packets import PacketType, Publish
from services.common.mqtt.properties import Properties, decode_properties
from services.common.records import (
    HEADER_META,
    HEADER_RETAINED_REQUEST,
    PublishMeta,
    SessionRecord,
    Target,
    decode_session,
    decode_subscriptions,
    encode_ack,
    encode_event,
    encode_meta,
    encode_session,
    encode_subscriptions,
    expiry_deadline,
)
from services.common.settings import Settings
from services.common.topics.trie import Subscription
from services.ingest import delivery, will
from services.ingest.connection import ServerConnection
from services.ingest.effects import (
    Close,
    Connected,
    CreateAppTopic,
    Effect,
    PublishWill,
    RecordEvent,
    Send,
    StoreAcks,
    StoreEffect,
    StorePublish,
    StoreRetained,
    StoreRetainedRequest,
    StoreSession,
    StoreSubscriptions,
)
from services.ingest.handle_connect import orphaned_session_end

log = logging.getLogger(__name__)

#: Seconds a node's shutdown waits for its last records (end records, wills) to be stored.
SHUTDOWN_FLUSH_SECONDS = 10.0


def now_ms() -> int:
    """Unix time in milliseconds."""
    return time.time_ns() // 1_000_000


EnsureAppTopic = Callable[[str], Awaitable[None]]
"""``await ensure(client_id)`` returns once the client's ``msg.app.<client>`` topic exists
(created if it did not); raises if it cannot be made sure of."""


class Client(Protocol):
    """What the node needs of a connected client's transport shell."""

    connection: ServerConnection
    connect_offset: int | None

    def write(self, data: bytes) -> None:
        """Queue ``data`` on the socket."""

    def close(self) -> None:
        """Close the socket after the queued data."""

    def pause_reading(self) -> None:
        """Stop reading from the socket (the client's sends back up in TCP)."""

    def resume_reading(self) -> None:
        """Read from the socket again."""


@dataclass
class _StoreQueue:
    """Store effects of one connection, sent to Kafka one by one in order; a Will Message
    published at once goes the same way, behind the client's last PUBLISHes (MQTT 4.6)."""

    items: deque[tuple[Client, StoreEffect | PublishWill]] = field(default_factory=deque)
    task: asyncio.Task[None] | None = None


@dataclass
class _WaitingWill:
    """A Will Message waiting out its delay: its timer, and the connection it belongs to
    (``connection_id``, ``connect_offset``) to tell that connection's records from newer ones."""

    timer: asyncio.TimerHandle
    connection_id: bytes
    connect_offset: int | None
    meta: PublishMeta
    payload: bytes


class IngestNode:
    """Registry of this node's clients plus the Kafka side of their effects.

    ``send`` produces a record (see :data:`SendRecord`); ``sync_state`` returns once the
    state topics have been applied up to their current end; ``ensure_app_topic`` makes
    sure of a persistent APPLICATION client's topic (:data:`EnsureAppTopic`); ``settings``
    gives the node id, topic names and the Kafka request timeout (seconds), which also
    bounds ``ensure_app_topic``.
    """

    def __init__(
        self,
        settings: Settings,
        send: SendRecord,
        sync_state: Callable[[], Awaitable[None]],
        ensure_app_topic: EnsureAppTopic,
    ) -> None:
        self.settings = settings
        self.sync_state = sync_state
        self._ensure_app_topic = ensure_app_topic
        self.names = TopicNames.from_settings(settings)
        self._send = send
        self.clients: dict[str, Client] = {}
        self.sessions: dict[str, SessionRecord] = {}
        self.subscriptions: dict[str, list[Subscription]] = {}
        self.waiting_wills: dict[str, _WaitingWill] = {}
        self._queues: dict[int, _StoreQueue] = {}
        self._background: set[asyncio.Task[None]] = set()
        # Records sent and not yet answered: key → (deadline on the loop clock, client, effect).
        self._watched: dict[int, tuple[float, Client, StoreEffect | PublishWill]] = {}
        self._next_watch = 0
        self._sweeper: asyncio.Task[None] | None = None
        # Backpressure: store effects queued and not yet handed to the producer, and the
        # publishing clients whose reading is paused until the pending records fall to half.
        self._unsent = 0
        self._paused: set[Client] = set()

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
        self._check_waiting_will(client_id, record, offset)
        self._check_ownership(client_id, record, offset)

    def _check_ownership(self, client_id: str, record: SessionRecord | None, offset: int) -> None:
        client = self.clients.get(client_id)
        if client is None or client.connect_offset is None or offset <= client.connect_offset:
            return  # not ours, or older than our own connect record
        state = client.connection.state
        if record is not None and record.connection_id == state.connection_id:
            return
        if (
            record is not None
            and record.connected
            and record.connection_id != state.previous_connection_id
        ):
            log.info(
                "client %r connected elsewhere (node %s): taking over", client_id, record.node_id
            )
            self.clients.pop(client_id, None)
            self.run(client, client.connection.taken_over(record.clean_start))
        else:
            # An older connection's record landed after ours: say again who holds it.
            self.run(client, client.connection.older_session_record(record))

    def _check_waiting_will(
        self, client_id: str, record: SessionRecord | None, offset: int
    ) -> None:
        """A newer connection of a client whose Will Message waits here settles it."""
        waiting = self.waiting_wills.get(client_id)
        if waiting is None or record is None or not record.connected:
            return
        if record.connection_id == waiting.connection_id:
            return  # the will's own connection
        if waiting.connect_offset is not None and offset <= waiting.connect_offset:
            return  # written before that connection's own records: older
        self._settle_will(client_id, record.clean_start)

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
            elif isinstance(effect, PublishWill):
                self._will(client, effect)
            elif isinstance(effect, CreateAppTopic):
                self._background_task(self._create_app_topic(client, effect))
            elif isinstance(effect, RecordEvent):
                self._record_event(effect)
            else:
                self._enqueue_store(client, effect)

    def _background_task(self, coroutine: Coroutine[object, object, None]) -> None:
        """Run ``coroutine`` as a task the node's shutdown waits for."""
        task = asyncio.create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _create_app_topic(self, client: Client, effect: CreateAppTopic) -> None:
        """Make sure of the client's ``msg.app`` topic, then report to its connection."""
        try:
            await asyncio.wait_for(
                self._ensure_app_topic(effect.client_id),
                self.settings.kafka_request_timeout_seconds,
            )
        except Exception as exc:
            log.warning("client %r: its msg.app topic could not be made: %r", effect.client_id, exc)
            self.run(client, client.connection.store_failed(effect.token))
            return
        self.run(client, client.connection.stored(effect.token))

    def _record_event(self, effect: RecordEvent) -> None:
        """Append a ``client.events`` record; nothing waits for it (off the hot path)."""
        record = (self.names.client_events, effect.client_id.encode("utf-8"),
                  encode_event(effect.event), None)  # fmt: skip
        self._background_task(self._write_logged(*record))

    def _register(self, client: Client, client_id: str) -> None:
        old = self.clients.get(client_id)
        self.clients[client_id] = client
        clean_start = client.connection.state.clean_start
        self._settle_will(client_id, clean_start)
        if old is not None and old is not client:
            log.info("client %r reconnected on this node: taking over", client_id)
            self.run(old, old.connection.taken_over(clean_start))

    def unregister(self, client: Client) -> None:
        """Forget ``client`` (its socket closed) unless a newer connection replaced it."""
        self._paused.discard(client)
        client_id = client.connection.client_id
        if self.clients.get(client_id) is client:
            del self.clients[client_id]

    # ----------------------------------------------------------------------------------------
    # will messages

    def _will(self, client: Client, effect: PublishWill) -> None:
        client_id = client.connection.client_id
        if effect.delay_seconds == 0:
            self._enqueue_store(client, effect)
            if effect.meta.retain:
                state = client.connection.state
                self._enqueue_store(
                    client, StoreRetained(state.new_token(), effect.meta, effect.payload)
                )
            return
        # No other will of this client waits: its registration settled any (_register).
        timer = asyncio.get_running_loop().call_later(
            effect.delay_seconds, self._will_delay_passed, client_id
        )
        self.waiting_wills[client_id] = _WaitingWill(
            timer,
            client.connection.state.connection_id,
            client.connect_offset,
            effect.meta,
            effect.payload,
        )

    def _will_delay_passed(self, client_id: str) -> None:
        waiting = self.waiting_wills.pop(client_id)
        self._publish_will(client_id, waiting.meta, waiting.payload)

    def _settle_will(self, client_id: str, new_clean_start: bool) -> None:
        """A new connection of ``client_id`` was made: publish or discard its waiting will."""
        waiting = self.waiting_wills.pop(client_id, None)
        if waiting is None:
            return
        waiting.timer.cancel()
        if will.published_on_new_connection(new_clean_start):
            self._publish_will(client_id, waiting.meta, waiting.payload)
        else:
            log.info("client %r reconnected: its Will Message is not sent", client_id)

    def _publish_will(self, client_id: str, meta: PublishMeta, payload: bytes) -> None:
        """Write a Will Message that waited out its delay to ``msg.all``, stamped now;
        failures are logged."""
        meta = dataclasses.replace(meta, received_at_ms=now_ms())
        headers = [(HEADER_META, encode_meta(meta))]
        records = [(self.names.msg_all, client_id.encode("utf-8"), payload, headers)]
        if meta.retain:
            records.append(self._retained_record(meta, payload))
        for record in records:
            task = asyncio.create_task(self._write_logged(*record))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _write_logged(
        self, topic: str, key: bytes, value: bytes | None, headers: Headers | None
    ) -> None:
        """Write one record nobody waits for; a failure is logged."""
        try:
            pending = await self._send(topic, key, value, headers)
            await asyncio.wait_for(pending, self.settings.kafka_request_timeout_seconds)
        except Exception as exc:
            log.warning("could not write a record of %r to %s: %r", key, topic, exc)

    # ----------------------------------------------------------------------------------------
    # store effects

    @property
    def pending_records(self) -> int:
        """Store effects waiting to be sent to Kafka or for its answer."""
        return self._unsent + len(self._watched)

    def _enqueue_store(self, client: Client, effect: StoreEffect | PublishWill) -> None:
        queue = self._queues.setdefault(id(client), _StoreQueue())
        queue.items.append((client, effect))
        self._unsent += 1
        if queue.task is None:
            queue.task = asyncio.create_task(self._drain(id(client), queue))
        if (
            isinstance(effect, StorePublish)
            and client not in self._paused
            and self.pending_records >= self.settings.ingest_max_pending_records
        ):
            # Every byte read would become one more record to wait for: let TCP hold the
            # client's PUBLISHes instead of the producer's buffer, which times out.
            client.pause_reading()
            self._paused.add(client)
            if len(self._paused) == 1:
                log.info("%d records wait for Kafka: pausing reads", self.pending_records)

    def _resume_if_drained(self) -> None:
        if self._paused and self.pending_records <= self.settings.ingest_max_pending_records // 2:
            paused, self._paused = self._paused, set()
            for client in paused:
                client.resume_reading()

    async def _drain(self, key: int, queue: _StoreQueue) -> None:
        """Send queued store effects in order; their acknowledgements complete concurrently."""
        try:
            while queue.items:
                client, effect = queue.items[0]
                topic, record_key, value, headers = self._record_of(client, effect)
                try:
                    pending = await self._send(topic, record_key, value, headers)
                except Exception as exc:  # Kafka unreachable or the record refused
                    log.warning("could not queue a record for %s: %r", topic, exc)
                    self._unsent_done(queue)
                    self._store_failed(client, effect)
                    self._resume_if_drained()
                    continue
                self._unsent_done(queue)
                self._watch(client, effect, pending)
        finally:
            queue.task = None
            self._unsent -= len(queue.items)  # cancelled at shutdown: never to be sent
            queue.items.clear()
            self._queues.pop(key, None)
            self._resume_if_drained()

    def _unsent_done(self, queue: _StoreQueue) -> None:
        queue.items.popleft()
        self._unsent -= 1

    def _watch(
        self, client: Client, effect: StoreEffect | PublishWill, pending: Awaitable[object]
    ) -> None:
        """Hand Kafka's answer for ``effect`` to its connection when it comes, or a failure
        after ``kafka_request_timeout_seconds``. A done-callback and one sweeper for all,
        not a task with a timeout per record: those cost more than the send itself."""
        future = asyncio.ensure_future(pending)
        key = self._next_watch
        self._next_watch += 1
        deadline = asyncio.get_running_loop().time() + self.settings.kafka_request_timeout_seconds
        self._watched[key] = (deadline, client, effect)
        future.add_done_callback(lambda done: self._answered(key, done))
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.create_task(self._sweep())

    def _answered(self, key: int, future: asyncio.Future[object]) -> None:
        watched = self._watched.pop(key, None)
        if watched is None:
            return  # timed out already
        self._resume_if_drained()
        _, client, effect = watched
        error = future.exception() if not future.cancelled() else asyncio.CancelledError()
        if error is not None:
            log.warning(
                "Kafka did not store a record of %r: %r", client.connection.client_id, error
            )
            self._store_failed(client, effect)
            return
        if isinstance(effect, PublishWill):
            return  # nobody waits for a Will Message
        if isinstance(effect, StoreSession) and effect.record is not None:
            offset = getattr(future.result(), "offset", None)
            if effect.record.connected and isinstance(offset, int):
                client.connect_offset = max(client.connect_offset or -1, offset)
        self.run(client, client.connection.stored(effect.token))

    async def _sweep(self) -> None:
        """Fail the watched records Kafka has not answered in time, until none is left.

        Every record gets the same timeout, so deadlines grow in insertion order and the
        sweep stops at the first one still running."""
        loop = asyncio.get_running_loop()
        while self._watched:
            now = loop.time()
            for key, (deadline, client, effect) in list(self._watched.items()):
                if deadline > now:
                    break
                del self._watched[key]
                log.warning("Kafka did not answer for a record of %r", client.connection.client_id)
                self._store_failed(client, effect)
            self._resume_if_drained()
            await asyncio.sleep(0.5)  # the sweep's pace: timeouts are seconds long

    def _store_failed(self, client: Client, effect: StoreEffect | PublishWill) -> None:
        if isinstance(effect, PublishWill):
            log.warning("the Will Message of %r was not stored", client.connection.client_id)
        else:
            self.run(client, client.connection.store_failed(effect.token))

    def _record_of(
        self, client: Client, effect: StoreEffect | PublishWill
    ) -> tuple[str, bytes, bytes | None, Headers | None]:
        key = client.connection.client_id.encode("utf-8")
        if isinstance(effect, StorePublish | PublishWill):
            return (
                self.names.msg_all,
                key,
                effect.payload,
                [(HEADER_META, encode_meta(effect.meta))],
            )
        if isinstance(effect, StoreRetained):
            return self._retained_record(effect.meta, effect.payload)
        if isinstance(effect, StoreSubscriptions):
            value = encode_subscriptions(effect.subscriptions) if effect.subscriptions else None
            return self.names.client_subscriptions, key, value, None
        if isinstance(effect, StoreSession):
            value = None if effect.record is None else encode_session(effect.record)
            return self.names.client_sessions, key, value, None
        if isinstance(effect, StoreAcks):
            return self.names.client_acks, key, encode_ack(effect.record), None
        assert isinstance(effect, StoreRetainedRequest)
        headers = [(HEADER_RETAINED_REQUEST, encode_subscriptions(effect.subscriptions))]
        return self.names.msg_all, key, b"", headers

    def _retained_record(
        self, meta: PublishMeta, payload: bytes
    ) -> tuple[str, bytes, bytes | None, Headers | None]:
        """The ``msg.retained`` record of a retained message (a tombstone for an empty one)."""
        value = payload or None
        return (
            self.names.msg_retained,
            meta.topic.encode("utf-8"),
            value,
            [(HEADER_META, encode_meta(meta))],
        )

    # ----------------------------------------------------------------------------------------
    # downlink

    def deliver(self, meta: PublishMeta, payload: bytes, targets: list[Target]) -> int:
        """Send one downlink record to its targets connected here; returns how many got it.

        QoS 0 packets are encoded once per variant (protocol version, RETAIN, Subscription
        Identifiers) and the same bytes go to every socket (DESIGN.md: encode-once fan-out),
        with the Message Expiry Interval left at this moment. A target's store-assigned
        Packet Identifier and DUP flag are used as they are.
        """
        forwarded = _forwarded(meta)
        expires_at_ms = expiry_deadline(forwarded, meta.received_at_ms)
        if expires_at_ms is not None:
            # Shared by the QoS 0 encodings; each connection checks the expiry again itself.
            left = delivery.remaining_interval(expires_at_ms, now_ms())
            if left is not None:
                forwarded.message_expiry_interval = left
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
                props = dataclasses.replace(
                    forwarded, subscription_identifiers=list(target.subscription_identifiers)
                )
            packet = Publish(
                meta.topic, payload, target.qos, retain, target.dup, target.packet_id or None, props
            )
            ready = None
            if target.qos == 0:
                variant = (version, retain, target.subscription_identifiers if version == 5 else ())
                ready = encoded.get(variant)
                if ready is None:
                    ready = encoded[variant] = encode(packet, version)
            self.run(client, client.connection.deliver(packet, ready, expires_at_ms))
            delivered += 1
        return delivered

    def release(self, releases: list[tuple[str, int]]) -> None:
        """Send PUBREL for each (client id, Packet Identifier) whose client is connected
        here: QoS 2 deliveries a message store saw acknowledged with PUBREC (MQTT 4.4)."""
        for client_id, packet_id in releases:
            client = self.clients.get(client_id)
            if client is not None:
                self.run(client, client.connection.release(packet_id))

    # ----------------------------------------------------------------------------------------
    # start and stop

    async def reconcile(self) -> int:
        """End the sessions that the state topics show connected to this node: at start,
        before the listener opens, their connections died with the previous process.

        Writes their end records as a closed connection would (persistent: marked
        disconnected; otherwise tombstones of its subscriptions and session), so routers
        stop sending to this node for them and other services see them offline. Call it once
        the state reader has caught up. Returns how many sessions it ended; write failures
        are logged.
        """
        node_id = self.settings.node_id
        orphans = [
            (client_id, record)
            for client_id, record in self.sessions.items()
            if record.node_id == node_id and record.connected
        ]
        now = now_ms()
        writes = []
        for client_id, record in orphans:
            key = client_id.encode("utf-8")
            end = orphaned_session_end(record, now)
            if end is None and self.subscriptions.get(client_id):
                writes.append(self._write_logged(self.names.client_subscriptions, key, None, None))
            value = None if end is None else encode_session(end)
            writes.append(self._write_logged(self.names.client_sessions, key, value, None))
        await asyncio.gather(*writes)
        if orphans:
            log.info("node %s: ended %d sessions of its previous process", node_id, len(orphans))
        return len(orphans)

    def _in_flight(self) -> set[asyncio.Task[None]]:
        """Tasks still writing records: store queues, unwatched writes, and the sweeper,
        which runs until every watched record is answered or timed out."""
        queues = {q.task for q in self._queues.values() if q.task is not None}
        sweeper = (
            {self._sweeper} if self._sweeper is not None and not self._sweeper.done() else set()
        )
        return queues | self._background | sweeper

    async def shut_down(self) -> None:
        """Close every connection (v5: DISCONNECT 0x8B Server shutting down), write their
        end records and Will Messages, publish the wills still waiting out their delay, and
        wait (at most :data:`SHUTDOWN_FLUSH_SECONDS`) until Kafka has them."""
        for client in list(self.clients.values()):
            connection = client.connection
            self.run(client, connection.shutting_down())
            self.run(client, connection.connection_lost())
        for client_id in list(self.waiting_wills):
            waiting = self.waiting_wills.pop(client_id)
            waiting.timer.cancel()
            self._publish_will(client_id, waiting.meta, waiting.payload)
        try:
            async with asyncio.timeout(SHUTDOWN_FLUSH_SECONDS):
                while pending := self._in_flight():
                    await asyncio.wait(pending)
        except TimeoutError:
            log.warning("shutdown: some records may not be stored")


def _forwarded(meta: PublishMeta) -> Properties:
    """The publisher's forwarded MQTT 5 properties, decoded (empty when there are none)."""
    if not meta.properties:
        return Properties()
    props, _ = decode_properties(meta.properties, 0, PacketType.PUBLISH)
    return props
