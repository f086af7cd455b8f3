"""The router service: reads ``msg.all``, writes downlink, ``msg.persisted`` and ``msg.app``
records.

Each message becomes one downlink record per ingest node holding connected non-persistent
subscribers, one ``msg.persisted`` record per persistent DEVICE subscriber (its store,
``device_persist``, delivers it), one ``msg.app.<client>`` record per persistent APPLICATION
subscriber and one ``msg.app-shared.<group>`` record per Shared Subscription served by its
APPLICATION members (``app_delivery`` delivers both). A retained message request (a
``msg.all`` record with header ``q``, written by the ingest node on SUBSCRIBE) is answered
the same way, with the matching retained messages for that one subscriber (MQTT 3.3.1.3).

State (subscriptions, client locations, retained messages) is replayed from the compacted
topics before the first message is routed, so a restarted router routes exactly as before.
A subscription acknowledged by SUBACK before a PUBLISH was acknowledged is always honoured,
and so is a retained message stored before a SUBSCRIBE: before what the router made of a
batch counts, it has applied every state record that existed when the batch had been
fetched (:meth:`CompactedTopicReader.barrier`; the argument is in that module). In
transactions the router routes a batch at once with the state it has, and the barrier runs
as the transaction is about to commit, beside the wait for its records' acknowledgements
(one end-offsets request serves every partition committing then): if state records
applied meanwhile concern the batch (:meth:`RoutingTable.outdated`), the transaction is
aborted and the partition's records are read again, and routed after a barrier this time.
Nobody reads what an aborted transaction wrote, so only a routing with every record the
barrier covers counts. Without transactions, the barrier runs before each batch is routed.

``msg.all`` is read in the router's consumer group (``<prefix>cormorant-router``: more
routers share its partitions) by :func:`~services.common.kafka.consumer.consume_batches`,
which commits a partition's offsets once what its records were routed to is stored (at
least once). Every record written carries its origin (header ``o``: the ``msg.all``
partition and offset it was routed from, :func:`outputs`), and every reader of the router's
topics drops a copy whose origin it has passed already
(:class:`~services.common.kafka.reroutes.RerouteFilter`): a router that crashes routes the
records after its last commit again, and what it writes a second time is neither stored
nor delivered again (docs/guarantees/index.md). With ``router_transactions`` on, ``msg.all``
is read in Kafka transactions instead
(:func:`~services.common.kafka.consumer.consume_in_transactions`, which hands each
partition's records to the router with the partition's open transaction): what a
partition's records are routed to and the partition's next offset are committed together,
one transactional producer per ``msg.all`` partition
(:class:`~services.common.kafka.consumer.PartitionTransactions`), and what a crashed router
wrote is never read (every reader of the router's topics reads committed records only);
it costs a transaction's round trips per partition per batch (docs/performance.md).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass
from functools import partial
from time import perf_counter

import faust
from aiokafka import TopicPartition
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from services.common import metrics
from services.common.clock import now_ms
from services.common.faust_app import (
    make_app,
    on_shutdown,
    run_service,
    run_task,
    send_in_transaction,
    sender,
    transactional_producer,
)
from services.common.kafka.admin import app_spec_of, ensure_topics
from services.common.kafka.consumer import (
    PartitionTransactions,
    Record,
    StaleOutputs,
    Transaction,
    consume_batches,
    consume_in_transactions,
    log_undecodable,
    make_consumer,
)
from services.common.kafka.names import TopicNames
from services.common.kafka.security import client_security
from services.common.kafka.state_reader import CompactedTopicReader
from services.common.records import (
    Headers,
    KafkaRecord,
    Message,
    Published,
    RecordError,
    RetainedRequest,
    app_record,
    app_shared_record,
    downlink_record,
    parse_msg_all,
    persisted_record,
    with_origins,
)
from services.common.settings import Settings
from services.common.web import serve_http
from services.router.routing import Routes, RoutingTable

log = logging.getLogger(__name__)

#: Most ``msg.all`` records routed as one batch (one state barrier).
BATCH_MAX = 2000

#: Seconds a transaction may stay open while records keep coming (when none are waiting,
#: it is committed at once): what routed messages may wait under load before readers see
#: them, against a transaction commit's cost (bench/NOTES.md).
TRANSACTION_SECONDS = 0.1


#: Seconds between two offset commits outside transactions (``router_transactions`` off):
#: at most what a crashed router routes again, and its readers drop.
COMMIT_SECONDS = 0.2


def build_app(settings: Settings) -> faust.App:
    """Build the router's Faust app: a :class:`Router` run by the app's worker."""
    app = make_app(settings, "router")
    router = Router(settings, app)
    run_task(app, router.run)
    on_shutdown(app, router.stop)
    return app


class Router:
    """The router stage of ``app`` (its Faust app): :meth:`run` replays the state and then
    routes ``msg.all`` until cancelled (the app's main task); :meth:`stop` is its shutdown
    hook. The state reader applies the compacted topics' records with
    :meth:`apply_state`; a batch is routed by :meth:`route_batch`, or in Kafka transactions
    by :meth:`route_in_transaction` (setting ``router_transactions``)."""

    def __init__(self, settings: Settings, app: faust.App) -> None:
        self.settings = settings
        self.app = app
        self.names = TopicNames.from_settings(settings)
        self.readiness = serve_http(app, "router", settings.ready_file)
        self.table = RoutingTable()
        self.counters = RouterCounters()
        metrics.register(self.counters.families)
        metrics.register(lambda: state_families(self.table))
        self.reader = CompactedTopicReader(
            settings.kafka_bootstrap,
            [self.names.client_subscriptions, self.names.client_sessions, self.names.msg_retained],
            self.apply_state,
            security=client_security(settings),
        )
        self.readiness.add("kafka", self.reader.end_offsets)
        self.send = sender(app)
        # APPLICATION topics known to exist. The ingest node creates a client's msg.app topic
        # before its CONNACK and app_delivery before serving it; the router makes sure of each
        # once more (and of msg.app-shared topics, which only it creates) before its first
        # write, since a write to a missing topic waits for it for the whole request timeout.
        self.app_topics: set[str] = set()
        # How those topics' names begin: the other records (downlink, msg.persisted) are
        # not looked at further.
        self.app_prefixes = self.names.app_prefixes
        # Partitions whose routing was outdated: their next records are routed after a barrier.
        self.behind: set[TopicPartition] = set()
        # The check of each partition's open transaction: later batches join it.
        self.checks: dict[TopicPartition, _Check] = {}

    def apply_state(
        self, topic: str, key: bytes, value: bytes | None, offset: int, headers: Headers
    ) -> None:
        """Apply one record of the compacted state topics to the routing table (the state
        reader's callback). Raises ``RecordError`` on garbage (the reader logs it)."""
        if topic == self.names.client_subscriptions:
            self.table.apply_subscriptions_record(key, value, headers)
        elif topic == self.names.client_sessions:
            self.table.apply_session_record(key, value, headers)
        else:
            self.table.apply_retained_record(key, value, headers)

    async def start(self) -> None:
        """Replay the state topics up to their end offsets."""
        await self.reader.start()
        log.info(
            "router ready: %d subscriptions, %d sessions",
            len(self.table.trie),
            len(self.table.sessions),
        )

    async def run(self) -> None:
        """:meth:`start`, then route ``msg.all`` in the router's consumer group until
        cancelled."""
        await self.start()
        settings = self.settings
        group = self.app.conf.id
        consumer = make_consumer(settings, group_id=group, instance_id=settings.group_instance_id)
        await consumer.start()
        try:
            self.readiness.serving("router")
            if settings.router_transactions:
                transactions = PartitionTransactions(
                    lambda transactional_id: transactional_producer(settings, transactional_id),
                    f"{group}.",
                    group,
                )
                await consume_in_transactions(
                    consumer,
                    self.route_in_transaction,
                    transactions,
                    topics=[self.names.msg_all],
                    max_records=BATCH_MAX,
                    commit_interval=TRANSACTION_SECONDS,
                    stage="router",
                )
            else:
                await consume_batches(
                    consumer,
                    self.route_batch,
                    topics=[self.names.msg_all],
                    max_records=BATCH_MAX,
                    commit_interval=COMMIT_SECONDS,
                    # State stored before the batch's records were is applied first: a
                    # subscription acknowledged before a PUBLISH applies to it. In
                    # transactions, route_in_transaction checks that before the commit.
                    prepare=self.reader.barrier,
                    stage="router",
                )
        finally:
            await consumer.stop()

    async def stop(self) -> None:
        """The shutdown hook: not ready any more, the state reader stopped."""
        self.readiness.stopping()
        await self.reader.stop()

    async def route_batch(self, records: list[Record]) -> list[Awaitable[object]]:
        """Route ``records`` (a batch of ``msg.all``, after a state barrier) outside
        transactions; returns the acknowledgements of the records written."""
        return await self._route(records, None)

    async def route_in_transaction(
        self, records: list[Record], transaction: Transaction
    ) -> list[Awaitable[object]]:
        """Route one partition's ``records`` in its open ``transaction``, with the state
        the router has; the routing counts only if :meth:`confirm` finds, just before the
        commit, that no state record it should have seen would change it. Later batches of
        the same transaction join the check of its first batch. A partition whose routing
        was outdated is routed after a barrier instead. Returns the acknowledgements of the
        records written."""
        tp = TopicPartition(records[0].topic, records[0].partition)
        if tp in self.behind:
            await self.reader.barrier()
            self.behind.discard(tp)
        elif (joined := self.checks.get(tp)) is not None and joined.transaction is transaction:
            joined.records.extend(records)  # checked from its first batch's version
        else:
            check = self.checks[tp] = _Check(self, self.table.version, list(records), transaction)
            transaction.before_commit(check.confirm)
        return await self._route(records, transaction)

    async def confirm(self, version: int, records: list[Record]) -> None:
        """Raise StaleOutputs if state records the barrier covers but the routing of
        ``records`` (at ``version``) did not see would change it."""
        await self.reader.barrier()
        table = self.table
        if table.version != version and table.outdated(version, *_topics_and_requests(records)):
            self.behind.add(TopicPartition(records[0].topic, records[0].partition))
            raise StaleOutputs("state records applied after routing concern them")

    async def _route(
        self, records: list[Record], transaction: Transaction | None
    ) -> list[Awaitable[object]]:
        """Write what ``records`` route to, in ``transaction`` if any; returns the
        acknowledgements."""
        settings = self.settings
        now = now_ms()
        batch = [
            out
            for record in records
            for out in outputs(self.table, self.names, record, now, self.counters)
        ]
        app_prefixes, app_topics = self.app_prefixes, self.app_topics
        specs = {
            spec.name: spec
            for topic, *_ in batch
            if topic.startswith(app_prefixes)
            and topic not in app_topics
            and (spec := app_spec_of(settings, topic)) is not None
        }
        send = self.send
        if transaction is not None:
            send = partial(send_in_transaction, transaction.producer)
        acks: list[Awaitable[object]] = []
        try:
            if specs:
                await ensure_topics(
                    settings.kafka_bootstrap,
                    list(specs.values()),
                    settings.replication_factor,
                    security=client_security(settings),
                )
                self.app_topics.update(specs)
            for topic, key, value, headers in batch:
                acks.append(await send(topic, key, value, headers))
        except Exception:
            self.app_topics.clear()  # one may have been deleted: the retry makes sure again
            raise
        return acks


@dataclass(slots=True)
class _Check:
    """The check of the records one partition's ``transaction`` routed, the first of them
    at ``version`` (:meth:`Router.confirm`), registered with
    :meth:`~services.common.kafka.consumer.Transaction.before_commit`: it runs just before
    the commit, together with the other partitions' checks (their barriers then share one
    end-offsets request). Later batches of the same transaction add their records to it."""

    router: Router
    version: int
    records: list[Record]
    transaction: Transaction

    async def confirm(self) -> None:
        """:meth:`Router.confirm` of the records, from the version of the first batch."""
        await self.router.confirm(self.version, self.records)


def _topics_and_requests(records: list[Record]) -> tuple[list[str], list[RetainedRequest]]:
    """The Topic Names of the messages among ``records`` and their retained message
    requests (records that do not decode route nothing and are left out)."""
    topics: list[str] = []
    requests: list[RetainedRequest] = []
    for record in records:
        try:
            parsed = parse_msg_all(record.key, record.value, record.headers)
        except RecordError:
            continue
        if isinstance(parsed, Published):
            topics.append(parsed.message.meta.topic)
        else:
            requests.append(parsed)
    return topics, requests


class RouterCounters:
    """What the router did: the match time of each message (seconds, subscription trie
    and delivery paths), and the records it wrote per delivery path."""

    PATHS = ("downlink", "persisted", "app", "app_shared")

    def __init__(self) -> None:
        self.match = metrics.Histogram(metrics.MATCH_BUCKETS)
        self.routed = dict.fromkeys(self.PATHS, 0)

    def count(self, routes: Routes) -> None:
        """Count the records ``routes`` makes, per path."""
        routed = self.routed
        routed["downlink"] += len(routes.by_node)
        if routes.persisted:
            routed["persisted"] += len(routes.persisted)
        if routes.app:
            routed["app"] += len(routes.app)
        if routes.app_shared:
            routed["app_shared"] += len(routes.app_shared)
        if not (routes.by_node or routes.persisted or routes.app or routes.app_shared):
            metrics.dropped(metrics.Drop.NO_SUBSCRIBER)

    def families(self) -> Iterable[Metric]:
        """``cormorant_router_match_seconds`` and ``cormorant_router_routed_records_total``."""
        yield metrics.histogram_family(
            "cormorant_router_match_seconds",
            "Time to find one message's subscribers and their delivery paths.",
            {"msg.all": self.match},
            "topic",
        )
        routed = CounterMetricFamily(
            "cormorant_router_routed_records",
            "Records the router wrote, by delivery path (downlink: one per node per message).",
            labels=["path"],
        )
        for path, count in self.routed.items():
            routed.add_metric([path], count)
        yield routed


def state_families(table: RoutingTable) -> Iterable[Metric]:
    """``cormorant_sessions{connected, persistent}``, ``cormorant_subscriptions`` and
    ``cormorant_retained_messages``: the state the router holds, which is the whole
    cluster's (every router reads all of ``client.sessions``, ``client.subscriptions`` and
    ``msg.retained``), so several routers serve the same numbers (``max()`` over them, not
    ``sum()``). Counted when Prometheus scrapes: one pass over the sessions."""
    states = (True, False)
    counts = {(connected, persistent): 0 for connected in states for persistent in states}
    for session in table.sessions.values():
        counts[(session.connected, session.persistent)] += 1
    sessions = GaugeMetricFamily(
        "cormorant_sessions",
        "Sessions the cluster holds (client.sessions), by connected and persistent (kept "
        "after the connection ends).",
        labels=["connected", "persistent"],
    )
    for (connected, persistent), count in counts.items():
        sessions.add_metric([str(connected).lower(), str(persistent).lower()], count)
    yield sessions
    yield GaugeMetricFamily(
        "cormorant_subscriptions",
        "Subscriptions the cluster holds (client.subscriptions), Shared Subscriptions included.",
        value=len(table.trie),
    )
    yield GaugeMetricFamily(
        "cormorant_retained_messages",
        "Topics holding a retained message (msg.retained).",
        value=len(table.retained),
    )


def outputs(
    table: RoutingTable,
    names: TopicNames,
    record: Record,
    now_ms: int,
    counters: RouterCounters | None = None,
) -> list[KafkaRecord]:
    """The records to produce for one ``msg.all`` record, each with its origin (header
    ``o``: the record's partition and offset, :func:`~services.common.records.with_origins`),
    by which readers drop a second routing of it; ``now_ms`` is Unix time in ms;
    ``counters`` (if given) count the match time and the records.

    A record that does not decode is logged and yields none (it must not block the
    partition).
    """
    try:
        parsed = parse_msg_all(record.key, record.value, record.headers)
    except RecordError as exc:
        log_undecodable(log, record, exc)
        return []
    key = record.key or b""  # the client id's bytes: parsed, so present and UTF-8
    out: list[KafkaRecord] = []
    if isinstance(parsed, RetainedRequest):
        client_id = parsed.client_id
        session = table.sessions.get(client_id)
        for message, target in table.retained_for(client_id, parsed.subscriptions, now_ms):
            routes = Routes()
            routes.add(session, target)
            out += _outputs_of(names, key, message, routes)
    else:
        message = parsed.message
        position = (record.partition, record.offset)
        started = perf_counter()
        routes = table.route(parsed.client_id, message.meta, position)
        if counters is not None:
            counters.match.observe(perf_counter() - started)
            counters.count(routes)
        out = _outputs_of(names, key, message, routes)
    return with_origins(out, record.partition, record.offset)


def _outputs_of(
    names: TopicNames, key: bytes, message: Message, routes: Routes
) -> list[KafkaRecord]:
    """One downlink record per node, one ``msg.persisted`` record per persistent DEVICE
    target, one ``msg.app`` record per persistent APPLICATION target (with its session id),
    one ``msg.app-shared`` record per APPLICATION shared group; ``key`` is the publisher's
    client id (the subscriber's for an answer to a retained message request)."""
    out = [
        downlink_record(names, node, key, message.meta_raw, message.payload, targets)
        for node, targets in routes.by_node.items()
    ]
    # Most messages take one path only: the others' empty lists are not walked.
    if routes.persisted:
        out.extend(persisted_record(names, message, target) for target in routes.persisted)
    if routes.app:
        out.extend(
            app_record(names, key, message, target, session_id) for target, session_id in routes.app
        )
    if routes.app_shared:
        out.extend(
            app_shared_record(names, share_name, topic_filter, key, message)
            for share_name, topic_filter in routes.app_shared
        )
    return out


def run() -> None:
    """Entry point of ``cormorant router``."""
    run_service(build_app)
