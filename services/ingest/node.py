"""The ingest node: its connections and what they ask of the world outside MQTT.

:class:`IngestNode` wires the node's parts together and carries out the effects of every
connection (:meth:`IngestNode.run`): bytes go to the client's socket, store effects to
Kafka (:mod:`~services.ingest.store_pipeline`; a delayed Will Message among them, to
``client.wills``, and delayed publications, to ``msg.delayed``), a registration to the
client registry (:mod:`~services.ingest.registry`), a credential check to the authenticator
(:mod:`services.common.auth.authenticate`, off the event loop's hot path). It follows
``client.sessions`` and ``client.subscriptions`` (session lookup at CONNECT; each record is
shown to the client's connection here, which decides on a session takeover, and to the
waiting Will Messages of the ``client.wills`` partitions this node owns,
:mod:`~services.ingest.delayed_wills`; the delayed publications of the ``msg.delayed``
partitions it owns are timed in :mod:`~services.ingest.delayed_publish`), hands downlink
records to the target connections (:meth:`IngestNode.deliver`), and applies credential
changes announced by PostgreSQL to the connections they concern
(:meth:`IngestNode.credential_changed`: a disabled or deleted credential disconnects its
clients, a changed one gives them its new rules). Every MQTT decision is the sans-IO core's
(:mod:`~services.ingest.connection` and its modules); start and stop are in
:mod:`~services.ingest.shutdown`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable

from services.common import metrics
from services.common.auth.authenticate import Authenticator
from services.common.auth.blocked import Block, ConnectGate, FlappingSettings, Verdict
from services.common.auth.credentials import Credential
from services.common.auth.principal import (
    Accepted,
    Refused,
    outcome_name,
    presented,
    principal_of,
)
from services.common.auth.store import Change
from services.common.clock import now_ms
from services.common.faust_app import SendRecord
from services.common.kafka.names import TopicNames
from services.common.mqtt.reason_codes import ReasonCode
from services.common.records import (
    AdminDisconnect,
    DelayedRecord,
    Downlink,
    Headers,
    SessionRecord,
    client_event_record,
    client_session_record,
    client_subscriptions_record,
    parse_client_session,
    parse_client_subscriptions,
    parse_delayed,
    stale_delete,
)
from services.common.sessions import assigned_client_id
from services.common.settings import Settings
from services.common.subscription import Subscription
from services.ingest import shutdown
from services.ingest.delayed_publish import DelayedTimers
from services.ingest.delayed_wills import WillTimers
from services.ingest.effects import (
    Authenticate,
    Close,
    Connected,
    CreateAppTopic,
    Effect,
    LimitRefused,
    RecordEvent,
    Send,
    StartReplay,
    StopReplay,
    StoreDelayed,
    StoreEffect,
    StoreSession,
    SyncState,
    WatchSession,
)
from services.ingest.events import AUTH_FAILURES
from services.ingest.fan_out import FanOut
from services.ingest.limits import Limits, Refusal
from services.ingest.rate_limits import Admission
from services.ingest.refusals import Refusals
from services.ingest.registry import Client, ClientRegistry
from services.ingest.replay import Replays
from services.ingest.state import ServerContext
from services.ingest.store_pipeline import ReadLiveFrom, StorePipeline
from services.ingest.timed_records import Commit

log = logging.getLogger(__name__)

StoreBlock = Callable[[Block], Awaitable[None]]
"""``await store(block)``: store a block flapping detection made (every node then has it)."""

FetchCredential = Callable[[uuid.UUID], Awaitable[Credential | None]]
"""``await fetch(id)``: the credential as PostgreSQL has it now (None: deleted)."""

#: Credential changes remembered for authentications in flight (older ones are forgotten).
_CHANGES_KEPT = 10_000

EnsureAppTopic = Callable[[str], Awaitable[None]]
"""``await ensure(client_id)`` returns once the client's ``msg.app.<client>`` topic exists
(created if it did not); raises if it cannot be made sure of."""


class IngestNode:
    """This node's clients and the Kafka side of their effects.

    ``send`` produces a record (see :data:`SendRecord`); ``sync_state`` returns once the
    state topics have been applied up to their current end; ``ensure_app_topic`` makes
    sure of a persistent APPLICATION client's topic (:data:`EnsureAppTopic`);
    ``authenticator`` checks credentials and ``fetch_credential`` reads one that changed
    (:data:`FetchCredential`); ``store_block`` stores the blocks flapping detection makes
    (:data:`StoreBlock`; None: they hold on this node only); ``read_live_from`` reads
    ``msg.all``'s end offsets for new subscriptions' cuts and replays' second cuts
    (:data:`~services.ingest.store_pipeline.ReadLiveFrom`; None: no cut); ``settings``
    gives the node id, topic names, the limits of its connections, the backpressure
    threshold and the Kafka request timeout (seconds), which also bounds
    ``ensure_app_topic``. ``commit_will`` writes records in one transaction of a
    ``client.wills`` partition this node owns, ``commit_delayed`` in one of a ``msg.delayed``
    partition (:data:`~services.ingest.timed_records.Commit`).
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
        commit_delayed: Commit,
        authenticator: Authenticator,
        fetch_credential: FetchCredential,
        store_block: StoreBlock | None = None,
        read_live_from: ReadLiveFrom | None = None,
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
        flapping = None
        if settings.flapping_max_connects:
            flapping = FlappingSettings(
                settings.flapping_max_connects,
                settings.flapping_window_seconds,
                settings.flapping_block_seconds,
            )
        self.gate = ConnectGate(flapping)
        self._store_block = store_block
        self.context = ServerContext(
            Limits.from_settings(settings),
            settings.node_id,
            self.previous_session,
            clock,
            new_client_id,
            blocked=self.check_blocked,
        )
        self.registry = ClientRegistry()
        self.pipeline = StorePipeline(
            send,
            self.names,
            settings.kafka_request_timeout_seconds,
            settings.ingest_max_pending_records,
            self._stored,
            self._store_failed,
            read_live_from,
        )
        self.replays = Replays(settings, self.run, clock, read_live_from)
        self.wills = WillTimers(self.names, commit_will, sync_state, self.latest_session, clock)
        self.delayed = DelayedTimers(self.names, commit_delayed, clock)
        self.authenticator = authenticator
        self._fetch_credential = fetch_credential
        # the connections authenticated with each credential (disconnected when it is
        # disabled or deleted); credential changes by epoch, for checks in flight
        self.by_credential: dict[uuid.UUID, set[Client]] = {}
        self._epoch = 0
        self._changed_at: dict[uuid.UUID, int] = {}
        self.auth_failures = 0
        self.refusals = Refusals()
        self.admission = Admission(
            settings.max_connections,
            settings.max_connection_rate,
            settings.max_connection_rate_per_address,
        )

    def admit(self, host: str) -> Refusal | None:
        """A new connection from IP address ``host`` opens: None if the connection limits
        let it proceed, else the one that refuses it (its CONNECT gets the CONNACK that
        says so). Counted as open until ``admission.closed()``."""
        refusal = self.admission.admit(host, time.monotonic())
        self.admission.opened()
        return refusal

    def check_blocked(self, client_id: str, username: str | None, address: str) -> Verdict | None:
        """The verdict of :attr:`gate` on a CONNECT (:data:`~services.ingest.state.
        CheckBlocked`); a client that flapping detection blocks just now has its block
        stored (in the background), so every node refuses it."""
        verdict = self.gate.check(client_id, username, address, self.clock())
        if verdict is not None and verdict.new and self._store_block is not None:
            log.warning("client %r: %s", client_id, verdict.block.describe())
            self.pipeline.background(self._keep_block(verdict.block))
        return verdict

    async def _keep_block(self, block: Block) -> None:
        assert self._store_block is not None
        try:
            await self._store_block(block)
        except Exception as exc:  # PostgreSQL unreachable: the block holds on this node
            log.warning("block of %r not stored: %r", block.value, exc)

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
        self, topic: str, key: bytes, value: bytes | None, offset: int, headers: Headers = ()
    ) -> None:
        """Apply one ``client.sessions`` / ``client.subscriptions`` / ``msg.delayed`` record
        (the state reader; ``msg.delayed`` only counts the waiting delayed messages).

        A late delete of an older session (:func:`~services.common.records.stale_delete`) is
        not applied; when the newer session is this node's and no connection holds it, its
        records are written again, so that they, not the delete, stay the latest (a
        compacted topic keeps the last record of a key). A connection that holds it does
        that itself (:meth:`ServerConnection.session_record_seen`).

        Raises ``RecordError`` on garbage (the reader skips it).
        """
        if topic == self.names.msg_delayed:
            self._delayed_record(key, value)
            return
        if topic == self.names.client_subscriptions:
            client_id, subscriptions = parse_client_subscriptions(key, value)
            if stale_delete(self.sessions.get(client_id), value, headers):
                return
            if subscriptions:
                self.subscriptions[client_id] = subscriptions
            else:
                self.subscriptions.pop(client_id, None)
            return
        client_id, record = parse_client_session(key, value)
        current = self.sessions.get(client_id)
        clients = (self.registry.watching(client_id), self.registry.get(client_id))
        if current is not None and stale_delete(current, value, headers):
            self._stale_delete(client_id, current)
            # A connection holding the newer session here stores its records again; one
            # still connecting is not told: no session it might resume has ended.
            clients = (None, self.registry.get(client_id))
        else:
            self.session_offsets[client_id] = offset
            if record is None:
                self.sessions.pop(client_id, None)
            else:
                self.sessions[client_id] = record
            self.wills.session_record(client_id, record, offset)
        for client in clients:
            if client is not None:
                self.run(client, client.connection.session_record_seen(record, offset))
                if client.connection.closed:
                    self.registry.unregister(client)  # taken over: the session is elsewhere

    def _delayed_record(self, key: bytes, value: bytes | None) -> None:
        """A ``msg.delayed`` record: the count of waiting delayed messages follows it."""
        client_id, delayed_id, waiting = parse_delayed(key, value)
        if waiting is None:
            self.context.delayed.remove(client_id, delayed_id)
        elif isinstance(waiting, DelayedRecord):
            self.context.delayed.add(client_id, delayed_id)

    # ----------------------------------------------------------------------------------------
    # effects

    def run(self, client: Client, effects: list[Effect]) -> None:
        """Carry out ``effects`` of ``client``'s connection, in order; the client's
        replays, if any, look at its in-flight window again."""
        if self.replays:
            self.replays.wake(client)
        for effect in effects:
            if isinstance(effect, Send):
                client.write(effect.data)
            elif isinstance(effect, Close):
                log.debug("closing %r: %s", client.connection.client_id, effect.reason)
                client.close()
            elif isinstance(effect, Connected):
                self._register(client, effect.client_id)
                client.keep_alive_changed()  # Keep Alive counts from the CONNACK just sent
            elif isinstance(effect, CreateAppTopic):
                ensure = self._ensure_app_topic(effect.client_id)
                self.pipeline.background(
                    self._report(client, effect.token, ensure, "msg.app topic")
                )
            elif isinstance(effect, WatchSession):
                self.registry.watch(client, effect.client_id)
            elif isinstance(effect, Authenticate):
                self.pipeline.background(self._authenticate(client, effect))
            elif isinstance(effect, SyncState):
                synced = self.sync_state()
                self.pipeline.background(self._report(client, effect.token, synced, "state"))
            elif isinstance(effect, LimitRefused):
                connection = client.connection
                who = connection.client_id or connection.state.client_address
                self.refusals.note(effect.refusal, who, effect.detail)
            elif isinstance(effect, StartReplay):
                self.replays.start(client, effect)
            elif isinstance(effect, StopReplay):
                self.replays.stop(client, effect.topic_filter)
            elif isinstance(effect, RecordEvent):
                # Nothing waits for it: off the hot path (a failure is only logged).
                record = client_event_record(self.names, effect.client_id, effect.event)
                self.pipeline.write_logged(record)
            else:
                self.pipeline.enqueue(client, effect)

    def _stale_delete(self, client_id: str, current: SessionRecord) -> None:
        log.info("client %r: a late delete of an older session ignored", client_id)
        if current.node_id != self.settings.node_id or self.registry.get(client_id) is not None:
            return
        self.pipeline.write_logged(client_session_record(self.names, client_id, current))
        subscriptions = self.subscriptions.get(client_id)
        if subscriptions:
            record = client_subscriptions_record(self.names, client_id, subscriptions)
            self.pipeline.write_logged(record)

    # ----------------------------------------------------------------------------------------
    # authentication

    async def _authenticate(self, client: Client, effect: Authenticate) -> None:
        """Check ``effect``'s credentials and report the outcome to the connection. A check
        that accepted a credential changed while it ran is made again, so a credential
        disabled meanwhile never lets a client in."""
        for _attempt in range(3):
            epoch = self._epoch
            outcome = await self.authenticator.authenticate(effect.request, effect.state)
            credential_id = (
                outcome.principal.credential_id if isinstance(outcome, Accepted) else None
            )
            if credential_id is None or self._changed_at.get(credential_id, -1) < epoch:
                break
        metrics.authentication(presented(effect.request), outcome_name(outcome))
        connection = client.connection
        if connection.closed:
            return
        if isinstance(outcome, Refused) and outcome.reason_code in AUTH_FAILURES:
            self.auth_failures += 1
            log.info(
                "authentication failure from %s (%d on this node)",
                connection.state.client_address,
                self.auth_failures,
            )
        before = connection.state.principal
        self.run(client, connection.authenticated(outcome))
        self._track(client, before.credential_id if before else None)

    def _track(self, client: Client, old: uuid.UUID | None) -> None:
        """Keep :attr:`by_credential` right after ``client``'s principal may have changed
        from credential ``old``."""
        principal = client.connection.state.principal
        new = None if principal is None or client.connection.closed else principal.credential_id
        if old == new:
            return
        if old is not None:
            clients = self.by_credential.get(old)
            if clients is not None:
                clients.discard(client)
                if not clients:
                    del self.by_credential[old]
        if new is not None:
            self.by_credential.setdefault(new, set()).add(client)

    def credential_changed(self, change: Change) -> None:
        """A credential was added, changed or deleted (PostgreSQL's notification; the
        credential cache has forgotten it already): its live connections here are
        disconnected (disabled, deleted: v5 DISCONNECT 0x98) or get its new rules."""
        self._epoch += 1
        if len(self._changed_at) >= _CHANGES_KEPT:
            self._changed_at.clear()
        self._changed_at[change.id] = self._epoch
        if change.id not in self.by_credential:
            return
        if change.op == "DELETE":
            self._apply(change.id, None)
        else:
            self.pipeline.background(self._refresh(change.id))

    def credentials_resynced(self) -> None:
        """Changes may have been missed (the notifications were not followed for a
        while; the cache was emptied): check every credential with live connections here."""
        for credential_id in list(self.by_credential):
            self.pipeline.background(self._refresh(credential_id))

    async def _refresh(self, credential_id: uuid.UUID) -> None:
        try:
            credential = await self._fetch_credential(credential_id)
        except Exception as exc:  # PostgreSQL unreachable: the resync after it reconnects
            log.warning("credential %s could not be read: %r", credential_id, exc)
            return
        self._apply(credential_id, credential)

    def _apply(self, credential_id: uuid.UUID, credential: Credential | None) -> None:
        """Apply the credential as it now is (None: deleted) to its connections here."""
        for client in list(self.by_credential.get(credential_id, ())):
            connection = client.connection
            principal = connection.state.principal
            if credential is None or not credential.enabled:
                what = "deleted" if credential is None else "disabled"
                self.run(client, connection.revoked(f"credential {what}"))
                self._track(client, credential_id)
            elif principal is not None and credential.revision != principal.revision:
                self.run(client, connection.principal_changed(
                    principal_of(credential, principal.username)
                ))  # fmt: skip

    def _stored(self, client: Client, effect: StoreEffect, metadata: object) -> None:
        connection = client.connection
        if isinstance(effect, StoreSession) and effect.record is not None:
            offset = getattr(metadata, "offset", None)
            if effect.record.connected and isinstance(offset, int):
                connection.session_stored_at(offset)
        self.run(client, connection.stored(effect.token))

    def _store_failed(self, client: Client, effect: StoreEffect) -> None:
        if isinstance(effect, StoreDelayed):
            # Counted at acceptance; if Kafka writes it after all, it is read and counted.
            self.context.delayed.remove(client.connection.client_id, effect.delayed_id)
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
        self.replays.stop_all(client)
        self.registry.unregister(client)
        principal = client.connection.state.principal
        if principal is not None and principal.credential_id is not None:
            clients = self.by_credential.get(principal.credential_id)
            if clients is not None:
                clients.discard(client)
                if not clients:
                    del self.by_credential[principal.credential_id]

    # ----------------------------------------------------------------------------------------
    # downlink

    def deliver(self, downlink: Downlink) -> int:
        """Send one downlink record to its targets connected here; returns how many got it.

        Raises ``RecordError`` if the message's properties do not decode.
        """
        # Its origin goes with every copy: a replay's switch drops what it replayed by it.
        message = FanOut(downlink.meta, downlink.payload, self.clock(), downlink.origin)
        delivered = 0
        for target in downlink.targets:
            client = self._recipient(target.client_id)
            if client is not None:
                self.run(client, client.connection.deliver_routed(message, target))
                delivered += 1
        return delivered

    def administer(self, command: AdminDisconnect) -> bool:
        """Carry out an administrator's command: disconnect the client's connection it
        names, if that connection is here (a newer one is left alone). Returns whether
        it was."""
        client = self.registry.get(command.client_id)
        if client is None or client.connection.state.connection_id != command.connection_id:
            return False
        log.info("client %r: disconnected by an administrator", command.client_id)
        self.run(client, client.connection.disconnected_by_administrator(command.end_session))
        return True

    def connections(self) -> dict[tuple[str, int], int]:
        """The connected clients by (listener, protocol level): ``cormorant_mqtt_connections``."""
        counts: dict[tuple[str, int], int] = {}
        for client in self.registry.clients():
            state = client.connection.state
            key = (state.listener, state.protocol_version)
            counts[key] = counts.get(key, 0) + 1
        return counts

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

    async def drain(self, window: float, reason_code: int = ReasonCode.SERVER_SHUTTING_DOWN) -> int:
        """Disconnect every client in paced batches, ``drain_notice_seconds`` and
        ``drain_rate`` of the settings, within ``window`` seconds, with v5 DISCONNECT
        ``reason_code`` (:func:`~services.ingest.shutdown.drain`); returns how many. The
        caller has stopped accepting connections first."""
        settings = self.settings
        return await shutdown.drain(
            self.registry,
            self.run,
            settings.drain_notice_seconds,
            settings.drain_rate,
            window,
            reason_code,
        )

    async def shut_down(self) -> None:
        """Close every connection and store what they leave behind
        (:func:`~services.ingest.shutdown.shut_down`)."""
        await shutdown.shut_down(self.registry, self.run, self.pipeline)
