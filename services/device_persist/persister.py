"""Stored delivery of persistent DEVICE sessions (docs/design.md, device_persist; TBMQ's
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
  deliveries in flight (MQTT 5.0 4.9), sending stored messages in order to the client's node,
  each target carrying the stored Packet Identifier, a window as one downlink record (a
  bundle, :func:`~services.common.records.downlink_bundle_record`) per
  :data:`BUNDLE_MAX_BYTES`;
- applies the client's acknowledgements (``client.acks``): PUBACK and PUBCOMP delete, PUBREC
  moves a QoS 2 message to "released" (MQTT 4.3.2, 4.3.3);
- after a new connection (and after this instance takes a partition over) resends what was
  in flight: PUBLISH with DUP=1 and the same Packet Identifier, PUBREL for released ones
  (MQTT 4.4), then continues with the queue;
- discards messages stored for an earlier session (Clean Start) and deletes expired
  sessions with their subscriptions and messages (Session Expiry Interval, MQTT 3.1.2.11.2).

Sending is tracked by a per-connection cursor (the highest ``seq`` sent to the current
connection): a message is sent once per connection, and a new connection starts from 0, so
what was in flight is sent again. Each batch is one store call
(:meth:`~services.common.stores.base.MessageStore.apply_batch`): its appends, its
acknowledgements and the touched clients' windows, whose messages the store marks SENT as it
reads them for sending (one Redis round trip per batch; marking after Kafka had the downlink
records took a second one, and a message marked early that never reached Kafka is resent
with DUP=1, which MQTT 3.3.1.1 allows).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, field, replace

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from services.common import clock, metrics
from services.common.faust_app import SendRecord
from services.common.kafka.consumer import Record, log_undecodable
from services.common.kafka.names import TopicNames
from services.common.kafka.partitioner import partition_of
from services.common.kafka.reroutes import RerouteFilter
from services.common.records import (
    AckKind,
    Headers,
    Origin,
    RecordError,
    SessionRecord,
    StoredRecord,
    Target,
    decode_stored,
    downlink_bundle_record,
    downlink_record,
    encode_stored,
    expires_at_ms,
    origin_of,
    parse_client_acks,
    parse_client_session,
    parse_persisted,
    release_record,
    session_expired_records,
    stale_delete,
)
from services.common.sessions import DeliveryPath, delivery_path, session_expired
from services.common.settings import Settings
from services.common.stores.base import (
    AckRequest,
    AppendRequest,
    AppendResult,
    MessageState,
    MessageStore,
    StoredMessage,
    StoreError,
    WindowRequest,
)

log = logging.getLogger(__name__)

#: Most bytes of stored messages sent in one downlink record (a window goes as few records,
#: not one per message: each record costs every process that produces or reads it). Well
#: under Kafka's default 1 MiB record limit; a larger message goes alone.
BUNDLE_MAX_BYTES = 256 * 1024


@dataclass(slots=True)
class _Batch:
    """What a batch of records asks of the store besides the windows (see
    :meth:`~services.common.stores.base.MessageStore.apply_batch`); empty when only
    clients are served."""

    appends: list[AppendRequest] = field(default_factory=list)
    applied: dict[int, int] = field(default_factory=dict)
    replaying: str = ""
    acknowledgements: list[AckRequest] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.appends or self.applied or self.acknowledgements)


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

    ``dropped_messages`` (int, messages) counts, since this process started, the stored
    messages the per-client cap (``persisted_max_messages``) dropped to take new ones (a
    client away too long loses its oldest messages, though their publishers got their
    PUBACK or PUBREC). The store keeps the
    exact count per client (:meth:`~services.common.stores.base.MessageStore.stats`); this
    process's count misses the drops of appends whose batch failed and was read again
    (the appends already applied come back as duplicates, dropping nothing).
    """

    def __init__(self, settings: Settings, store: MessageStore, send: SendRecord) -> None:
        self.settings = settings
        self.names = TopicNames.from_settings(settings)
        self.store = store
        self._send = send
        self.sessions: dict[str, SessionRecord] = {}
        self.owned: set[int] = set()
        self._cursors: dict[str, _Cursor] = {}
        self._serving = asyncio.Lock()
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()
        self._live = False  # False while the session topic is replayed at start
        self.dropped_messages = 0
        # msg.persisted records a crashed router routed again (its store's offset check
        # cannot tell: they stand at new offsets).
        self.reroutes = RerouteFilter()

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

    def failed_over(self) -> None:
        """The store failed over: what the connected clients of the owned partitions were
        sent may be missing from it (and acknowledgements it applied too), so each gets its
        window again from the start, as after a reconnect (DUP=1 for what was sent): no
        message stays counted as in flight that the client never got, or acknowledged
        already (MQTT 4.4)."""
        count = self.settings.state_topic_partitions
        for client_id, session in self.sessions.items():
            if session.connected and partition_of(client_id, count) in self.owned:
                cursor = self._cursors.pop(client_id, None)
                if cursor is not None:
                    before = max(cursor.sent_seq, cursor.sent_before)
                    self._cursors[client_id] = _Cursor(b"", 0, before)
                self._mark_dirty(client_id)

    def go_live(self) -> None:
        """The session topic has been replayed: from now on, changes are acted upon."""
        self._live = True

    def apply_session(self, key: bytes, value: bytes | None, headers: Headers = ()) -> None:
        """Apply one ``client.sessions`` record (the state reader's handler; never blocks).
        A late delete of an older session (:func:`~services.common.records.stale_delete`)
        is not applied: the newer session's stored messages stay.

        Raises ``RecordError`` on garbage (the reader skips it).
        """
        client_id, record = parse_client_session(key, value)
        if stale_delete(self.sessions.get(client_id), value, headers):
            return
        previous = self.sessions.pop(client_id, None)
        if record is not None:
            self.sessions[client_id] = record
        if not self._live or not self.owns(client_id):
            return
        had_store = previous is not None and _stored_for(previous)
        ended = record is None or (
            previous is not None and previous.session_id != record.session_id
        )
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

        A failure is logged and the clients are tried again a second later.
        """
        while True:
            await self._wake.wait()
            self._wake.clear()
            dirty, self._dirty = self._dirty, set()
            try:
                await asyncio.gather(*await self.serve(dirty))
            except Exception as exc:
                log.warning("stored messages of %d clients not served: %r", len(dirty), exc)
                await asyncio.sleep(1.0)  # retry pacing while the store or Kafka is down
                for client_id in dirty:
                    self._mark_dirty(client_id)

    # ------------------------------------------------------------------ records

    async def handle_batch(
        self, records: list[Record], now_ms: int, replaying: str = ""
    ) -> list[Awaitable[object]]:
        """Store the batch's messages, apply its acknowledgements, serve the clients it
        touched; returns the acknowledgements of the records produced for it.

        The store sees one call (:meth:`~services.common.stores.base.MessageStore.apply_batch`:
        appends with how far each ``msg.persisted`` partition is applied, acknowledgements,
        and the touched clients' windows, marked SENT as they are read), whatever the
        number of records: one round trip on Redis. Raises
        :class:`~services.common.stores.base.StoreFailedOver` (before storing anything)
        when the store's primary changed since the partitions' records were last applied:
        the caller re-applies them (``replaying``: the new primary's replication id) and
        hands the batch again.
        """
        acks: list[Awaitable[object]] = []
        appends: list[AppendRequest] = []
        applied: dict[int, int] = {}
        for record in records:
            if record.topic == self.names.msg_persisted:
                applied[record.partition] = max(applied.get(record.partition, 0), record.offset + 1)
                request = await self._message(record, now_ms, acks)
                if request is not None:
                    appends.append(request)
        acknowledgements = [
            request
            for record in records
            if record.topic == self.names.client_acks
            for request in self._acknowledgements(record)
        ]
        touched = {r.client_id: None for r in appends}
        touched.update((r.client_id, None) for r in acknowledgements)
        batch = _Batch(appends, applied, replaying, acknowledgements)
        async with self._serving:
            results, served = await self._serve(list(touched), now_ms, batch)
        self._count_dropped(appends, results)
        acks.extend(served)
        return acks

    def _count_dropped(self, appends: list[AppendRequest], results: list[AppendResult]) -> None:
        """Add the messages the per-client cap dropped for ``appends`` to
        :attr:`dropped_messages`, and log one WARNING per client of the batch that lost
        some (not one per append: a full client's every append drops one)."""
        by_client: dict[str, int] = {}
        for request, result in zip(appends, results, strict=True):
            if result.dropped:
                by_client[request.client_id] = by_client.get(request.client_id, 0) + result.dropped
        for client_id, dropped in by_client.items():
            self.dropped_messages += dropped
            metrics.dropped(metrics.Drop.STORE_FULL, dropped)
            log.warning(
                "client %r: store full (%d messages), dropped its %d oldest",
                client_id,
                self.settings.persisted_max_messages,
                dropped,
            )

    async def _message(
        self, record: Record, now_ms: int, acks: list[Awaitable[object]]
    ) -> AppendRequest | None:
        """The append a ``msg.persisted`` record asks for; a QoS 0 message is forwarded at
        once (to a connected client) instead."""
        try:
            persisted = parse_persisted(record.key, record.value, record.headers)
            deadline = expires_at_ms(persisted.message.meta)
            origin = origin_of(record.headers)  # a replay's switch needs it (handle_replay)
            if not self.reroutes.first(record, record.key):
                return None  # routed again by a router that crashed: stored once already
        except RecordError as exc:
            log_undecodable(log, record, exc)
            return None
        client_id, message, target = persisted.client_id, persisted.message, persisted.target
        session = self.sessions.get(client_id)
        if session is None or not session.persistent:
            metrics.dropped(metrics.Drop.SESSION_GONE)
            return None  # the session is gone: nobody to store for
        if deadline is not None and deadline <= now_ms:
            metrics.dropped(metrics.Drop.EXPIRED)
            return None  # expired on the way (MQTT 3.3.2.3.3)
        if target.qos == 0:
            if session.connected:
                target = replace(target, packet_id=0, dup=False)
                acks.append(
                    await self._publish(
                        session, client_id, message.meta_raw, message.payload, target, origin
                    )
                )
            return None
        if deadline is None:
            ttl_ms = self.settings.persisted_default_ttl_seconds * 1000
            deadline = message.meta.received_at_ms + ttl_ms
        data = encode_stored(
            StoredRecord(session.session_id, message.meta_raw, target, message.payload, origin)
        )
        return AppendRequest(client_id, record.offset, target.qos, deadline, data, record.partition)

    def _acknowledgements(self, record: Record) -> list[AckRequest]:
        """The store acknowledgements a ``client.acks`` record carries (none from an
        earlier session: its messages are gone already)."""
        try:
            client_id, ack = parse_client_acks(record.key, record.value)
        except RecordError as exc:
            log_undecodable(log, record, exc)
            return []
        session = self.sessions.get(client_id)
        if session is None or session.session_id != ack.session_id:
            return []  # from an earlier session: its messages are gone already
        if not _stored_for(session):
            return []  # an APPLICATION client's: app_delivery's, not this store's
        return [AckRequest(client_id, packet_id, kind) for kind, packet_id in ack.acks]

    # ------------------------------------------------------------------ delivery

    async def serve(
        self, client_ids: Iterable[str], now_ms: int | None = None
    ) -> list[Awaitable[object]]:
        """Bring each client up to date: drop what belongs to no live session, send what
        its connection has not been sent yet within the in-flight window. Returns the
        acknowledgements of the records produced. Calls are serialised: two at once would
        send the same messages."""
        async with self._serving:
            _, acks = await self._serve(list(client_ids), now_ms or clock.now_ms(), _Batch())
            return acks

    async def _serve(
        self, client_ids: list[str], now_ms: int, batch: _Batch
    ) -> tuple[list[AppendResult], list[Awaitable[object]]]:
        """Apply ``batch`` to the store and send the windows of ``client_ids`` in the same
        store call; then clear the stores of those whose session ended. Returns the
        append results and the acknowledgements of the records produced. The caller holds
        ``_serving``."""
        requests: list[WindowRequest] = []
        sessions: list[SessionRecord] = []
        ended: list[str] = []
        for client_id in client_ids:
            if not self.owns(client_id):
                continue
            session = self.sessions.get(client_id)
            if session is None or not _stored_for(session):
                ended.append(client_id)
                continue
            if not session.connected:
                continue
            cursor = self._cursors.get(client_id)
            if cursor is None or cursor.connection_id != session.connection_id:
                before = 0 if cursor is None else max(cursor.sent_seq, cursor.sent_before)
                cursor = self._cursors[client_id] = _Cursor(session.connection_id, 0, before)
            limit = max(1, min(session.receive_maximum, self.settings.persisted_inflight_max))
            requests.append(WindowRequest(client_id, limit, cursor.sent_seq))
            sessions.append(session)
        acks: list[Awaitable[object]] = []
        results: list[AppendResult] = []
        if requests or batch:
            done = await self.store.apply_batch(
                batch.appends,
                batch.applied,
                batch.replaying,
                batch.acknowledgements,
                requests,
                now_ms,
            )
            results = done.appended
            stale: list[StoredMessage] = []
            for request, session, window in zip(requests, sessions, done.windows, strict=True):
                await self._send_window(session, request.client_id, window, acks, stale)
            await self._discard(stale)
        # After the batch's appends, as before a combined call: what an ended session's
        # store got in them goes too.
        for client_id in ended:
            self._cursors.pop(client_id, None)
            if await self.store.clear(client_id):
                log.info("client %r: session ended, stored messages deleted", client_id)
        return results, acks

    async def _send_window(
        self,
        session: SessionRecord,
        client_id: str,
        window: list[StoredMessage],
        acks: list[Awaitable[object]],
        stale: list[StoredMessage],
    ) -> None:
        """Send ``window`` (messages not yet sent to this connection, marked SENT by the
        store as it read them) to the client's node; the messages of another session go
        to ``stale``."""
        cursor = self._cursors[client_id]
        releases: list[tuple[str, int]] = []
        bundle: list[tuple[bytes, bytes, Target]] = []
        origins: list[Origin | None] = []  # each bundled message's msg.all origin
        size = 0
        for message in window:
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
            if bundle and size + len(message.data) > BUNDLE_MAX_BYTES:
                acks.append(await self._send_bundle(session, client_id, bundle, origins))
                bundle, origins, size = [], [], 0
            bundle.append((stored.meta_raw, stored.payload, target))
            origins.append(stored.origin)
            size += len(message.data)
        if bundle:
            acks.append(await self._send_bundle(session, client_id, bundle, origins))
        if releases:
            acks.append(
                await self._send(*release_record(self.names, session.node_id, client_id, releases))
            )
        if window:
            cursor.sent_seq = window[-1].seq

    async def _publish(
        self,
        session: SessionRecord,
        client_id: str,
        meta_raw: bytes,
        payload: bytes,
        target: Target,
        origin: Origin | None = None,
    ) -> Awaitable[object]:
        """Send a message (raw ``m`` header, payload) to ``target`` on the node of its
        connected ``session``, with its ``msg.all`` ``origin`` if known (header ``a``)."""
        key = client_id.encode("utf-8")
        record = downlink_record(
            self.names, session.node_id, key, meta_raw, payload, [target], origin
        )
        return await self._send(*record)

    async def _send_bundle(
        self,
        session: SessionRecord,
        client_id: str,
        messages: list[tuple[bytes, bytes, Target]],
        origins: list[Origin | None],
    ) -> Awaitable[object]:
        """Send ``messages`` (raw ``m`` header, payload, target each), in order, to the
        node of the client's connected ``session`` as one downlink record, with each one's
        ``msg.all`` origin where known (``origins``, one per message: a replay's switch
        reads them)."""
        return await self._send(
            *downlink_bundle_record(self.names, session.node_id, client_id, messages, origins)
        )

    async def _discard(self, messages: list[StoredMessage]) -> None:
        """Delete ``messages`` (of no live session, or undecodable) from the store, and
        serve their clients again: their window has room now."""
        requests: list[AckRequest] = []
        for message in messages:
            client_id, packet_id = message.client_id, message.packet_id
            if message.qos == 1:
                requests.append(AckRequest(client_id, packet_id, AckKind.PUBACK))
                continue
            if message.state is not MessageState.RELEASED:
                requests.append(AckRequest(client_id, packet_id, AckKind.PUBREC))
            requests.append(AckRequest(client_id, packet_id, AckKind.PUBCOMP))
        await self.store.acknowledge_many(requests)
        for message in messages:
            self._mark_dirty(message.client_id)

    # ------------------------------------------------------------------ session expiry

    async def expire_sessions(self, now_ms: int) -> list[Awaitable[object]]:
        """End the owned persistent DEVICE sessions that outlived their Session Expiry
        Interval (MQTT 3.1.2.11.2) or ``session_expiry_max_seconds``: tombstones for their
        session and subscriptions records, their SESSION_EXPIRED event in ``client.events``,
        and their stored messages deleted."""
        acks: list[Awaitable[object]] = []
        cap = self.settings.session_expiry_max_seconds
        for client_id, session in list(self.sessions.items()):
            if not _stored_for(session):
                continue
            if not self.owns(client_id) or not session_expired(session, now_ms, cap):
                continue
            log.info("client %r: session expired", client_id)
            async with self._serving:
                await self.store.clear(client_id)
                self._cursors.pop(client_id, None)
            for record in session_expired_records(self.names, client_id, session, now_ms):
                acks.append(await self._send(*record))
        return acks


class StoreMetrics:
    """What device_persist serves about its store on ``/metrics``:

    - ``cormorant_device_store_sessions{state}`` (gauge): the persistent DEVICE sessions
      this instance owns, by connected state;
    - ``cormorant_device_store_messages`` (gauge): the messages the store holds for them,
      counted again at most every ``interval`` seconds (one pipelined round trip to the
      store for all of them);
    - ``cormorant_device_store_dropped_messages_total`` (counter): stored messages the
      per-client cap dropped since this process started
      (:attr:`DevicePersister.dropped_messages`). No client id label: the number of
      clients is unbounded; the admin API's session view gives a client's own count.
    """

    def __init__(self, persister: DevicePersister, interval: float = 10.0) -> None:
        self.persister = persister
        self.interval = interval
        self.sessions = {"connected": 0, "disconnected": 0}
        self.messages = 0
        self._counted_at = -interval

    async def refresh(self) -> None:
        """Count again if the last count is older than ``interval`` (store errors logged)."""
        loop = asyncio.get_running_loop()
        if loop.time() - self._counted_at < self.interval:
            return
        self._counted_at = loop.time()
        persister = self.persister
        owned = [
            (client_id, session)
            for client_id, session in persister.sessions.items()
            if _stored_for(session) and persister.owns(client_id)
        ]
        connected = sum(1 for _, session in owned if session.connected)
        self.sessions = {"connected": connected, "disconnected": len(owned) - connected}
        try:
            self.messages = sum(await persister.store.counts([c for c, _ in owned]))
        except StoreError as exc:
            log.warning("could not count the stored messages: %r", exc)

    def families(self) -> Iterable[Metric]:
        """The two gauges as of the last :meth:`refresh`, and the counter as of now."""
        sessions = GaugeMetricFamily(
            "cormorant_device_store_sessions",
            "Persistent DEVICE sessions this instance owns, by connected state.",
            labels=["state"],
        )
        for state, count in self.sessions.items():
            sessions.add_metric([state], count)
        yield sessions
        yield GaugeMetricFamily(
            "cormorant_device_store_messages",
            "Messages the DEVICE store holds for the sessions this instance owns.",
            value=self.messages,
        )
        yield CounterMetricFamily(
            "cormorant_device_store_dropped_messages",
            "Stored messages the per-client cap (CORMORANT_PERSISTED_MAX_MESSAGES) dropped, "
            "oldest first, to take new ones.",
            value=self.persister.dropped_messages,
        )


def _stored_for(session: SessionRecord) -> bool:
    """Whether messages for this session go through the store (a persistent DEVICE one)."""
    return delivery_path(session) is DeliveryPath.PERSISTED
