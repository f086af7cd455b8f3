"""The integrations service: the broker's messages into the systems teams already run
(docs/integrations/index.md).

A Faust app in producer-only mode like the other stages (:mod:`services.common.faust_app`):
Faust's worker gives it its life cycle and its ``/health``, ``/ready`` and ``/metrics``
pages; :class:`~services.integrations.stage.IntegrationsStage` is its main task. Faust
agents would fit the rates of a team's export, but each integration needs transactions
with its own sink cluster and offsets committed there, which Faust's exactly-once mode
(transactions on the app's own Kafka) cannot give: the stage reads ``msg.all`` with the
same consume loop as the router (:func:`~services.common.kafka.consumer.
consume_in_transactions`). Its consumer groups are ``<prefix>cormorant-integrations.<id>``,
one per integration.
"""

from __future__ import annotations

import faust

from services.command_names import INTEGRATIONS_COMMAND, INTEGRATIONS_SERVICE
from services.common.faust_app import make_app, on_shutdown, run_service, run_task
from services.common.kafka.admin import dead_letter_topic_spec
from services.common.settings import Settings
from services.common.web import serve_http
from services.integrations.stage import IntegrationsStage

SERVICE = INTEGRATIONS_SERVICE
"""The service's name in its consumer groups (``<prefix>cormorant-integrations.<id>``);
its metrics' ``service`` label is its command, :data:`INTEGRATIONS_COMMAND`."""


def build_app(settings: Settings) -> faust.App:
    """Build the integrations' Faust app: an :class:`IntegrationsStage` run by the app's
    worker, not ready once it stops."""
    app = make_app(settings, SERVICE)
    readiness = serve_http(app, INTEGRATIONS_COMMAND, settings.ready_file)
    stage = IntegrationsStage(settings, readiness, app.conf.id)
    run_task(app, stage.run)

    async def stop() -> None:
        readiness.stopping()

    on_shutdown(app, stop)
    return app


def run() -> None:
    """Entry point of ``cormorant integrations-stage``: the core topics and
    ``integrations.dead-letter`` are created first if missing."""
    run_service(build_app, lambda settings: [dead_letter_topic_spec(settings)])
