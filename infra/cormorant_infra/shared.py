"""What the deployment takes from Cormorant itself: one source of truth for every fact.

Service names and commands (``services/command_names.py``), topic names, partitions and consumer
groups (``services/common/kafka/``), settings and their environment variables
(``services/common/settings.py``), the MQTT ports and the keep alive rule
(``services/common/mqtt/``), the Kafka and Spark versions and the EMR release
(``services/common/versions.py``), an ingest node's drain timing (``services/common/drain.py``),
what an IAM role ARN looks like to a Kafka sink (``services/common/integrations/model.py``)
are imported here, never copied, so a change there changes the deployment.
"""

from __future__ import annotations

from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from services.command_names import (
    ADMIN_COMMAND,
    INTEGRATIONS_COMMAND,
    INTEGRATIONS_SERVICE,
    MIGRATE_COMMAND,
    SERVICE_COMMANDS,
    TOPICS_COMMAND,
)
from services.common.drain import DEFAULT_TIMING, DrainTiming
from services.common.integrations.model import AWS_ROLE_ARN_PATTERN
from services.common.kafka.admin import (
    TopicSpec,
    app_shared_topic_spec,
    app_topic_spec,
    core_topic_specs,
    downlink_topic_spec,
    refused_configs,
)
from services.common.kafka.names import TopicNames
from services.common.mqtt.keep_alive import max_keep_alive_for_idle_timeout
from services.common.mqtt.ports import (
    MQTT_PORT,
    MQTT_TLS_PORT,
    MQTT_WS_PORT,
    MQTT_WSS_PORT,
    MQTT_WSS_PUBLIC_PORT,
)
from services.common.settings import Settings
from services.common.stores.service_role import SERVICE_ROLE
from services.common.versions import (
    EMR_RELEASE_LABEL,
    KAFKA_VERSION,
    SPARK_VERSION,
    release_line,
)

__all__ = [
    "ADMIN",
    "ADMIN_PORT",
    "AWS_ROLE_ARN_PATTERN",
    "EMR_RELEASE_LABEL",
    "EMR_RELEASE_SPARK",
    "HTTP_PORT",
    "INGEST",
    "INGEST_DIRECT_MQTT_PORT",
    "INGEST_DRAIN",
    "INTEGRATIONS_COMMAND",
    "INTEGRATIONS_SERVICE",
    "KAFKA_VERSION",
    "MIGRATE_COMMAND",
    "MQTT_PORT",
    "MQTT_TLS_PORT",
    "MQTT_WSS_PORT",
    "MQTT_WSS_PUBLIC_PORT",
    "MQTT_WS_PORT",
    "PRODUCTION_TAG",
    "SERVICE_COMMANDS",
    "SERVICE_ROLE",
    "SPARK_VERSION",
    "TOPICS_COMMAND",
    "DrainTiming",
    "Settings",
    "TopicNames",
    "TopicSpec",
    "check_emr_release",
    "core_topic_specs",
    "max_keep_alive_for_idle_timeout",
    "msk_kafka_version",
    "refused_topic_configs",
    "setting_env",
    "settings_for",
    "topic_specs",
]

INGEST = "ingest"
"""The one service that holds MQTT sockets: the only target of the load balancer."""
assert INGEST in SERVICE_COMMANDS

INGEST_DRAIN: DrainTiming = DEFAULT_TIMING
"""An ingest task's drain (the settings' defaults, which the tasks run with): its notice
sets the NLB's deregistration delay and health check, its ``stop_seconds`` ECS's
``stopTimeout`` (docs/operations/drain.md)."""

PRODUCTION_TAG = "cormorant:production"
"""The tag (value ``true``) on the resources of a stack with ``cormorant:production`` that
the policy pack's production rules look at (it cannot read the stack's configuration)."""

ADMIN = ADMIN_COMMAND
"""The operators' REST API and console: behind its own internal HTTPS load balancer."""

HTTP_PORT: int = Settings.model_fields["http_port"].default
"""Every service task's /health, /ready and /metrics port (``http_port``'s default)."""

INGEST_DIRECT_MQTT_PORT: int = Settings.model_fields["mqtt_port"].default
"""The ingest tasks' direct MQTT listener (``mqtt_port``'s default: plain MQTT, no PROXY
protocol), never behind the NLB: the integrations stage's MQTT bridges publish there
(``integrations_mqtt_port``), reached only from the integrations tier."""

ADMIN_PORT: int = Settings.model_fields["admin_port"].default
"""The admin task's API and console port (``admin_port``'s default)."""

EMR_RELEASE_SPARK: dict[str, str] = {
    "emr-7.8.0": "3.5.4",
    "emr-7.9.0": "3.5.5",
    "emr-7.10.0": "3.5.5",
    "emr-7.11.0": "3.5.6",
    "emr-7.12.0": "3.5.6",
    "emr-7.13.0": "3.5.6",
}
"""The Apache Spark each EMR release runs (AWS, EMR Release Guide, "Spark release
history"). Add a release here, with its Spark version from that page, to deploy it."""


def check_emr_release(label: str) -> str:
    """The Spark version of EMR release ``label``, checked against :data:`SPARK_VERSION`.

    The release must run the same ``major.minor`` Spark line as the one the Spark jobs pin
    (EMR ships its own patch level: ``3.5.6`` on EMR for jobs built against ``3.5.7``).
    Raises ``ValueError`` for an unknown label or another Spark line.
    """
    spark = EMR_RELEASE_SPARK.get(label)
    if spark is None:
        raise ValueError(
            f"unknown EMR release {label!r}; known: {sorted(EMR_RELEASE_SPARK)} "
            "(add a release with its Spark version to cormorant_infra/shared.py)"
        )
    if release_line(spark) != release_line(SPARK_VERSION):
        raise ValueError(
            f"{label} runs Spark {spark}, but the Spark jobs pin {SPARK_VERSION}: choose a "
            f"release of the Spark {release_line(SPARK_VERSION)} line"
        )
    return spark


def msk_kafka_version() -> str:
    """The MSK version of the Kafka line Cormorant is tested with: ``3.9.1`` → ``3.9.x``."""
    return f"{release_line(KAFKA_VERSION)}.x"


def setting_env(name: str) -> str:
    """The environment variable of setting ``name``: ``kafka_bootstrap`` →
    ``CORMORANT_KAFKA_BOOTSTRAP``. Raises ``KeyError`` for a name that is no setting."""
    if name not in Settings.model_fields:
        raise KeyError(f"{name!r} is not a Cormorant setting (services/common/settings.py)")
    prefix = Settings.model_config.get("env_prefix", "")
    return f"{prefix}{name}".upper()


class _DeclaredSettings(Settings):
    """:class:`Settings` from the values given only: not this machine's environment or
    settings file (the deployment's tasks do not see them)."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


def settings_for(**values: object) -> Settings:
    """The :class:`Settings` a service would build from ``values`` alone (no environment,
    no settings file), validated the way the service validates them. Raises
    ``pydantic.ValidationError`` naming a bad value."""
    return _DeclaredSettings.model_validate(values)


def topic_specs(settings: Settings) -> list[TopicSpec]:
    """Every kind of topic the services create with ``settings``: the core topics, and one
    example each of a downlink topic and the APPLICATION clients' topics (their configs do
    not depend on the node or client they are named after)."""
    return [
        *core_topic_specs(settings),
        downlink_topic_spec(settings, "node"),
        app_topic_spec(settings, "client"),
        app_shared_topic_spec(settings, "share", "filter/#"),
    ]


def refused_topic_configs(settings: Settings) -> dict[str, list[str]]:
    """Topic name → the configs of it that the Kafka of ``settings.kafka_flavor`` refuses;
    only topics with a refused config are named."""
    refused = {
        spec.name: refused_configs(spec, settings.kafka_flavor) for spec in topic_specs(settings)
    }
    return {name: configs for name, configs in refused.items() if configs}
