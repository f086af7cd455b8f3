"""Cormorant's settings: one typed object, read from the environment and an optional file.

Every setting can be given as an environment variable ``CORMORANT_<NAME>`` (for example
``CORMORANT_KAFKA_BOOTSTRAP=10.0.0.5:9092``) or in a dotenv-style file named by
``CORMORANT_SETTINGS_FILE`` (default ``cormorant.env`` in the working directory, if present).
Environment variables win over the file. Durations are in seconds, sizes in bytes.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

KafkaSecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_SSL"]
"""Kafka's ``security.protocol`` values Cormorant's clients speak (services' aiokafka
clients: :mod:`services.common.kafka.security`; the Spark jobs: :mod:`spark_emr.kafka_options`)."""

KafkaSaslMechanism = Literal["SCRAM-SHA-512", "OAUTHBEARER"]
"""SASL mechanisms with ``SASL_SSL``: SCRAM-SHA-512 (MSK port 9096) or OAUTHBEARER (MSK IAM,
port 9098)."""


def _default_state_dir() -> Path:
    """The local cluster's data and log directory: ``$XDG_STATE_HOME/cormorant``."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "cormorant"


class Settings(BaseSettings):
    """All of Cormorant's settings (environment prefix ``CORMORANT_``).

    Groups: Kafka connection and topic layout, MQTT limits, the ingest listener, and the
    message store of device_persist: what the services read at run time. The local cluster
    launcher's own settings (ports, Kafka's heap and version) are
    :class:`services.local.settings.LocalSettings`. Validation errors raise
    ``pydantic.ValidationError`` naming the offending variable.
    """

    model_config = SettingsConfigDict(
        env_prefix="CORMORANT_",
        env_file=os.environ.get("CORMORANT_SETTINGS_FILE", "cormorant.env"),
        env_file_encoding="utf-8",
        extra="ignore",
    )

    # --- Kafka -----------------------------------------------------------------------------
    kafka_bootstrap: str = Field("127.0.0.1:9092", description="host:port[,host:port...]")
    topic_prefix: str = Field(
        "", description="Prepended to every Kafka topic name, to share one Kafka cluster."
    )
    replication_factor: int = Field(1, ge=1, description="Replication factor of new topics.")
    msg_all_partitions: int = Field(12, ge=1, description="Partitions of msg.all.")
    state_topic_partitions: int = Field(
        12,
        ge=1,
        description="Partitions of every topic keyed by client id: client.sessions, "
        "client.subscriptions, client.acks, msg.persisted (equal counts keep one client's "
        "records at the same partition number of each).",
    )
    downlink_partitions: int = Field(
        4, ge=1, description="Partitions of each msg.downlink.<node_id> topic."
    )
    msg_retention_seconds: int = Field(
        7 * 24 * 3600, ge=60, description="retention.ms (as seconds) of msg.all."
    )
    downlink_retention_seconds: int = Field(
        3600, ge=60, description="retention.ms (as seconds) of downlink topics."
    )
    producer_linger_seconds: float = Field(
        0.001, ge=0, description="Producer linger: how long a batch may wait to fill."
    )
    kafka_request_timeout_seconds: float = Field(
        10.0, gt=0, description="How long a produce may take before the PUBLISH is refused."
    )
    transaction_timeout_seconds: float = Field(
        30.0,
        gt=0,
        le=900,
        description="Kafka transaction timeout of the router's transactions (and of Will "
        "Message publications): Kafka aborts a transaction left open longer, e.g. by a "
        "router that died with no other to take its partitions (at most the brokers' "
        "transaction.max.timeout.ms, 900 by default).",
    )
    router_transactions: bool = Field(
        True,
        description="Route msg.all in Kafka transactions (exactly once: a router crash "
        "routes nothing twice). False: at-least-once routing, offsets committed after the "
        "outputs are stored, so a crash may route a message again (a duplicate delivery, "
        "or a QoS 2 message stored twice for a persistent subscriber); only to measure "
        'what the transactions cost (bench/README.md, "The transactional router\'s cost").',
    )
    consumer_session_timeout_seconds: float = Field(
        6.0,
        ge=1,
        description="Consumer group session timeout of the stages (router, device_persist, "
        "app_delivery, the ingest nodes' Will Message owners): a member silent this long "
        "loses its partitions to the others. At least the brokers' "
        "group.min.session.timeout.ms (6 s by default; the local cluster's is 1 s).",
    )
    consumer_heartbeat_interval_seconds: float = Field(
        2.0,
        gt=0,
        description="Consumer group heartbeat interval (at most a third of the session "
        "timeout): how soon a member hears of a rebalance.",
    )
    group_instance_id: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9._-]{1,100}$",
        description="Static consumer group member id of this router, device_persist or "
        "app_delivery instance (KIP-345), unique per stage: a restarted instance takes its "
        "partitions back at once, without waiting for the session timeout and a rebalance. "
        "Unset: a dynamic member. The local cluster names its instances (router-1...).",
    )
    ingest_max_pending_records: int = Field(
        10_000,
        ge=1,
        description="Records an ingest node may have waiting for Kafka's answer; past it, the "
        "node stops reading from the clients that publish until half are answered (TCP "
        "backpressure), so a QoS 0 flood cannot make Kafka time out everyone's records.",
    )

    # --- Kafka security (MSK) ---------------------------------------------------------------
    kafka_security_protocol: KafkaSecurityProtocol = Field(
        "PLAINTEXT",
        description="Kafka's security.protocol for every client: PLAINTEXT (local), SSL (TLS "
        "only) or SASL_SSL (TLS and SASL: MSK's SCRAM port 9096 or IAM port 9098).",
    )
    kafka_sasl_mechanism: KafkaSaslMechanism = Field(
        "SCRAM-SHA-512",
        description="SASL mechanism with SASL_SSL: SCRAM-SHA-512 (username and password) or "
        "OAUTHBEARER (MSK IAM: a token signed with the task's AWS credentials).",
    )
    kafka_sasl_username: str | None = Field(None, description="SCRAM username.")
    kafka_sasl_password: SecretStr | None = Field(
        None, description="SCRAM password (ECS fills it from Secrets Manager)."
    )
    kafka_ssl_cafile: Path | None = Field(
        None,
        description="CA bundle (PEM) that signs the brokers' certificates; unset: the "
        "system's trust store (MSK's certificates chain to public roots).",
    )
    kafka_iam_region: str | None = Field(
        None,
        description="AWS region of the MSK cluster for IAM tokens; unset: AWS_REGION (set by ECS).",
    )

    # --- MQTT ------------------------------------------------------------------------------
    max_packet_size: int = Field(
        1024 * 1024,
        ge=64,
        le=268_435_460,
        description="Largest MQTT control packet accepted or sent, in bytes (MQTT 3.2.2.3.6).",
    )
    server_keep_alive: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="If set, the v5 Server Keep Alive returned in CONNACK (seconds).",
    )
    max_keep_alive: int = Field(
        65535, ge=0, le=65535, description="Largest keep alive a client may ask for (seconds)."
    )
    receive_maximum: int = Field(
        100, ge=1, le=65535, description="Inbound QoS 1/2 PUBLISHes in flight per client."
    )
    topic_alias_maximum: int = Field(
        10,
        ge=0,
        le=65535,
        description="Topic Alias Maximum advertised in CONNACK: aliases a v5 client may set "
        "(MQTT 5.0 3.2.2.3.8); 0 turns Topic Aliases off.",
    )
    assign_topic_aliases: bool = Field(
        True,
        description="Send PUBLISHes to v5 clients whose CONNECT allows it (Topic Alias Maximum "
        "> 0) with server-assigned Topic Aliases: the Topic Name once, then only the alias "
        "(MQTT 5.0 3.3.2.3.4); the least recently used alias is reassigned when the client's "
        "maximum is reached.",
    )
    connect_timeout_seconds: float = Field(
        10.0, gt=0, description="A socket must send CONNECT within this many seconds."
    )
    session_expiry_max_seconds: int | None = Field(
        None,
        ge=1,
        description="If set, a disconnected persistent session is deleted after at most this "
        "many seconds, whatever its Session Expiry Interval (v3.1.1 sessions never expire "
        "otherwise).",
    )

    # --- APPLICATION clients (app_delivery) -------------------------------------------
    application_client_ids: list[str] = Field(
        default_factory=list,
        description="Client Identifier patterns of APPLICATION clients, shell-style globs "
        "(fnmatch: * ? [seq]); every other client is a DEVICE. In the environment a JSON "
        'list: CORMORANT_APPLICATION_CLIENT_IDS=\'["app-*", "analytics"]\'.',
    )
    app_topic_partitions: int = Field(
        1,
        ge=1,
        le=64,
        description="Partitions of each msg.app.<client_id> topic (created at the client's "
        "first connect; changing it later does not touch existing topics).",
    )
    app_shared_topic_partitions: int = Field(
        12,
        ge=1,
        le=64,
        description="Partitions of each msg.app-shared.<group> topic: Kafka spreads them over "
        "the group's APPLICATION members, so more members than partitions leaves some idle.",
    )
    app_retention_seconds: int = Field(
        7 * 24 * 3600,
        ge=60,
        description="retention.ms (as seconds) of the msg.app.* topics: how long an offline "
        "APPLICATION client's messages wait for it.",
    )
    app_inflight_max: int = Field(
        1000,
        ge=1,
        le=16384,
        description="Deliveries in flight (sent, not yet acknowledged) per APPLICATION client, "
        "within its Receive Maximum.",
    )

    # --- device_persist ----------------------------------------------------------------
    persisted_inflight_max: int = Field(
        256,
        ge=1,
        le=65535,
        description="Stored messages in flight (sent, not yet acknowledged) per persistent "
        "DEVICE client, within its Receive Maximum.",
    )
    session_expiry_check_seconds: float = Field(
        5.0, gt=0, description="How often device_persist looks for expired sessions."
    )

    # --- ingest ----------------------------------------------------------------------------
    node_id: str = Field("node1", pattern=r"^[A-Za-z0-9_-]{1,64}$", description="Ingest node id.")
    mqtt_host: str = Field("127.0.0.1", description="Address the ingest MQTT listener binds.")
    mqtt_port: int = Field(1884, ge=0, le=65535, description="Port of the ingest MQTT listener.")
    ready_file: Path | None = Field(
        None,
        description="A service writes this file once it serves (Kafka reached, state restored) "
        "and removes it on shutdown; the local cluster launcher waits on it.",
    )

    # --- every service ---------------------------------------------------------------------
    state_dir: Path = Field(
        default_factory=_default_state_dir,
        description="Data directory: each service's Faust data dir, and the local cluster's "
        "data, logs and pid files ($XDG_STATE_HOME/cormorant).",
    )
    log_level: str = Field("INFO", description="Python logging level of the services.")

    # --- device_persist store --------------------------------------------------------------
    store_backend: Literal["redis", "postgres"] = Field(
        "redis",
        description="Where stored messages of persistent DEVICE sessions live: redis or postgres.",
    )
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0", description="Redis of the message store (redis://host:port/db)."
    )
    redis_key_prefix: str = Field(
        "cormorant:",
        pattern=r"^[^{}]*$",
        description="Prefix of every Redis key of the message store; no braces (hash tags).",
    )
    redis_password: SecretStr | None = Field(
        None,
        description="Redis AUTH password (ElastiCache's auth token; ECS fills it from "
        "Secrets Manager). Use a rediss:// redis_url for TLS.",
    )
    redis_ssl_cafile: Path | None = Field(
        None,
        description="CA bundle (PEM) of a rediss:// server; unset: the system's trust store.",
    )
    redis_sentinels: list[str] = Field(
        default_factory=list,
        description="host:port of Redis Sentinels: when set, the store asks them for the "
        "current primary of redis_sentinel_master (and follows it after a failover) instead "
        "of redis_url's host and port (its database, TLS and user still apply). In the "
        "environment a JSON list: CORMORANT_REDIS_SENTINELS='[\"10.0.0.5:26379\"]'.",
    )
    redis_sentinel_master: str = Field(
        "cormorant", description="The master name the Sentinels monitor (redis_sentinels)."
    )
    redis_wait_replicas: int = Field(
        0,
        ge=0,
        le=16,
        description="Replicas that must have each write of the Redis store (Redis WAIT) "
        "before it counts as done, so device_persist never commits the Kafka offset of a "
        "record whose store write a failover could drop; 0: do not wait (no replica). A "
        "write that fewer replicas confirm within half of store_timeout_seconds fails as "
        "unavailable and its records are read again.",
    )
    postgres_dsn: str = Field(
        "postgresql://cormorant@127.0.0.1:5432/cormorant",
        description="PostgreSQL of the message store (libpq connection URL).",
    )
    postgres_password: SecretStr | None = Field(
        None,
        description="PostgreSQL password (RDS's managed password; ECS fills it from "
        "Secrets Manager).",
    )
    postgres_sslmode: Literal[
        "disable", "allow", "prefer", "require", "verify-ca", "verify-full"
    ] = Field(
        "prefer",
        description="libpq sslmode of PostgreSQL connections; verify-full checks the "
        "server's certificate and host name against postgres_sslrootcert.",
    )
    postgres_sslrootcert: Path | None = Field(
        None,
        description="CA bundle (PEM) for verify-ca/verify-full: the RDS bundle in the "
        "images (/etc/ssl/certs/rds-global-bundle.pem).",
    )
    persisted_max_messages: int = Field(
        10_000,
        ge=1,
        lt=65535,
        description="Stored messages per client; the oldest is dropped past it (< 65535, "
        "the number of Packet Identifiers).",
    )
    persisted_default_ttl_seconds: int = Field(
        7 * 24 * 3600,
        ge=1,
        description="Lifetime of a stored message without a Message Expiry Interval (seconds).",
    )
    store_timeout_seconds: float = Field(
        5.0, gt=0, description="How long one message store operation may take (seconds)."
    )


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """Return the process-wide :class:`Settings`, read once from environment and file."""
    return Settings()
