"""The ingest node: its connections and what they ask of the world outside MQTT.

:class:`IngestNode` wires the node's parts together and carries out the effects of every
connection (:meth:`IngestNode.run`): bytes go to the client's socket, store effects to
Kafka (:mod:`~services.ingest.store_pipeline`; a delayed Will Message among them, to
``client.wills``), a registration to the client registry (:mod:`~services.ingest.registry`).
It follows ``client.sessions`` and ``client.subscriptions`` (session lookup at CONNECT;
each record is shown to the client's connection here, which decides on a session takeover,
and to the waiting Will Messages of the ``client.wills`` partitions this node owns,
:mod:`~services.ingest.wills`), and
hands downlink records to the target connections (:meth:`IngestNode.deliver`). Every MQTT
decision is the sans-IO core's (:mod:`~services.ingest.connection` and its modules); start
and stop are in :mod:`~services.ingest.shutdown`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from services.common.clock import now_ms
from services.common.faust_app import SendRecord
from services.common.kafka.names import TopicNames
from services.common.records import (
    Downlink,
    SessionRecord,
    client_event_record,
    parse_client_session,
    parse_client_subscriptions,
)
from services.common.sessions import assigned_client_id
from services.common.settings import Settings
from services.common.subscription import Subscription
from services.ingest import shutdown
from services.ingest.effects import (
    Close,
    Connected,
    CreateAppTopic,
    Effect,
    RecordEvent,
    Send,
    StoreEffect,
    StoreSession,
    SyncState,
    WatchSession,
)
from services.ingest.fan_out import FanOut
from services.ingest.limits import Limits
from services.ingest.registry import Client, ClientRegistry
from services.ingest.state import ServerContext
from services.ingest.store_pipeline import StorePipeline
from services.ingest.wills import Commit, WillTimers

log = logging.getLogger(__name__)

EnsureAppTopic = Callable[[str], Awaitable[None]]
"""``await ensure(client_id)`` returns once the client's ``msg.app.<client>`` topic exists
(created if it did not); raises if it cannot be made sure of."""


class IngestNode:
    """This node's clients and the Kafka side of their effects.

    ``send`` produces a record (see :data:`SendRecord`); ``sync_state`` returns once the
    state topics have been applied up to their current end; ``ensure_app_topic`` makes
    sure of a persistent APPLICATION client's topic (:data:`EnsureAppTopic`); ``settings``
    gives the node id, topic names, the limits of its connections, the backpressure
    threshold and the Kafka request timeout (seconds), which also bounds
    ``ensure_app_topic``. ``commit_will`` writes records in one transaction of a
    ``client.wills`` partition this node owns (:data:`~services.ingest.wills.Commit`).
    ``clock`` (Unix ms) and ``new_client_id`` are the real ones unless a test gives its own.
    """

    def __init__(
        self,
        settings: Settings,
        send: SendRecord,
        sync_state: Callable[[], Awaitable[None]],
        ensure_app_topic: EnsureAppTopic,
        *,
        commit_will: Commit,
        clock: Callable[[], int] = now_ms,
        new_client_id: Callable[[], str] = assigned_client_id,
    ) -> None:
        self.settings = settings
        self.sync_state = sync_state
        self.names = TopicNames.from_settings(settings)
        self.clock = clock
        self._ensure_app_topic = ensure_app_topic
        self.sessions: dict[str, SessionRecord] = {}
        self.session_offsets: dict[str, int] = {}
        self.subscriptions: dict[str, list[Subscription]] = {}
        self.context = ServerContext(
            Limits.from_settings(settings),
            settings.node_id,
            self.previous_session,
            clock,
            new_client_id,
        )
        self.registry = ClientRegistry()
        self.pipeline = StorePipeline(
            send,
            self.names,
            settings.kafka_request_timeout_seconds,
            settings.ingest_max_pending_records,
            self._stored,
            self._store_failed,
        )
        self.wills = WillTimers(self.names, commit_will, sync_state, self.latest_session, clock)

    @property
    def pending_records(self) -> int:
        """Store effects waiting to be sent to Kafka or for its answer."""
        return self.pipeline.pending_records

    # ----------------------------------------------------------------------------------------
    # state topics

    def previous_session(self, client_id: str) -> tuple[SessionRecord | None, list[Subscription]]:
        """The latest session record and subscriptions of ``client_id`` known to this node."""
        return self.sessions.get(client_id), self.subscriptions.get(client_id, [])

    def latest_session(self, client_id: str) -> tuple[SessionRecord | None, int]:
        """The latest ``client.sessions`` record of ``client_id`` (None: none, or a
        tombstone) and its offset (-1 if none was read)."""
        return self.sessions.get(client_id), self.session_offsets.get(client_id, -1)

    def apply_state(
        self, topic: str, key: bytes, value: bytes | None, offset: int, headers: object = ()
    ) -> None:
        """Apply one ``client.sessions`` / ``client.subscriptions`` record (the state reader).

        Raises ``RecordError`` on garbage (the reader skips it).
        """
        if topic == self.names.client_subscriptions:
            client_id, subscriptions = parse_client_subscriptions(key, value)
            if subscriptions:
                self.subscriptions[client_id] = subscriptions
            else:
                self.subscriptions.pop(client_id, None)
            return
        client_id, record = parse_client_session(key, value)
        self.session_offsets[client_id] = offset
        if record is None:
            self.sessions.pop(client_id, None)
        else:
            self.sessions[client_id] = record
        self.wills.session_record(client_id, record, offset)
        for client in (self.registry.watching(client_id), self.registry.get(client_id)):
            if client is not None:
                self.run(client, client.connection.session_record_seen(record, offset))
                if client.connection.closed:
                    self.registry.unregister(client)  # taken over: the session is elsewhere

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
            elif isinstance(effect, CreateAppTopic):
                ensure = self._ensure_app_topic(effect.client_id)
                self.pipeline.background(
                    self._report(client, effect.token, ensure, "msg.app topic")
                )
            elif isinstance(effect, WatchSession):
                self.registry.watch(client, effect.client_id)
            elif isinstance(effect, SyncState):
                synced = self.sync_state()
                self.pipeline.background(self._report(client, effect.token, synced, "state"))
            elif isinstance(effect, RecordEvent):
                # Nothing waits for it: off the hot path (a failure is only logged).
                record = client_event_record(self.names, effect.client_id, effect.event)
                self.pipeline.write_logged(record)
            else:
                self.pipeline.enqueue(client, effect)

    def _stored(self, client: Client, effect: StoreEffect, metadata: object) -> None:
        connection = client.connection
        if isinstance(effect, StoreSession) and effect.record is not None:
            offset = getattr(metadata, "offset", None)
            if effect.record.connected and isinstance(offset, int):
                connection.session_stored_at(offset)
        self.run(client, connection.stored(effect.token))

    def _store_failed(self, client: Client, effect: StoreEffect) -> None:
        self.run(client, client.connection.store_failed(effect.token))

    async def _report(self, client: Client, token: int, done: Awaitable[None], what: str) -> None:
        """Await ``done`` (at most the Kafka request timeout), then report the outcome to
        the connection as that of its effect ``token``."""
        try:
            await asyncio.wait_for(done, self.settings.kafka_request_timeout_seconds)
        except Exception as exc:
            log.warning("client %r: %s not ready: %r", client.connection.client_id, what, exc)
            self.run(client, client.connection.store_failed(token))
            return
        self.run(client, client.connection.stored(token))

    def _register(self, client: Client, client_id: str) -> None:
        clean_start = client.connection.state.clean_start
        old = self.registry.register(client, client_id)
        if old is not None:
            log.info("client %r reconnected on this node: taking over", client_id)
            self.run(old, old.connection.taken_over(clean_start))

    def unregister(self, client: Client) -> None:
        """Forget ``client`` (its socket closed) unless a newer connection replaced it."""
        self.pipeline.forget(client)
        self.registry.unregister(client)

    # ----------------------------------------------------------------------------------------
    # downlink

    def deliver(self, downlink: Downlink) -> int:
        """Send one downlink record to its targets connected here; returns how many got it.

        Raises ``RecordError`` if the message's properties do not decode.
        """
        message = FanOut(downlink.meta, downlink.payload, self.clock())
        delivered = 0
        for target in downlink.targets:
            client = self._recipient(target.client_id)
            if client is not None:
                self.run(client, client.connection.deliver_routed(message, target))
                delivered += 1
        return delivered

    def release(self, releases: list[tuple[str, int]]) -> None:
        """Send PUBREL for each (client id, Packet Identifier) whose client is connected
        here: QoS 2 deliveries a message store saw acknowledged with PUBREC (MQTT 4.4)."""
        for client_id, packet_id in releases:
            client = self._recipient(client_id)
            if client is not None:
                self.run(client, client.connection.release(packet_id))

    def _recipient(self, client_id: str) -> Client | None:
        """The connection of ``client_id`` here: the registered one, else one still
        waiting for its CONNACK (it holds what it gets until then)."""
        return self.registry.get(client_id) or self.registry.watching(client_id)

    # ----------------------------------------------------------------------------------------
    # start and stop

    async def reconcile(self) -> int:
        """End the sessions the state topics show connected to this node (they died with
        the previous process): :func:`~services.ingest.shutdown.end_orphaned_sessions`.
        Returns how many."""
        return await shutdown.end_orphaned_sessions(
            self.settings.node_id, self.sessions, self.subscriptions, self.pipeline, self.clock()
        )

    async def shut_down(self) -> None:
        """Close every connection and store what they leave behind
        (:func:`~services.ingest.shutdown.shut_down`)."""
        await shutdown.shut_down(self.registry, self.run, self.pipeline)
