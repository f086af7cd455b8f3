"""The ingest service: a Faust app that owns MQTT sockets (DESIGN.md, ``services/ingest``).

Its producer writes ``msg.all``, ``client.acks`` and the client state topics (and its admin
client creates a persistent APPLICATION client's ``msg.app`` topic at CONNECT); a task reads
the node's own ``msg.downlink.<node_id>`` topic (every partition, from its end, no consumer
group) and writes each message to the target sockets, or sends the PUBRELs a record with
header ``r`` asks for. A state reader follows ``client.sessions`` and ``client.subscriptions``
in full for session takeover, session resumption and Will Messages waiting out their delay;
another task owns this node's share of ``client.wills`` (:mod:`services.ingest.wills`).
Credentials come from PostgreSQL through a cache that the store's change notifications
keep right (:mod:`services.common.auth.cache`), as they keep the passwords verified lately
(:mod:`services.common.auth.verified`); a task follows them.

At start, once the state is read and before the listener opens, the sessions still shown
connected to this node are ended (their connections died with the previous process); at
shutdown every connection is closed and its Will Message and end records are stored before
the producer stops.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable

import faust
from aiokafka import TopicPartition

from services.common import metrics
from services.common.auth.authenticate import Authenticator
from services.common.auth.authorize import parse_rules
from services.common.auth.cache import CredentialCache
from services.common.auth.jwks import JwksKeys
from services.common.auth.store import Change, CredentialStore
from services.common.auth.throttle import AuthThrottle
from services.common.auth.verified import VerifiedPasswords
from services.common.faust_app import (
    make_app,
    on_shutdown,
    run_service,
    run_task,
    sender,
    transactional_producer,
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
from services.common.kafka.names import TopicNames
from services.common.kafka.security import client_security
from services.common.kafka.state_reader import CompactedTopicReader
from services.common.records import (
    AdminDisconnect,
    Downlink,
    KafkaRecord,
    RecordError,
    parse_downlink,
)
from services.common.settings import Settings
from services.common.web import serve_http
from services.ingest.listeners import Listeners, start_listeners
from services.ingest.node import IngestNode
from services.ingest.wills import WillOwnership

log = logging.getLogger(__name__)


def build_app(settings: Settings) -> faust.App:
    """Build the ingest node's Faust app: listener, state reader and downlink reader."""
    names = TopicNames.from_settings(settings)
    app = make_app(settings, f"ingest-{settings.node_id}")
    readiness = serve_http(app, "ingest", settings.ready_file, settings.node_id)

    send = sender(app)

    async def sync_state() -> None:
        await reader.barrier()

    async def ensure_app_topic(client_id: str) -> None:
        await ensure_topics(
            settings.kafka_bootstrap,
            [app_topic_spec(settings, client_id)],
            settings.replication_factor,
            security=client_security(settings),
        )

    wills_transactions = PartitionTransactions(
        lambda transactional_id: transactional_producer(settings, transactional_id),
        f"{names.wills_group}.",
        names.wills_group,
    )

    async def commit_will(partition: int, records: list[KafkaRecord]) -> None:
        async def produce() -> list[Awaitable[object]]:
            return [await send(*record) for record in records]

        tp = TopicPartition(names.client_wills, partition)
        await wills_transactions.run_in(tp, produce, settings.kafka_request_timeout_seconds)

    cache = CredentialCache(CredentialStore.from_settings(settings))
    verified = VerifiedPasswords(
        settings.auth_verified_cache_entries, settings.auth_verified_cache_seconds
    )
    authenticator = Authenticator(
        cache,
        jwks=JwksKeys(settings.jwt_jwks_refresh_seconds, settings.jwt_jwks_ca_file),
        allow_anonymous=settings.allow_anonymous,
        anonymous_rules=parse_rules(settings.anonymous_rules),
        hash_workers=settings.auth_hash_workers,
        max_pending_hashes=settings.auth_max_pending,
        max_pending_per_address=settings.auth_max_pending_per_address,
        verified=verified,
        throttle=AuthThrottle(
            window=settings.auth_failure_window_seconds,
            delay_after=settings.auth_failure_delay_after,
            delay=settings.auth_failure_delay_seconds,
            max_delay=settings.auth_failure_max_delay_seconds,
            limit=settings.auth_failure_limit,
            ban_after=settings.auth_failure_ban_after,
            ban_seconds=settings.auth_failure_ban_seconds,
            exempt=settings.auth_failure_exempt_networks,
        ),
        scram_unknown_user_key=(
            None
            if settings.scram_unknown_user_key is None
            else settings.scram_unknown_user_key.get_secret_value().encode()
        ),
    )
    node = IngestNode(
        settings,
        send,
        sync_state,
        ensure_app_topic,
        authenticator=authenticator,
        fetch_credential=cache.get,
        commit_will=commit_will,
    )

    def credential_changed(change: Change) -> None:
        cache.changed(change)
        verified.forget(change.id)
        node.credential_changed(change)

    def credentials_resynced() -> None:
        cache.clear()
        verified.clear()
        node.credentials_resynced()

    reader = CompactedTopicReader(
        settings.kafka_bootstrap,
        [names.client_sessions, names.client_subscriptions],
        node.apply_state,
        security=client_security(settings),
    )
    listeners: list[Listeners] = []
    tasks: list[asyncio.Task[None]] = []
    downlink = names.downlink(settings.node_id)
    readiness.add("kafka", reader.end_offsets)
    metrics.register(
        lambda: metrics.mqtt_families(
            metrics.MQTT, node.connections, node.pending_records, node.refusals.counts.items()
        )
    )

    async def deliver_batch(records: list[Record]) -> list[Awaitable[object]]:
        for record in records:
            try:
                parsed = parse_downlink(record.value, record.headers)
                if isinstance(parsed, Downlink):
                    node.deliver(parsed)
                elif isinstance(parsed, AdminDisconnect):
                    node.administer(parsed)
                else:
                    node.release(parsed.releases)
            except RecordError as exc:
                # A poisoned record is logged and skipped; it must never block the partition.
                log_undecodable(log, record, exc)
        return []  # delivery is best effort here: QoS 1/2 is tracked per connection

    async def own_wills() -> None:
        # In the ingest nodes' client.wills group, a static member named by the node id: a
        # restarted node takes its partitions back without a rebalance.
        consumer = make_consumer(settings, group_id=names.wills_group, instance_id=settings.node_id)
        await consumer.start()
        try:
            await WillOwnership(consumer, wills_transactions, node.wills, names).run()
        finally:
            await node.wills.stop()
            await wills_transactions.close()
            await consumer.stop()

    async def serve() -> None:
        await reader.start()
        tasks.append(
            asyncio.create_task(cache.store.listen(credential_changed, credentials_resynced))
        )
        tasks.append(asyncio.create_task(cache.follow_client_ids(), name="client-ids"))
        if settings.allow_anonymous:
            log.warning("node %s: anonymous clients may connect", settings.node_id)
        # Sessions the state shows connected here died with the previous process.
        await node.reconcile()
        tasks.append(asyncio.create_task(own_wills(), name="ingest-wills"))
        # The downlink topic is read from its end, outside any consumer group: its records
        # are for the connections of this process's life only (a restarted node has none).
        # The position is fixed before the listener opens, so no client misses a record.
        consumer = make_consumer(settings, group_id=None)
        await consumer.start()
        try:
            async with asyncio.timeout(60):
                await assign_whole_topics(consumer, [downlink], from_end=True)
            opened = await start_listeners(node)
            listeners.append(opened)
            # SIGHUP: new TLS connections get the certificate files' current content.
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, opened.reload_tls)
            readiness.serving(f"ingest {settings.node_id} {settings.mqtt_port}")
            await consume_batches(consumer, deliver_batch, stage="ingest")
        finally:
            await consumer.stop()

    async def stop() -> None:
        readiness.stopping()
        for opened in listeners:
            opened.close()
        await node.shut_down()  # wills and end records, while the producer still runs
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        authenticator.close()
        await cache.store.close()
        await reader.stop()

    run_task(app, serve)
    on_shutdown(app, stop)
    return app


def run() -> None:
    """Entry point of ``cormorant ingest``: the core topics and this node's downlink topic
    are created before consumers start."""
    run_service(build_app, lambda settings: [downlink_topic_spec(settings, settings.node_id)])
