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
    """Build app_delivery's Faust app: the ownership consumer, the feeds, the expiry timer."""
    names = TopicNames.from_settings(settings)
    app = make_app(settings, "app-delivery")
    readiness = serve_http(app, "app-delivery", settings.ready_file)

    send = sender(app)

    clients = AppClients(settings, send)
    readiness.add("kafka", clients.kafka_reachable)
    metrics.register(clients.families)

    async def serve() -> None:
        await clients.start()
        consumer = make_consumer(
            settings,
            group_id=app.conf.id,
            instance_id=settings.group_instance_id,
            partition_assignment_strategy=(RangePartitionAssignor,),
        )
        await consumer.start()
        ready = asyncio.Event()
        ownership = Ownership(consumer, clients, names, ready)
        reading = asyncio.create_task(ownership.run(), name="app-delivery-ownership")
        try:
            await ready.wait()
            readiness.serving("app_delivery")
            await reading
        finally:
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)
            await clients.close()
            await consumer.stop()

    async def expire_sessions() -> None:
        await asyncio.gather(*await clients.expire_sessions(now_ms()))

    async def stop() -> None:
        readiness.stopping()

    run_task(app, serve)
    every(app, settings.session_expiry_check_seconds, expire_sessions, "session expiry check")
    on_shutdown(app, stop)
    return app


def run() -> None:
    """Entry point of ``cormorant app-delivery``."""
    run_service(build_app)
