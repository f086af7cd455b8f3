"""``cormorant cloud doctor``: is a deployed stack ready for devices? Each check with a hint.

Where ``cormorant cloud status`` reports each part's state, the doctor says whether a
deployment has really finished and what to do when it has not, from what boto3 can see:

- ``ecs``: each service steady (running = desired > 0, one deployment, COMPLETED, none
  FAILED) and running the stack's image (``serviceImage``): an older task definition's
  image means the deployment circuit breaker rolled the release back.
- ``image``: that image is still in its repository (the lifecycle policy keeps the newest
  ``imagesKept``; a scale-out of an expired digest cannot start) and its scan on push found
  nothing CRITICAL.
- ``nlb``: every target of each target group healthy, at least one.
- ``msk``: the cluster ACTIVE; ``topics``: Cormorant's core topics exist (MSK ListTopics,
  the topic API of provisioned clusters; where it is refused, the hint says how to check).
- ``elasticache``, ``rds``: available (and Redis failover on).
- ``alarms``: the stack's alarms send to its SNS topic; ``subscription``: the topic has a
  CONFIRMED subscription (an e-mail one is pending until its link is followed: no alarm
  reaches anyone before).
- ``secrets``: every Secrets Manager secret the stack names (outputs) or its tasks read
  (their task definitions) exists and is not scheduled for deletion. DescribeSecret only:
  no value is ever read or printed.

An AWS error for one check (missing resource, access denied) fails that check with AWS's
message; it does not stop the others.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from botocore.exceptions import ClientError

from services.cloud.outputs import StackOutputs
from services.cloud.status import Check, check_cache, check_database
from services.common.kafka.admin import core_topic_specs
from services.common.settings import Settings

Client = Any
"""A boto3 client (boto3 ships no type information)."""

SECRET_ARN = re.compile(r"^(arn:aws[a-z-]*:secretsmanager:[^:]+:\d{12}:secret:[^:]+)")
"""A Secrets Manager secret's ARN at the start of an ECS ``valueFrom`` (which may go on with
``:<json key>:<version stage>:<version id>``)."""

ECR_IMAGE = re.compile(r"^\d{12}\.dkr\.ecr\.[a-z0-9-]+\.amazonaws\.com(?:\.cn)?/([^@:]+)@(.+)$")
"""``<account>.dkr.ecr.<region>.amazonaws.com/<repository>@<digest>`` (``serviceImage``)."""

DESCRIBE_SERVICES_MAX = 10
"""ECS DescribeServices takes at most ten services per call."""


@dataclass(frozen=True, slots=True)
class Finding:
    """One check's verdict: ``check`` (``ecs``, ``nlb``, ``topics``...), the resource
    ``name``, ``ok``, what was found (``detail``) and, when not ok, what to do (``hint``)."""

    check: str
    name: str
    ok: bool
    detail: str
    hint: str = ""

    def as_dict(self) -> dict[str, object]:
        """The finding as a JSON object."""
        return asdict(self)

    def line(self) -> str:
        """``OK   ecs ingest: 3/3 running ...`` or ``FAIL ... (hint: ...)``: one line."""
        text = f"{'OK  ' if self.ok else 'FAIL'} {self.check} {self.name}: {self.detail}"
        return text if self.ok or not self.hint else f"{text} (hint: {self.hint})"


@dataclass(frozen=True)
class DoctorClients:
    """The boto3 clients the checks use (one region)."""

    ecs: Client
    ecr: Client
    elbv2: Client
    kafka: Client
    elasticache: Client
    rds: Client
    sns: Client
    cloudwatch: Client
    secretsmanager: Client

    @classmethod
    def for_region(cls, region: str, session: Any = None) -> DoctorClients:
        """Clients for ``region`` from ``session`` (default: boto3's, credentials from the
        usual environment, profile or role)."""
        import boto3

        session = session or boto3.session.Session()
        return cls(
            **{
                field: session.client(field, region_name=region)
                for field in cls.__dataclass_fields__
            }
        )


def _aws_error(exc: ClientError) -> str:
    error = exc.response.get("Error", {})
    return f"{error.get('Code', 'error')}: {error.get('Message', str(exc))}"


def _guarded(check: str, name: str, hint: str, run: Callable[[], list[Finding]]) -> list[Finding]:
    """``run()``, or one failed finding carrying AWS's error and ``hint``."""
    try:
        return run()
    except ClientError as exc:
        return [Finding(check, name, False, _aws_error(exc), hint)]


# --- ECS -------------------------------------------------------------------------------


def service_finding(
    service: dict[str, Any], running_image: str | None, expected_image: str | None
) -> Finding:
    """The verdict on one ECS service, from DescribeServices' ``service`` and the image its
    task definition runs (``running_image``; None when unknown)."""
    name = service["serviceName"]
    running, desired = service["runningCount"], service["desiredCount"]
    deployments = service.get("deployments", [])
    primary: dict[str, Any] = next((d for d in deployments if d.get("status") == "PRIMARY"), {})
    rollout = primary.get("rolloutState", "COMPLETED")
    detail = f"{running}/{desired} tasks running, deployment {rollout}"
    failed = [d for d in deployments if d.get("rolloutState") == "FAILED"]
    logs = "read the service's events (aws ecs describe-services) and its tasks' log group"
    if service.get("status") != "ACTIVE":
        return Finding("ecs", name, False, f"service {service.get('status')}", "pulumi up")
    if failed:
        reason = failed[0].get("rolloutStateReason", "no reason given")
        return Finding(
            "ecs",
            name,
            False,
            f"{detail}; a deployment FAILED: {reason}",
            f"the deployment circuit breaker stopped it: {logs}, fix, then pulumi up",
        )
    if expected_image and running_image and running_image != expected_image:
        return Finding(
            "ecs",
            name,
            False,
            f"{detail}; runs {running_image}, the stack declares {expected_image}",
            "the circuit breaker rolled the release back, or the service was changed "
            f"outside Pulumi: {logs}, then pulumi up",
        )
    if desired == 0:
        return Finding(
            "ecs",
            name,
            False,
            detail,
            "0 tasks wanted: after the first up, pulumi config rm cormorant:bootstrap and "
            "pulumi up (docs/deploy.md)",
        )
    if rollout != "COMPLETED" or len(deployments) > 1 or running != desired:
        return Finding(
            "ecs",
            name,
            False,
            f"{detail}, {len(deployments)} deployment(s)",
            f"ECS is still deploying: run the doctor again in a few minutes; if it stays, {logs}",
        )
    image = f", image {running_image.rsplit('@', 1)[-1][:19]}" if running_image else ""
    return Finding("ecs", name, True, detail + image)


def check_services(
    ecs: Client, cluster: str, services: list[str], expected_image: str | None
) -> tuple[list[Finding], list[dict[str, Any]]]:
    """Each ECS service's finding, and the task definitions the services run (ECS
    DescribeTaskDefinition's ``taskDefinition``) for the other checks."""
    findings: list[Finding] = []
    definitions: dict[str, dict[str, Any]] = {}
    for start in range(0, len(services), DESCRIBE_SERVICES_MAX):
        chunk = services[start : start + DESCRIBE_SERVICES_MAX]
        try:
            answer = ecs.describe_services(cluster=cluster, services=chunk)
        except ClientError as exc:
            findings += [Finding("ecs", n, False, _aws_error(exc), "pulumi up") for n in chunk]
            continue
        found = {service["serviceName"]: service for service in answer["services"]}
        for name in chunk:
            service = found.get(name)
            if service is None:
                findings.append(
                    Finding("ecs", name, False, f"not in cluster {cluster}", "pulumi up")
                )
                continue
            arn = service["taskDefinition"]
            try:
                if arn not in definitions:
                    definitions[arn] = ecs.describe_task_definition(taskDefinition=arn)[
                        "taskDefinition"
                    ]
                containers = definitions[arn].get("containerDefinitions", [])
                image = containers[0].get("image") if containers else None
            except ClientError:
                image = None
            findings.append(service_finding(service, image, expected_image))
    return findings, list(definitions.values())


def check_image(ecr: Client, image: str) -> list[Finding]:
    """The stack's image is in its ECR repository, and its scan found nothing CRITICAL
    (ECR DescribeImages)."""
    match = ECR_IMAGE.match(image)
    if match is None:
        return [Finding("image", image, False, "not an ECR image by digest", "pulumi up")]
    repository, digest = match.groups()
    name = f"{repository}@{digest[:19]}"

    def describe() -> list[Finding]:
        [found] = ecr.describe_images(
            repositoryName=repository, imageIds=[{"imageDigest": digest}]
        )["imageDetails"]
        tags = ", ".join(found.get("imageTags", [])) or "untagged"
        scan = found.get("imageScanStatus", {}).get("status", "not scanned")
        counts = found.get("imageScanFindingsSummary", {}).get("findingSeverityCounts", {})
        detail = f"tags {tags}, scan {scan}" + "".join(
            f", {count} {severity}" for severity, count in sorted(counts.items())
        )
        if counts.get("CRITICAL", 0):
            return [
                Finding(
                    "image",
                    name,
                    False,
                    detail,
                    "rebuild on a patched base image, push, set cormorant:imageDigest, pulumi up",
                )
            ]
        return [Finding("image", name, True, detail)]

    hint = (
        "not in the repository (expired by the lifecycle policy, or never pushed): push the "
        "release again, or roll to a kept one (docs/deploy.md)"
    )
    return _guarded("image", name, hint, describe)


# --- load balancer, Kafka, stores --------------------------------------------------------


def check_targets(elbv2: Client, target_group_arn: str) -> list[Finding]:
    """One NLB target group: at least one target, every one healthy (DescribeTargetHealth)."""
    name = target_group_arn.rsplit(":", 1)[-1].removeprefix("targetgroup/")

    def describe() -> list[Finding]:
        targets = elbv2.describe_target_health(TargetGroupArn=target_group_arn)[
            "TargetHealthDescriptions"
        ]
        return [target_finding(name, targets)]

    return _guarded("nlb", name, "pulumi up", describe)


def target_finding(name: str, targets: list[dict[str, Any]]) -> Finding:
    """The verdict on one target group from DescribeTargetHealth's descriptions."""
    states = Counter(target["TargetHealth"]["State"] for target in targets)
    if not states:
        return Finding(
            "nlb",
            name,
            False,
            "no targets",
            "no ingest task is registered: see the ecs ingest check",
        )
    detail = ", ".join(f"{count} {state}" for state, count in sorted(states.items()))
    if states["healthy"] == len(targets) - states["draining"] and states["healthy"]:
        return Finding("nlb", name, True, detail)
    reasons = sorted(
        {
            target["TargetHealth"].get("Reason", "")
            for target in targets
            if target["TargetHealth"]["State"] not in ("healthy", "draining")
        }
        - {""}
    )
    return Finding(
        "nlb",
        name,
        False,
        detail + (f" ({', '.join(reasons)})" if reasons else ""),
        "targets failing GET /ready: read the ingest tasks' log group (Kafka, PostgreSQL "
        "reachable?); targets in initial are still starting: run the doctor again",
    )


def check_kafka(kafka: Client, cluster_arn: str, topic_prefix: str) -> list[Finding]:
    """The MSK cluster ACTIVE (DescribeClusterV2), then Cormorant's core topics present
    (ListTopics; not asked while the cluster is not ACTIVE)."""
    name = cluster_arn.split("/")[1] if "/" in cluster_arn else cluster_arn
    try:
        info = kafka.describe_cluster_v2(ClusterArn=cluster_arn)["ClusterInfo"]
        state, name = info["State"], info.get("ClusterName", name)
    except ClientError as exc:
        cause = _aws_error(exc)
        return [
            Finding("msk", name, False, cause, "is mskClusterArn this stack's?"),
            Finding("topics", name, False, "not checked: no cluster", "see the msk check"),
        ]
    if state != "ACTIVE":
        wait = "MSK is still being created or updated: run the doctor again later"
        return [
            Finding("msk", name, False, state, wait),
            Finding("topics", name, False, f"not checked: the cluster is {state}", wait),
        ]

    def topics() -> list[Finding]:
        found: set[str] = set()
        token: str | None = None
        while True:
            more = {"NextToken": token} if token else {}
            page = kafka.list_topics(ClusterArn=cluster_arn, **more)
            found |= {topic["TopicName"] for topic in page.get("Topics", [])}
            token = page.get("NextToken")
            if not token:
                return [topics_finding(name, topic_prefix, found)]

    topics_hint = (
        "MSK's topic API answers for provisioned clusters only: run cormorant cloud "
        "create-topics (it creates what is missing, and exits 0 when all exist)"
    )
    return [Finding("msk", name, True, state), *_guarded("topics", name, topics_hint, topics)]


def expected_topics(topic_prefix: str) -> list[str]:
    """The core topics every deployment has, with ``topic_prefix`` (the stack's
    ``topicPrefix``): :func:`services.common.kafka.admin.core_topic_specs`'s names."""
    settings = Settings.model_construct(topic_prefix=topic_prefix)
    return [spec.name for spec in core_topic_specs(settings)]


def topics_finding(name: str, topic_prefix: str, found: set[str]) -> Finding:
    """The verdict on the cluster's topics ``found`` (ListTopics' names)."""
    expected = expected_topics(topic_prefix)
    missing = [topic for topic in expected if topic not in found]
    if missing:
        return Finding(
            "topics",
            name,
            False,
            f"missing {', '.join(missing)}",
            "cormorant cloud create-topics --stack-outputs <file>",
        )
    return Finding("topics", name, True, f"all {len(expected)} core topics present")


# --- alarms ------------------------------------------------------------------------------


def check_alarms(
    cloudwatch: Client, sns: Client, topic_arn: str, alarm_prefix: str
) -> list[Finding]:
    """The stack's alarms (names starting ``alarm_prefix``) all send to ``topic_arn``
    (CloudWatch DescribeAlarms), and the topic has a confirmed subscription (SNS
    ListSubscriptionsByTopic)."""
    topic = topic_arn.rsplit(":", 1)[-1]

    def alarms() -> list[Finding]:
        found: list[dict[str, Any]] = []
        for page in cloudwatch.get_paginator("describe_alarms").paginate(
            AlarmNamePrefix=alarm_prefix, AlarmTypes=["MetricAlarm", "CompositeAlarm"]
        ):
            found += page.get("MetricAlarms", []) + page.get("CompositeAlarms", [])
        return [alarms_finding(topic, topic_arn, found)]

    def subscriptions() -> list[Finding]:
        found: list[dict[str, Any]] = []
        for page in sns.get_paginator("list_subscriptions_by_topic").paginate(TopicArn=topic_arn):
            found += page.get("Subscriptions", [])
        return [subscription_finding(topic, found)]

    return [
        *_guarded("alarms", topic, "pulumi up", alarms),
        *_guarded("subscription", topic, "is alarmTopicArn this stack's?", subscriptions),
    ]


def alarms_finding(topic: str, topic_arn: str, alarms: list[dict[str, Any]]) -> Finding:
    """The verdict on the stack's ``alarms`` (DescribeAlarms' MetricAlarms)."""
    if not alarms:
        return Finding("alarms", topic, False, "the stack has no alarms", "pulumi up")
    unwired = [a["AlarmName"] for a in alarms if topic_arn not in a.get("AlarmActions", [])]
    if unwired:
        return Finding(
            "alarms",
            topic,
            False,
            f"{len(unwired)} of {len(alarms)} alarms do not notify the topic: "
            + ", ".join(unwired[:3])
            + (" ..." if len(unwired) > 3 else ""),
            "changed outside Pulumi: pulumi up puts their actions back",
        )
    return Finding("alarms", topic, True, f"{len(alarms)} alarms notify the topic")


def subscription_finding(topic: str, subscriptions: list[dict[str, Any]]) -> Finding:
    """The verdict on the topic's ``subscriptions`` (ListSubscriptionsByTopic): a pending
    one's ``SubscriptionArn`` is ``PendingConfirmation``, a confirmed one's an ARN."""
    confirmed = [s for s in subscriptions if s.get("SubscriptionArn", "").startswith("arn:")]
    pending = [s for s in subscriptions if s.get("SubscriptionArn") == "PendingConfirmation"]
    detail = f"{len(confirmed)} confirmed, {len(pending)} pending confirmation"
    if confirmed:
        protocols = ", ".join(sorted({s.get("Protocol", "?") for s in confirmed}))
        return Finding("subscription", topic, True, f"{detail} ({protocols})")
    hint = (
        "follow the link AWS mailed to cormorant:alarmEmail (SNS deletes a subscription "
        "left unconfirmed for 48 hours: then pulumi refresh and pulumi up make it again)"
        if pending
        else "set cormorant:alarmEmail and pulumi up, or subscribe your pager to the topic"
    )
    return Finding("subscription", topic, False, f"{detail}: no alarm reaches anyone", hint)


# --- secrets -----------------------------------------------------------------------------


def secret_arns(outputs: StackOutputs, task_definitions: Iterable[dict[str, Any]]) -> list[str]:
    """Every Secrets Manager secret the stack names: the outputs' and those the task
    definitions have ECS inject (``secrets[].valueFrom``) or the tasks read themselves
    (``*_SECRET_ARN`` variables); each ARN once, sorted."""
    found = {
        arn for arn in (outputs.admin_credentials_secret_arn, outputs.kafka_scram_secret_arn) if arn
    }
    for definition in task_definitions:
        for container in definition.get("containerDefinitions", []):
            references = [s.get("valueFrom", "") for s in container.get("secrets", [])]
            references += [
                e.get("value", "")
                for e in container.get("environment", [])
                if e.get("name", "").endswith("_SECRET_ARN")
            ]
            found |= {m.group(1) for m in map(SECRET_ARN.match, references) if m}
    return sorted(found)


def check_secrets(secretsmanager: Client, arns: list[str]) -> list[Finding]:
    """Each secret exists and is not scheduled for deletion (DescribeSecret: names and
    dates only; no value is read)."""
    findings: list[Finding] = []
    for arn in arns:
        name = arn.rsplit(":", 1)[-1]

        def describe(arn: str = arn, name: str = name) -> list[Finding]:
            secret = secretsmanager.describe_secret(SecretId=arn)
            if secret.get("DeletedDate"):
                return [
                    Finding(
                        "secrets",
                        name,
                        False,
                        "scheduled for deletion",
                        f"aws secretsmanager restore-secret --secret-id {arn}",
                    )
                ]
            changed = secret.get("LastChangedDate") or secret.get("CreatedDate")
            when = f", last changed {changed:%Y-%m-%d}" if changed else ""
            return [Finding("secrets", name, True, f"present{when}")]

        findings += _guarded("secrets", name, "pulumi up (or restore it)", describe)
    return findings


# --- all ---------------------------------------------------------------------------------


def diagnose(outputs: StackOutputs, clients: DoctorClients) -> list[Finding]:
    """Every check of the deployed stack ``outputs`` describes, in the order a device's
    connection depends on them.

    Raises ``botocore.exceptions.BotoCoreError`` when AWS cannot be asked at all (no
    credentials, no network); an error answer for one check is that check's finding.
    """
    services, definitions = check_services(
        clients.ecs, outputs.ecs_cluster, outputs.ecs_services, outputs.service_image
    )
    findings = [
        *[f for arn in outputs.target_group_arns for f in check_targets(clients.elbv2, arn)],
        *services,
        *(check_image(clients.ecr, outputs.service_image) if outputs.service_image else []),
        *check_kafka(clients.kafka, outputs.msk_cluster_arn, outputs.topic_prefix),
        *[_from_status(check_cache(clients.elasticache, outputs.redis_replication_group_id))],
        *[_from_status(check_database(clients.rds, outputs.db_instance_identifier))],
    ]
    if outputs.alarm_topic_arn and outputs.alarm_name_prefix:
        findings += check_alarms(
            clients.cloudwatch, clients.sns, outputs.alarm_topic_arn, outputs.alarm_name_prefix
        )
    findings += check_secrets(clients.secretsmanager, secret_arns(outputs, definitions))
    return findings


def _from_status(check: Check) -> Finding:
    """A :class:`services.cloud.status.Check` of a data store as a finding with a hint."""
    hint = "" if check.ok else "still being created or modified: run the doctor again later"
    return Finding(check.part, check.name, check.ok, f"{check.state}, {check.detail}", hint)
