"""Cormorant's settings: one typed object, read from the environment and an optional file.

Every setting can be given as an environment variable ``CORMORANT_<NAME>`` (for example
``CORMORANT_KAFKA_BOOTSTRAP=10.0.0.5:9092``) or in a dotenv-style file named by
``CORMORANT_SETTINGS_FILE`` (default ``cormorant.env`` in the working directory, if present).
Environment variables win over the file. Durations are in seconds, sizes in bytes.
"""

from __future__ import annotations

import ipaddress
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from services.common.auth.authorize import parse_rules
from services.common.auth.passwords import MIN_PASSWORD_LENGTH

KafkaSecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_SSL"]
"""Kafka's ``security.protocol`` values Cormorant's clients speak (services' aiokafka
clients: :mod:`services.common.kafka.security`; the Spark jobs: :mod:`spark_emr.kafka_options`)."""

KafkaSaslMechanism = Literal["SCRAM-SHA-512", "OAUTHBEARER"]
"""SASL mechanisms with ``SASL_SSL``: SCRAM-SHA-512 (MSK port 9096) or OAUTHBEARER (MSK IAM,
port 9098)."""

KafkaFlavor = Literal["apache", "msk-serverless"]
"""Which Kafka the topics are created on: Apache Kafka (and MSK provisioned), which accepts
every topic-level config, or MSK Serverless, which accepts only a few
(:data:`services.common.kafka.admin.MSK_SERVERLESS_TOPIC_CONFIGS`)."""


ListenerKind = Literal["mqtt", "mqtts", "ws", "wss"]
"""What an ingest listener speaks: MQTT over TCP, over TLS, over WebSocket (``/mqtt``), over
WebSocket on TLS."""

TlsClientAuth = Literal["none", "optional", "required"]
"""Client certificates on the TLS listeners: not asked for, verified when sent, or required."""


PRIVATE_NETWORKS = (
    "127.0.0.0/8",
    "::1/128",
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "fc00::/7",
)
"""Where load balancers live by default: loopback and the private ranges (RFC 1918, RFC
4193). A listener's ``proxy_trusted_cidrs`` default."""


class Listener(BaseModel):
    """One more MQTT listener of an ingest node (besides ``mqtt_port``), on ``mqtt_host``.

    ``kind``: :data:`ListenerKind`; ``port``: its TCP port; ``proxy_protocol``: every
    connection must start with a PROXY protocol header (v1 or v2) naming the client's
    address, as a load balancer sends it (HAProxy ``send-proxy-v2``, an NLB target group's
    ``proxy_protocol_v2``); one without it is closed. ``proxy_trusted_cidrs``: the networks
    a PROXY header is taken from (the load balancers'); a connection from anywhere else is
    closed before a byte is read, so nobody outside them can claim another address
    (default: loopback and the private ranges, :data:`PRIVATE_NETWORKS`).
    ``allowed_origins`` (ws, wss): the ``Origin`` values a WebSocket upgrade may carry
    (``https://console.example.com``); a browser page from any other origin gets HTTP 403.
    Clients that send no ``Origin`` (devices, non-browser libraries) are not concerned.
    Empty: every origin.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: ListenerKind
    port: int = Field(ge=0, le=65535)
    proxy_protocol: bool = False
    proxy_trusted_cidrs: tuple[str, ...] = PRIVATE_NETWORKS
    allowed_origins: tuple[str, ...] = ()

    @field_validator("proxy_trusted_cidrs")
    @classmethod
    def _networks(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for cidr in value:
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError as exc:
                message = f"proxy_trusted_cidrs: {cidr!r} is not a CIDR network ({exc})"
                raise ValueError(message) from None
        return value

    @field_validator("allowed_origins")
    @classmethod
    def _origins(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for origin in value:
            if not re.fullmatch(r"(https?)://[^/\s?#]+", origin):
                raise ValueError(
                    f"allowed_origins: {origin!r} is not an origin (scheme://host[:port], "
                    "no path: what a browser sends in Origin)"
                )
        return value

    @model_validator(mode="after")
    def _websocket_only(self) -> Listener:
        if self.allowed_origins and not self.websocket:
            raise ValueError("allowed_origins applies to WebSocket listeners (ws, wss) only")
        return self

    def proxy_trusted(self, host: str) -> bool:
        """Whether a PROXY header may come from peer IP address ``host`` (an IPv4-mapped
        IPv6 address counts as its IPv4 one); False for anything not an IP address."""
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return any(ip in ipaddress.ip_network(c, strict=False) for c in self.proxy_trusted_cidrs)

    @property
    def tls(self) -> bool:
        """Whether the listener speaks TLS (mqtts, wss)."""
        return self.kind in ("mqtts", "wss")

    @property
    def websocket(self) -> bool:
        """Whether MQTT travels in WebSocket frames (ws, wss)."""
        return self.kind in ("ws", "wss")


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
        False,
        description="Route msg.all in Kafka transactions, one per msg.all partition per "
        "batch. Off (the default), the router commits its offsets after what it wrote is "
        "stored, and the readers of what it writes drop the copies a crashed router routes "
        "again (by their msg.all origin), so each message is still stored and delivered "
        "once through a router crash, without a transaction's round trips "
        "(docs/performance.md). On: what a crashed router wrote is never read; kept to "
        'measure the two against each other (bench/README.md, "The transactional '
        "router's cost\").",
    )
    consumer_session_timeout_seconds: float = Field(
        6.0,
        ge=1,
        description="Consumer group session timeout of the stages (router, device_persist, "
        "app_delivery, the ingest nodes' owners of Will Messages and delayed publications): "
        "a member silent this long "
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
    kafka_flavor: KafkaFlavor = Field(
        "apache",
        description="The Kafka the topics are created on: apache (Apache Kafka, MSK "
        "provisioned) or msk-serverless, which refuses every topic-level config but seven "
        "(the compacted topics then go without segment.ms and compact on MSK's own schedule).",
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

    # --- authentication and authorization (services/common/auth) ----------------------
    allow_anonymous: bool = Field(
        False,
        description="Let clients that present no User Name, Password or client certificate "
        "(and whose client id has no credential) connect, with anonymous_rules. Off by "
        "default; the local cluster turns it on for its loopback listener.",
    )
    anonymous_rules: list[str] = Field(
        default_factory=list,
        description="Authorization rules of anonymous clients, in order, as a JSON list of "
        "'<allow|deny> <publish|subscribe|all> <topic filter>': "
        'CORMORANT_ANONYMOUS_RULES=\'["deny subscribe admin/#", "allow all #"]\'. Empty: '
        "nothing allowed (rules are deny by default; the local cluster gives its anonymous "
        "clients 'allow all #' when this is empty).",
    )
    credential_password_min_length: int = Field(
        MIN_PASSWORD_LENGTH,
        ge=1,
        le=1024,
        description="The shortest password (in characters) cormorant credentials add/update "
        "and the admin API accept for an MQTT_BASIC or SCRAM credential.",
    )
    auth_hash_workers: int = Field(
        1,
        ge=1,
        le=64,
        description="Threads of an ingest node that verify passwords (argon2id, about 20 ms "
        "of a core each), beside the event loop.",
    )
    auth_max_pending: int = Field(
        1000,
        ge=1,
        description="Password checks that may wait for those threads; past it a CONNECT is "
        "refused with Server busy (v5 0x89, v3.1.1 return code 3), so a storm of wrong "
        "passwords queues in bounded memory.",
    )

    auth_verified_cache_entries: int = Field(
        100_000,
        ge=0,
        description="MQTT_BASIC passwords an ingest node remembers having verified (one per "
        "credential, least recently used dropped first), so a client connecting again skips "
        "argon2id: kept as an HMAC-SHA-256 under a per-process random key, never in clear, "
        "forgotten when the credential changes. 0: every CONNECT verifies.",
    )
    auth_verified_cache_seconds: float = Field(
        900.0,
        ge=0,
        description="How long after its argon2id verification a remembered password may "
        "match (seconds; 0: none is remembered).",
    )

    auth_max_pending_per_address: int = Field(
        8,
        ge=1,
        description="Of auth_max_pending, the password checks one source address may have "
        "waiting or running; past it that address's CONNECT is refused with Connection rate "
        "exceeded (v5 0x9F, v3.1.1 return code 3), so a storm of wrong passwords from one "
        "address cannot make other clients get Server busy.",
    )
    auth_failure_window_seconds: float = Field(
        300.0,
        gt=0,
        description="The sliding window in which an ingest node counts the authentication "
        "failures (wrong password, unknown user name, bad token or SCRAM proof) of each source "
        "address and of each User Name (seconds).",
    )
    auth_failure_delay_after: int = Field(
        3,
        ge=0,
        description="Failures of an address or User Name in the window after which each new "
        "CONNECT of it is answered only after a delay: auth_failure_delay_seconds, doubled "
        "for each further failure, at most auth_failure_max_delay_seconds.",
    )
    auth_failure_delay_seconds: float = Field(
        0.25, ge=0, description="The first delay of a throttled CONNECT (seconds)."
    )
    auth_failure_max_delay_seconds: float = Field(
        4.0, ge=0, description="The longest delay of a throttled CONNECT (seconds)."
    )
    auth_failure_limit: int = Field(
        20,
        ge=1,
        description="Failures of an address or User Name in the window after which its "
        "CONNECTs are refused without checking anything, with Connection rate exceeded (v5 "
        "0x9F, v3.1.1 return code 3), until older failures leave the window.",
    )
    auth_failure_ban_after: int = Field(
        100,
        ge=1,
        description="Failures of a source address in the window after which it is banned "
        "for auth_failure_ban_seconds: its CONNECTs get Banned (v5 0x8A, v3.1.1 return code "
        "5).",
    )
    auth_failure_ban_seconds: float = Field(
        900.0, gt=0, description="How long a banned source address stays banned (seconds)."
    )

    jwt_jwks_refresh_seconds: float = Field(
        300.0,
        gt=0,
        description="How long the key set of a JWT credential's JWKS URL is used before it "
        "is fetched again (seconds); also the least time between two fetches caused by a "
        "token whose 'kid' the set lacks, so made-up kids cannot make a node hammer the "
        "issuer (a newly rotated key may wait this long).",
    )
    jwt_jwks_ca_file: str | None = Field(
        None,
        description="PEM file of CAs a JWKS server's certificate may chain to, besides the "
        "system's (for an issuer under a private CA). `cormorant up` sets it to the local "
        "cluster's CA.",
    )
    scram_unknown_user_key: SecretStr | None = Field(
        None,
        description="A secret every ingest node shares (32 random bytes or more, e.g. "
        "`openssl rand -base64 32`): the SCRAM salt of a user name without a SCRAM "
        "credential is an HMAC of the name under it, so every node answers it alike, every "
        "time, as for a real user. Unset: each node draws its own (logged as a warning), "
        "and comparing two nodes' answers tells which user names exist; `cormorant up` "
        "makes one once into `<state_dir>/scram_unknown_user_key` (mode 600) for the "
        "local cluster's nodes.",
        min_length=32,
    )
    auth_failure_exempt_networks: list[str] = Field(
        default_factory=list,
        description="Source networks (CIDR, as a JSON list: '[\"10.1.2.0/24\"]') whose "
        "addresses are never delayed, refused or banned for authentication failures (their "
        "User Names still are): monitoring probes, a test harness. Empty by default.",
    )

    auth_http_url: str | None = Field(
        None,
        pattern=r"^https?://",
        description="The HTTP authentication provider: a URL every ingest node POSTs each "
        "CONNECT's Client Identifier, User Name, Password (or client certificate "
        "fingerprint) and source address to, as JSON, before the stored credentials; its "
        "allow or deny answer, with the client's kind and rules, is final "
        "(docs/security/http-authentication.md). Unset: no provider.",
    )
    auth_http_secret: SecretStr | None = Field(
        None,
        min_length=32,
        description="The key the requests to auth_http_url are signed with (HMAC-SHA-256 of "
        "'<timestamp>.<body>' in X-Cormorant-Signature), so the endpoint can trust they "
        "come from the broker; 32 characters or more (openssl rand -base64 32). Required "
        "with auth_http_url.",
    )
    auth_http_timeout_seconds: float = Field(
        2.0, gt=0, description="How long a CONNECT waits for the HTTP provider (seconds)."
    )
    auth_http_failure_policy: Literal["deny", "fall_through"] = Field(
        "deny",
        description="When the HTTP provider does not answer (timeout, unreachable, a status "
        "other than 200): deny (CONNACK 0x88 Server unavailable) or fall_through to the "
        "stored credentials.",
    )
    auth_http_allow_cache_seconds: float = Field(
        60.0,
        ge=0,
        description="How long a node reuses the HTTP provider's allow for the same Client "
        "Identifier, User Name, Password, certificate and address (seconds; 0: ask each "
        "time). The cache is keyed by a keyed hash, never the password.",
    )
    auth_http_deny_cache_seconds: float = Field(
        5.0,
        ge=0,
        description="How long a node reuses the HTTP provider's deny (seconds; 0: ask each time).",
    )
    auth_http_tls_verify: bool = Field(
        True,
        description="Verify the HTTP provider's TLS certificate (https URLs). Turning it "
        "off lets anyone on the path answer allow: for a test bench only.",
    )
    auth_http_ca_file: Path | None = Field(
        None,
        description="PEM file of CAs the HTTP provider's certificate may chain to, besides "
        "the system's.",
    )

    @model_validator(mode="after")
    def _check_http_provider(self) -> Settings:
        """An HTTP provider signs its requests: its URL needs a secret."""
        if self.auth_http_url is not None and self.auth_http_secret is None:
            raise ValueError("auth_http_url needs auth_http_secret (the requests' HMAC key)")
        return self

    @field_validator("auth_failure_exempt_networks")
    @classmethod
    def _valid_networks(cls, networks: list[str]) -> list[str]:
        for network in networks:
            ipaddress.ip_network(network)  # ValueError: pydantic reports it with the field
        return networks

    @field_validator("anonymous_rules")
    @classmethod
    def _valid_rules(cls, rules: list[str]) -> list[str]:
        parse_rules(rules)  # RuleError is a ValueError: pydantic reports it with the field
        return rules

    # --- APPLICATION clients (app_delivery) -------------------------------------------
    application_client_ids: list[str] = Field(
        default_factory=list,
        description="Client Identifier patterns of APPLICATION clients, shell-style globs "
        "(fnmatch: * ? [seq]): the kind of anonymous clients (an authenticated client's "
        "comes from its credential); every other anonymous client is a DEVICE. In the "
        'environment a JSON list: CORMORANT_APPLICATION_CLIENT_IDS=\'["app-*", "analytics"]\'.',
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
    app_client_lag_top: int = Field(
        20,
        ge=0,
        le=1000,
        description="APPLICATION clients an app_delivery instance reports by Client Identifier "
        "in cormorant_app_client_lag_records: the ones furthest behind; the others' lag is "
        "summed into cormorant_app_client_lag_other_records, so the series stay bounded.",
    )

    # --- device_persist ----------------------------------------------------------------
    persisted_inflight_max: int = Field(
        2048,
        ge=1,
        le=65535,
        description="Stored messages in flight (sent, not yet acknowledged) per persistent "
        "DEVICE client, within its Receive Maximum. A backlog (after an outage) drains at "
        "most this many per acknowledgement round trip (three Kafka hops): at 256 a backlog "
        "behind a 500 msg/s publisher never drained on the production layout and grew until "
        "persisted_max_messages dropped its oldest (docs/guarantees/production-failover.md).",
    )
    session_expiry_check_seconds: float = Field(
        5.0, gt=0, description="How often device_persist looks for expired sessions."
    )

    # --- ingest ----------------------------------------------------------------------------
    node_id: str = Field("node1", pattern=r"^[A-Za-z0-9_-]{1,64}$", description="Ingest node id.")
    ingest_node_pool_size: int = Field(
        16,
        ge=1,
        le=999,
        description="Node ids an autoscaled ingest task (cormorant ingest --node-id-from-pool) "
        "may claim: ingest-1 ... ingest-<size>, leased in PostgreSQL. Each names a downlink "
        "topic, so this bounds their number; at least twice the ingest service's maximum "
        "task count (a rolling deploy runs both generations at once).",
    )
    ingest_node_lease_seconds: float = Field(
        30.0,
        ge=3.0,
        le=600.0,
        description="How long a pooled node id's lease lasts without renewal (renewed every "
        "third of it): a dead task's id comes free after at most this; a node that cannot "
        "renew it (PostgreSQL unreachable) stops before it runs out.",
    )
    mqtt_host: str = Field("127.0.0.1", description="Address the ingest MQTT listener binds.")
    mqtt_port: int = Field(1884, ge=0, le=65535, description="Port of the ingest MQTT listener.")
    listeners: list[Listener] = Field(
        default_factory=list,
        description="More listeners besides mqtt_port (which is plain MQTT over TCP without "
        "PROXY protocol), as a JSON list of {kind: mqtt|mqtts|ws|wss, port, proxy_protocol, "
        "proxy_trusted_cidrs, allowed_origins}: "
        'CORMORANT_LISTENERS=\'[{"kind": "mqtts", "port": 8883, "proxy_protocol": true, '
        '"proxy_trusted_cidrs": ["10.40.0.0/16"]}, {"kind": "ws", "port": 8083, '
        '"allowed_origins": ["https://console.example.com"]}]\'. mqtts and wss need the TLS '
        "certificate; ws and wss serve MQTT over WebSocket on /mqtt (subprotocol mqtt). A "
        "PROXY header is taken only from proxy_trusted_cidrs (default: loopback and the "
        "private ranges); a WebSocket upgrade whose Origin is not in allowed_origins (when "
        "set) gets HTTP 403.",
    )
    tls_cert_file: Path | None = Field(
        None,
        description="Server certificate chain (PEM) of the TLS listeners (mqtts, wss); "
        "re-read with tls_key_file on SIGHUP (new connections get it, open ones keep theirs).",
    )
    tls_key_file: Path | None = Field(
        None, description="Private key (PEM, unencrypted) of tls_cert_file."
    )
    tls_cert_pem: str | None = Field(
        None,
        description="The server certificate chain itself (PEM text), instead of "
        "tls_cert_file: how ECS hands it over from Secrets Manager.",
    )
    tls_key_pem: SecretStr | None = Field(
        None, description="The private key itself (PEM text), instead of tls_key_file."
    )
    tls_client_auth: TlsClientAuth = Field(
        "none",
        description="Client certificates (mutual TLS): none; optional (verified when the "
        "client sends one); required (a connection without a valid one fails its TLS "
        "handshake). Verified against tls_client_ca_file / tls_client_ca_pem.",
    )
    tls_client_ca_file: Path | None = Field(
        None, description="CA bundle (PEM) that signs the client certificates accepted."
    )
    tls_client_ca_pem: str | None = Field(
        None, description="The client CA bundle itself (PEM text), instead of the file."
    )
    close_grace_seconds: float = Field(
        1.0,
        ge=0,
        le=30,
        description="After the server sends DISCONNECT or a refusing CONNACK it writes no "
        "more, reads and discards what the client still sends for at most this long, then "
        "closes: the client reads the Reason Code instead of a connection reset.",
    )
    drain_notice_seconds: float = Field(
        10.0,
        ge=0,
        le=60,
        description="When an ingest node drains (SIGTERM, `cormorant drain`), its /ready fails "
        "and it stops accepting at once, then waits this long before it disconnects its first "
        "client, so that the load balancer has taken it out of rotation and sends the "
        "reconnects to the other nodes (docs/operations/drain.md). Skipped when the node has "
        "no client.",
    )
    drain_rate: float = Field(
        200.0,
        gt=0,
        description="Clients per second a draining ingest node disconnects (at least): the "
        "reconnect rate it adds to the other nodes. Pick what they take (CONNECT verification "
        "included); a node with more clients than drain_rate x drain_seconds goes faster, so "
        "that it finishes within drain_seconds.",
    )
    drain_seconds: float = Field(
        60.0,
        ge=0,
        le=600,
        description="The longest a draining ingest node takes to disconnect its clients, after "
        "drain_notice_seconds (0: all at once). In AWS, ECS's stopTimeout for the ingest task "
        "is derived from it (infra/), and Fargate allows at most 120 s in all.",
    )

    # --- ingest limits (refusals are counted, and logged once per client per minute) ----------
    max_connections: int = Field(
        100_000,
        ge=1,
        description="Open MQTT connections per ingest node; beyond it a CONNECT is refused: "
        "v5 CONNACK 0x97 Quota exceeded, v3.1.1 0x03 Server unavailable.",
    )
    max_connection_rate: float = Field(
        1000.0,
        ge=0,
        description="New connections per second per ingest node (a token bucket holding one "
        "second's worth); beyond it: CONNACK 0x9F Connection rate exceeded (v3.1.1: 0x03). "
        "0: no limit.",
    )
    flapping_max_connects: int = Field(
        0,
        ge=0,
        description="Flapping detection: a Client Identifier that connects more than this "
        "many times within flapping_window_seconds (counted per ingest node) is blocked "
        "for flapping_block_seconds on every node (a block with reason 'flapping', listed "
        "by `cormorant blocked list`). 0: off (the default).",
    )
    flapping_window_seconds: float = Field(
        60.0, gt=0, description="Flapping detection's window (seconds)."
    )
    flapping_block_seconds: float = Field(
        300.0, gt=0, description="How long flapping detection blocks a client id (seconds)."
    )
    max_connection_rate_per_address: float = Field(
        500.0,
        ge=0,
        description="New connections per second per client IP address (from the PROXY "
        "header behind a load balancer), per ingest node; beyond it: CONNACK 0x9F (v3.1.1: "
        "0x03). Devices behind one NAT share an address: keep it well above their "
        "reconnect rate. 0: no limit.",
    )
    client_max_messages_per_second: float = Field(
        5000.0,
        ge=0,
        description="Inbound PUBLISH packets per second per client (a token bucket holding "
        "one second's worth); beyond it the node stops reading from that client until the "
        "bucket refills (TCP backpressure, as TBMQ does: nothing is lost). 0: no limit.",
    )
    client_max_bytes_per_second: float = Field(
        8 * 1024 * 1024,
        ge=0,
        description="Inbound bytes per second per client (MQTT bytes, as read); beyond it "
        "reading from that client pauses likewise. 0: no limit.",
    )
    max_inflight_qos2: int = Field(
        1000,
        ge=1,
        le=65535,
        description="Inbound QoS 2 messages per client not yet released (PUBREL), stored ones "
        "included; a QoS 2 PUBLISH beyond it is refused: v5 PUBREC 0x97 Quota exceeded, "
        "v3.1.1 the connection is closed (no negative acknowledgement). v5 clients are "
        "bounded by receive_maximum first.",
    )
    max_delay_seconds: int = Field(
        4_294_967,
        ge=0,
        le=4_294_967,
        description="The longest delay of a delayed publication (PUBLISH to "
        "$delayed/<seconds>/<topic>, seconds; EMQX's maximum, about 49.7 days, by "
        "default). A longer one is refused: v5 PUBACK/PUBREC 0x90 Topic Name invalid, "
        "v3.1.1 acknowledged and dropped (logged). 0: only $delayed/0/<topic>, published "
        "at once.",
    )
    max_delayed_messages: int = Field(
        100_000,
        ge=0,
        description="Delayed publications ($delayed/<seconds>/<topic>) waiting in the whole "
        "cluster. Whole-cluster rather than per node: the msg.delayed partitions, and the "
        "messages waiting in them (payloads included, in memory), move between the ingest "
        "nodes, and a single surviving node holds them all: size it for one node's memory "
        "(docs/concepts/delayed-publish.md). A delayed PUBLISH beyond it is refused: v5 PUBACK / "
        "PUBREC 0x97 Quota exceeded; v3.1.1 QoS 1/2 the connection is closed, unacknowledged "
        "(the client publishes it again later); QoS 0 dropped; each counted in "
        'cormorant_mqtt_refusals_total{limit="delayed_messages"} and logged. 0: only '
        "$delayed/0/<topic>, published at once.",
    )
    max_delayed_messages_per_client: int = Field(
        1000,
        ge=0,
        description="Delayed publications one publisher (Client Identifier) may have waiting; "
        "beyond it a delayed PUBLISH is refused as over max_delayed_messages, so that one "
        "client cannot take the whole cluster's quota.",
    )
    delayed_cancel_timeout_seconds: float = Field(
        10.0,
        gt=0,
        le=300,
        description="How long DELETE /api/delayed/{id} (cormorant delayed cancel) waits for the "
        "ingest node holding the message to decide between its cancel and its publication; "
        "past it the answer is 504 and the cancel request stays queued for that node.",
    )
    max_subscriptions: int = Field(
        1000,
        ge=1,
        description="Subscriptions per client (its whole set is one client.subscriptions "
        "record); a new Topic Filter beyond it gets SUBACK 0x97 Quota exceeded (v3.1.1: "
        "0x80 Failure).",
    )
    max_topic_levels: int = Field(
        32,
        ge=1,
        le=65535,
        description="Topic levels of a Topic Filter in SUBSCRIBE; a deeper one gets SUBACK "
        "0x97 Quota exceeded (v3.1.1: 0x80 Failure).",
    )
    max_replay_age_seconds: int = Field(
        30 * 24 * 3600,
        ge=1,
        description="How far back a replay subscription ($replay/<since>/<filter>, "
        "docs/concepts/replay.md) may start; an older <since> gets SUBACK 0x97 Quota "
        "exceeded (v3.1.1: 0x80 Failure). A <since> within it but older than "
        "msg_retention_seconds starts at the oldest message msg.all still keeps (v5: the "
        "SUBACK's Reason String says so).",
    )
    max_replay_messages: int = Field(
        1_000_000,
        ge=1,
        description="msg.all records one replay subscription reads at most (over all "
        "partitions): a longer history is truncated at its old end, each partition keeping "
        "its share of the newest records before the switch to live messages, so the replay "
        "still meets the live stream with no gap (docs/concepts/replay.md).",
    )
    replay_max_messages_per_second: float = Field(
        500.0,
        gt=0,
        description="Messages one replay hands its client per second at most: what a replay "
        "may take of its ingest node and Kafka, beside the node's live deliveries. 500 keeps "
        "other clients' live p99 within 10 % on a 2-core node (1,000 raised it 30 %, 2,000 "
        '49 %: docs/performance.md, "Replay subscriptions"); raise it with the cores.',
    )
    max_concurrent_replays: int = Field(
        4,
        ge=1,
        description="Replays an ingest node reads at once; more wait their turn (their live "
        "messages held meanwhile), so replays cannot crowd out the node's live delivery.",
    )
    ready_file: Path | None = Field(
        None,
        description="A service writes this file once it serves (Kafka reached, state restored) "
        "and removes it on shutdown; the local cluster launcher waits on it.",
    )

    # --- integrations stage ----------------------------------------------------------------
    integrations_commit_delay_seconds: float = Field(
        0.0,
        ge=0,
        le=60,
        description="For tests only: the integrations stage holds each sink transaction "
        "open this long after its records were acknowledged, before committing it, so that "
        "a test can kill the stage between produce and commit (0: no delay; "
        "docs/integrations/kafka.md).",
    )
    integrations_dead_letter_retention_seconds: int = Field(
        14 * 24 * 3600,
        ge=3600,
        description="retention.ms (as seconds) of integrations.dead-letter: the messages a "
        "webhook gave up on after its attempts, kept to be looked at and sent again "
        "(docs/integrations/webhook.md).",
    )

    # --- delayed publish, for tests --------------------------------------------------------
    delayed_hold_topic_prefix: str = Field(
        "",
        description="For tests only: the ingest node publishing a due delayed message whose "
        "target topic starts with this prefix holds its transaction open "
        "delayed_hold_seconds before committing it, so that a test can cancel it while its "
        'publication is under way ("": none is held; docs/concepts/delayed-publish.md).',
    )
    delayed_hold_seconds: float = Field(
        0.0,
        ge=0,
        le=20,
        description="For tests only: how long such a publication is held (seconds).",
    )

    integrations_mqtt_host: str = Field(
        "127.0.0.1",
        description="Where the MQTT bridges' reverse directions publish the remote brokers' "
        "messages: this broker's plain MQTT address without PROXY protocol, host name or IP "
        "address (the local cluster: HAProxy; the AWS stack: the ingest tasks' direct "
        "listener, ingest.<namespace>:1884) (docs/integrations/mqtt-bridge.md).",
    )
    integrations_mqtt_port: int = Field(
        1883,
        ge=1,
        le=65535,
        description="The port of integrations_mqtt_host (the local cluster sets HAProxy's).",
    )
    integrations_mqtt_reverse: bool = Field(
        True,
        description="Whether this integrations-stage instance runs the MQTT bridges' reverse "
        "directions. Run them in exactly one instance: each holds the bridge's session on "
        "the remote broker, which another instance would take over.",
    )

    # --- every service ---------------------------------------------------------------------
    http_host: str = Field(
        "127.0.0.1",
        description="Address a service's HTTP endpoints bind (/health, /ready, /metrics): "
        "loopback unless asked (0.0.0.0 in a container, where the load balancer and "
        "Prometheus reach it).",
    )
    http_port: int = Field(
        9180,
        ge=0,
        le=65535,
        description="Port of a service's HTTP endpoints (/health, /ready, /metrics); one "
        "per process (the local cluster gives each process its own).",
    )
    state_dir: Path = Field(
        default_factory=_default_state_dir,
        description="Data directory: each service's Faust data dir, and the local cluster's "
        "data, logs and pid files ($XDG_STATE_HOME/cormorant).",
    )
    log_level: str = Field("INFO", description="Python logging level of the services.")
    gc_gen0_threshold: int = Field(
        50_000,
        ge=700,
        le=10_000_000,
        description="Allocations of container objects between two young-generation garbage "
        "collections in each service process (CPython's default is 700): the services "
        "allocate a few dozen per message, and at the default a third of their CPU went to "
        "the collector (bench/NOTES.md, 2026-11-24).",
    )

    # --- admin (the operators' REST API and web console) -----------------------------------
    admin_host: str = Field(
        "127.0.0.1",
        description="Address the admin API and console bind: loopback unless asked (0.0.0.0 "
        "behind the deployment's internal load balancer).",
    )
    admin_port: int = Field(9170, ge=1, le=65535, description="Port of the admin API and console.")
    admin_token_ttl_seconds: int = Field(
        12 * 3600, ge=60, description="How long an admin user's bearer token is valid (seconds)."
    )
    admin_login_max_failures_per_address: int = Field(
        20,
        ge=1,
        description="Failed admin logins from one IP address within "
        "admin_login_window_seconds after which its logins get 429 Too Many Requests (with "
        "Retry-After) without a password check, until older failures leave the window.",
    )
    admin_login_max_failures_per_user: int = Field(
        5,
        ge=1,
        description="Failed logins of one admin user name within admin_login_window_seconds "
        "after which its logins get 429 Too Many Requests (with Retry-After), from any "
        "address; a successful login clears them.",
    )
    admin_login_window_seconds: float = Field(
        300.0, gt=0, description="The sliding window of failed admin logins (seconds)."
    )
    admin_hash_workers: int = Field(
        1,
        ge=1,
        le=16,
        description="Threads of the admin service that hash and verify admin passwords "
        "(argon2id), beside the event loop.",
    )
    admin_max_pending_hashes: int = Field(
        32,
        ge=1,
        description="Admin password checks that may wait for those threads; past it a login "
        "gets 503 with Retry-After; one address may hold at most a quarter of them (429).",
    )
    admin_password_time_cost: int = Field(
        3,
        ge=1,
        le=100,
        description="argon2id passes over memory for admin passwords (default: RFC 9106's "
        "second recommended set, t=3, m=64 MiB, p=4, argon2-cffi's default). New hashes and "
        "logins use it; a stored hash made with other parameters is rehashed at its user's "
        "next successful login. Lower only where the hashes protect nothing (the test "
        "suite's cluster).",
    )
    admin_password_memory_kib: int = Field(
        65_536,
        ge=8,
        le=4 * 1024 * 1024,
        description="argon2id memory for admin passwords, in KiB (default 65536 = 64 MiB; at "
        "least 8 per lane of admin_password_parallelism). Each check running in the "
        "admin_hash_workers threads holds this much.",
    )
    admin_password_parallelism: int = Field(
        4,
        ge=1,
        le=64,
        description="argon2id lanes of admin passwords (default 4).",
    )
    admin_bootstrap_user: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9._@-]{1,64}$",
        description="An admin user the admin service creates at start if it does not exist "
        "(with admin_bootstrap_password): the first login of a fresh deployment. An "
        "existing user is left as it is.",
    )
    admin_bootstrap_password: SecretStr | None = Field(
        None,
        description="admin_bootstrap_user's password (ECS fills it from the Secrets Manager "
        "secret the deployment generates).",
    )
    admin_console_ws_url: str | None = Field(
        None,
        pattern=r"^wss?://[^\s/?#]+(/[^\s?#]*)?$",
        description="The MQTT over WebSocket URL the console's WebSocket client connects to "
        "by default (ws://host:port/mqtt or wss://...), the only one besides the admin "
        "service itself that the console's Content-Security-Policy lets it connect to "
        "(connect-src). The local cluster sets HAProxy's ws listener; unset: the console "
        "has no WebSocket client target.",
    )
    admin_haproxy_stats_sockets: list[Path] = Field(
        default_factory=list,
        description="HAProxy stats sockets (Unix sockets) the admin service asks which "
        "ingest nodes are in rotation (show stat), for the console's infrastructure page; "
        "the local cluster sets its HAProxy processes'. Empty: no HAProxy (AWS: the NLB's "
        "target health).",
    )
    cluster_endpoints: dict[str, str] = Field(
        default_factory=dict,
        description="The admin service's view of the cluster: process name -> base URL of "
        'its HTTP endpoints, as a JSON object (\'{"router": "http://10.0.0.5:9180"}\'); '
        "the local cluster sets it.",
    )
    cluster_dns_namespace: str | None = Field(
        None,
        description="In AWS: the private DNS namespace where each service's tasks are "
        "registered (<service>.<namespace>, A records); the admin service finds them there, "
        "on http_port.",
    )

    # --- HTTP publish API (served by the admin service: services/admin/publish_api.py) ----
    http_publish_max_batch: int = Field(
        100,
        ge=1,
        le=10_000,
        description="Most messages one POST /api/v1/publish:batch may carry (more: 413).",
    )
    http_publish_max_body_bytes: int = Field(
        8 * 1024 * 1024,
        ge=1024,
        description="Largest request body of the HTTP publish API, in bytes (more: 413, "
        "read no further). Each message is bounded by max_packet_size as an MQTT PUBLISH "
        "is; this bounds a request's JSON (base64 and escapes make it larger than the "
        "payloads).",
    )
    http_publish_rate_per_key: float = Field(
        100.0,
        ge=0,
        description="Messages per second one API key or credential may publish over HTTP "
        "(a token bucket holding one second's worth, or a full batch if more); past it the "
        "request is refused with 429 and Retry-After. 0: no limit.",
    )

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
        description="PostgreSQL password, read once at start (the local cluster's; on AWS "
        "the services read postgres_password_secret_arn instead).",
    )
    postgres_password_secret_arn: str | None = Field(
        None,
        pattern=r"^arn:aws[a-z-]*:secretsmanager:",
        description="A Secrets Manager secret (JSON with password) the PostgreSQL password is "
        "read from for every new connection, so a rotated password is picked up without a "
        "restart (the task's role needs secretsmanager:GetSecretValue on it). Takes "
        "precedence over postgres_password.",
    )
    postgres_service_password_secret_arn: str | None = Field(
        None,
        pattern=r"^arn:aws[a-z-]*:secretsmanager:",
        description="For cormorant migrate-db only: the Secrets Manager secret (JSON with "
        "username and password) of the services' own PostgreSQL role, which the task "
        "creates or updates (it logs in as postgres_dsn's owner, on AWS the RDS master "
        "user); the services read it as their postgres_password_secret_arn.",
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

    @model_validator(mode="after")
    def _check_tls(self) -> Settings:
        """TLS settings that contradict each other, or a TLS listener without a certificate."""
        for name in ("cert", "key", "client_ca"):
            if getattr(self, f"tls_{name}_file") and getattr(self, f"tls_{name}_pem"):
                raise ValueError(f"set tls_{name}_file or tls_{name}_pem, not both")
        has_cert = bool(self.tls_cert_file or self.tls_cert_pem)
        if has_cert != bool(self.tls_key_file or self.tls_key_pem):
            raise ValueError("the TLS certificate and its key go together")
        if any(listener.tls for listener in self.listeners) and not has_cert:
            raise ValueError("an mqtts or wss listener needs tls_cert_file and tls_key_file")
        has_ca = bool(self.tls_client_ca_file or self.tls_client_ca_pem)
        if self.tls_client_auth != "none" and not has_ca:
            raise ValueError(f"tls_client_auth {self.tls_client_auth} needs tls_client_ca_file")
        ports = [self.mqtt_port, *(listener.port for listener in self.listeners)]
        taken = {port for port in ports if port and ports.count(port) > 1}
        if taken:
            raise ValueError(f"two listeners on port {min(taken)}")
        return self

    @model_validator(mode="after")
    def _check_admin_password_cost(self) -> Settings:
        """argon2 needs at least 8 KiB of memory per lane (RFC 9106 3.1)."""
        if self.admin_password_memory_kib < 8 * self.admin_password_parallelism:
            raise ValueError(
                "admin_password_memory_kib must be at least 8 per lane of "
                f"admin_password_parallelism ({8 * self.admin_password_parallelism})"
            )
        return self


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """Return the process-wide :class:`Settings`, read once from environment and file."""
    return Settings()
