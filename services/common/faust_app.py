"""The one Faust configuration every Cormorant service starts from.

Each service is a faust-streaming app (DESIGN.md); this module keeps their Kafka settings in
one place: raw bytes serializers (records are encoded by :mod:`services.common.records`),
``acks=all`` production, an in-memory table store (no service keeps Faust tables), and
Faust's web server on ``http_host:http_port`` with only Cormorant's pages
(:mod:`services.common.web`: ``/health``, ``/ready``, ``/metrics``).

The apps run in Faust's producer-only mode: Faust's worker gives each service its life cycle
(signals, logging, ``@app.task``, start-up and shutdown hooks) and its producer, while the
hot-path topics are consumed by :mod:`services.common.kafka.consumer` (the measured reason is
there). So Faust's own consumer never joins a group, and the app id is free to be the
service's consumer group.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import faust

from services.common import metrics
from services.common.kafka import partitioner
from services.common.kafka.admin import TopicSpec, core_topic_specs, ensure_topics
from services.common.kafka.names import TopicNames, kind_of_topic
from services.common.kafka.security import client_security, faust_credentials
from services.common.records import Headers
from services.common.settings import Settings, get_settings

log = logging.getLogger(__name__)

SendRecord = Callable[[str, bytes, bytes | None, Headers | None], Awaitable[Awaitable[object]]]
"""``await send(topic, key, value, headers)`` queues a record (``value`` None: a tombstone)
and returns an awaitable that resolves with the record's metadata (it has an ``offset``)
once Kafka acknowledged it, or raises if Kafka did not store it."""


def sender(app: faust.App) -> SendRecord:
    """The :data:`SendRecord` of ``app``'s producer (partition by key, no timestamp)."""

    async def send(
        topic: str, key: bytes, value: bytes | None, headers: Headers | None
    ) -> Awaitable[object]:
        acknowledged = asyncio.ensure_future(
            await app.producer.send(
                topic, key, value, None, None, None if headers is None else list(headers)
            )
        )
        watch_produce(acknowledged, topic)
        return acknowledged

    return send


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
    ``<topic_prefix>cormorant-<service>``; the producer waits for all in-sync replicas
    (``acks=-1``).
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
    app.producer_only = True
    return app


def run_task(app: faust.App, task: Callable[[], Awaitable[None]]) -> None:
    """Run ``task()`` in ``app``'s worker once it has started (Faust's ``@app.task``)."""
    app.task(task)


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
    """Run ``app`` in a Faust worker until SIGTERM/SIGINT; uses uvloop when installed."""
    worker = faust.Worker(app, loglevel=settings.log_level, loop=_event_loop())
    worker.execute_from_commandline()


def _event_loop() -> Any:
    try:
        import uvloop
    except ImportError:  # uvloop is optional on platforms without it
        return None
    return uvloop.new_event_loop()
