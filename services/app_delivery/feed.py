"""Delivery to one connected persistent APPLICATION client, straight from Kafka (TBMQ: one
Kafka consumer per APPLICATION client, reading ``msg.app.<client>``).

A :class:`ClientFeed` lives while its client is connected and owned by this app_delivery
instance. It reads:

- the client's own topic with a consumer that is assigned every partition by hand, in the
  consumer group :meth:`~services.common.kafka.names.TopicNames.app_group` whose committed
  offsets are the client's durable position (no group member ever joins that group: the
  instance that owns the client is the only one reading it, by the ownership group);
- for each Shared Subscription the client has, the group's topic, as a member of the group's
  one consumer group (:meth:`~services.common.kafka.names.TopicNames.app_shared_group`), so
  that Kafka spreads its partitions over the members.

Records become downlink records for the client's node, with the Packet Identifier and DUP
flag the :class:`~services.app_delivery.window.ClientWindow` gives them (store-assigned
deliveries: the node sends them as they are and reports every acknowledgement to
``client.acks``). Before any delivery is sent, the offsets are committed with what was sent
as metadata, so a restarted instance resends those with DUP=1; as acknowledgements come in,
the offset below which everything is acknowledged is committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import replace

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata

from services.app_delivery.window import (
    ClientWindow,
    CommitPoint,
    Delivery,
    Entry,
    Sendable,
    decode_mark,
    encode_mark,
)
from services.common.clock import now_ms
from services.common.faust_app import SendRecord
from services.common.kafka.admin import app_shared_topic_spec, ensure_topics
from services.common.kafka.consumer import Record, log_undecodable, make_consumer
from services.common.kafka.names import TopicNames
from services.common.kafka.reroutes import RerouteFilter
from services.common.kafka.security import client_security
from services.common.records import (
    AckRecord,
    RecordError,
    SessionRecord,
    Target,
    downlink_record,
    expires_at_ms,
    origin_of,
    parse_app,
    parse_app_shared,
    release_record,
)
from services.common.settings import Settings
from services.common.subscription import Subscription

log = logging.getLogger(__name__)


SharedKey = tuple[str, str]
"""A Shared Subscription: (ShareName, Topic Filter)."""

#: Records a feed fetches ahead of its window (on top of the window itself).
PREFETCH = 1000

#: Seconds acknowledgements may wait before the offset they move is committed (a crash in
#: between makes those deliveries go again, with DUP=1).
COMMIT_INTERVAL = 0.2

#: Seconds a stopping feed waits for its tasks to end.
STOP_TIMEOUT = 5.0

#: Most acknowledgement records kept for a feed that has not read its position yet.
EARLY_ACKS_MAX = 10_000


class FeedError(RuntimeError):
    """A feed cannot go on (its topic is missing, or Kafka failed it); it is restarted."""


class ClientFeed:
    """Delivery to one connected persistent APPLICATION client.

    ``session`` is the client's connected session record (node, connection, session id,
    Receive Maximum); ``send`` produces records; ``admin`` reads committed offsets and
    partition counts; ``on_failure`` is called (once) when a background task of the feed
    fails, so that its owner restarts it. Call :meth:`start`, then :meth:`update`,
    :meth:`acknowledge` and :meth:`set_shared` as things change, and :meth:`stop`.
    """

    def __init__(
        self,
        settings: Settings,
        client_id: str,
        session: SessionRecord,
        send: SendRecord,
        admin: AIOKafkaAdminClient,
        on_failure: Callable[[], None],
        reroutes: RerouteFilter,
    ) -> None:
        self.settings = settings
        self.names = TopicNames.from_settings(settings)
        self.client_id = client_id
        self.session = session
        self.session_id = session.session_id
        self.failed = False
        self.window = ClientWindow(self._limit(session))
        self._key = client_id.encode("utf-8")
        self._send = send
        self._admin = admin
        self._on_failure = on_failure
        self._topic = self.names.app(client_id)
        self._own: AIOKafkaConsumer | None = None
        self._shared: dict[SharedKey, AIOKafkaConsumer] = {}
        self._shared_subs: dict[str, Subscription] = {}  # shared topic -> the subscription
        self._consumer_of: dict[TopicPartition, AIOKafkaConsumer] = {}
        self._committed: dict[TopicPartition, CommitPoint] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._early: list[AckRecord] | None = []  # None once the position is read
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self._confirming: set[asyncio.Task[None]] = set()
        # Counts the client's connections seen: deliveries chosen for one connection are
        # never sent to the next (it gets everything unacknowledged again, in order).
        self._connection = 0
        # Records a crashed router routed again (they stand at new offsets: the window's
        # marks cannot tell); the client's, kept across its connections by the caller.
        self._reroutes = reroutes

    def lag(self) -> int | None:
        """Records of the client's own topic below its high watermark (as of the last
        fetch) that it has not acknowledged; None before the first fetch."""
        if self._own is None:
            return None
        points = self.window.commit_points()
        total = None
        for tp in self._own.assignment():
            end = self._own.highwater(tp)
            point = points.get(tp)
            if end is None or point is None:
                continue
            total = (total or 0) + max(0, end - point.low)
        return total

    def _limit(self, session: SessionRecord) -> int:
        return max(1, min(session.receive_maximum, self.settings.app_inflight_max))

    # ------------------------------------------------------------------ life cycle

    async def start(self) -> None:
        """Read the client's position in its own topic and start delivering.

        Raises :class:`FeedError` if the topic does not exist, ``KafkaError`` if Kafka
        fails; nothing is left running then.
        """
        consumer = make_consumer(self.settings, group_id=self.names.app_group(self.client_id))
        await consumer.start()
        self._own = consumer
        try:
            tps = await self._partitions(self._topic)
            consumer.assign(tps)
            await self._restore(consumer, self.names.app_group(self.client_id), tps, len(tps))
        except BaseException:
            await self.stop()
            raise
        for ack in self._early or ():
            self._apply(ack)
        self._early = None
        self._spawn("own-fetch", self._fetch(consumer))
        self._spawn("send", self._send_loop())
        self._wake.set()

    async def _partitions(self, topic: str) -> list[TopicPartition]:
        [meta] = await self._admin.describe_topics([topic])
        if meta.get("error_code") or not meta.get("partitions"):
            raise FeedError(f"topic {topic} is missing")
        return [TopicPartition(topic, p["partition"]) for p in meta["partitions"]]

    async def _restore(
        self,
        consumer: AIOKafkaConsumer,
        group: str,
        tps: list[TopicPartition],
        own_partitions: int | None,
    ) -> None:
        """Add ``tps`` to the window at their committed offsets (the beginning where none
        is committed) with the ``sent_upto`` their metadata records."""
        committed = await self._committed_offsets(group, tps)
        missing = [tp for tp in tps if committed.get(tp, OffsetAndMetadata(-1, "")).offset < 0]
        beginnings = await consumer.beginning_offsets(missing) if missing else {}
        for tp in tps:
            mark = committed.get(tp, OffsetAndMetadata(-1, ""))
            low = mark.offset if mark.offset >= 0 else beginnings[tp]
            sent_upto, released = decode_mark(mark.metadata, low)
            self.window.add_source(tp, low, sent_upto, own_partitions, released)
            self._committed[tp] = self.window.commit_points()[tp]
            self._consumer_of[tp] = consumer
            consumer.seek(tp, low)

    async def _committed_offsets(
        self, group: str, tps: list[TopicPartition]
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        """The committed offsets and metadata of ``group`` for ``tps``, retried while the
        group's coordinator is not ready (as on a fresh Kafka cluster) for at most the Kafka
        request timeout. Raises ``KafkaError``."""
        deadline = time.monotonic() + self.settings.kafka_request_timeout_seconds
        while True:
            try:
                offsets: dict[TopicPartition, OffsetAndMetadata]
                offsets = await self._admin.list_consumer_group_offsets(group, partitions=tps)
                return offsets
            except KafkaError as exc:
                if not exc.retriable or time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.2)  # retry pacing while the coordinator loads

    async def stop(self) -> None:
        """Stop delivering: commit what is acknowledged, close the consumers (the shared
        ones leave their groups). Errors of the last commit are logged."""
        tasks = list(self._tasks.values()) + list(self._confirming)
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        if tasks:
            # Bounded: an owner stops feeds inside a rebalance, which must not stall.
            _, stuck = await asyncio.wait(tasks, timeout=STOP_TIMEOUT)
            if stuck:
                log.warning("client %r: %d feed tasks did not stop", self.client_id, len(stuck))
        with contextlib.suppress(Exception):
            await self._commit(self.window.commit_points())
        for consumer in [*self._shared.values(), self._own]:
            if consumer is not None:
                with contextlib.suppress(Exception):
                    await consumer.stop()
        self._shared.clear()
        self._own = None

    def _spawn(self, name: str, coroutine: Coroutine[object, object, None]) -> None:
        task = asyncio.create_task(coroutine, name=f"app-feed-{name}")
        self._tasks[name] = task
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or self.failed:
            return
        error = task.exception()
        if error is not None:
            log.warning("client %r: delivery failed, restarting it: %r", self.client_id, error)
            self.failed = True
            self._on_failure()

    # ------------------------------------------------------------------ changes

    def update(self, session: SessionRecord) -> None:
        """The client's latest session record (same session): a new connection gets what
        is unacknowledged again (MQTT 4.4), wherever it is now."""
        new_connection = session.connection_id != self.session.connection_id
        self.session = session
        self.window.limit = self._limit(session)
        if new_connection:
            self.window.new_connection()
            self._connection += 1
        self._wake.set()

    def acknowledge(self, ack: AckRecord) -> None:
        """Apply the client's acknowledgements (``client.acks``); others sessions' are
        ignored."""
        if ack.session_id != self.session_id:
            return
        if self._early is not None:
            if len(self._early) < EARLY_ACKS_MAX:
                self._early.append(ack)
            return
        self._apply(ack)

    def _apply(self, ack: AckRecord) -> None:
        for kind, packet_id in ack.acks:
            self.window.acknowledge(kind, packet_id)
        self._wake.set()

    async def set_shared(self, subscriptions: dict[SharedKey, Subscription]) -> None:
        """Be a member of exactly these Shared Subscriptions' groups (the client's own
        subscriptions); joining makes sure the group's topic exists."""
        for key in [k for k in self._shared if k not in subscriptions]:
            consumer = self._shared.pop(key)
            topic = self.names.app_shared(*key)
            fetching = self._tasks.pop(f"shared-fetch-{topic}", None)
            if fetching is not None:
                fetching.cancel()
                await asyncio.gather(fetching, return_exceptions=True)
            await self.drop_partitions([tp for tp, c in self._consumer_of.items() if c is consumer])
            self._shared_subs.pop(topic, None)
            await consumer.stop()  # leaves the group: Kafka gives its partitions to the others
        for key, subscription in subscriptions.items():
            topic = self.names.app_shared(*key)
            self._shared_subs[topic] = subscription
            if key in self._shared:
                continue
            await ensure_topics(
                self.settings.kafka_bootstrap,
                [app_shared_topic_spec(self.settings, *key)],
                self.settings.replication_factor,
                security=client_security(self.settings),
            )
            group = self.names.app_shared_group(*key)
            consumer = make_consumer(self.settings, group_id=group)
            await consumer.start()
            self._shared[key] = consumer
            consumer.subscribe([topic], listener=_SharedMember(self, consumer, group))
            self._spawn(f"shared-fetch-{topic}", self._fetch(consumer))

    async def drop_partitions(self, tps: list[TopicPartition]) -> None:
        """Shared partitions Kafka moves to another member: commit what is acknowledged
        and stop reading them (failures are logged: the next member reads again)."""
        points = {tp: p for tp, p in self.window.commit_points().items() if tp in tps}
        await self._commit(points)
        for tp in tps:
            self.window.remove_source(tp)
            self._consumer_of.pop(tp, None)
            self._committed.pop(tp, None)

    async def add_partitions(
        self, consumer: AIOKafkaConsumer, group: str, tps: list[TopicPartition]
    ) -> None:
        """Shared partitions Kafka gave this member: read them from the group's position."""
        if tps:
            await self._restore(consumer, group, sorted(tps), None)
            self._wake.set()

    # ------------------------------------------------------------------ reading

    async def _fetch(self, consumer: AIOKafkaConsumer) -> None:
        """Hand fetched records to the window, at most :data:`PREFETCH` ahead of it."""
        while True:
            room = self.window.limit + PREFETCH - self.window.backlog()
            if room <= 0:
                self._room.clear()
                await self._room.wait()
                continue
            batches = await consumer.getmany(timeout_ms=1000, max_records=min(room, 2000))
            for tp, records in batches.items():
                for record in records:
                    self.window.add(tp, record.offset, self._entry(record))
            if batches:
                self._wake.set()

    def _entry(self, record: Record) -> Entry | None:
        """The window entry of a fetched record; None for one that is not for this session
        or does not decode (logged)."""
        try:
            if not self._reroutes.first(record):
                return None  # routed again by a router that crashed: delivered once already
            if record.topic == self._topic:
                own = parse_app(record.value, record.headers)
                if own.session_id != self.session_id:
                    return None  # routed for an earlier session (MQTT 3.1.2.4)
                message, target = own.message, own.target
            else:
                message = parse_app_shared(record.value, record.headers)
                sub = self._shared_subs.get(record.topic)
                if sub is None:
                    return None  # the client left that group since the fetch
                target = self._shared_target(sub, message.meta.qos)
            deadline = expires_at_ms(message.meta)
            origin = origin_of(record.headers)
        except RecordError as exc:
            log_undecodable(log, record, exc)
            return None
        return Entry(target, message.meta_raw, message.payload, record.key, deadline, origin=origin)

    def _shared_target(self, sub: Subscription, qos: int) -> Target:
        """The client's delivery of a shared topic's message, from its own subscription."""
        ids = () if sub.subscription_identifier is None else (sub.subscription_identifier,)
        return Target(self.client_id, min(qos, sub.qos), sub.retain_as_published, ids)

    # ------------------------------------------------------------------ sending

    async def _send_loop(self) -> None:
        """Send what the window allows whenever something changed: commit first, then the
        downlink records.

        A delivery waits for a commit only when the committed sent mark does not cover it
        yet; that commit raises the mark to everything fetched, so the next deliveries need
        none (DUP=1 on a first delivery after a crash is allowed: it says "might be a
        re-delivery", MQTT 3.3.1.1). Acknowledgements alone are committed at most every
        :data:`COMMIT_INTERVAL` seconds.
        """
        last_commit = 0.0
        while True:
            timeout = None
            if self._uncommitted():
                timeout = max(0.0, last_commit + COMMIT_INTERVAL - time.monotonic())
            # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow the
            # cancellation that stop() sends when the event is set at the same moment.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            self._wake.clear()
            connection, node = self._connection, self.session.node_id
            out = self.window.sendable(now_ms())
            needed = any(
                tp not in self._committed or self._committed[tp].sent_upto < mark
                for tp, mark in out.marks.items()
            )
            failed: set[TopicPartition] = set()
            if needed or (
                self._uncommitted() and time.monotonic() - last_commit >= COMMIT_INTERVAL
            ):
                points = {
                    tp: point._replace(sent_upto=max(point.sent_upto, self.window.fetched(tp)))
                    for tp, point in self.window.commit_points().items()
                }
                failed = await self._commit(points)
                last_commit = time.monotonic()
            if failed:
                # Not recorded as sent: those partitions' deliveries wait for the next turn.
                held = [d for d in [*out.publishes, *out.releases] if d.tp in failed]
                self.window.unsend(held)
                out = Sendable(
                    [d for d in out.publishes if d.tp not in failed],
                    [d for d in out.releases if d.tp not in failed],
                )
            if connection != self._connection:
                continue  # a new connection came during the commit: it starts over
            if out:
                await self._deliver(out, node, connection)
            if self.window.backlog() < self.window.limit + PREFETCH:
                self._room.set()

    def _uncommitted(self) -> bool:
        """Whether acknowledgements moved a partition's commit point since the last commit."""
        for tp, point in self.window.commit_points().items():
            done = self._committed.get(tp)
            if done is None or (done.low, done.released) != (point.low, point.released):
                return True
        return False

    async def _commit(self, points: dict[TopicPartition, CommitPoint]) -> set[TopicPartition]:
        """Commit the (offset, sent mark) of partitions that changed; returns the shared
        partitions whose commit failed (a rebalance took them). A failed commit of the own
        topic raises ``KafkaError``."""
        by_consumer: dict[int, tuple[AIOKafkaConsumer, dict[TopicPartition, OffsetAndMetadata]]]
        by_consumer = {}
        for tp, point in points.items():
            consumer = self._consumer_of.get(tp)
            if consumer is None or self._committed.get(tp) == point:
                continue
            _, offsets = by_consumer.setdefault(id(consumer), (consumer, {}))
            offsets[tp] = OffsetAndMetadata(point.low, encode_mark(point))
        failed: set[TopicPartition] = set()
        for consumer, offsets in by_consumer.values():
            try:
                await consumer.commit(offsets)
            except Exception as exc:
                if consumer is self._own:
                    raise
                # A shared member's partitions can be taken by a rebalance at any time.
                log.info("client %r: shared commit failed: %r", self.client_id, exc)
                failed.update(offsets)
                continue
            self._committed.update({tp: points[tp] for tp in offsets})
        return failed

    async def _deliver(self, out: Sendable, node: str, connection: int) -> None:
        """Downlink records for ``out`` on ``node``, the node of the client's
        ``connection``; a failed write puts the delivery back in the window."""
        acks: list[Awaitable[object]] = []
        for delivery in out.publishes:
            if connection != self._connection:
                return  # the client connected again: the rest goes to it in order
            entry = delivery.entry
            target = replace(entry.target, packet_id=delivery.packet_id, dup=delivery.dup)
            record = downlink_record(
                self.names, node, self._key, entry.meta_raw, entry.payload, [target], entry.origin
            )
            acks.append(await self._send(*record))
        if out.releases and connection == self._connection:
            releases = [(self.client_id, d.packet_id) for d in out.releases]
            acks.append(
                await self._send(*release_record(self.names, node, self.client_id, releases))
            )
        deliveries = [*out.publishes, *out.releases]
        task = asyncio.create_task(self._confirm(acks, deliveries, connection))
        self._confirming.add(task)
        task.add_done_callback(self._confirming.discard)

    async def _confirm(
        self, acks: list[Awaitable[object]], deliveries: list[Delivery], connection: int
    ) -> None:
        results = await asyncio.gather(*acks, return_exceptions=True)
        if connection != self._connection:
            return  # a newer connection gets everything unacknowledged anyway
        if any(isinstance(r, BaseException) for r in results):
            log.warning("client %r: downlink records not stored, sending again", self.client_id)
            self.window.unsend(deliveries)
            self._wake.set()


class _SharedMember(ConsumerRebalanceListener):  # type: ignore[misc]
    """Follows the partitions Kafka gives a feed's member consumer of a shared group."""

    def __init__(self, feed: ClientFeed, consumer: AIOKafkaConsumer, group: str) -> None:
        self.feed = feed
        self.consumer = consumer
        self.group = group

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        """Commit what is acknowledged, then let the partitions go."""
        await self.feed.drop_partitions(revoked)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        """Read the new partitions from the group's committed offsets."""
        await self.feed.add_partitions(self.consumer, self.group, assigned)
