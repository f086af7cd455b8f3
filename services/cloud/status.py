"""``cormorant cloud status``: is the deployed stack healthy? One check per part, read with boto3.

ECS services (running vs desired tasks, deployment rollout), the NLB's target groups
(target health), MSK, ElastiCache and RDS (their state), and the EMR Serverless
application. Each check answers ok or not with the state AWS reports; an AWS error for one
part (missing resource, access denied) makes that part not ok, not the whole report.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from botocore.exceptions import ClientError

from services.cloud.outputs import StackOutputs

Client = Any
"""A boto3 client (boto3 ships no type information)."""

EMR_READY_STATES = frozenset({"CREATED", "STARTED", "STARTING", "STOPPED", "STOPPING"})
"""EMR Serverless application states in which a job can be submitted (a stopped application
starts itself on submission)."""


@dataclass(frozen=True, slots=True)
class Check:
    """One part's verdict: ``part`` (``ecs``, ``nlb``, ``msk``...), the resource ``name``,
    ``ok``, the ``state`` AWS reports and a human ``detail``."""

    part: str
    name: str
    ok: bool
    state: str
    detail: str

    def as_dict(self) -> dict[str, object]:
        """The check as a JSON object."""
        return asdict(self)


@dataclass(frozen=True)
class Clients:
    """The boto3 clients the checks use (one region)."""

    ecs: Client
    elbv2: Client
    kafka: Client
    elasticache: Client
    rds: Client
    emr_serverless: Client

    @classmethod
    def for_region(cls, region: str, session: Any = None) -> Clients:
        """Clients for ``region`` from ``session`` (default: boto3's, credentials from the
        usual environment, profile or instance role)."""
        import boto3

        session = session or boto3.session.Session()
        return cls(
            **{
                field: session.client(service, region_name=region)
                for field, service in (
                    ("ecs", "ecs"),
                    ("elbv2", "elbv2"),
                    ("kafka", "kafka"),
                    ("elasticache", "elasticache"),
                    ("rds", "rds"),
                    ("emr_serverless", "emr-serverless"),
                )
            }
        )


def _guarded(part: str, name: str, check: Callable[[], Check]) -> Check:
    """``check()``, or a failed check carrying AWS's error."""
    try:
        return check()
    except ClientError as exc:
        error = exc.response.get("Error", {})
        return Check(part, name, False, error.get("Code", "error"), error.get("Message", str(exc)))


def check_services(ecs: Client, cluster: str, services: list[str]) -> list[Check]:
    """Each ECS service: ok when active, running at least its desired count (one or more)
    and its primary deployment has completed (ECS DescribeServices)."""

    def describe() -> list[Check]:
        answer = ecs.describe_services(cluster=cluster, services=services)
        found = {service["serviceName"]: service for service in answer["services"]}
        checks = []
        for name in services:
            service = found.get(name)
            if service is None:
                checks.append(Check("ecs", name, False, "MISSING", f"not in cluster {cluster}"))
                continue
            running, desired = service["runningCount"], service["desiredCount"]
            primary: dict[str, Any] = next(
                (d for d in service.get("deployments", []) if d.get("status") == "PRIMARY"), {}
            )
            rollout = primary.get("rolloutState", "COMPLETED")
            ok = service["status"] == "ACTIVE" and desired > 0 and running >= desired
            ok = ok and rollout == "COMPLETED"
            detail = f"{running}/{desired} tasks running, deployment {rollout}"
            checks.append(Check("ecs", name, ok, service["status"], detail))
        return checks

    try:
        return describe()
    except ClientError as exc:
        error = exc.response.get("Error", {})
        message = error.get("Message", str(exc))
        return [Check("ecs", name, False, error.get("Code", "error"), message) for name in services]


def check_targets(elbv2: Client, target_group_arn: str) -> Check:
    """One NLB target group: ok when it has healthy targets and none unhealthy
    (ELBv2 DescribeTargetHealth)."""
    name = target_group_arn.rsplit(":", 1)[-1]

    def describe() -> Check:
        answer = elbv2.describe_target_health(TargetGroupArn=target_group_arn)
        states = Counter(
            target["TargetHealth"]["State"] for target in answer["TargetHealthDescriptions"]
        )
        if not states:
            return Check("nlb", name, False, "no targets", "no ingest task registered")
        detail = ", ".join(f"{count} {state}" for state, count in sorted(states.items()))
        ok = states["healthy"] > 0 and states["unhealthy"] == 0
        return Check("nlb", name, ok, "healthy" if ok else "unhealthy", detail)

    return _guarded("nlb", name, describe)


def check_kafka(kafka: Client, cluster_arn: str) -> Check:
    """The MSK cluster (provisioned or serverless): ok when ACTIVE (Kafka DescribeClusterV2)."""
    name = cluster_arn.split("/")[1] if "/" in cluster_arn else cluster_arn

    def describe() -> Check:
        info = kafka.describe_cluster_v2(ClusterArn=cluster_arn)["ClusterInfo"]
        state = info["State"]
        detail = f"{info['ClusterType'].lower()} cluster"
        return Check("msk", info.get("ClusterName", name), state == "ACTIVE", state, detail)

    return _guarded("msk", name, describe)


def check_cache(elasticache: Client, group_id: str) -> Check:
    """The Redis replication group: ok when available with automatic failover on
    (ElastiCache DescribeReplicationGroups)."""

    def describe() -> Check:
        [group] = elasticache.describe_replication_groups(ReplicationGroupId=group_id)[
            "ReplicationGroups"
        ]
        failover = group.get("AutomaticFailover", "disabled")
        multi_az = group.get("MultiAZ", "disabled")
        nodes = len(group.get("MemberClusters", []))
        ok = group["Status"] == "available" and failover == "enabled"
        plural = "" if nodes == 1 else "s"
        detail = f"{nodes} node{plural}, failover {failover}, Multi-AZ {multi_az}"
        return Check("elasticache", group_id, ok, group["Status"], detail)

    return _guarded("elasticache", group_id, describe)


def check_database(rds: Client, identifier: str) -> Check:
    """The PostgreSQL instance: ok when available (RDS DescribeDBInstances)."""

    def describe() -> Check:
        [instance] = rds.describe_db_instances(DBInstanceIdentifier=identifier)["DBInstances"]
        status = instance["DBInstanceStatus"]
        detail = (
            f"{instance['Engine']} {instance.get('EngineVersion', '')}".strip()
            + f", Multi-AZ {'on' if instance.get('MultiAZ') else 'off'}"
        )
        return Check("rds", identifier, status == "available", status, detail)

    return _guarded("rds", identifier, describe)


def check_analytics(emr_serverless: Client, application_id: str) -> Check:
    """The EMR Serverless application: ok in a state that takes jobs (GetApplication)."""

    def describe() -> Check:
        application = emr_serverless.get_application(applicationId=application_id)["application"]
        state = application["state"]
        detail = f"{application.get('name', '')} {application.get('releaseLabel', '')}".strip()
        return Check("emr-serverless", application_id, state in EMR_READY_STATES, state, detail)

    return _guarded("emr-serverless", application_id, describe)


def stack_status(outputs: StackOutputs, clients: Clients) -> list[Check]:
    """Every check of the stack, in the order a request crosses the parts.

    Raises ``botocore.exceptions.BotoCoreError`` when AWS cannot be asked at all (no
    credentials, no network); an error answer for one part is that part's check.
    """
    return [
        *[check_targets(clients.elbv2, arn) for arn in outputs.target_group_arns],
        *check_services(clients.ecs, outputs.ecs_cluster, outputs.ecs_services),
        check_kafka(clients.kafka, outputs.msk_cluster_arn),
        check_cache(clients.elasticache, outputs.redis_replication_group_id),
        check_database(clients.rds, outputs.db_instance_identifier),
        check_analytics(clients.emr_serverless, outputs.emr_application_id),
    ]
