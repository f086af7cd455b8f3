"""Stored delivery of persistent DEVICE sessions (DESIGN.md, device_persist; TBMQ's
persistent DEVICE client).

:class:`DevicePersister` owns the clients whose ``msg.persisted`` partition this instance
was assigned (every record about one client is in the same partition number of
``msg.persisted`` and ``client.acks``, read together in one consumer group with the range
assignor). For them it:

- stores each QoS 1/2 message in the :class:`~services.common.stores.base.MessageStore`
  (which assigns its Packet Identifier), stamped with the client's session;
- forwards QoS 0 messages to a connected client, and drops them for an offline one (MQTT
  3.1.2.4: storing QoS 0 messages is optional);
- keeps, per connected client, at most ``min(Receive Maximum, persisted_inflight_max)``
  deliveries in flight (MQTT 5.0 4.9), sending stored messages in order to the client's node
  as downlink records whose target carries the stored Packet Identifier;
- applies the client's acknowledgements (``client.acks``): PUBACK and PUBCOMP delete, PUBREC
  moves a QoS 2 message to "released" (MQTT 4.3.2, 4.3.3);
- after a new connection (and after this instance takes a partition over) resends what was
  in flight: PUBLISH with DUP=1 and the same Packet Identifier, PUBREL for released ones
  (MQTT 4.4), then continues with the queue;
- discards messages stored for an earlier session (Clean Start) and deletes expired
  sessions with their subscriptions and messages (Session Expiry Interval, MQTT 3.1.2.11.2).

Sending is tracked by a per-connection cursor (the highest ``seq`` sent to the current
connection): a message is sent once per connection, and a new connection starts from 0, so
what was in flight is sent again.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, replace

from services.common.kafka.consumer import Record
from services.common.kafka.names import TopicNames
from services.common.kafka.partitioner import partition_of as key_partition
from services.common.mqtt.errors import MQTTError
from services.common.records import (
    HEADER_META,
    HEADER_RELEASES,
    HEADER_TARGETS,
    AckKind,
    ClientKind,
    RecordError,
    SessionRecord,
    StoredRecord,
    Target,
    decode_ack,
    decode_meta,
    decode_session,
    decode_stored,
    decode_targets,
    encode_releases,
    encode_stored,
    encode_targets,
    expires_at_ms,
)
from services.common.sessions import session_expired
from services.common.settings import Settings
from services.common.stores.base import MessageState, MessageStore, StoredMessage

log = logging.getLogger(__name__)

Headers = list[tuple[str, bytes]]
SendRecord = Callable[[str, bytes, bytes | None, Headers], Awaitable[Awaitable[object]]]
"""``await send(topic, key, value, headers)`` queues a record; the returned awaitable
resolves once Kafka acknowledged it."""


def partition_of(client_id: str, partitions: int) -> int:
    """The partition of every record keyed by ``client_id`` in a topic of ``partitions``."""
    return key_partition(client_id.encode("utf-8"), partitions)


@dataclass(slots=True)
class _Cursor:
    """What the current connection of a client has been sent (``sent_seq``), and up to
    which ``seq`` earlier connections were (``sent_before``: those go again with DUP=1,
    even when the store has not recorded them as sent yet)."""

    connection_id: bytes
    sent_seq: int = 0
    sent_before: int = 0


class DevicePersister:
    """The device_persist logic for the clients of the assigned partitions.

    ``store`` keeps the messages; ``send`` produces records; ``settings`` gives topic names,
    the in-flight cap, the default message TTL (seconds) and the partition count. Methods
    raise :class:`~services.common.stores.base.StoreUnavailable` when the store fails; the
    caller reads the batch again.
    """

    def __init__(self, settings: Settings, store: MessageStore, send: SendRecord) -> None:
        self.settings = settings
        self.names = TopicNames.from_settings(settings)
        self.store = store
        self._send = send
        self.sessions: dict[str, SessionRecord] = {}
        self.owned: set[int] = set()
        self._cursors: dict[str, _Cursor] = {}
        # One lock per client being served (weak: it goes when nobody holds or awaits it).
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()
        self._live = False  # False while the session topic is replayed at start

    # ------------------------------------------------------------------ ownership, sessions

    def owns(self, client_id: str) -> bool:
        """Whether ``client_id``'s records are in a partition assigned to this instance."""
        return partition_of(client_id, self.settings.state_topic_partitions) in self.owned

    def assign(self, partitions: Iterable[int]) -> None:
        """The consumer group gave this instance ``partitions`` (of ``msg.persisted``): the
        connected clients in newly owned ones get what they had in flight again."""
        owned = set(partitions)
        new = owned - self.owned
        self.owned = owned
        count = self.settings.state_topic_partitions
        for client_id, session in self.sessions.items():
            if session.connected and partition_of(client_id, count) in new:
                self._cursors.pop(client_id, None)
                self._mark_dirty(client_id)

    def go_live(self) -> None:
        """The session topic has been replayed: from now on, changes are acted upon."""
        self._live = True

    def apply_session(self, key: bytes, value: bytes | None) -> None:
        """Apply one ``client.sessions`` record (the state reader's handler; never blocks).

        Raises ``RecordError`` / ``UnicodeDecodeError`` on garbage (the reader skips it).
        """
        client_id = key.decode("utf-8")
        record = None if value is None else decode_session(value)
        previous = self.sessions.pop(client_id, None)
        if record is not None:
            self.sessions[client_id] = record
        if not self._live or not self.owns(client_id):
            return
        had_store = previous is not None and _stored_for(previous)
        restarted = previous is not None and record is not None
        ended = record is None or (restarted and previous.session_id != record.session_id)
        if ended and had_store:
            self._mark_dirty(client_id)  # the session ended or restarted: its messages go
        elif record is not None and record.connected and _stored_for(record):
            cursor = self._cursors.get(client_id)
            if cursor is None or cursor.connection_id != record.connection_id:
                self._mark_dirty(client_id)

    def _mark_dirty(self, client_id: str) -> None:
        self._dirty.add(client_id)
        self._wake.set()

    async def run_dirty(self) -> None:
        """Serve clients whose session changed, until cancelled (a background task).

        A failure is logged and the client is tried again a second later.
        """
        while True:
            await self._wake.wait()
            self._wake.clear()
            dirty, self._dirty = self._dirty, set()
            failed: set[str] = set()
            for client_id in dirty:
                try:
                    await asyncio.gather(*await self.serve(client_id))
                except Exception as exc:
                    log.warning("client %r: stored messages not served: %r", client_id, exc)
                    failed.add(client_id)
            if failed:
                await asyncio.sleep(1.0)  # retry pacing while the store or Kafka is down
                for client_id in failed:
                    self._mark_dirty(client_id)

    # ------------------------------------------------------------------ records

    async def handle_batch(self, records: list[Record], now_ms: int) -> list[Awaitable[object]]:
        """Store the batch's messages, apply its acknowledgements, serve the clients it
        touched; returns the acknowledgements of the records produced for it."""
        touched: dict[str, None] = {}
        acks: list[Awaitable[object]] = []
        for record in records:
            if record.topic != self.names.msg_persisted:
                continue
            client_id = await self._store_message(record, now_ms, acks)
            if client_id is not None:
                touched[client_id] = None
        for record in records:
            if record.topic == self.names.client_acks:
                client_id = await self._apply_acks(record)
                if client_id is not None:
                    touched[client_id] = None
        for client_id in touched:
            acks.extend(await self.serve(client_id, now_ms))
        return acks

    def _skip(self, record: Record, exc: Exception) -> None:
        log.warning(
            "skipping undecodable record %s[%d]@%d: %r",
            record.topic,
            record.partition,
            record.offset,
            exc,
        )

    async def _store_message(
        self, record: Record, now_ms: int, acks: list[Awaitable[object]]
    ) -> str | None:
        try:
            client_id = record.key.decode("utf-8")
            headers = dict(record.headers or ())
            meta_raw = headers[HEADER_META]
            meta = decode_meta(meta_raw)
            [target] = decode_targets(headers[HEADER_TARGETS])
            deadline = expires_at_ms(meta)
        except (AttributeError, KeyError, ValueError, RecordError, MQTTError) as exc:
            self._skip(record, exc)
            return None
        session = self.sessions.get(client_id)
        if session is None or not session.persistent:
            return None  # the session is gone: nobody to store for
        if deadline is not None and deadline <= now_ms:
            return None  # expired on the way (MQTT 3.3.2.3.3)
        payload = record.value or b""
        if target.qos == 0:
            if session.connected:
                target = replace(target, packet_id=0, dup=False)
                acks.append(await self._publish(session, client_id, meta_raw, target, payload))
            return None
        if deadline is None:
            deadline = meta.received_at_ms + self.settings.persisted_default_ttl_seconds * 1000
        data = encode_stored(StoredRecord(session.session_id, meta_raw, target, payload))
        result = await self.store.append(client_id, record.offset, target.qos, deadline, data)
        if result.dropped:
            log.warning(
                "client %r: store full (%d messages), dropped its %d oldest",
                client_id,
                self.settings.persisted_max_messages,
                result.dropped,
            )
        return client_id

    async def _apply_acks(self, record: Record) -> str | None:
        try:
            client_id = record.key.decode("utf-8")
            ack = decode_ack(record.value or b"")
        except (AttributeError, ValueError, RecordError) as exc:
            self._skip(record, exc)
            return None
        session = self.sessions.get(client_id)
        if session is None or session.session_id != ack.session_id:
            return None  # from an earlier session: its messages are gone already
        if not _stored_for(session):
            return None  # an APPLICATION client's: app_delivery's, not this store's
        for kind, packet_id in ack.acks:
            await self.store.acknowledge(client_id, packet_id, kind)
        return client_id

    # ------------------------------------------------------------------ delivery

    async def serve(self, client_id: str, now_ms: int | None = None) -> list[Awaitable[object]]:
        """Bring ``client_id`` up to date: drop what belongs to no live session, send what
        its connection has not been sent yet within the in-flight window. Returns the
        acknowledgements of the records produced."""
        async with self._lock(client_id):
            return await self._serve(client_id, now_ms)

    def _lock(self, client_id: str) -> asyncio.Lock:
        lock = self._locks.get(client_id)
        if lock is None:
            lock = self._locks[client_id] = asyncio.Lock()
        return lock

    async def _serve(self, client_id: str, now_ms: int | None) -> list[Awaitable[object]]:
        if not self.owns(client_id):
            return []
        session = self.sessions.get(client_id)
        if session is None or not _stored_for(session):
            self._cursors.pop(client_id, None)
            if await self.store.clear(client_id):
                log.info("client %r: session ended, stored messages deleted", client_id)
            return []
        if not session.connected:
            return []
        cursor = self._cursors.get(client_id)
        if cursor is None or cursor.connection_id != session.connection_id:
            before = 0 if cursor is None else max(cursor.sent_seq, cursor.sent_before)
            cursor = self._cursors[client_id] = _Cursor(session.connection_id, 0, before)
        limit = max(1, min(session.receive_maximum, self.settings.persisted_inflight_max))
        now = now_ms if now_ms is not None else _now_ms()
        window = await self.store.window(client_id, limit, now)
        fresh = [m for m in window if m.seq > cursor.sent_seq]
        acks: list[Awaitable[object]] = []
        releases: list[tuple[str, int]] = []
        queued: list[int] = []
        stale: list[StoredMessage] = []
        for message in fresh:
            try:
                stored = decode_stored(message.data)
            except RecordError as exc:
                log.warning("client %r: dropping an undecodable stored message: %r", client_id, exc)
                stale.append(message)
                continue
            if stored.session_id != session.session_id:
                stale.append(message)  # stored for an earlier session (Clean Start)
                continue
            if message.state is MessageState.RELEASED:
                releases.append((client_id, message.packet_id))
                continue
            target = replace(
                stored.target,
                packet_id=message.packet_id,
                dup=message.state is MessageState.SENT or message.seq <= cursor.sent_before,
            )
            acks.append(
                await self._publish(session, client_id, stored.meta_raw, target, stored.payload)
            )
            if message.state is MessageState.QUEUED:
                queued.append(message.packet_id)
        if releases:
            acks.append(
                await self._send(
                    self.names.downlink(session.node_id),
                    client_id.encode("utf-8"),
                    b"",
                    [(HEADER_RELEASES, encode_releases(releases))],
                )
            )
        if fresh:
            cursor.sent_seq = fresh[-1].seq
        await self._discard(client_id, stale)
        if queued:
            # Started now, not when the caller gets round to awaiting it: a resend after a
            # reconnect must find the message SENT (DUP=1).
            acks.append(asyncio.ensure_future(self._mark_sent_after(client_id, queued, list(acks))))
        if stale:
            self._mark_dirty(client_id)  # the window had room for more
        return acks

    async def _publish(
        self,
        session: SessionRecord,
        client_id: str,
        meta_raw: bytes,
        target: Target,
        payload: bytes,
    ) -> Awaitable[object]:
        return await self._send(
            self.names.downlink(session.node_id),
            client_id.encode("utf-8"),
            payload,
            [(HEADER_META, meta_raw), (HEADER_TARGETS, encode_targets([target]))],
        )

    async def _mark_sent_after(
        self, client_id: str, packet_ids: list[int], sent: list[Awaitable[object]]
    ) -> None:
        """Record the deliveries as made once their downlink records are in Kafka (a resend
        then carries DUP=1)."""
        await asyncio.gather(*sent)
        await self.store.mark_sent(client_id, packet_ids)

    async def _discard(self, client_id: str, messages: list[StoredMessage]) -> None:
        """Delete ``messages`` (of no live session, or undecodable) from the store."""
        for message in messages:
            if message.qos == 1:
                await self.store.acknowledge(client_id, message.packet_id, AckKind.PUBACK)
                continue
            if message.state is not MessageState.RELEASED:
                await self.store.acknowledge(client_id, message.packet_id, AckKind.PUBREC)
            await self.store.acknowledge(client_id, message.packet_id, AckKind.PUBCOMP)

    # ------------------------------------------------------------------ session expiry

    async def expire_sessions(self, now_ms: int) -> list[Awaitable[object]]:
        """End the owned persistent DEVICE sessions that outlived their Session Expiry
        Interval (MQTT 3.1.2.11.2) or ``session_expiry_max_seconds``: tombstones for their
        session and subscriptions records, and their stored messages deleted."""
        acks: list[Awaitable[object]] = []
        cap = self.settings.session_expiry_max_seconds
        for client_id, session in list(self.sessions.items()):
            if not _stored_for(session):
                continue
            if not self.owns(client_id) or not session_expired(session, now_ms, cap):
                continue
            log.info("client %r: session expired", client_id)
            key = client_id.encode("utf-8")
            async with self._lock(client_id):
                await self.store.clear(client_id)
                self._cursors.pop(client_id, None)
            acks.append(await self._send(self.names.client_subscriptions, key, None, []))
            acks.append(await self._send(self.names.client_sessions, key, None, []))
        return acks


def _stored_for(session: SessionRecord) -> bool:
    """Whether messages for this session go through the store (a persistent DEVICE one)."""
    return session.persistent and session.kind is ClientKind.DEVICE


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
