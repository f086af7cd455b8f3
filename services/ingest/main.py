"""The ingest service: a Faust app that owns MQTT sockets (docs/design.md, ``services/ingest``).

Its producer writes ``msg.all``, ``client.acks`` and the client state topics (and its admin
client creates a persistent APPLICATION client's ``msg.app`` topic at CONNECT); a task reads
the node's own ``msg.downlink.<node_id>`` topic (every partition, from its end, no consumer
group) and writes each message to the target sockets, or sends the PUBRELs a record with
header ``r`` asks for. A state reader follows ``client.sessions`` and ``client.subscriptions``
in full for session takeover, session resumption and Will Messages waiting out their delay
(and ``msg.delayed``, to count the waiting delayed messages for their bounds);
other tasks own this node's share of ``client.wills`` (:mod:`services.ingest.delayed_wills`)
and of ``msg.delayed`` (:mod:`services.ingest.delayed_publish`).
Credentials come from PostgreSQL through a cache that the store's change notifications
keep right (:mod:`services.common.auth.cache`), as they keep the passwords verified lately
(:mod:`services.common.auth.verified`) and the blocked clients
(:mod:`services.common.auth.blocked_store`); a task follows them.

At start, once the state is read and before the listener opens, the sessions still shown
connected to this node are ended (their connections died with the previous process). At
shutdown (SIGTERM) the node drains: its ``/ready`` fails and its listeners close, then its
clients are disconnected in paced batches (:mod:`services.common.drain`), and their Will
Messages and end records are stored before the producer stops. An administrator's drain
command (a downlink record, ``cormorant drain``) does the same and leaves the node up, out
of rotation (docs/operations/drain.md).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable
from typing import TypeVar

import faust
from aiokafka import AIOKafkaProducer, TopicPartition

from services.common import metrics
from services.common.auth import http_provider
from services.common.auth.authenticate import Authenticator
from services.common.auth.authorize import parse_rules
from services.common.auth.blocked_store import CHANNEL as BLOCKED_CHANNEL
from services.common.auth.blocked_store import BlockedFollower, BlockedStore
from services.common.auth.cache import CredentialCache
from services.common.auth.http_provider import HttpAuthProvider, provider_settings
from services.common.auth.jwks import JwksKeys
from services.common.auth.store import Change, CredentialStore
from services.common.auth.throttle import AuthThrottle
from services.common.auth.verified import VerifiedPasswords
from services.common.faust_app import (
    make_app,
    on_shutdown,
    run_service,
    run_task,
    send_in_transaction,
    sender,
    transactional_producer,
    watched,
)
from services.common.kafka.admin import (
    app_topic_spec,
    downlink_topic_spec,
    ensure_topics,
)
from services.common.kafka.consumer import (
    PartitionTransactions,
    Record,
    assign_whole_topics,
    consume_batches,
    log_undecodable,
    make_consumer,
)
from services.common.kafka.end_offsets import EndOffsets
from services.common.kafka.names import TopicNames
from services.common.kafka.reroutes import RerouteFilter
from services.common.kafka.security import client_security
from services.common.kafka.state_reader import CompactedTopicReader
from services.common.mqtt.reason_codes import ReasonCode
from services.common.records import (
    AdminDisconnect,
    AdminDrain,
    Bundle,
    Downlink,
    KafkaRecord,
    RecordError,
    decode_meta,
    parse_delayed,
    parse_downlink,
    parse_will,
)
from services.common.settings import Settings
from services.common.stores.base import StoreUnavailable
from services.common.web import serve_http
from services.ingest.listeners import Listeners, start_listeners
from services.ingest.node import IngestNode
from services.ingest.node_lease import HeldLease, NodeLeases
from services.ingest.timed_records import Parse, TimedRecords, own_partitions

log = logging.getLogger(__name__)

V = TypeVar("V")


def build_app(settings: Settings, lease: HeldLease | None = None) -> faust.App:
    """Build the ingest node's Faust app: an :class:`IngestService` run by the app's worker.

    With ``lease`` (the claimed pool slot that gave ``settings.node_id``), a task renews it
    for the worker's life (a lost lease crashes the worker: the id may be another's now)
    and the shutdown hook releases it once every connection is closed."""
    app = make_app(settings, f"ingest-{settings.node_id}")
    service = IngestService(settings, app)
    run_task(app, service.run)
    if lease is not None:
        held = lease.moved_to(NodeLeases.from_settings(settings))
        service.lease = held
        run_task(app, held.hold)
    on_shutdown(app, service.stop)
    return app


class IngestService:
    """The ingest node of ``app`` (its Faust app): :meth:`run` reads the state, starts the
    tasks that follow credentials and own this node's wills, opens the listeners and then
    delivers this node's downlink records until cancelled (the app's main task);
    :meth:`stop` is its shutdown hook. The :class:`~services.ingest.node.IngestNode` holds
    the connections; this class connects it to Kafka, PostgreSQL and the sockets."""

    def __init__(self, settings: Settings, app: faust.App) -> None:
        self.settings = settings
        self.names = names = TopicNames.from_settings(settings)
        self.readiness = serve_http(app, "ingest", settings.ready_file, settings.node_id)
        self.send = sender(app)
        self.wills_transactions = self._transactions(names.wills_group)
        self.delayed_transactions = self._transactions(names.delayed_group)
        self.cache = CredentialCache(CredentialStore.from_settings(settings))
        self.blocked_store = BlockedStore(self.cache.store.pool)
        self.verified = VerifiedPasswords(
            settings.auth_verified_cache_entries, settings.auth_verified_cache_seconds
        )
        if settings.allow_anonymous:
            log.warning(
                "anonymous MQTT clients are allowed, with the rules %s",
                settings.anonymous_rules or "[] (none: they may do nothing)",
            )
        provider = provider_settings(settings)
        self.http_provider = None if provider is None else HttpAuthProvider(provider)
        if self.http_provider is not None:
            metrics.register(http_provider.collect)
            log.info("CONNECTs are put to the HTTP authentication provider first")
        self.authenticator = Authenticator(
            self.cache,
            http_provider=self.http_provider,
            jwks=JwksKeys(settings.jwt_jwks_refresh_seconds, settings.jwt_jwks_ca_file),
            allow_anonymous=settings.allow_anonymous,
            anonymous_rules=parse_rules(settings.anonymous_rules),
            hash_workers=settings.auth_hash_workers,
            max_pending_hashes=settings.auth_max_pending,
            max_pending_per_address=settings.auth_max_pending_per_address,
            verified=self.verified,
            throttle=AuthThrottle.from_settings(settings),
            scram_unknown_user_key=(
                None
                if settings.scram_unknown_user_key is None
                else settings.scram_unknown_user_key.get_secret_value().encode()
            ),
        )
        # msg.all's high watermarks: beyond every PUBLISH acknowledged (acks=all), also
        # behind a Will's open transaction, which a last stable offset would stop at.
        self.msg_all_ends = EndOffsets(
            settings.kafka_bootstrap, "read_uncommitted", security=client_security(settings)
        )
        self.node = node = IngestNode(
            settings,
            self.send,
            self.sync_state,
            self.ensure_app_topic,
            read_live_from=self.read_live_from,
            authenticator=self.authenticator,
            fetch_credential=self.cache.get,
            commit_will=self.commit_will,
            commit_delayed=self.commit_delayed,
            store_block=self.blocked_store.extend,
        )
        self.blocked = BlockedFollower(self.blocked_store, node.gate)
        self.reader = CompactedTopicReader(
            settings.kafka_bootstrap,
            # msg.delayed: the count of waiting delayed messages, for their bounds.
            [names.client_sessions, names.client_subscriptions, names.msg_delayed],
            node.apply_state,
            security=client_security(settings),
        )
        self.listeners: list[Listeners] = []
        self.tasks: list[asyncio.Task[None]] = []
        #: Set by :meth:`stop` before it cancels :attr:`tasks`: their end is no failure then.
        self.stopped = False
        self.draining: asyncio.Task[int] | None = None
        self.lease: HeldLease | None = None
        self.downlink = names.downlink(settings.node_id)
        # Downlink records a crashed router routed twice (read from the end: a restarted
        # node has no connection that got the originals).
        self.reroutes = RerouteFilter()
        self.readiness.add("kafka", self.reader.end_offsets)
        metrics.register(
            lambda: metrics.mqtt_families(
                metrics.MQTT, node.connections, node.pending_records, node.refusals.counts.items()
            )
        )
        metrics.register(
            lambda: metrics.delayed_families(
                len(node.delayed), node.context.delayed.total, node.delayed.ended
            )
        )

    async def read_live_from(self) -> tuple[int, ...]:
        """``msg.all``'s end offsets (high watermarks), one per partition, asked of Kafka
        after the call: a new subscription's
        :class:`~services.common.subscription.LiveFrom` cut."""
        ends = await self.msg_all_ends.get()
        return tuple(
            ends[TopicPartition(self.names.msg_all, p)]
            for p in range(self.settings.msg_all_partitions)
        )

    async def sync_state(self) -> None:
        """Return once the state reader has applied every state record stored so far."""
        await self.reader.barrier()

    async def ensure_app_topic(self, client_id: str) -> None:
        """Create the ``msg.app`` topic of APPLICATION client ``client_id`` if missing."""
        settings = self.settings
        await ensure_topics(
            settings.kafka_bootstrap,
            [app_topic_spec(settings, client_id)],
            settings.replication_factor,
            security=client_security(settings),
        )

    def _transactions(self, group: str) -> PartitionTransactions:
        """The partitions' transactional producers of the ingest nodes' ``group``."""
        settings = self.settings
        return PartitionTransactions(
            lambda transactional_id: transactional_producer(settings, transactional_id),
            f"{group}.",
            group,
        )

    async def commit_will(self, partition: int, records: list[KafkaRecord]) -> None:
        """Write ``records`` in one transaction of ``client.wills`` partition ``partition``
        (see :data:`~services.ingest.timed_records.Commit`)."""
        tp = TopicPartition(self.names.client_wills, partition)
        await self._commit(self.wills_transactions, tp, records)

    async def commit_delayed(self, partition: int, records: list[KafkaRecord]) -> None:
        """Write ``records`` in one transaction of ``msg.delayed`` partition ``partition``
        (see :data:`~services.ingest.timed_records.Commit`)."""
        tp = TopicPartition(self.names.msg_delayed, partition)
        await self._commit(self.delayed_transactions, tp, records, self._held(records))

    def _held(self, records: list[KafkaRecord]) -> float:
        """For tests only: seconds to hold a delayed publication's transaction open before
        committing it (``delayed_hold_seconds`` when it publishes to a topic under
        ``delayed_hold_topic_prefix``; else 0)."""
        prefix = self.settings.delayed_hold_topic_prefix
        if not prefix:
            return 0.0
        for record in records:
            if record.topic == self.names.msg_all:
                meta = decode_meta(dict(record.headers)["m"])
                if meta.topic.startswith(prefix):
                    return self.settings.delayed_hold_seconds
        return 0.0

    async def _commit(
        self,
        transactions: PartitionTransactions,
        tp: TopicPartition,
        records: list[KafkaRecord],
        hold: float = 0.0,
    ) -> None:
        async def produce(producer: AIOKafkaProducer) -> list[Awaitable[object]]:
            sent = [await send_in_transaction(producer, *record) for record in records]
            if hold:
                await asyncio.gather(*sent)  # written, uncommitted: a test can see them
                log.warning("delayed_hold_seconds (tests only): committing in %.1f s", hold)
                await asyncio.sleep(hold)
            return sent

        timeout = self.settings.kafka_request_timeout_seconds + hold
        await transactions.run_in(tp, produce, timeout)

    def credential_changed(self, change: Change) -> None:
        """A credential changed in the store: forget what was cached or verified of it."""
        self.cache.changed(change)
        self.verified.forget(change.id)
        self.node.credential_changed(change)

    def credentials_resynced(self) -> None:
        """The store's notifications were lost: forget every cached credential."""
        self.cache.clear()
        self.verified.clear()
        self.node.credentials_resynced()
        self.blocked.changed()

    async def deliver_batch(self, records: list[Record]) -> list[Awaitable[object]]:
        """Hand a batch of this node's downlink records to the node (nothing to await)."""
        node, reroutes = self.node, self.reroutes
        for record in records:
            try:
                parsed = parse_downlink(record.value, record.headers)
                if isinstance(parsed, Downlink):
                    # A copy a crashed router routed again is dropped: QoS 2 stays once.
                    if reroutes.first(record):
                        node.deliver(parsed)
                elif isinstance(parsed, Bundle):
                    # A stored window (device_persist), in order; no router writes these.
                    for downlink in parsed.messages:
                        try:
                            node.deliver(downlink)
                        except RecordError as exc:  # the others of the window still go
                            log_undecodable(log, record, exc)
                elif isinstance(parsed, AdminDisconnect):
                    node.administer(parsed)
                elif isinstance(parsed, AdminDrain):
                    self.drain_by_hand(parsed)
                else:
                    node.release(parsed.releases)
            except RecordError as exc:
                # A poisoned record is logged and skipped; it must never block the partition.
                log_undecodable(log, record, exc)
        return []  # delivery is best effort here: QoS 1/2 is tracked per connection

    async def own(
        self,
        group: str,
        transactions: PartitionTransactions,
        timers: TimedRecords[V],
        topic: str,
        parse: Parse[V],
    ) -> None:
        """Own this node's share of ``topic`` (``client.wills`` or ``msg.delayed``) in the
        ingest nodes' ``group`` until cancelled, joining again whenever the membership
        ends (:func:`~services.ingest.timed_records.own_partitions`)."""
        # A static member named by the node id: a restarted node takes its partitions back
        # without a rebalance.
        settings = self.settings
        await own_partitions(
            lambda: make_consumer(settings, group_id=group, instance_id=settings.node_id),
            transactions,
            timers,
            topic,
            parse,
            group.removeprefix(self.names.service_group("")),
        )

    async def start(self) -> None:
        """Read the state, start the credential, will and delayed publication tasks, end
        the sessions that died with the previous process."""
        settings, cache = self.settings, self.cache
        await self.reader.start()
        await self.msg_all_ends.start(
            [TopicPartition(self.names.msg_all, p) for p in range(settings.msg_all_partitions)]
        )
        self.tasks.append(
            asyncio.create_task(
                cache.store.listen(
                    self.credential_changed,
                    self.credentials_resynced,
                    {BLOCKED_CHANNEL: self.blocked.changed},
                )
            )
        )
        self.tasks.append(asyncio.create_task(self.blocked.run(), name="blocked-clients"))
        self.tasks.append(asyncio.create_task(cache.follow_client_ids(), name="client-ids"))
        if settings.allow_anonymous:
            log.warning("node %s: anonymous clients may connect", settings.node_id)
        # Sessions the state shows connected here died with the previous process.
        await self.node.reconcile()
        names, node = self.names, self.node
        wills = self.own(
            names.wills_group, self.wills_transactions, node.wills, names.client_wills, parse_will
        )
        self.tasks.append(asyncio.create_task(wills, name="ingest-wills"))
        delayed = self.own(
            names.delayed_group,
            self.delayed_transactions,
            node.delayed,
            names.msg_delayed,
            parse_delayed,
        )
        self.tasks.append(asyncio.create_task(delayed, name="ingest-delayed"))

    async def run(self) -> None:
        """:meth:`start`, then open the listeners and deliver the downlink records until
        cancelled."""
        await self.start()
        settings = self.settings
        # The downlink topic is read from its end, outside any consumer group: its records
        # are for the connections of this process's life only (a restarted node has none).
        # The position is fixed before the listener opens, so no client misses a record.
        consumer = make_consumer(settings, group_id=None)
        await consumer.start()
        try:
            async with asyncio.timeout(60):
                await assign_whole_topics(consumer, [self.downlink], from_end=True)
            opened = await start_listeners(self.node)
            self.listeners.append(opened)
            # SIGHUP: new TLS connections get the certificate files' current content.
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, opened.reload_tls)
            self.readiness.serving(f"ingest {settings.node_id} {settings.mqtt_port}")
            await watched(
                consume_batches(consumer, self.deliver_batch, stage="ingest"),
                self.tasks,
                lambda: self.stopped,
            )
        finally:
            await consumer.stop()

    def leave_rotation(self) -> None:
        """Fail ``/ready`` (the load balancer stops sending clients here) and close the
        listeners (connections still coming are refused)."""
        self.readiness.stopping()
        for opened in self.listeners:
            opened.close()
        self.listeners.clear()

    def drain_by_hand(self, command: AdminDrain) -> None:
        """An administrator's drain command: leave the rotation, then disconnect every
        client (0x9C Use another server) in paced batches within the command's window. The
        node stays up, out of rotation, until it is stopped. A second command while one
        runs is ignored."""
        if self.draining is not None:
            log.info("node %s: already drained or draining", self.settings.node_id)
            return
        window = command.window_ms / 1000
        log.info(
            "node %s: drained by an administrator, within %.1f s", self.settings.node_id, window
        )
        self.leave_rotation()
        self.draining = asyncio.create_task(
            self.node.drain(window, ReasonCode.USE_ANOTHER_SERVER), name="drain"
        )

    async def stop(self) -> None:
        """The shutdown hook: leave the rotation, drain (:meth:`IngestNode.drain`: the
        downlink, the state reader and the producer still run, so the clients not yet
        disconnected keep their traffic), end every connection left (wills and end records,
        while the producer still runs), then stop the tasks and readers."""
        self.leave_rotation()
        if self.draining is not None:  # a drain by hand: its window is not ECS's
            self.draining.cancel()
            await asyncio.gather(self.draining, return_exceptions=True)
        await self.node.drain(self.settings.drain_seconds)
        await self.node.shut_down()  # wills and end records, while the producer still runs
        self.stopped = True
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.authenticator.close()
        if self.http_provider is not None:
            await self.http_provider.close()
        await self.cache.store.close()
        await self.reader.stop()
        await self.msg_all_ends.stop()
        if self.lease is not None:
            await self.release_lease(self.lease)

    async def release_lease(self, lease: HeldLease) -> None:
        """Give the node id back for the next task (it would expire by itself otherwise)."""
        try:
            await lease.release()
        except StoreUnavailable as exc:
            log.warning("node id %s: not released (it expires by itself): %s", lease.node_id, exc)
        finally:
            await lease.leases.close()


def run(lease: HeldLease | None = None) -> None:
    """Entry point of ``cormorant ingest``: the core topics and this node's downlink topic
    are created before consumers start; ``lease``: the pooled node id's lease, if the node
    id came from the pool (:mod:`services.ingest.node_lease`)."""
    run_service(
        lambda settings: build_app(settings, lease),
        lambda settings: [downlink_topic_spec(settings, settings.node_id)],
    )
