"""The stack's configuration: every ``cormorant:*`` key, typed, with defaults and cross-checks.

A stack file (``Pulumi.<stack>.yaml``) sets the keys; :func:`load` reads them from Pulumi's
configuration and :class:`StackConfig` validates them before any resource is declared, so a
bad value stops ``pulumi preview``/``up`` with one clear message (:class:`ConfigError`)
instead of a half-applied stack. Keys are camelCase (``natGateways``); structured values
(``services``, ``allowedCidrs``) are YAML objects and lists in the stack file.
"""

from __future__ import annotations

import ipaddress
import json
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import pulumi
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from cormorant_infra import shared

NAMESPACE = "cormorant"
"""The configuration namespace of every key of this program (``cormorant:natGateways``)."""

NLB_TLS_IDLE_TIMEOUT_SECONDS = 350
"""The idle timeout of an NLB TLS listener: fixed by AWS (TCP listeners' is configurable)."""

CLOUDWATCH_RETENTION_DAYS = frozenset(
    {
        1,
        3,
        5,
        7,
        14,
        30,
        60,
        90,
        120,
        150,
        180,
        365,
        400,
        545,
        731,
        1096,
        1827,
        2192,
        2557,
        2922,
        3288,
        3653,
    }
)
"""The retention periods CloudWatch Logs accepts (PutRetentionPolicy)."""

FARGATE_CPU_MEMORY: dict[int, range] = {
    256: range(512, 2048 + 1, 512),
    512: range(1024, 4096 + 1, 1024),
    1024: range(2048, 8192 + 1, 1024),
    2048: range(4096, 16384 + 1, 1024),
    4096: range(8192, 30720 + 1, 1024),
}
"""Fargate's valid task sizes: CPU units → the memory sizes (MiB) allowed with it."""


CONSUMER_GROUP_PARTITIONS = {
    "router": "msg_all_partitions",
    "device-persist": "state_topic_partitions",
    "app-delivery": "state_topic_partitions",
    "integrations-stage": "msg_all_partitions",
}
"""The services whose tasks share topics' partitions in one consumer group → the setting
with that partition count (router and the integrations stage: msg.all; device_persist and
app_delivery: the topics keyed by client id)."""


IMAGE_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
"""An OCI content digest as ECR names images by it (``imageDigest``): SHA-256, lowercase hex."""

REMOVED_KEYS = {
    "image": "the stack makes its own image repository (output imageRepository) and runs "
    "the image by digest: set cormorant:imageDigest instead (docs/deploy.md)",
}
"""Keys of earlier releases → what replaced them (said instead of "extra inputs")."""


MAX_INTEGRATIONS_EGRESS = 40
"""Entries of ``integrationsEgress``: one egress rule each in the integrations stage's
security group, which also holds its own few rules, under the 60 outbound rules a security
group may have by default (VPC quotas, "Inbound or outbound rules per security group")."""

PREFIX_LIST_ID = re.compile(r"pl-[0-9a-f]{8,17}")
"""A managed prefix list's id (``pl-0123456789abcdef0``)."""

MSK_CLUSTER_ARN = re.compile(
    r"arn:aws[a-z-]*:kafka:[a-z]{2}(-[a-z]+)+-[0-9]{1,2}:[0-9]{12}:cluster/[A-Za-z0-9-]{1,64}/"
    r"[0-9a-z-]{1,80}"
)
"""An MSK cluster's ARN: ``arn:aws:kafka:<region>:<account>:cluster/<name>/<uuid>``."""

ROLE_ARN = re.compile(shared.AWS_ROLE_ARN_PATTERN.removeprefix("^").removesuffix("$"))
"""An IAM role's ARN, as a Kafka sink's ``aws_role_arn`` takes it."""


@dataclass(frozen=True)
class EgressRule:
    """One way out of the integrations stage (an ``integrationsEgress`` entry): TCP ports
    ``from_port`` to ``to_port`` of the IPv4 or IPv6 network ``cidr`` or the managed prefix
    list ``prefix_list_id`` (exactly one of them)."""

    cidr: str | None
    prefix_list_id: str | None
    from_port: int
    to_port: int


def parse_egress(entry: str) -> EgressRule:
    """An ``integrationsEgress`` entry, ``<CIDR or prefix list id>:<port>[-<port>]``
    (``203.0.113.0/24:9094``, ``10.60.0.0/16:9092-9098``, ``2001:db8::/48:443``,
    ``pl-0123456789abcdef0:443``), as an :class:`EgressRule`. Raises ``ValueError``
    saying what is wrong: no port, a port outside 1 to 65535 or a range backwards, a
    network with host bits set or not a network, a prefix list id malformed."""
    destination, colon, ports = entry.rpartition(":")
    if not colon or not destination:
        raise ValueError(
            f"{entry!r}: give a CIDR or prefix list id and a TCP port or range, like "
            "203.0.113.0/24:9094 or pl-0123456789abcdef0:9092-9098"
        )
    low, dash, high = ports.partition("-")
    if not (low.isdigit() and (not dash or high.isdigit())):
        raise ValueError(f"{entry!r}: {ports!r} is not a TCP port or range (9094, 9092-9098)")
    from_port, to_port = int(low), int(high) if dash else int(low)
    if not (1 <= from_port <= to_port <= 65535):
        raise ValueError(f"{entry!r}: ports are 1 to 65535, the lower first")
    if destination.startswith("pl-"):
        if not PREFIX_LIST_ID.fullmatch(destination):
            raise ValueError(f"{entry!r}: {destination!r} is not a prefix list id (pl-0123abcd)")
        return EgressRule(None, destination, from_port, to_port)
    try:
        network = ipaddress.ip_network(destination, strict=True)
    except ValueError as exc:
        raise ValueError(
            f"{entry!r}: {destination!r} is not a network in CIDR notation ({exc})"
        ) from None
    if "/" not in destination:
        raise ValueError(f"{entry!r}: give the network's prefix length ({network})")
    return EgressRule(str(network), None, from_port, to_port)


RFC_1918 = tuple(
    ipaddress.IPv4Network(block) for block in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")
)
"""The private IPv4 address ranges (RFC 1918): where operators and a Prometheus may be."""


class ConfigError(pulumi.RunError):
    """A configuration value is invalid; the message names each key and what is wrong.

    A :class:`pulumi.RunError`, so Pulumi prints the message without a traceback.
    """


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class ServiceSize(_Model):
    """One ECS service's task size and scaling range.

    ``cpu`` in Fargate CPU units (1024 = one vCPU), ``memory`` in MiB (a pair Fargate
    accepts), ``min_tasks``/``max_tasks`` the autoscaling range (min is also the count the
    service starts with).
    """

    cpu: int = 512
    memory: int = 1024
    min_tasks: int = Field(1, ge=1, le=100)
    max_tasks: int = Field(4, ge=1, le=100)

    @model_validator(mode="after")
    def _check(self) -> ServiceSize:
        allowed = FARGATE_CPU_MEMORY.get(self.cpu)
        if allowed is None:
            raise ValueError(f"cpu {self.cpu} is not a Fargate size ({sorted(FARGATE_CPU_MEMORY)})")
        if self.memory not in allowed:
            raise ValueError(
                f"memory {self.memory} MiB is not allowed with cpu {self.cpu} "
                f"({allowed.start}..{allowed.stop - 1} MiB in steps of {allowed.step})"
            )
        if self.max_tasks < self.min_tasks:
            raise ValueError(f"maxTasks {self.max_tasks} is below minTasks {self.min_tasks}")
        return self


def _default_services() -> dict[str, ServiceSize]:
    return {command: ServiceSize() for command in shared.SERVICE_COMMANDS}


class StackConfig(_Model):
    """Every ``cormorant:*`` key of a stack, with its default. Sizes: GiB for disks, MiB for
    task memory; durations in seconds unless the key says days."""

    # --- network -----------------------------------------------------------------------
    vpc_cidr: str = "10.40.0.0/16"
    availability_zones: int = Field(3, ge=2, le=3)
    nat_gateways: int = Field(1, ge=1)

    # --- kafka -------------------------------------------------------------------------
    kafka_mode: Literal["provisioned", "serverless"] = "provisioned"
    kafka_broker_instance_type: str = "kafka.t3.small"
    kafka_brokers: int = Field(3, ge=3)
    kafka_broker_volume_gib: int = Field(100, ge=1, le=16384)
    kafka_broker_max_volume_gib: int = Field(1000, ge=1, le=16384)
    kafka_enhanced_monitoring: Literal[
        "DEFAULT", "PER_BROKER", "PER_TOPIC_PER_BROKER", "PER_TOPIC_PER_PARTITION"
    ] = "DEFAULT"
    topic_prefix: str = ""

    # --- cache -------------------------------------------------------------------------
    redis_node_type: str = "cache.t4g.small"
    redis_nodes: int = Field(2, ge=2, le=6)
    redis_snapshot_retention_days: int = Field(1, ge=0, le=35)

    # --- database ----------------------------------------------------------------------
    db_instance_class: str = "db.t4g.micro"
    db_engine_version: str = "16"
    db_allocated_storage_gib: int = Field(20, ge=20, le=65536)
    db_max_allocated_storage_gib: int = Field(100, ge=20, le=65536)
    db_multi_az: bool = False
    db_deletion_protection: bool = False
    db_backup_retention_days: int = Field(1, ge=1, le=35)

    # --- compute -----------------------------------------------------------------------
    image_digest: str | None = None
    """The digest (``sha256:<64 hex digits>``) of the release's image in the stack's own
    repository (:mod:`cormorant_infra.images`): every service and one-off task runs
    ``<repository>@<digest>``. Unset only in a new stack's first ``up`` (with ``bootstrap``),
    which makes the repositories the image is then pushed to."""
    images_kept: int = Field(30, ge=2, le=1000)
    image_tag: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,100}$")
    cpu_architecture: Literal["X86_64", "ARM64"] = "X86_64"
    services: dict[str, ServiceSize] = Field(default_factory=_default_services)
    store_backend: Literal["redis", "postgres"] = "redis"
    application_client_ids: list[str] = Field(default_factory=list)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_retention_days: int = 30
    cpu_target_percent: int = Field(60, ge=10, le=90)
    connections_per_ingest_task: int = Field(10_000, ge=100)
    consumer_lag_per_task: int = Field(10_000, ge=100)

    # --- ingress -----------------------------------------------------------------------
    tls_mode: Literal["terminate", "passthrough"] = "terminate"
    certificate_arn: str | None = None
    tls_certificate_secret_arn: str | None = Field(None, pattern=r"^arn:aws[a-z-]*:secretsmanager:")
    tls_client_auth: Literal["none", "optional", "required"] = "none"
    plain_mqtt: bool = False
    websocket: bool = True
    allowed_cidrs: list[str] = Field(default_factory=lambda: ["0.0.0.0/0"], min_length=1)
    nlb_idle_timeout_seconds: int = Field(350, ge=60, le=6000)
    max_keep_alive: int = Field(230, ge=1, le=65535)
    proxy_protocol_v2: bool = True
    nlb_deletion_protection: bool = False

    # --- operations ----------------------------------------------------------------------
    admin_certificate_arn: str | None = Field(None, pattern=r"^arn:aws[a-z-]*:acm:")
    admin_allowed_cidrs: list[str] = Field(default_factory=list)
    metrics_allowed_cidrs: list[str] = Field(default_factory=list)

    # --- integrations ---------------------------------------------------------------------
    integrations_egress: list[str] = Field(default_factory=list, max_length=MAX_INTEGRATIONS_EGRESS)
    """Where the integrations stage may connect besides Cormorant's own servers and HTTPS
    (:func:`parse_egress`): its own security group's egress rules."""
    integrations_msk_cluster_arns: list[str] = Field(default_factory=list)
    """MSK clusters (their ARNs) the integrations stage's task role may write to with IAM."""
    integrations_assume_role_arns: list[str] = Field(default_factory=list)
    """IAM roles (of other accounts) the integrations stage may assume to sign MSK IAM
    logins (a Kafka sink's ``aws_role_arn``)."""

    # --- analytics ---------------------------------------------------------------------
    emr_release_label: str = shared.EMR_RELEASE_LABEL
    emr_max_vcpu: int = Field(16, ge=1, le=4000)
    emr_max_memory_gib: int = Field(64, ge=1, le=16000)
    archive_infrequent_access_days: int = Field(30, ge=30)
    archive_expiration_days: int | None = Field(None, ge=1)

    # --- observability -----------------------------------------------------------------
    alarm_email: str | None = Field(None, pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$")

    # --- the stack as a whole --------------------------------------------------------------
    production: bool = False
    bootstrap: bool = False
    """The stack's first ``pulumi up``: every service at 0 tasks (its desired count and
    autoscaling minimum), so that nothing logs in to PostgreSQL before the migration task
    (``cormorant cloud migrate-db``) made the services' role; the next ``up`` without it
    raises the autoscaling minimums, and the services start."""

    @field_validator("image_digest")
    @classmethod
    def _image_digest(cls, value: str | None) -> str | None:
        if value is None or IMAGE_DIGEST.fullmatch(value):
            return value
        if "@" in value:
            raise ValueError(
                f"{value!r} is an image reference, not a digest: set only the part after "
                "'@' (sha256:...); the repository is the stack's own (output imageRepository)"
            )
        raise ValueError(
            f"{value!r} is not an image digest: expected 'sha256:' and 64 lowercase hex "
            "digits, as `docker buildx build --push --metadata-file` writes it "
            "(containerimage.digest) or `aws ecr describe-images` lists it (imageDigest)"
        )

    @field_validator("vpc_cidr")
    @classmethod
    def _vpc_cidr(cls, value: str) -> str:
        network = ipaddress.ip_network(value, strict=True)
        if network.version != 4 or not 16 <= network.prefixlen <= 20:
            raise ValueError(f"{value} must be an IPv4 network with a /16 to /20 prefix")
        if not network.is_private:
            raise ValueError(f"{value} is not a private address range (RFC 1918)")
        return value

    @field_validator("allowed_cidrs")
    @classmethod
    def _allowed_cidrs(cls, value: list[str]) -> list[str]:
        for cidr in value:
            ipaddress.ip_network(cidr, strict=True)
        return value

    @field_validator("admin_allowed_cidrs", "metrics_allowed_cidrs")
    @classmethod
    def _private_cidrs(cls, value: list[str]) -> list[str]:
        # The admin API and the metrics endpoints are never on the internet: only addresses
        # of the VPC and of networks joined to it (VPN, peering, Direct Connect) get in.
        for cidr in value:
            try:
                network = ipaddress.ip_network(cidr, strict=True)
            except ValueError as exc:
                raise ValueError(f"{cidr!r} is not a network in CIDR notation ({exc})") from None
            if not (network.version == 4 and any(network.subnet_of(r) for r in RFC_1918)):
                raise ValueError(
                    f"{cidr} is not a private IPv4 range (RFC 1918): the admin API and the "
                    "metrics are reached from the VPC and the networks joined to it (VPN, "
                    "peering, Direct Connect) only, never from the internet"
                )
        return value

    @field_validator("integrations_egress")
    @classmethod
    def _integrations_egress(cls, value: list[str]) -> list[str]:
        for entry in value:
            parse_egress(entry)
        if len(set(value)) != len(value):
            raise ValueError("an entry is given twice")
        return value

    @field_validator("integrations_msk_cluster_arns")
    @classmethod
    def _msk_cluster_arns(cls, value: list[str]) -> list[str]:
        for arn in value:
            if not MSK_CLUSTER_ARN.fullmatch(arn):
                raise ValueError(
                    f"{arn!r} is not an MSK cluster ARN "
                    "(arn:aws:kafka:<region>:<account>:cluster/<name>/<uuid>, as "
                    "`aws kafka list-clusters-v2` gives it)"
                )
        return value

    @field_validator("integrations_assume_role_arns")
    @classmethod
    def _role_arns(cls, value: list[str]) -> list[str]:
        for arn in value:
            if not ROLE_ARN.fullmatch(arn):
                raise ValueError(
                    f"{arn!r} is not an IAM role ARN (arn:aws:iam::<account>:role/<name>)"
                )
        return value

    @property
    def integrations_egress_rules(self) -> list[EgressRule]:
        """``integrationsEgress``, parsed."""
        return [parse_egress(entry) for entry in self.integrations_egress]

    @field_validator("log_retention_days")
    @classmethod
    def _retention(cls, value: int) -> int:
        if value not in CLOUDWATCH_RETENTION_DAYS:
            raise ValueError(
                f"{value} is not a CloudWatch Logs retention ({sorted(CLOUDWATCH_RETENTION_DAYS)})"
            )
        return value

    @field_validator("services")
    @classmethod
    def _services(cls, value: dict[str, ServiceSize]) -> dict[str, ServiceSize]:
        unknown = set(value) - set(shared.SERVICE_COMMANDS)
        if unknown:
            raise ValueError(
                f"unknown services {sorted(unknown)}; the services are {shared.SERVICE_COMMANDS}"
            )
        return {command: value.get(command, ServiceSize()) for command in shared.SERVICE_COMMANDS}

    @field_validator("emr_release_label")
    @classmethod
    def _emr_release(cls, value: str) -> str:
        shared.check_emr_release(value)
        return value

    @model_validator(mode="after")
    def _cross_checks(self) -> StackConfig:
        if self.image_digest is None and not self.bootstrap:
            raise ValueError(
                "imageDigest is required: the digest of the release's image pushed to the "
                "stack's repository (output imageRepository). Only a new stack's first up "
                "runs without it, with bootstrap true: it makes the repositories to push to "
                "(docs/deploy.md, The first deployment)"
            )
        if self.nat_gateways > self.availability_zones:
            raise ValueError(
                f"natGateways is {self.nat_gateways} but there are {self.availability_zones} "
                "availability zones: at most one NAT gateway per zone"
            )
        if self.kafka_mode == "provisioned" and self.kafka_brokers % self.availability_zones:
            raise ValueError(
                f"kafkaBrokers {self.kafka_brokers} must be a multiple of availabilityZones "
                f"{self.availability_zones} (MSK spreads brokers evenly over the zones)"
            )
        if self.tls_mode == "terminate" and not self.certificate_arn:
            raise ValueError("tlsMode terminate needs certificateArn (an ACM certificate)")
        if self.admin_allowed_cidrs and not self.admin_certificate_arn:
            raise ValueError(
                "adminAllowedCidrs needs adminCertificateArn: without a certificate there is "
                "no admin load balancer to let them in (bearer tokens never cross in clear)"
            )
        if self.tls_mode == "passthrough" and not self.tls_certificate_secret_arn:
            raise ValueError(
                "tlsMode passthrough needs tlsCertificateSecretArn (a Secrets Manager secret "
                "with the ingest tasks' certificate and key)"
            )
        if self.tls_client_auth != "none" and self.tls_mode != "passthrough":
            raise ValueError(
                "tlsClientAuth needs tlsMode passthrough: the tasks verify client "
                "certificates, so TLS must reach them"
            )
        if self.kafka_broker_max_volume_gib < self.kafka_broker_volume_gib:
            raise ValueError("kafkaBrokerMaxVolumeGib is below kafkaBrokerVolumeGib")
        if (
            self.production
            and self.plain_mqtt
            and any(ipaddress.ip_network(cidr).prefixlen == 0 for cidr in self.allowed_cidrs)
        ):
            raise ValueError(
                "a production stack does not serve plaintext MQTT (1883) to the whole "
                "internet: passwords and tokens would cross it in clear; set plainMqtt "
                "false (devices use 8883) or narrow allowedCidrs"
            )
        if self.production and self.store_backend == "redis" and self.redis_nodes < 3:
            raise ValueError(
                "a production stack's Redis needs redisNodes 3 or more (a primary and two "
                "replicas): with one replica, a failover leaves the new primary nothing to "
                "confirm writes until ElastiCache has replaced the failed node"
            )
        if self.db_max_allocated_storage_gib < self.db_allocated_storage_gib:
            raise ValueError("dbMaxAllocatedStorageGib is below dbAllocatedStorageGib")
        if self.archive_expiration_days is not None and (
            self.archive_expiration_days <= self.archive_infrequent_access_days
        ):
            raise ValueError("archiveExpirationDays must come after archiveInfrequentAccessDays")
        defaults = shared.settings_for()
        refused = shared.refused_topic_configs(shared.settings_for(**self.kafka_settings))
        if refused:
            raise ValueError(
                f"kafkaMode {self.kafka_mode}: the Kafka refuses these topic configs: "
                + "; ".join(f"{topic}: {', '.join(c)}" for topic, c in sorted(refused.items()))
            )
        for command, setting in CONSUMER_GROUP_PARTITIONS.items():
            partitions = getattr(defaults, setting)
            if self.services[command].max_tasks > partitions:
                raise ValueError(
                    f"services.{command}.maxTasks {self.services[command].max_tasks} is more "
                    f"than the {partitions} partitions its consumer group shares "
                    f"({shared.setting_env(setting)}): the extra tasks would get none"
                )
        idle = self.shortest_idle_timeout
        allowed = shared.max_keep_alive_for_idle_timeout(idle)
        if self.max_keep_alive > allowed:
            raise ValueError(
                f"maxKeepAlive {self.max_keep_alive} s is too long for the load balancer's "
                f"{idle} s idle timeout: the broker waits 1.5 x keep alive before it gives up "
                f"on a silent client, so at most {allowed} s keeps the NLB from dropping "
                "flows the broker still counts as alive"
            )
        return self

    @property
    def tls_listener(self) -> bool:
        """Whether port 8883 is an NLB TLS listener (TLS terminated at the NLB)."""
        return self.tls_mode == "terminate"

    @property
    def shortest_idle_timeout(self) -> int:
        """The shortest idle timeout (seconds) of the NLB's MQTT listeners: a TLS listener's
        is fixed at 350 s, the TCP listeners' is ``nlbIdleTimeoutSeconds``."""
        timeouts = []
        if self.tls_listener:
            timeouts.append(NLB_TLS_IDLE_TIMEOUT_SECONDS)
        if self.plain_mqtt or not self.tls_listener:
            timeouts.append(self.nlb_idle_timeout_seconds)
        return min(timeouts)

    @property
    def kafka_settings(self) -> dict[str, str]:
        """The Kafka settings the kafka mode gives every task (setting name → value): with
        MSK Serverless, ``kafka_flavor`` ``msk-serverless`` so topics are created with only
        the configs it accepts."""
        return {"kafka_flavor": "msk-serverless" if self.kafka_iam else "apache"}

    @property
    def kafka_iam(self) -> bool:
        """Whether clients authenticate to Kafka with IAM (MSK Serverless) rather than SCRAM."""
        return self.kafka_mode == "serverless"


def _is_text(annotation: Any) -> bool:
    """Whether a field holds text (its configuration value is used as is, not as JSON)."""
    if annotation is str:
        return True
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _is_text(typing.get_args(annotation)[0])
    if origin is Literal:
        return all(isinstance(arg, str) for arg in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return all(_is_text(arg) or arg is type(None) for arg in typing.get_args(annotation))
    return False


def from_values(values: Mapping[str, str]) -> StackConfig:
    """Validate the configuration ``values`` (key without namespace → value as Pulumi
    stores it: text, or JSON for numbers, booleans, lists and objects).

    Raises :class:`ConfigError` naming every invalid or unknown key.
    """
    fields = {info.alias or name: info for name, info in StackConfig.model_fields.items()}
    removed = [f"  {NAMESPACE}:{key}: {why}" for key, why in REMOVED_KEYS.items() if key in values]
    if removed:
        raise ConfigError(
            "invalid stack configuration (Pulumi.<stack>.yaml):\n" + "\n".join(removed)
        )
    parsed: dict[str, Any] = {}
    for key, raw in values.items():
        info = fields.get(key)
        if info is not None and _is_text(info.annotation):
            parsed[key] = raw
            continue
        try:
            parsed[key] = json.loads(raw)
        except json.JSONDecodeError:
            parsed[key] = raw  # pydantic then says what type it wanted
    try:
        return StackConfig.model_validate(parsed)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            where = ".".join(str(part) for part in error["loc"])
            key = f"{NAMESPACE}:{where}" if where else "configuration"
            problems.append(f"  {key}: {error['msg'].removeprefix('Value error, ')}")
        raise ConfigError(
            "invalid stack configuration (Pulumi.<stack>.yaml):\n" + "\n".join(problems)
        ) from None


def load() -> StackConfig:
    """The :class:`StackConfig` of the running Pulumi program (its ``cormorant:*`` keys).

    Raises :class:`ConfigError` as :func:`from_values` does.
    """
    everything = {**pulumi.runtime.get_config_env(), **pulumi.runtime.config.CONFIG.get()}
    prefix = f"{NAMESPACE}:"
    return from_values(
        {
            key[len(prefix) :]: str(value)
            for key, value in everything.items()
            if key.startswith(prefix)
        }
    )
