"""The app_delivery service: APPLICATION clients at Kafka speed (docs/design.md, app_delivery).

``client.sessions``, ``client.subscriptions`` and ``client.acks`` are read in the consumer
group ``<prefix>cormorant-app-delivery``: the instance given a partition number owns the
clients whose records are there (:mod:`.ownership`), and keeps their state and feeds
(:mod:`.clients`). Each owned, connected, persistent APPLICATION client gets a feed
(:mod:`.feed`) reading its ``msg.app`` topic (and its shared groups' topics) and sending to
its node.
"""

from __future__ import annotations

import asyncio
import logging

import faust
from aiokafka.coordinator.assignors.range import RangePartitionAssignor

from services.app_delivery.clients import AppClients
from services.app_delivery.ownership import Ownership
from services.common import metrics
from services.common.clock import now_ms
from services.common.faust_app import (
    every,
    make_app,
    on_shutdown,
    run_service,
    run_task,
    sender,
)
from services.common.kafka.consumer import make_consumer
from services.common.kafka.names import TopicNames
from services.common.settings import Settings
from services.common.web import serve_http

log = logging.getLogger(__name__)


def build_app(settings: Settings) -> faust.App:
    """Build app_delivery's Faust app: an :class:`AppDeliveryService` run by the app's
    worker, with its session expiry timer."""
    app = make_app(settings, "app-delivery")
    service = AppDeliveryService(settings, app)
    run_task(app, service.run)
    every(
        app, settings.session_expiry_check_seconds, service.expire_sessions, "session expiry check"
    )
    on_shutdown(app, service.stop)
    return app


class AppDeliveryService:
    """app_delivery in ``app`` (its Faust app): :meth:`run` owns the partitions the
    consumer group gives it and feeds their APPLICATION clients until cancelled (the app's
    main task); :meth:`expire_sessions` is its timer, :meth:`stop` its shutdown hook."""

    def __init__(self, settings: Settings, app: faust.App) -> None:
        self.settings = settings
        self.group = app.conf.id
        self.names = TopicNames.from_settings(settings)
        self.readiness = serve_http(app, "app-delivery", settings.ready_file)
        self.clients = AppClients(settings, sender(app))
        self.readiness.add("kafka", self.clients.kafka_reachable)
        metrics.register(self.clients.families)

    async def start(self) -> None:
        """Start the clients' Kafka parts."""
        await self.clients.start()

    async def run(self) -> None:
        """:meth:`start`, then follow the ownership topics in app_delivery's group until
        cancelled; ready once the first assignment is read."""
        await self.start()
        settings, clients = self.settings, self.clients
        consumer = make_consumer(
            settings,
            group_id=self.group,
            instance_id=settings.group_instance_id,
            partition_assignment_strategy=(RangePartitionAssignor,),
        )
        await consumer.start()
        ready = asyncio.Event()
        ownership = Ownership(consumer, clients, self.names, ready)
        reading = asyncio.create_task(ownership.run(), name="app-delivery-ownership")
        try:
            await ready.wait()
            self.readiness.serving("app_delivery")
            await reading
        finally:
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)
            await clients.close()
            await consumer.stop()

    async def expire_sessions(self) -> None:
        """End the sessions whose Session Expiry Interval has passed (the timer's job)."""
        await asyncio.gather(*await self.clients.expire_sessions(now_ms()))

    async def stop(self) -> None:
        """The shutdown hook: not ready any more."""
        self.readiness.stopping()


def run() -> None:
    """Entry point of ``cormorant app-delivery``."""
    run_service(build_app)
