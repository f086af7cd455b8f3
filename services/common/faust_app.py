"""The one Faust configuration every Cormorant service starts from.

Each service is a faust-streaming app (docs/design.md); this module keeps their Kafka settings in
one place: raw bytes serializers (records are encoded by :mod:`services.common.records`),
``acks=all`` production, an in-memory table store (no service keeps Faust tables), and
Faust's web server on ``http_host:http_port`` with only Cormorant's pages
(:mod:`services.common.web`: ``/health``, ``/ready``, ``/metrics``).

Every producer is idempotent (Kafka's ``enable.idempotence``, KIP-98): the broker drops a
batch it already has, so a retry after a lost answer writes nothing twice, and a batch is
retried until Kafka takes it instead of expiring while a later one of its partition is
stored. faust-streaming 0.15 has no setting for it: its aiokafka producer asks for
idempotence only with ``processing_guarantee="exactly_once"``, which runs Faust's own agent
transactions (not used here, see below); :class:`IdempotentProducer` is that producer with
idempotence always on. aiokafka 0.14 sends one request at a time per broker and puts a
retried batch back at the head of its partition's queue, so a producer keeps the order of
each partition with or without idempotence; without it, a batch Kafka stored but whose answer
was lost was stored again on retry, and a batch that timed out in the producer was dropped
while later ones were written (bench/NOTES.md, "Idempotent and transactional writes").

A stage that consumes, produces and commits (the router) does it in Kafka transactions
(:mod:`services.common.kafka.consumer`): :func:`transactional_producer` makes their
producers with the same settings, and :func:`send_in_transaction` sends with one, inside
its open transaction.

The apps run in Faust's producer-only mode: Faust's worker gives each service its life cycle
(signals, logging, ``@app.task``, start-up and shutdown hooks) and its producer, while the
hot-path topics are consumed by :mod:`services.common.kafka.consumer` (the measured reason is
there). So Faust's own consumer never joins a group, and the app id is free to be the
service's consumer group.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any

import faust
from aiokafka import AIOKafkaProducer
from aiokafka.errors import InvalidProducerEpoch, OutOfOrderSequenceNumber, UnknownProducerId
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types.core import HeadersArg
from faust.types.tuples import RecordMetadata

from services.common import metrics
from services.common.gc_tuning import tune_gc
from services.common.kafka import partitioner, uvloop_writes
from services.common.kafka.admin import TopicSpec, core_topic_specs, ensure_topics
from services.common.kafka.consumer import close_producer
from services.common.kafka.names import TopicNames, kind_of_topic
from services.common.kafka.security import client_security, faust_credentials
from services.common.records import Headers
from services.common.settings import Settings, get_settings

log = logging.getLogger(__name__)

SendRecord = Callable[[str, bytes, bytes | None, Headers | None], Awaitable[Awaitable[object]]]
"""``await send(topic, key, value, headers)`` queues a record (``value`` None: a tombstone)
and returns an awaitable that resolves with the record's metadata (it has an ``offset``)
once Kafka acknowledged it, or raises if Kafka did not store it."""


#: Seconds a replaced producer may take to hand over what it still holds before it is closed.
RENEW_CLOSE_SECONDS = 5.0

#: Errors after which an idempotent producer's sequence numbers no longer match the broker's
#: for a partition (a batch failed after its numbers were given out: too large for the
#: topic, or its partition had no leader past the request timeout): every later batch of
#: that partition would fail too, so the producer is replaced by one with a new producer id.
SEQUENCE_ERRORS = (OutOfOrderSequenceNumber, UnknownProducerId, InvalidProducerEpoch)


class IdempotentProducer(faust_aiokafka.Producer):
    """Faust's aiokafka producer with ``enable_idempotence`` (and so ``acks=all``).

    aiokafka 0.14 never moves an idempotent producer to a new producer id; when a record
    fails with one of :data:`SEQUENCE_ERRORS`, this one starts a new aiokafka producer and
    closes the old one (its remaining records fail, and their writers see it as for any
    failure).
    """

    def _settings_extra(self) -> dict[str, Any]:
        return {**super()._settings_extra(), "enable_idempotence": True}

    async def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        partition: int | None,
        timestamp: float | None,
        headers: HeadersArg | None,
        *,
        transactional_id: str | None = None,
    ) -> Awaitable[RecordMetadata]:
        """Faust's ``send``; the returned future is watched for :data:`SEQUENCE_ERRORS`."""
        current = self._producer
        acknowledged = await super().send(
            topic, key, value, partition, timestamp, headers, transactional_id=transactional_id
        )
        assert isinstance(acknowledged, asyncio.Future)
        acknowledged.add_done_callback(lambda done: self._check(current, done))
        return acknowledged

    async def send_record(
        self, topic: str, key: bytes, value: bytes | None, headers: Headers | None
    ) -> asyncio.Future[RecordMetadata]:
        """The :data:`SendRecord` of the services: straight to the aiokafka producer,
        partition by key, no timestamp. Kafka's answer is counted in
        :data:`services.common.metrics.KAFKA` (latency or failure) and watched for
        :data:`SEQUENCE_ERRORS` by one done-callback. Faust's :meth:`send` around it (its
        produce signal, header conversion, error wrapping), a second callback and a
        closure per record were a tenth of the router's and the ingest nodes' CPU per
        message (bench/NOTES.md, "issue 30 part 1: CPU per message"). Raises what aiokafka
        raises when the record cannot be queued (``KafkaError``, ``KafkaTimeoutError``)."""
        current = self._ensure_producer()
        acknowledged: asyncio.Future[RecordMetadata] = await current.send(
            topic, value, key=key, headers=None if headers is None else list(headers)
        )
        acknowledged.add_done_callback(
            partial(self._answered, current, topic_label(topic), time.monotonic())
        )
        return acknowledged

    def _answered(
        self,
        used: AIOKafkaProducer,
        label: str,
        started: float,
        done: asyncio.Future[RecordMetadata],
    ) -> None:
        """Count the record (of topic kind ``label``, queued at ``started``, monotonic
        seconds) Kafka answered, and renew the producer after a sequence error."""
        if done.cancelled():
            metrics.KAFKA.failed(label)
            return
        error = done.exception()
        if error is None:
            metrics.KAFKA.produced(label, time.monotonic() - started)
            return
        metrics.KAFKA.failed(label)
        self._check(used, done)

    def _check(self, used: AIOKafkaProducer, done: asyncio.Future[RecordMetadata]) -> None:
        if done.cancelled() or not isinstance(done.exception(), SEQUENCE_ERRORS):
            return
        if used is self._producer and not getattr(self, "_renewing", False):
            self._renewing = True
            log.warning("producer out of sequence (%r): starting a new one", done.exception())
            self.add_future(self._renew(used))

    async def _renew(self, old: AIOKafkaProducer) -> None:
        try:
            fresh = self._new_producer()
            await fresh.start()
            self._producer = fresh
        finally:
            self._renewing = False
        await close_producer(old, RENEW_CLOSE_SECONDS)


class IdempotentTransport(faust_aiokafka.Transport):
    """Faust's aiokafka transport whose producer is :class:`IdempotentProducer`."""

    Producer = IdempotentProducer


def producer_options(settings: Settings) -> dict[str, Any]:
    """The options of an aiokafka producer of the services (those :func:`make_app` gives
    Faust's): ``acks=all``, partitioning by key hash, linger, request timeout and largest
    request from ``settings``, and the client security."""
    return {
        "bootstrap_servers": settings.kafka_bootstrap,
        "acks": "all",
        "partitioner": partitioner.partition,
        "linger_ms": int(settings.producer_linger_seconds * 1000),
        "request_timeout_ms": int(settings.kafka_request_timeout_seconds * 1000),
        "max_request_size": max(settings.max_packet_size * 2, 1024 * 1024),
        **client_security(settings),
    }


def transactional_producer(settings: Settings, transactional_id: str) -> AIOKafkaProducer:
    """A transactional aiokafka producer (not started) with :func:`producer_options`.

    ``transactional_id`` names it to Kafka: starting a producer with the same id fences
    this one and aborts its open transaction. A transaction must end within
    ``transaction_timeout_seconds`` or Kafka aborts it.
    """
    return AIOKafkaProducer(
        **producer_options(settings),
        transactional_id=transactional_id,
        transaction_timeout_ms=int(settings.transaction_timeout_seconds * 1000),
    )


def sender(app: faust.App) -> SendRecord:
    """The :data:`SendRecord` of ``app``: through ``app``'s idempotent producer
    (:meth:`IdempotentProducer.send_record`), partition by key, no timestamp (in no
    transaction: :func:`send_in_transaction` sends in one)."""

    def send(
        topic: str, key: bytes, value: bytes | None, headers: Headers | None
    ) -> Awaitable[Awaitable[object]]:
        # app.producer is looked up when sending: made before the worker's event loop
        # runs, the producer would belong to another loop.
        producer = app.producer
        assert isinstance(producer, IdempotentProducer), "make_app's transport makes one"
        return producer.send_record(topic, key, value, headers)

    return send


async def send_in_transaction(
    producer: AIOKafkaProducer,
    topic: str,
    key: bytes,
    value: bytes | None,
    headers: Headers | None,
) -> Awaitable[object]:
    """Queue a record in the open transaction of ``producer`` (a started
    :func:`transactional_producer`), partition by key, no timestamp; what
    :data:`SendRecord` returns: an awaitable of Kafka's acknowledgement (the record is
    visible to readers once the transaction commits)."""
    listed = None if headers is None else list(headers)
    acknowledged: asyncio.Future[Any] = asyncio.ensure_future(
        await producer.send(topic, value, key=key, headers=listed)
    )
    watch_produce(acknowledged, topic)
    return acknowledged


def watch_produce(acknowledged: asyncio.Future[Any], topic: str) -> None:
    """Count the record of ``topic`` whose acknowledgement is ``acknowledged`` in
    :data:`services.common.metrics.KAFKA` when Kafka answers: its latency, or a failure."""
    loop = asyncio.get_running_loop()
    started = loop.time()

    def answered(future: asyncio.Future[Any]) -> None:
        label = topic_label(topic)
        if future.cancelled() or future.exception() is not None:
            metrics.KAFKA.failed(label)
        else:
            metrics.KAFKA.produced(label, loop.time() - started)

    acknowledged.add_done_callback(answered)


_LABELS: dict[str, str] = {}


def topic_label(topic: str) -> str:
    """The ``topic`` label of a record's metrics: the topic's kind, without the prefix or
    the client, node or group its name carries (``msg.app``, ``msg.downlink``)."""
    label = _LABELS.get(topic)
    if label is None:
        label = kind_of_topic(topic)
        if len(_LABELS) < 10_000:  # msg.app topics are one per client: keep the cache small
            _LABELS[topic] = label
    return label


def make_app(settings: Settings, service: str, **overrides: Any) -> faust.App:
    """Build the Faust app of ``service`` (e.g. ``"router"``), configured from ``settings``.

    The app id (the service's consumer group, ``app.conf.id``) is
    ``<topic_prefix>cormorant-<service>``; the producer is idempotent
    (:class:`IdempotentProducer`) and waits for all in-sync replicas (``acks=-1``).
    ``overrides`` are passed to :class:`faust.App` last.
    """
    datadir = settings.state_dir / "faust" / service
    datadir.mkdir(parents=True, exist_ok=True)
    options: dict[str, Any] = {
        "broker": [f"kafka://{host}" for host in settings.kafka_bootstrap.split(",")],
        "broker_credentials": faust_credentials(settings),
        "store": "memory://",
        "web_enabled": True,
        "web_bind": settings.http_host,
        "web_host": settings.http_host,
        "web_port": settings.http_port,
        # Faust's own pages (its router, tables, graph, statistics) are not served.
        "web_router_enabled": False,
        "web_tables_enabled": False,
        "web_graph_enabled": False,
        "web_stats_enabled": False,
        "autodiscover": False,
        "key_serializer": "raw",
        "value_serializer": "raw",
        "producer_acks": -1,
        "producer_partitioner": partitioner.partition,
        "producer_linger": settings.producer_linger_seconds,
        "producer_request_timeout": settings.kafka_request_timeout_seconds,
        "producer_max_request_size": max(settings.max_packet_size * 2, 1024 * 1024),
        "consumer_max_fetch_size": max(settings.max_packet_size * 2, 1024 * 1024),
        "topic_replication_factor": settings.replication_factor,
        "topic_allow_declare": True,
        "broker_commit_interval": 1.0,
        "stream_recovery_delay": 0.0,
        "datadir": str(datadir),
    }
    options.update(overrides)
    app = faust.App(TopicNames.from_settings(settings).service_group(service), **options)
    app.transport = IdempotentTransport(app.conf.broker_consumer, app)
    app.producer_only = True
    return app


class TaskEnded(Exception):
    """A service's main task ended while its worker was not stopping."""


async def watched(
    main: Awaitable[object],
    background: Sequence[asyncio.Task[Any]],
    stopping: Callable[[], bool],
) -> None:
    """Await ``main`` while the ``background`` tasks of the same service run; raise
    :class:`TaskEnded` naming the first background task that ends (returns, raises, or is
    cancelled; its exception as the cause) while ``stopping()`` is False, ``main`` then
    cancelled. ``main``'s own failure is raised as it is. Why: a background task
    that ended (a wills owner's read loop, a credential listener) used to be noticed only at
    shutdown, and the process ran on without it; this way the service's main task fails,
    and :func:`run_task` crashes the worker for its supervisor to start again."""
    running = asyncio.ensure_future(main)
    waiting: set[asyncio.Future[Any]] = {running, *background}
    try:
        while True:
            done, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if running in done:
                running.result()  # raises what ``main`` raised
                return
            for task in done:
                if stopping():
                    continue  # the shutdown hook cancels them
                name = task.get_name() if isinstance(task, asyncio.Task) else repr(task)
                if task.cancelled():
                    raise TaskEnded(f"{name} was cancelled")
                failure = task.exception()
                if failure is not None:
                    raise TaskEnded(f"{name} failed: {failure!r}") from failure
                raise TaskEnded(f"{name} returned")
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


def run_task(app: faust.App, task: Callable[[], Awaitable[None]]) -> None:
    """Run ``task()``, which runs until shutdown, in ``app``'s worker once it has started
    (Faust's ``@app.task``), guarded by :func:`until_shutdown`: if it ends before, the
    worker crashes and the process exits non-zero (mode re-raises the crash), so that its
    supervisor (ECS, ``cormorant up``) starts it again."""

    async def guarded() -> None:
        await until_shutdown(task, lambda: bool(app.should_stop))

    app.task(guarded)


async def until_shutdown(task: Callable[[], Awaitable[None]], stopping: Callable[[], bool]) -> None:
    """Await ``task()``; raise :class:`TaskEnded` if it returns, raises, or is cancelled
    while ``stopping()`` is False. mode only logs a cancelled task: aiokafka cancelled a
    consumer loop after a failed rebalance (SyncGroup's UnknownError in a broker failover),
    and device_persist ran on without consuming anything."""
    try:
        await task()
    except asyncio.CancelledError:
        if stopping():
            raise
        raise TaskEnded(f"{getattr(task, '__name__', task)!s} was cancelled") from None
    except Exception as exc:
        if stopping():
            raise
        raise TaskEnded(f"{getattr(task, '__name__', task)!s} failed: {exc!r}") from exc
    if not stopping():
        raise TaskEnded(f"{getattr(task, '__name__', task)!s} returned")


def every(app: faust.App, seconds: float, job: Callable[[], Awaitable[object]], what: str) -> None:
    """Run ``job()`` every ``seconds`` in ``app``'s worker (Faust's ``@app.timer``); a
    failure (Kafka or a store down) is logged as ``what`` failing, and the next tick tries
    again."""

    async def tick() -> None:
        try:
            await job()
        except Exception as exc:
            log.warning("%s failed: %r", what, exc)

    app.timer(seconds)(tick)


def on_shutdown(app: faust.App, stop: Callable[[], Awaitable[None]]) -> None:
    """Run ``stop()`` when ``app``'s worker shuts down, before its producer stops (Faust's
    ``on_before_shutdown`` signal): the last records can still be written."""

    async def handler(*args: object, **kwargs: object) -> None:  # (sender, signal=...)
        await stop()

    app.on_before_shutdown.connect(handler)


def run_service(
    build_app: Callable[[Settings], faust.App],
    extra_topics: Callable[[Settings], list[TopicSpec]] = lambda settings: [],
) -> None:
    """A service's entry point: read the settings, create the core topics (and
    ``extra_topics``) if they are missing, then run ``build_app(settings)`` until
    SIGTERM/SIGINT. Raises ``aiokafka.errors.KafkaError`` when Kafka cannot be reached."""
    settings = get_settings()
    specs = [*core_topic_specs(settings), *extra_topics(settings)]
    asyncio.run(
        ensure_topics(
            settings.kafka_bootstrap,
            specs,
            settings.replication_factor,
            security=client_security(settings),
        )
    )
    run_worker(build_app(settings), settings)


def run_worker(app: faust.App, settings: Settings) -> None:
    """Run ``app`` in a Faust worker until SIGTERM/SIGINT; uses uvloop when installed (with
    :func:`~services.common.kafka.uvloop_writes.install`), and the garbage collector's
    settings of :func:`~services.common.gc_tuning.tune_gc`."""
    worker = faust.Worker(app, loglevel=settings.log_level, loop=_event_loop())
    tune_gc(settings.gc_gen0_threshold)
    worker.execute_from_commandline()


def _event_loop() -> Any:
    try:
        import uvloop
    except ImportError:  # uvloop is optional on platforms without it
        return None
    uvloop_writes.install()
    return uvloop.new_event_loop()
