"""Cormorant's deployment rules as a Pulumi policy pack (pulumi_policy), checked on preview/up.

``pulumi preview --policy-pack infra/policy`` (or ``up``) runs them against the resources
the program declares; the tests call each ``validate`` function directly. Properties are
the providers' camelCase inputs. During a preview some values are not known yet (ARNs,
JSON built from them); a rule then checks what is known and reports nothing for the rest.

Rules: MQTT is the only thing open to the internet, and plaintext MQTT (1883) not
(advisory: a dev stack may keep it; mandatory in a stack tagged production); the NLB's IP
target groups pass the clients' addresses on (PROXY protocol v2); the admin API's load
balancer is internal; encryption at rest and in transit on MSK, ElastiCache, RDS, S3, SNS
(never under ``alias/aws/sns``, which alarms cannot use) and the load balancers' listeners
(HTTPS, TLS 1.3 policies); failover for Redis, Multi-AZ for RDS (advisory: off in dev); no
public database; IAM policies never allow ``*`` on ``*``; ECR tags are immutable and
scanned on push, and every container runs its image by digest; every ECS service logs and
autoscales; the EMR release runs the Spark line the jobs pin; the NLB's idle timeouts and
the broker's largest Keep Alive agree.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    Policy,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from cormorant_infra import shared
from cormorant_infra.config import NLB_TLS_IDLE_TIMEOUT_SECONDS

Props = Mapping[str, Any]

SG = "aws:ec2/securityGroup:SecurityGroup"
SG_RULE = "aws:ec2/securityGroupRule:SecurityGroupRule"
SG_INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
MSK = "aws:msk/cluster:Cluster"
REDIS = "aws:elasticache/replicationGroup:ReplicationGroup"
RDS = "aws:rds/instance:Instance"
RDS_PARAMETERS = "aws:rds/parameterGroup:ParameterGroup"
BUCKET = "aws:s3/bucket:Bucket"
BUCKET_SSE = (
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
)
BUCKET_PUBLIC = "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock"
SNS = "aws:sns/topic:Topic"
LISTENER = "aws:lb/listener:Listener"
LOAD_BALANCER = "aws:lb/loadBalancer:LoadBalancer"
ECS_SERVICE = "aws:ecs/service:Service"
TASK_DEFINITION = "aws:ecs/taskDefinition:TaskDefinition"
ECR_REPOSITORY = "aws:ecr/repository:Repository"
DIGEST_REFERENCE = re.compile(r"@sha256:[0-9a-f]{64}$")
"""An image reference pinned to content: ``<repository>@sha256:<64 hex digits>``."""
SCALING_TARGET = "aws:appautoscaling/target:Target"
EMR_APPLICATION = "aws:emrserverless/application:Application"
POLICY_TYPES = (
    "aws:iam/rolePolicy:RolePolicy",
    "aws:iam/policy:Policy",
    "aws:iam/userPolicy:UserPolicy",
    "aws:iam/groupPolicy:GroupPolicy",
)

MQTT_PORTS = frozenset({shared.MQTT_PORT, shared.MQTT_TLS_PORT, shared.MQTT_WSS_PUBLIC_PORT})
"""The NLB's MQTT listener ports: MQTT, MQTT over TLS, MQTT over WebSocket over TLS."""
AWS_MANAGED_SNS_KEY = "alias/aws/sns"
TARGET_GROUP = "aws:lb/targetGroup:TargetGroup"
KEEP_ALIVE_ENV = shared.setting_env("max_keep_alive")
PUBLIC_ACCESS_BLOCKS = (
    "blockPublicAcls",
    "blockPublicPolicy",
    "ignorePublicAcls",
    "restrictPublicBuckets",
)
TCP_IDLE_DEFAULT_SECONDS = 350
"""An NLB TCP listener's idle timeout when ``tcpIdleTimeoutSeconds`` is not set."""


def _anywhere(cidr: object) -> bool:
    """Whether ``cidr`` admits the whole internet (``0.0.0.0/0`` or ``::/0``)."""
    if not isinstance(cidr, str):
        return False
    try:
        return ipaddress.ip_network(cidr, strict=False).prefixlen == 0
    except ValueError:
        return False


def _only_mqtt(props: Props) -> bool:
    """Whether an ingress rule's TCP port range lies within the MQTT ports."""
    low, high = props.get("fromPort"), props.get("toPort")
    if not isinstance(low, int | float) or not isinstance(high, int | float):
        return False
    return props.get("protocol", props.get("ipProtocol")) == "tcp" and all(
        port in MQTT_PORTS for port in range(int(low), int(high) + 1)
    )


def _internet_ingress(props: Props) -> Iterable[Props]:
    """The ingress rules in ``props`` open to the whole internet."""
    for rule in props.get("ingress") or []:
        if any(
            _anywhere(c)
            for c in [*(rule.get("cidrBlocks") or []), *(rule.get("ipv6CidrBlocks") or [])]
        ):
            yield rule
    if props.get("type", "ingress") == "ingress" and (
        any(_anywhere(c) for c in props.get("cidrBlocks") or [])
        or _anywhere(props.get("cidrIpv4"))
        or _anywhere(props.get("cidrIpv6"))
    ):
        yield props


def validate_internet_ingress(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """Only the MQTT listener ports (1883, 8883, 443: MQTT over WebSocket, TCP) may be open
    to 0.0.0.0/0 or ::/0."""
    if args.resource_type not in (SG, SG_RULE, SG_INGRESS):
        return
    for rule in _internet_ingress(args.props):
        if not _only_mqtt(rule):
            protocol = rule.get("protocol", rule.get("ipProtocol"))
            report(
                f"ingress from the whole internet on {protocol} "
                f"{rule.get('fromPort')}-{rule.get('toPort')}: only MQTT (1883, 8883, 443) may be",
                None,
            )


def _covers(rule: Props, port: int) -> bool:
    """Whether an ingress rule's port range includes ``port`` (every protocol: all ports)."""
    if rule.get("protocol", rule.get("ipProtocol")) in ("-1", "all"):
        return True
    low, high = rule.get("fromPort"), rule.get("toPort")
    if not isinstance(low, int | float) or not isinstance(high, int | float):
        return False
    return int(low) <= port <= int(high)


def validate_plaintext_mqtt(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """Plaintext MQTT (1883) is not open to 0.0.0.0/0 or ::/0: passwords, tokens and
    messages would cross the internet in clear (advisory: a dev stack may keep it; a
    production stack sets ``plainMqtt: false`` or narrows ``allowedCidrs``)."""
    if args.resource_type not in (SG, SG_RULE, SG_INGRESS):
        return
    for rule in _internet_ingress(args.props):
        if _covers(rule, shared.MQTT_PORT):
            report(
                f"plaintext MQTT ({shared.MQTT_PORT}) is open to the whole internet: set "
                "cormorant:plainMqtt false (clients use 8883, TLS) or narrow "
                "cormorant:allowedCidrs",
                None,
            )


def _production(props: Props) -> bool:
    """Whether a resource belongs to a stack with ``cormorant:production`` (its tag)."""
    return (props.get("tags") or {}).get(shared.PRODUCTION_TAG) == "true"


def validate_production_plaintext_mqtt(
    args: ResourceValidationArgs, report: ReportViolation
) -> None:
    """In a production stack, plaintext MQTT (1883) is never open to 0.0.0.0/0 or ::/0
    (mandatory: :func:`validate_plaintext_mqtt` is its advisory form for every stack)."""
    if args.resource_type not in (SG, SG_RULE, SG_INGRESS) or not _production(args.props):
        return
    for rule in _internet_ingress(args.props):
        if _covers(rule, shared.MQTT_PORT):
            report(
                f"production stack: plaintext MQTT ({shared.MQTT_PORT}) is open to the whole "
                "internet: passwords and tokens would cross it in clear",
                None,
            )


def validate_client_addresses(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """An NLB target group of IP targets over TCP or TLS passes the client's address on,
    by PROXY protocol v2 (or client IP preservation). AWS, "Edit target group attributes
    for your Network Load Balancer": client IP preservation defaults to "IP type target
    groups (TCP, TLS): Disabled"; without either, every connection appears to come from
    the NLB and the brokers' per-address limits apply to the NLB's few addresses."""
    props = args.props
    if (
        args.resource_type != TARGET_GROUP
        or props.get("targetType") != "ip"
        or props.get("protocol") not in ("TCP", "TLS")
    ):
        return
    if props.get("proxyProtocolV2") is not True and str(props.get("preserveClientIp")) != "true":
        report(
            f"target group on port {props.get('port')}: IP targets lose the client's address "
            "(set cormorant:proxyProtocolV2 true)",
            None,
        )


def _path(props: Props, *keys: str) -> Any:
    value: Any = props
    for key in keys:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def validate_encryption(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """Encryption at rest and in transit on every data store and the alarm topic."""
    props, kind = args.props, args.resource_type
    if kind == MSK:
        if _path(props, "encryptionInfo", "encryptionInTransit", "clientBroker") != "TLS":
            report("MSK: clients must use TLS (encryptionInTransit.clientBroker = TLS)", None)
        if _path(props, "encryptionInfo", "encryptionInTransit", "inCluster") is False:
            report("MSK: traffic between brokers must be encrypted (inCluster)", None)
        if "encryptionAtRestKmsKeyArn" not in (props.get("encryptionInfo") or {}):
            report("MSK: data at rest must use a customer-managed KMS key", None)
        if _path(props, "clientAuthentication", "unauthenticated") is not False:
            report("MSK: unauthenticated clients must be refused", None)
    elif kind == REDIS:
        if props.get("atRestEncryptionEnabled") is not True:
            report("ElastiCache: encryption at rest must be on", None)
        if props.get("transitEncryptionEnabled") is not True:
            report("ElastiCache: encryption in transit (TLS) must be on", None)
        if "authToken" not in props:
            report("ElastiCache: clients must authenticate (authToken)", None)
    elif kind == RDS:
        if props.get("storageEncrypted") is not True:
            report("RDS: storage must be encrypted", None)
    elif kind == RDS_PARAMETERS:
        forced = {p.get("name"): p.get("value") for p in props.get("parameters") or []}
        if (
            str(props.get("family", "")).startswith("postgres")
            and forced.get("rds.force_ssl") != "1"
        ):
            report("RDS: PostgreSQL must refuse connections without TLS (rds.force_ssl = 1)", None)
    elif kind == SNS and not props.get("kmsMasterKeyId"):
        report("SNS: the topic must be encrypted (kmsMasterKeyId)", None)
    elif kind == SNS and str(props.get("kmsMasterKeyId")).endswith(AWS_MANAGED_SNS_KEY):
        # SNS Developer Guide, "Enable compatibility between event sources from AWS
        # services and encrypted topics": CloudWatch needs kms:GenerateDataKey* and
        # kms:Decrypt in the key's policy, which the AWS managed key's cannot grant.
        report(
            "SNS: alias/aws/sns cannot take CloudWatch alarms (its key policy cannot let "
            "cloudwatch.amazonaws.com use it): use a customer managed key",
            None,
        )
    elif kind == LISTENER and props.get("protocol") == "HTTP":
        report("load balancer: HTTP listeners carry bearer tokens in clear: use HTTPS", None)
    elif (
        kind == LISTENER
        and props.get("protocol") in ("TLS", "HTTPS")
        and not str(props.get("sslPolicy", "")).startswith("ELBSecurityPolicy-TLS13")
    ):
        report("load balancer: TLS and HTTPS listeners must use a TLS 1.3 security policy", None)


def validate_internal_application_balancers(
    args: ResourceValidationArgs, report: ReportViolation
) -> None:
    """Application load balancers (the admin API and console's) are internal: operators
    reach them from the VPC and networks joined to it, never from the internet."""
    if (
        args.resource_type == LOAD_BALANCER
        and args.props.get("loadBalancerType") == "application"
        and args.props.get("internal") is not True
    ):
        report("application load balancer: must be internal (the admin API is private)", None)


def validate_high_availability(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """Redis keeps serving through the loss of a node or a zone."""
    if args.resource_type != REDIS:
        return
    props = args.props
    if not props.get("automaticFailoverEnabled") or not props.get("multiAzEnabled"):
        report("ElastiCache: automatic failover and Multi-AZ must be on", None)
    if (props.get("numCacheClusters") or 0) < 2:
        report("ElastiCache: at least two nodes (a primary and a replica)", None)


def validate_database_multi_az(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """RDS runs Multi-AZ with deletion protection (advisory: a dev stack runs without)."""
    if args.resource_type != RDS:
        return
    if args.props.get("multiAz") is not True:
        report("RDS: not Multi-AZ (a zone failure stops the database)", None)
    if args.props.get("deletionProtection") is not True:
        report("RDS: deletion protection is off", None)


def validate_private_database(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """No database or cache is reachable from the internet."""
    if args.resource_type == RDS and args.props.get("publiclyAccessible") is True:
        report("RDS: the database must not be publicly accessible", None)


def _statements(document: Any) -> list[Mapping[str, Any]]:
    if isinstance(document, str):
        document = json.loads(document)
    statements = document.get("Statement", [])
    return [statements] if isinstance(statements, Mapping) else list(statements)


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def validate_iam(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """No IAM statement allows every action, or any action through NotAction, on ``*``."""
    if args.resource_type not in POLICY_TYPES or not isinstance(args.props.get("policy"), str):
        return
    try:
        statements = _statements(args.props["policy"])
    except (ValueError, AttributeError):
        report("IAM: the policy is not a JSON policy document", None)
        return
    for statement in statements:
        if statement.get("Effect") != "Allow":
            continue
        actions = _as_list(statement.get("Action", []))
        resources = _as_list(statement.get("Resource", []))
        if "NotAction" in statement or "NotResource" in statement:
            report("IAM: Allow with NotAction/NotResource grants more than it names", None)
        if any(a in ("*", "*:*") for a in actions):
            report("IAM: a statement allows every action", None)
        elif "*" in resources and any(a.endswith(":*") for a in actions):
            report(f"IAM: a statement allows all of {actions} on every resource", None)


def validate_emr_release(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """The EMR Serverless application runs the Spark line that spark_emr pins."""
    if args.resource_type != EMR_APPLICATION:
        return
    try:
        shared.check_emr_release(str(args.props.get("releaseLabel")))
    except ValueError as exc:
        report(f"EMR: {exc}", None)


def validate_images(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """ECR repositories keep tags immutable and scan every push; every container of a task
    definition runs its image by digest (a re-pushed tag would start no deployment, and a
    scale-out could run other code than the tasks already running)."""
    if args.resource_type == ECR_REPOSITORY:
        if args.props.get("imageTagMutability") != "IMMUTABLE":
            report("ECR repository: tags are mutable (imageTagMutability IMMUTABLE)", None)
        if _path(args.props, "imageScanningConfiguration", "scanOnPush") is not True:
            report("ECR repository: images are not scanned on push", None)
    if args.resource_type == TASK_DEFINITION:
        for container in _containers(args.props) or []:
            image = container.get("image")
            if isinstance(image, str) and not DIGEST_REFERENCE.search(image):
                report(
                    f"container {container.get('name')}: image {image} is not pinned by "
                    "digest (<repository>@sha256:...)",
                    None,
                )


def _containers(props: Props) -> list[Mapping[str, Any]] | None:
    text = props.get("containerDefinitions")
    if not isinstance(text, str):
        return None  # not known during a preview
    containers: list[Mapping[str, Any]] = json.loads(text)
    return containers


def validate_services(args: StackValidationArgs, report: ReportViolation) -> None:
    """Every ECS service has an autoscaling target, and every container logs to CloudWatch."""
    targets = {
        str(r.props.get("resourceId")) for r in args.resources if r.resource_type == SCALING_TARGET
    }
    for resource in args.resources:
        if resource.resource_type == ECS_SERVICE:
            name = resource.props.get("name")
            if not any(t.endswith(f"/{name}") for t in targets):
                report(f"ECS service {name}: no autoscaling target", resource.urn)
        if resource.resource_type == TASK_DEFINITION:
            for container in _containers(resource.props) or []:
                if _path(container, "logConfiguration", "logDriver") != "awslogs":
                    report(
                        f"container {container.get('name')}: no CloudWatch log group", resource.urn
                    )


def _idle_timeouts(resources: Iterable[Any]) -> list[int]:
    timeouts = []
    for resource in resources:
        if resource.resource_type != LISTENER:
            continue
        if resource.props.get("protocol") == "TLS":
            timeouts.append(NLB_TLS_IDLE_TIMEOUT_SECONDS)
        elif resource.props.get("protocol") == "TCP":
            timeouts.append(
                int(resource.props.get("tcpIdleTimeoutSeconds") or TCP_IDLE_DEFAULT_SECONDS)
            )
    return timeouts


def validate_keep_alive(args: StackValidationArgs, report: ReportViolation) -> None:
    """The largest Keep Alive an ingest task grants fits the NLB listeners' idle timeouts
    (the broker waits 1.5 x Keep Alive before it gives up on a silent client; the NLB must
    not forget the flow before that)."""
    timeouts = _idle_timeouts(args.resources)
    if not timeouts:
        return
    allowed = shared.max_keep_alive_for_idle_timeout(min(timeouts))
    default = shared.settings_for().max_keep_alive
    for resource in args.resources:
        if resource.resource_type != TASK_DEFINITION:
            continue
        for container in _containers(resource.props) or []:
            if container.get("name") != shared.INGEST:
                continue
            env = {e.get("name"): e.get("value") for e in container.get("environment") or []}
            keep_alive = int(env.get(KEEP_ALIVE_ENV, default))
            if keep_alive > allowed:
                report(
                    f"ingest grants keep alive up to {keep_alive} s ({KEEP_ALIVE_ENV}); the "
                    f"NLB's {min(timeouts)} s idle timeout allows at most {allowed} s",
                    resource.urn,
                )


def validate_public_buckets(args: StackValidationArgs, report: ReportViolation) -> None:
    """Every S3 bucket is encrypted by default and closed to the public."""
    encrypted = {
        str(r.props.get("bucket")) for r in args.resources if r.resource_type == BUCKET_SSE
    }
    blocked = {
        str(r.props.get("bucket"))
        for r in args.resources
        if r.resource_type == BUCKET_PUBLIC
        and all(r.props.get(key) is True for key in PUBLIC_ACCESS_BLOCKS)
    }
    for resource in args.resources:
        if resource.resource_type != BUCKET:
            continue
        bucket = resource.props.get("bucket")
        if not isinstance(bucket, str):
            continue  # a generated name, not known during a preview
        if bucket not in encrypted:
            report(f"S3 bucket {bucket}: no default encryption", resource.urn)
        if bucket not in blocked:
            report(f"S3 bucket {bucket}: public access is not fully blocked", resource.urn)


POLICIES: list[Policy] = [
    ResourceValidationPolicy(
        name="mqtt-only-from-internet",
        description="Only the NLB's MQTT listener ports are open to 0.0.0.0/0.",
        validate=validate_internet_ingress,
    ),
    ResourceValidationPolicy(
        name="no-plaintext-mqtt-from-internet",
        description="Plaintext MQTT (1883) is not open to 0.0.0.0/0 (production stacks).",
        validate=validate_plaintext_mqtt,
        enforcement_level=EnforcementLevel.ADVISORY,
    ),
    ResourceValidationPolicy(
        name="no-plaintext-mqtt-in-production",
        description="A production stack never opens plaintext MQTT (1883) to 0.0.0.0/0.",
        validate=validate_production_plaintext_mqtt,
    ),
    ResourceValidationPolicy(
        name="client-addresses-reach-the-brokers",
        description="NLB IP target groups send PROXY protocol v2 (or preserve client IPs).",
        validate=validate_client_addresses,
    ),
    ResourceValidationPolicy(
        name="encryption-everywhere",
        description="MSK, ElastiCache, RDS and SNS encrypt at rest and in transit.",
        validate=validate_encryption,
    ),
    ResourceValidationPolicy(
        name="private-admin-load-balancer",
        description="Application load balancers (the admin API's) are internal.",
        validate=validate_internal_application_balancers,
    ),
    ResourceValidationPolicy(
        name="redis-failover",
        description="ElastiCache has two or more nodes, automatic failover and Multi-AZ.",
        validate=validate_high_availability,
    ),
    ResourceValidationPolicy(
        name="database-multi-az",
        description="RDS is Multi-AZ with deletion protection (production stacks).",
        validate=validate_database_multi_az,
        enforcement_level=EnforcementLevel.ADVISORY,
    ),
    ResourceValidationPolicy(
        name="private-database",
        description="RDS is not publicly accessible.",
        validate=validate_private_database,
    ),
    ResourceValidationPolicy(
        name="iam-least-privilege",
        description="No IAM statement allows * on *.",
        validate=validate_iam,
    ),
    ResourceValidationPolicy(
        name="emr-spark-version",
        description="The EMR release runs the Spark line spark_emr pins.",
        validate=validate_emr_release,
    ),
    ResourceValidationPolicy(
        name="images-by-digest",
        description="ECR tags are immutable and scanned on push; tasks run images by digest.",
        validate=validate_images,
    ),
    StackValidationPolicy(
        name="services-log-and-scale",
        description="Every ECS service autoscales and every container logs to CloudWatch.",
        validate=validate_services,
    ),
    StackValidationPolicy(
        name="keep-alive-within-idle-timeout",
        description="The broker's largest Keep Alive fits the NLB's idle timeout.",
        validate=validate_keep_alive,
    ),
    StackValidationPolicy(
        name="private-encrypted-buckets",
        description="Every S3 bucket is encrypted by default and blocks public access.",
        validate=validate_public_buckets,
    ),
]
"""Every rule of the pack (``__main__.py`` serves them as the ``cormorant`` policy pack)."""
