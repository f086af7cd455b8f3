"""The APPLICATION clients an app_delivery instance owns, and what it does for them.

Which clients those are follows Kafka (:mod:`services.app_delivery.ownership`): the
instance given a partition number of the state topics owns every client whose records are
there. :class:`AppClients` keeps the session and subscriptions of the persistent APPLICATION
clients it owns (a partition is replayed from its beginning when assigned: the topics are
compacted) and, per client, reconciles what runs with what should:

- a connected client has a :class:`~services.app_delivery.feed.ClientFeed`, started when it
  connects, told of each new connection, stopped when it disconnects, when its session is
  replaced (Clean Start: a new session id), or when its partition moves away;
- a session that is removed (a tombstone, or a record that is no longer a persistent
  APPLICATION one) has its ``msg.app.<client>`` topic and consumer group deleted;
- a disconnected session past its Session Expiry Interval (MQTT 3.1.2.11.2) or
  ``session_expiry_max_seconds`` is ended: tombstones for its session and subscriptions,
  whose arrival then deletes its topic.

Acknowledgements (``client.acks``) go to the client's feed; those that arrive while it has
none (before its partition is replayed, between connections) are kept for the next feed,
which applies them once it has read its position.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Iterable

from aiokafka.admin import AIOKafkaAdminClient
from prometheus_client.core import GaugeMetricFamily, Metric

from services.app_delivery.feed import ClientFeed, SharedKey
from services.common.faust_app import SendRecord
from services.common.kafka.admin import app_topic_spec, delete_topics_and_groups, ensure_topics
from services.common.kafka.names import TopicNames
from services.common.kafka.partitioner import partition_of
from services.common.kafka.reroutes import RerouteFilter
from services.common.kafka.security import client_security
from services.common.records import (
    AckRecord,
    SessionRecord,
    parse_client_acks,
    parse_client_session,
    parse_client_subscriptions,
    session_expired_records,
)
from services.common.sessions import DeliveryPath, delivery_path, session_expired
from services.common.settings import Settings
from services.common.subscription import Subscription
from services.common.topics.validation import parse_shared

log = logging.getLogger(__name__)

#: Seconds before a client whose reconciliation failed (Kafka down) is tried again.
RETRY_SECONDS = 1.0

#: Acknowledgement records kept per client while it has no feed.
EARLY_ACKS_MAX = 1000

#: Connection ids remembered per client once taken over: a record of one landing later is
#: stale (it lands right after the takeover, so a few suffice).
SUPERSEDED_KEPT = 8


class AppClients:
    """The clients of the assigned partitions, their feeds and their topics' life.

    ``send`` produces records; ``settings`` gives Kafka's address, topic names, the
    partition count of the state topics and the session expiry cap. Call :meth:`start`
    first (it opens the admin client the feeds share) and :meth:`close` last. Record
    handlers never block; the work is done by one task per client.
    """

    def __init__(self, settings: Settings, send: SendRecord) -> None:
        self.settings = settings
        self.names = TopicNames.from_settings(settings)
        self._send = send
        self._admin: AIOKafkaAdminClient | None = None
        self.sessions: dict[str, SessionRecord] = {}  # persistent APPLICATION sessions only
        self.subscriptions: dict[str, list[Subscription]] = {}
        self.owned: set[int] = set()
        self.live: set[int] = set()
        self.feeds: dict[str, ClientFeed] = {}
        # Per client, what the router routed that its feeds have read: kept while the
        # session lives, so a copy a crashed router routed again is dropped also when the
        # client reconnected (a new feed) in between.
        self.reroutes: dict[str, RerouteFilter] = {}
        self._early_acks: dict[str, list[AckRecord]] = {}
        self._replayed: set[str] = set()  # had an APPLICATION session in a replay
        self._to_delete: set[str] = set()
        self._expiring: set[str] = set()
        self._dirty: set[str] = set()
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._superseded: dict[str, deque[bytes]] = {}  # connection ids taken over

    def partition(self, client_id: str) -> int:
        """The partition of ``client_id``'s records in the state topics."""
        return partition_of(client_id, self.settings.state_topic_partitions)

    # ------------------------------------------------------------------ ownership

    def assign(self, partitions: Iterable[int]) -> None:
        """The group gave this instance ``partitions``: their replay starts (each one is
        acted upon once :meth:`go_live` says it is replayed)."""
        self.owned = set(partitions)

    def go_live(self, partition: int) -> None:
        """``partition`` of the state topics has been replayed to where it stood when it
        was assigned: serve its clients, and delete the topics of sessions that ended
        while nobody owned them."""
        self.live.add(partition)
        mine = {c for c in (*self.sessions, *self._replayed) if self.partition(c) == partition}
        for client_id in mine:
            if client_id in self._replayed and client_id not in self.sessions:
                self._to_delete.add(client_id)
            self._mark(client_id)
        self._replayed -= mine
        for client_id in [c for c in self._early_acks if self.partition(c) == partition]:
            if client_id not in self.sessions:
                del self._early_acks[client_id]
        for client_id in [c for c in self.subscriptions if self.partition(c) == partition]:
            if client_id not in self.sessions:
                del self.subscriptions[client_id]

    async def revoke(self, partitions: Iterable[int]) -> None:
        """The group takes ``partitions`` away: stop their clients' feeds (committing what
        is acknowledged) before another instance may start them, and forget their state."""
        gone = set(partitions)
        self.owned -= gone
        self.live -= gone
        for client_id in list(self.feeds):
            if self.partition(client_id) in gone:
                self._mark(client_id)
        workers = [w for c, w in self._workers.items() if self.partition(c) in gone]
        await asyncio.gather(*workers, return_exceptions=True)
        for table in (self.sessions, self.subscriptions, self._early_acks):
            for client_id in [c for c in table if self.partition(c) in gone]:
                del table[client_id]
        for names in (self._replayed, self._to_delete, self._expiring):
            names -= {c for c in names if self.partition(c) in gone}

    async def start(self) -> None:
        """Open the admin client. Raises ``KafkaError`` if Kafka cannot be reached."""
        self._admin = AIOKafkaAdminClient(
            bootstrap_servers=self.settings.kafka_bootstrap,
            request_timeout_ms=max(int(self.settings.kafka_request_timeout_seconds * 1000), 15000),
            **client_security(self.settings),
        )
        await self._admin.start()

    async def kafka_reachable(self) -> None:
        """Return once Kafka answers a metadata request (a readiness check); raises
        ``KafkaError`` otherwise."""
        assert self._admin is not None, "start() first"
        await self._admin.describe_cluster()

    def families(self) -> Iterable[Metric]:
        """``cormorant_app_clients{state}`` (the persistent APPLICATION sessions this
        instance owns) and the connected ones' records not yet acknowledged in their own
        topics (:func:`lag_families`)."""
        connected = sum(1 for session in self.sessions.values() if session.connected)
        clients = GaugeMetricFamily(
            "cormorant_app_clients",
            "Persistent APPLICATION sessions this instance owns, by connected state.",
            labels=["state"],
        )
        clients.add_metric(["connected"], connected)
        clients.add_metric(["disconnected"], len(self.sessions) - connected)
        yield clients
        behind = [
            (lag, client_id)
            for client_id, feed in self.feeds.items()
            if (lag := feed.lag()) is not None
        ]
        yield from lag_families(behind, self.settings.app_client_lag_top)

    async def close(self) -> None:
        """Stop every feed and close the admin client (at shutdown)."""
        for worker in list(self._workers.values()):
            worker.cancel()
        await asyncio.gather(*self._workers.values(), return_exceptions=True)
        feeds, self.feeds = list(self.feeds.values()), {}
        await asyncio.gather(*(feed.stop() for feed in feeds), return_exceptions=True)
        if self._admin is not None:
            await self._admin.close()

    # ------------------------------------------------------------------ records

    def apply(self, topic: str, partition: int, key: bytes, value: bytes | None) -> None:
        """Apply one record of the owned partitions (the handler of
        :class:`~services.app_delivery.ownership.Ownership`).

        Raises ``RecordError`` on garbage (the caller skips it).
        """
        if topic == self.names.client_sessions:
            self._apply_session(partition, *parse_client_session(key, value))
        elif topic == self.names.client_subscriptions:
            client_id, subscriptions = parse_client_subscriptions(key, value)
            if subscriptions:
                self.subscriptions[client_id] = subscriptions
            else:
                self.subscriptions.pop(client_id, None)
            if client_id in self.feeds:
                self._mark(client_id)
        elif topic == self.names.client_acks and value is not None:
            self._apply_ack(partition, *parse_client_acks(key, value))

    def _stale(self, client_id: str, record: SessionRecord | None) -> bool:
        """Whether ``record`` is an older connection's, landed after a newer connection of
        the same session took it over (its ingest node then stores its own record again:
        ``restate_session``). Acting on it would stop the feed and start it again on the
        same connection, which would then get PUBLISH and PUBREL packets a second time
        (MQTT 4.4: resent on a new connection only)."""
        current = self.sessions.get(client_id)
        if record is None or current is None or record.session_id != current.session_id:
            self._superseded.pop(client_id, None)
            return False
        seen = self._superseded.setdefault(client_id, deque(maxlen=SUPERSEDED_KEPT))
        if record.connection_id in seen:
            return True
        if record.connection_id != current.connection_id:
            seen.append(current.connection_id)
        return False

    def _apply_session(self, partition: int, client_id: str, record: SessionRecord | None) -> None:
        if self._stale(client_id, record):
            log.debug("client %r: an older connection's session record, ignored", client_id)
            return
        previous = self.sessions.pop(client_id, None)
        if delivery_path(record) is DeliveryPath.APPLICATION:
            assert record is not None
            self.sessions[client_id] = record
        else:
            # Only APPLICATION sessions are kept: a fleet of DEVICE clients costs nothing.
            self.subscriptions.pop(client_id, None)
            self._early_acks.pop(client_id, None)
            self._expiring.discard(client_id)
        if partition not in self.live:
            if client_id in self.sessions:
                self._replayed.add(client_id)
            return
        if previous is not None and client_id not in self.sessions:
            self._to_delete.add(client_id)  # the session ended: its topic goes
        if previous is not None or client_id in self.sessions:
            self._mark(client_id)

    def _apply_ack(self, partition: int, client_id: str, ack: AckRecord) -> None:
        feed = self.feeds.get(client_id)
        if feed is not None:
            feed.acknowledge(ack)
        elif partition not in self.live or client_id in self.sessions:
            kept = self._early_acks.setdefault(client_id, [])
            if len(kept) >= EARLY_ACKS_MAX:
                del kept[0]
            kept.append(ack)

    # ------------------------------------------------------------------ per-client work

    def _mark(self, client_id: str) -> None:
        """Reconcile ``client_id`` soon, in its own task (one at a time per client)."""
        self._dirty.add(client_id)
        if client_id not in self._workers:
            self._workers[client_id] = asyncio.create_task(
                self._work(client_id), name=f"app-delivery-{client_id}"
            )

    async def _work(self, client_id: str) -> None:
        try:
            while client_id in self._dirty:
                self._dirty.discard(client_id)
                try:
                    await self._reconcile(client_id)
                except Exception as exc:
                    log.warning("client %r: not served, trying again: %r", client_id, exc)
                    await asyncio.sleep(RETRY_SECONDS)  # retry pacing while Kafka is down
                    if self.partition(client_id) in self.live:
                        self._dirty.add(client_id)
        finally:
            del self._workers[client_id]

    async def _reconcile(self, client_id: str) -> None:
        """Bring what runs for ``client_id`` in line with its latest records."""
        session = self.sessions.get(client_id)
        owned = self.partition(client_id) in self.live
        wanted = session if owned and session is not None and session.connected else None
        feed = self.feeds.get(client_id)
        if feed is not None and (
            wanted is None or feed.failed or feed.session_id != wanted.session_id
        ):
            del self.feeds[client_id]
            await feed.stop()
            if feed.failed:
                await asyncio.sleep(RETRY_SECONDS)  # retry pacing after a Kafka failure
        if client_id in self._to_delete:
            self._to_delete.discard(client_id)
            if owned and session is None:
                self.reroutes.pop(client_id, None)
                await delete_topics_and_groups(
                    self.settings.kafka_bootstrap,
                    [self.names.app(client_id)],
                    [self.names.app_group(client_id)],
                    security=client_security(self.settings),
                )
                log.info("client %r: session ended, its topic is deleted", client_id)
        if wanted is None:
            return
        feed = self.feeds.get(client_id)
        if feed is None:
            await ensure_topics(
                self.settings.kafka_bootstrap,
                [app_topic_spec(self.settings, client_id)],
                self.settings.replication_factor,
                security=client_security(self.settings),
            )
            assert self._admin is not None, "start() first"
            feed = ClientFeed(
                self.settings,
                client_id,
                wanted,
                self._send,
                self._admin,
                lambda: self._mark(client_id),
                self.reroutes.setdefault(client_id, RerouteFilter()),
            )
            for ack in self._early_acks.pop(client_id, []):
                feed.acknowledge(ack)  # kept by the feed until it has read its position
            self.feeds[client_id] = feed
            try:
                await feed.start()
            except BaseException:
                del self.feeds[client_id]
                raise
            log.info("client %r: delivering from its topic", client_id)
        else:
            feed.update(wanted)
        await feed.set_shared(self._shared_of(client_id))

    def _shared_of(self, client_id: str) -> dict[SharedKey, Subscription]:
        """The client's Shared Subscriptions, by (ShareName, Topic Filter)."""
        shared: dict[SharedKey, Subscription] = {}
        for sub in self.subscriptions.get(client_id, []):
            parts = parse_shared(sub.topic_filter)
            if parts is not None:
                shared[(parts.group, parts.topic_filter)] = sub
        return shared

    # ------------------------------------------------------------------ expiry

    async def expire_sessions(self, now_ms: int) -> list[Awaitable[object]]:
        """End the owned APPLICATION sessions past their Session Expiry Interval (or
        ``session_expiry_max_seconds``): tombstones for their session and subscriptions
        records and their SESSION_EXPIRED event; their topics go when the tombstones come
        back. Returns the writes' acknowledgements."""
        acks: list[Awaitable[object]] = []
        cap = self.settings.session_expiry_max_seconds
        for client_id, session in list(self.sessions.items()):
            if client_id in self._expiring or self.partition(client_id) not in self.live:
                continue
            if not session_expired(session, now_ms, cap):
                continue
            log.info("client %r: session expired", client_id)
            self._expiring.add(client_id)
            for record in session_expired_records(self.names, client_id, session, now_ms):
                acks.append(await self._send(*record))
        return acks


def lag_families(behind: list[tuple[int, str]], top: int) -> Iterable[Metric]:
    """``cormorant_app_client_lag_records{client_id}`` for the ``top`` clients furthest
    behind (ties by Client Identifier) and ``cormorant_app_client_lag_other_records``, the
    sum of the others' lag (0 when there are none). ``behind`` is (records not acknowledged,
    Client Identifier) per connected APPLICATION client.

    Bounded: at most ``top`` client series per instance, whatever the number of clients.
    The rest goes into a family of its own rather than a ``client_id="other"`` series, which
    a client named ``other`` would share.
    """
    ranked = sorted(behind, key=lambda pair: (-pair[0], pair[1]))
    lag = GaugeMetricFamily(
        "cormorant_app_client_lag_records",
        "Records of a connected APPLICATION client's topic it has not acknowledged: the "
        "CORMORANT_APP_CLIENT_LAG_TOP clients furthest behind, per app_delivery instance.",
        labels=["client_id"],
    )
    for records, client_id in ranked[:top]:
        lag.add_metric([client_id], records)
    yield lag
    yield GaugeMetricFamily(
        "cormorant_app_client_lag_other_records",
        "The summed lag of the connected APPLICATION clients not in "
        "cormorant_app_client_lag_records (beyond CORMORANT_APP_CLIENT_LAG_TOP).",
        value=sum(records for records, _ in ranked[top:]),
    )
