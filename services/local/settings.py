"""The local cluster launcher's settings: what only ``cormorant up / down / status`` reads.

:class:`LocalSettings` adds to the services' run-time :class:`~services.common.settings.Settings`
where the launcher puts the processes of a local cluster (ports, node count), which Kafka it
fetches and how much heap it gets. The launcher hands the services only the run-time part
(:func:`services.local.cluster.runtime_settings`). Every setting is still an environment
variable ``CORMORANT_<NAME>`` or a line of the settings file.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field

from services.common.settings import Settings
from services.common.versions import KAFKA_VERSION


def _default_cache_dir() -> Path:
    """Where downloaded jars are cached: ``$XDG_CACHE_HOME/cormorant``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cormorant"


class LocalSettings(Settings):
    """Run-time settings plus the local cluster's layout (environment prefix ``CORMORANT_``)."""

    cache_dir: Path = Field(
        default_factory=_default_cache_dir,
        description="Downloaded jars: the local Kafka's and the Spark jobs' Kafka connector "
        "($XDG_CACHE_HOME/cormorant).",
    )
    kafka_version: str = Field(
        KAFKA_VERSION, description="Apache Kafka release fetched from Maven."
    )
    kafka_port: int = Field(9092, ge=1, le=65535, description="Local Kafka's client port.")
    kafka_controller_port: int = Field(
        9093, ge=1, le=65535, description="Local Kafka's KRaft controller port."
    )
    kafka_heap: str = Field("512m", description="-Xmx of each local Kafka broker.")
    kafka_brokers: int = Field(
        1,
        ge=1,
        le=9,
        description="Kafka brokers of the local cluster: 1, or 3 as MSK (KRaft, each broker "
        "also a controller; replication factor min(3, brokers), min.insync.replicas 2). "
        "Broker i listens on kafka_port + 2(i - 1), its controller on "
        "kafka_controller_port + 2(i - 1).",
    )
    redis_port: int = Field(6379, ge=1, le=65535, description="Local Redis port.")
    redis_replicas: int = Field(
        0,
        ge=0,
        le=4,
        description="Replicas of the local Redis, watched by redis_sentinel_count Sentinels "
        "that promote one when the primary dies (as ElastiCache with failover); node i "
        "listens on redis_port + i - 1. device_persist then waits for one replica to have "
        "each write (redis_wait_replicas) before it commits the Kafka offsets behind it.",
    )
    redis_sentinel_count: int = Field(
        3, ge=1, le=5, description="Sentinels of a local Redis with replicas."
    )
    redis_sentinel_port: int = Field(
        26379, ge=1, le=65535, description="Sentinel j listens on redis_sentinel_port + j - 1."
    )
    postgres_port: int = Field(5432, ge=1, le=65535, description="Local PostgreSQL port.")
    listen_port: int = Field(1883, ge=1, le=65535, description="HAProxy's MQTT port.")
    tls_listen_port: int = Field(
        8883, ge=1, le=65535, description="HAProxy's MQTT over TLS port (the nodes' TLS)."
    )
    ws_listen_port: int = Field(
        8083, ge=1, le=65535, description="HAProxy's MQTT over WebSocket port (ws://…/mqtt)."
    )
    wss_listen_port: int = Field(
        8084,
        ge=1,
        le=65535,
        description="HAProxy's MQTT over WebSocket on TLS port (wss://…/mqtt).",
    )
    ingest_nodes: int = Field(2, ge=1, le=16, description="Ingest nodes behind HAProxy.")
    haproxy_processes: int = Field(
        0,
        ge=0,
        le=16,
        description="HAProxy processes sharing the listen ports (SO_REUSEPORT; processes "
        "haproxy, haproxy-2...). Each holds two open files per connection, so a hard "
        "open-file limit the cluster cannot raise caps each one near half of it. 0: as "
        "many as the connections the ingest nodes take need under that limit "
        "(docs/operations/connections.md).",
    )
    router_instances: int = Field(
        1, ge=1, le=12, description="Routers (processes router, router-2...) sharing msg.all."
    )
    device_persist_instances: int = Field(
        1,
        ge=1,
        le=12,
        description="device_persist instances (device-persist, device-persist-2...).",
    )
    app_delivery_instances: int = Field(
        1, ge=1, le=12, description="app_delivery instances (app-delivery, app-delivery-2...)."
    )
    integrations_instances: int = Field(
        1,
        ge=1,
        le=12,
        description="Integrations stage instances (integrations-stage, integrations-stage-2...).",
    )
    consumer_session_timeout_seconds: float = Field(
        3.0,
        ge=1,
        description="Consumer group session timeout of the local cluster's stages (its Kafka "
        "allows 1 s and up): a killed instance's partitions move to another within about "
        "this plus a heartbeat interval.",
    )
    consumer_heartbeat_interval_seconds: float = Field(
        1.0, gt=0, description="Consumer group heartbeat interval of the local cluster's stages."
    )
    ingest_base_port: int = Field(
        11883,
        ge=1,
        le=65400,
        description="Ingest node i listens on base port + i (plain MQTT, for direct "
        "connections), and behind HAProxy (PROXY protocol v2) on base + 16 + i (MQTT), "
        "+ 32 + i (TLS), + 48 + i (WebSocket), + 64 + i (WebSocket on TLS).",
    )
    local_anonymous: bool = Field(
        True,
        description="The local cluster lets anonymous MQTT clients in (allow_anonymous on its "
        "ingest nodes) while they listen on loopback only (mqtt_host 127.0.0.1, HAProxy on "
        "127.0.0.1); cormorant up says so. false: credentials are required locally too.",
    )
    http_base_port: int = Field(
        9180,
        ge=1,
        le=65500,
        description="The services' HTTP ports (/health, /ready, /metrics): ingest node i on "
        "base + i, router instance j on base + 16 + j, device_persist instance j on "
        "base + 32 + j, app_delivery instance j on base + 48 + j, integrations stage instance "
        "j on base + 64 + j.",
    )
    local_tls_cert_file: Path | None = Field(
        None,
        description="Certificate (PEM) of the local cluster's Kafka, Redis and PostgreSQL: when "
        "set with local_tls_key_file, they serve TLS (Kafka with kafka_security_protocol, "
        "Redis only on TLS, PostgreSQL requiring it for the cormorant role), the way the "
        "services meet them in AWS.",
    )
    local_tls_key_file: Path | None = Field(
        None, description="Private key (PEM, unencrypted) of local_tls_cert_file."
    )
