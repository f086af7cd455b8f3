"""``cormorant cloud status`` against moto's AWS (``mock_aws``): a stack built with boto3.

moto models ECS services (running counts through its documented ``MOTO_ECS_SERVICE_RUNNING``
switch), NLB target health, ElastiCache replication groups, RDS and EMR Serverless. It
keeps an MSK cluster in CREATING forever (moto 5.2 has no state transitions for MSK), so the
test of a healthy stack answers that one call, DescribeClusterV2, with botocore's Stubber.
(moto also names an MSK cluster's ARN without its name and lists one member of a Redis
replication group whatever its node count; the checks do not depend on either.)
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from click.testing import CliRunner
from moto import mock_aws

from services.cli import main
from services.cloud.outputs import OutputsError, StackOutputs
from services.cloud.status import Check, Clients, stack_status
from services.command_names import SERVICE_COMMANDS

REGION = "eu-west-1"


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """moto in place of AWS, with fake credentials (nothing leaves the process)."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": REGION,
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with mock_aws():
        yield


def build_stack(
    running: int,
    monkeypatch: pytest.MonkeyPatch,
    container: Callable[[str], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A Cormorant-shaped stack in moto (what infra/ would have made); its outputs.
    ``container`` gives each service command's container definition (default: a name and
    an image tag)."""
    monkeypatch.setenv("MOTO_ECS_SERVICE_RUNNING", str(running))
    ec2 = boto3.client("ec2", REGION)
    vpc = ec2.create_vpc(CidrBlock="10.40.0.0/16")["Vpc"]["VpcId"]
    subnets = [
        ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.40.{i}.0/24", AvailabilityZone=f"{REGION}{z}")[
            "Subnet"
        ]["SubnetId"]
        for i, z in enumerate("abc")
    ]
    group = ec2.create_security_group(GroupName="stages", Description="stages", VpcId=vpc)
    ecs = boto3.client("ecs", REGION)
    ecs.create_cluster(clusterName="cormorant-prod")
    for command in SERVICE_COMMANDS:
        definition = ecs.register_task_definition(
            family=f"cormorant-prod-{command}",
            networkMode="awsvpc",
            requiresCompatibilities=["FARGATE"],
            cpu="512",
            memory="1024",
            containerDefinitions=[
                container(command)
                if container
                else {"name": command, "image": f"cormorant:0.1.0-{command}"}
            ],
        )["taskDefinition"]["taskDefinitionArn"]
        ecs.create_service(
            cluster="cormorant-prod",
            serviceName=command,
            taskDefinition=definition,
            desiredCount=2,
            launchType="FARGATE",
            networkConfiguration={
                "awsvpcConfiguration": {"subnets": subnets, "securityGroups": [group["GroupId"]]}
            },
        )
    elbv2 = boto3.client("elbv2", REGION)
    elbv2.create_load_balancer(
        Name="cormorant-prod", Subnets=subnets, Type="network", Scheme="internet-facing"
    )
    target_group = elbv2.create_target_group(
        Name="cormorant-prod-mqtt-1883", Protocol="TCP", Port=1883, VpcId=vpc, TargetType="ip"
    )["TargetGroups"][0]["TargetGroupArn"]
    elbv2.register_targets(
        TargetGroupArn=target_group,
        Targets=[{"Id": "10.40.0.10", "Port": 1883}, {"Id": "10.40.1.10", "Port": 1883}],
    )
    msk = boto3.client("kafka", REGION).create_cluster_v2(
        ClusterName="cormorant-prod",
        Provisioned={
            "BrokerNodeGroupInfo": {"InstanceType": "kafka.m7g.large", "ClientSubnets": subnets},
            "KafkaVersion": "3.9.x",
            "NumberOfBrokerNodes": 3,
        },
    )["ClusterArn"]
    boto3.client("elasticache", REGION).create_replication_group(
        ReplicationGroupId="cormorant-prod",
        ReplicationGroupDescription="Cormorant message store",
        Engine="redis",
        CacheNodeType="cache.r7g.large",
        NumCacheClusters=3,
        AutomaticFailoverEnabled=True,
        MultiAZEnabled=True,
    )
    boto3.client("rds", REGION).create_db_instance(
        DBInstanceIdentifier="cormorant-prod-0001",
        Engine="postgres",
        EngineVersion="16.4",
        DBInstanceClass="db.r7g.large",
        MasterUsername="cormorant",
        ManageMasterUserPassword=True,
        AllocatedStorage=100,
        MultiAZ=True,
    )
    application = boto3.client("emr-serverless", REGION).create_application(
        name="cormorant-prod-spark", releaseLabel="emr-7.12.0", type="SPARK"
    )["applicationId"]
    return {
        "region": REGION,
        "ecsCluster": "cormorant-prod",
        "ecsServices": list(SERVICE_COMMANDS),
        "targetGroupArns": [target_group],
        "mskClusterArn": msk,
        "redisReplicationGroupId": "cormorant-prod",
        "dbInstanceIdentifier": "cormorant-prod-0001",
        "emrApplicationId": application,
        "topicsTaskDefinition": "arn:aws:ecs:eu-west-1:123456789012:task-definition/t:1",
        "taskSubnetIds": subnets,
        "taskSecurityGroupId": group["GroupId"],
        "logGroups": {"create-topics": "/cormorant/cormorant-prod/create-topics"},
        "mqttEndpoints": ["mqtts://nlb.example:8883"],
        "kafkaBootstrap": "b-1.example:9096",
        "archiveBucket": "cormorant-prod-archive",
    }


def run_status(outputs: dict[str, Any], tmp_path: Path, *options: str) -> Any:
    path = tmp_path / "outputs.json"
    path.write_text(json.dumps(outputs), encoding="utf-8")
    return CliRunner().invoke(main, ["cloud", "status", "--stack-outputs", str(path), *options])


def by_part(checks: list[Check]) -> dict[tuple[str, str], Check]:
    return {(check.part, check.name): check for check in checks}


def test_a_stack_still_coming_up_is_reported_part_by_part(
    aws: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    outputs = build_stack(running=1, monkeypatch=monkeypatch)
    result = run_status(outputs, tmp_path)
    assert result.exit_code == 1
    # Columns are separated by two spaces or more (a detail holds single spaces).
    rows = [re.split(r"\s{2,}", line) for line in result.output.splitlines()]
    assert rows[0] == ["PART", "NAME", "OK", "STATE", "DETAIL"]
    found = {(row[0], row[1]): row[2:] for row in rows[1:]}
    for command in SERVICE_COMMANDS:
        assert found[("ecs", command)] == [
            "NOT OK", "ACTIVE", "1/2 tasks running, deployment IN_PROGRESS"
        ]  # fmt: skip
    assert found[("msk", "cormorant-prod")] == ["NOT OK", "CREATING", "provisioned cluster"]
    [nlb] = [row[2:] for row in rows if row[0] == "nlb"]
    assert nlb == ["ok", "healthy", "2 healthy"]
    # moto lists one member cluster whatever NumCacheClusters says: the count is not checked.
    redis = found[("elasticache", "cormorant-prod")]
    assert redis[:2] == ["ok", "available"]
    assert re.fullmatch(r"\d+ nodes?, failover enabled, Multi-AZ enabled", redis[2])
    assert found[("rds", "cormorant-prod-0001")] == [
        "ok",
        "available",
        "postgres 16.4, Multi-AZ on",
    ]
    assert found[("emr-serverless", outputs["emrApplicationId"])] == [
        "ok", "STARTED", "cormorant-prod-spark emr-7.12.0"
    ]  # fmt: skip


def test_a_healthy_stack(aws: None, monkeypatch: pytest.MonkeyPatch) -> None:
    outputs = StackOutputs.model_validate(build_stack(running=2, monkeypatch=monkeypatch))
    clients = Clients.for_region(REGION)
    # moto cannot bring an MSK cluster to ACTIVE: this one call is answered by a Stubber.
    kafka = boto3.client("kafka", REGION)
    stubber = Stubber(kafka)
    stubber.add_response(
        "describe_cluster_v2",
        {
            "ClusterInfo": {
                "ClusterArn": outputs.msk_cluster_arn,
                "ClusterName": "cormorant-prod",
                "ClusterType": "PROVISIONED",
                "State": "ACTIVE",
            }
        },
        {"ClusterArn": outputs.msk_cluster_arn},
    )
    with stubber:
        checks = stack_status(outputs, replace(clients, kafka=kafka))
    stubber.assert_no_pending_responses()
    assert [c for c in checks if not c.ok] == []
    assert [c.part for c in checks] == [
        "nlb",
        *["ecs"] * len(SERVICE_COMMANDS),
        "msk",
        "elasticache",
        "rds",
        "emr-serverless",
    ]
    assert by_part(checks)[("ecs", "router")].detail == "2/2 tasks running, deployment COMPLETED"


def test_missing_parts_and_targets(
    aws: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    outputs = build_stack(running=2, monkeypatch=monkeypatch)
    elbv2 = boto3.client("elbv2", REGION)
    [group] = outputs["targetGroupArns"]
    elbv2.deregister_targets(
        TargetGroupArn=group,
        Targets=[{"Id": "10.40.0.10", "Port": 1883}, {"Id": "10.40.1.10", "Port": 1883}],
    )
    boto3.client("rds", REGION).delete_db_instance(
        DBInstanceIdentifier="cormorant-prod-0001", SkipFinalSnapshot=True
    )
    outputs["ecsServices"] = [*SERVICE_COMMANDS, "gateway"]
    result = run_status(outputs, tmp_path, "--json")
    assert result.exit_code == 1
    checks = {(c["part"], c["name"]): c for c in json.loads(result.output)}
    assert checks[("ecs", "gateway")] == {
        "part": "ecs", "name": "gateway", "ok": False, "state": "MISSING",
        "detail": "not in cluster cormorant-prod",
    }  # fmt: skip
    nlb = next(c for c in checks.values() if c["part"] == "nlb")
    assert (nlb["ok"], nlb["state"]) == (False, "no targets")
    rds = checks[("rds", "cormorant-prod-0001")]
    assert (rds["ok"], rds["state"]) == (False, "DBInstanceNotFound")


def test_outputs_that_are_not_a_cormorant_stack(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{not json", encoding="utf-8")
    result = CliRunner().invoke(
        main, ["cloud", "status", "--stack-outputs", str(tmp_path / "bad.json")]
    )
    assert result.exit_code == 1
    assert "Error: stack outputs are not JSON" in result.output
    with pytest.raises(OutputsError, match=r"ecsCluster \(field required\)"):
        StackOutputs.parse(json.dumps({"region": REGION}))


def test_no_credentials_is_a_clear_error(
    aws: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    outputs = build_stack(running=2, monkeypatch=monkeypatch)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    result = run_status(outputs, tmp_path)
    assert result.exit_code == 1
    assert "Error: cannot ask AWS (eu-west-1): Unable to locate credentials" in result.output
