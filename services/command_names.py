"""The names of the ``cormorant`` commands that the deployment runs, apart from the click
CLI (:mod:`services.cli`) so that the CLI, ``cormorant cloud`` and the Pulumi program
(``infra/``) import them without importing the CLI or each other."""

from __future__ import annotations

INTEGRATIONS_COMMAND = "integrations-stage"
"""The integrations stage (services/integrations/); ``cormorant integrations`` manages what
it runs."""

INTEGRATIONS_SERVICE = "integrations"
"""The integrations stage's name in its consumer groups and transactional ids
(``<prefix>cormorant-integrations.<integration id>``, in the sink clusters too)."""

SERVICE_COMMANDS = (
    "ingest",
    "router",
    "device-persist",
    "app-delivery",
    INTEGRATIONS_COMMAND,
    "admin",
)
"""The commands that each run one deployable service: one container image target
(Dockerfile) and one ECS service (infra/) each."""

ADMIN_COMMAND = "admin"
"""The operators' REST API and console: a deployable service, not a stage of the data path."""

TOPICS_COMMAND = "create-topics"
"""The command of the one-off task that creates Cormorant's core Kafka topics."""

MIGRATE_COMMAND = "migrate-db"
"""The command of the one-off task that migrates the PostgreSQL schema as the master user and
creates or updates the services' own role."""
