"""``cormorant cloud doctor`` against moto's AWS (``mock_aws``), and its verdicts on the
response shapes moto cannot produce.

moto (5.2) models what the doctor reads of ECS (services, task definitions), ECR (images),
ElastiCache, RDS, CloudWatch alarms, SNS subscriptions and Secrets Manager. It does not
model: an MSK cluster leaving CREATING, nor MSK's ListTopics (both answered here by
botocore's Stubber, as in test_status.py); an unhealthy NLB target (its IP targets are
always healthy); a deployment FAILED by the circuit breaker; an e-mail subscription
pending confirmation (moto confirms every subscription at once). Those verdicts are tested
on the response shapes the AWS API references document (DescribeTargetHealth, ListTopics,
DescribeServices' ``deployments``, ListSubscriptionsByTopic's ``PendingConfirmation``).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from click.testing import CliRunner

from services.cli import main
from services.cloud.doctor import (
    DoctorClients,
    Finding,
    diagnose,
    expected_topics,
    service_finding,
    subscription_finding,
    target_finding,
    topics_finding,
)
from services.cloud.outputs import StackOutputs
from services.command_names import SERVICE_COMMANDS
from tests.cloud.test_status import REGION, aws, build_stack

__all__ = ["aws"]  # the fixture, used by name

SECRET_VALUE = "do-not-print-this-value"


def build_deployed_stack(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The stack of test_status.py as this release deploys it: the image by digest from the
    stack's ECR repository, secrets injected and read by ARN, alarms on an SNS topic with a
    confirmed subscription; its outputs."""
    ecr = boto3.client("ecr", REGION)
    repository = ecr.create_repository(
        repositoryName="cormorant-prod", imageTagMutability="IMMUTABLE"
    )["repository"]["repositoryUri"]
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": {"digest": "sha256:" + "c" * 64, "size": 1},
            "layers": [],
        }
    )
    digest = ecr.put_image(
        repositoryName="cormorant-prod", imageManifest=manifest, imageTag="0.2.0"
    )["image"]["imageId"]["imageDigest"]
    image = f"{repository}@{digest}"
    secrets = boto3.client("secretsmanager", REGION)
    arns = {
        name: secrets.create_secret(Name=name, SecretString=SECRET_VALUE)["ARN"]
        for name in ("cormorant-prod-admin", "AmazonMSK_cormorant-prod", "cormorant-prod-pg")
    }

    def container(command: str) -> dict[str, Any]:
        return {
            "name": command,
            "image": image,
            "command": [command],
            "secrets": [
                {
                    "name": "CORMORANT_KAFKA_SASL_PASSWORD",
                    "valueFrom": f"{arns['AmazonMSK_cormorant-prod']}:password::",
                },
            ],
            "environment": [
                {
                    "name": "CORMORANT_POSTGRES_PASSWORD_SECRET_ARN",
                    "value": arns["cormorant-prod-pg"],
                }
            ],
        }

    outputs = build_stack(running=2, monkeypatch=monkeypatch, container=container)
    sns = boto3.client("sns", REGION)
    topic = sns.create_topic(Name="cormorant-prod-alarms")["TopicArn"]
    queue = boto3.client("sqs", REGION).create_queue(QueueName="pager")["QueueUrl"]
    queue_arn = boto3.client("sqs", REGION).get_queue_attributes(
        QueueUrl=queue, AttributeNames=["QueueArn"]
    )["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn)
    cloudwatch = boto3.client("cloudwatch", REGION)
    for alarm in ("cormorant-prod-rds-cpu-0a1b", "cormorant-prod-unhealthy-targets-1883-2c3d"):
        cloudwatch.put_metric_alarm(
            AlarmName=alarm,
            Namespace="AWS/RDS",
            MetricName="CPUUtilization",
            Statistic="Average",
            Period=60,
            EvaluationPeriods=3,
            Threshold=80.0,
            ComparisonOperator="GreaterThanThreshold",
            AlarmActions=[topic],
        )
    return outputs | {
        "serviceImage": image,
        "alarmTopicArn": topic,
        "alarmNamePrefix": "cormorant-prod-",
        "adminCredentialsSecretArn": arns["cormorant-prod-admin"],
        "kafkaScramSecretArn": arns["AmazonMSK_cormorant-prod"],
    }


def stubbed_kafka(outputs: dict[str, Any], topics: list[str]) -> tuple[Any, Stubber]:
    """A Kafka client whose DescribeClusterV2 says ACTIVE and ListTopics lists ``topics``
    (in two pages), as MSK answers: moto has neither."""
    kafka = boto3.client("kafka", REGION)
    stubber = Stubber(kafka)
    arn = outputs["mskClusterArn"]
    stubber.add_response(
        "describe_cluster_v2",
        {"ClusterInfo": {"ClusterArn": arn, "ClusterName": "cormorant-prod", "State": "ACTIVE"}},
        {"ClusterArn": arn},
    )
    half = len(topics) // 2
    stubber.add_response(
        "list_topics",
        {"Topics": [{"TopicName": t} for t in topics[:half]], "NextToken": "page-2"},
        {"ClusterArn": arn},
    )
    stubber.add_response(
        "list_topics",
        {"Topics": [{"TopicName": t} for t in topics[half:]]},
        {"ClusterArn": arn, "NextToken": "page-2"},
    )
    return kafka, stubber


def test_a_ready_stack_passes_every_check(aws: None, monkeypatch: pytest.MonkeyPatch) -> None:
    outputs = build_deployed_stack(monkeypatch)
    clients = DoctorClients.for_region(REGION)
    kafka, stubber = stubbed_kafka(outputs, [*expected_topics(""), "msg.downlink.ingest-1"])
    with stubber:
        findings = diagnose(StackOutputs.model_validate(outputs), replace(clients, kafka=kafka))
    stubber.assert_no_pending_responses()
    assert [f for f in findings if not f.ok] == []
    checks = [f.check for f in findings]
    assert checks == [
        "nlb", *["ecs"] * len(SERVICE_COMMANDS), "image", "msk", "topics", "elasticache",
        "rds", "alarms", "subscription", "secrets", "secrets", "secrets",
    ]  # fmt: skip
    by_check = {f.check: f for f in findings}
    assert by_check["subscription"].detail == "1 confirmed, 0 pending confirmation (sqs)"
    assert by_check["topics"].detail == f"all {len(expected_topics(''))} core topics present"
    assert by_check["alarms"].detail == "2 alarms notify the topic"


def test_what_breaks_a_deployment_fails_with_a_hint(
    aws: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    outputs = build_deployed_stack(monkeypatch)
    # The services run an older image than the stack declares (a rollback), the topic
    # lost its only subscription, an alarm lost its action, a secret is scheduled for
    # deletion; MSK is still CREATING in moto.
    outputs["serviceImage"] = outputs["serviceImage"].split("@")[0] + "@sha256:" + "e" * 64
    sns = boto3.client("sns", REGION)
    [confirmed] = sns.list_subscriptions_by_topic(TopicArn=outputs["alarmTopicArn"])[
        "Subscriptions"
    ]
    sns.unsubscribe(SubscriptionArn=confirmed["SubscriptionArn"])
    boto3.client("cloudwatch", REGION).put_metric_alarm(
        AlarmName="cormorant-prod-rds-memory-4e5f",
        Namespace="AWS/RDS",
        MetricName="FreeableMemory",
        Statistic="Average",
        Period=60,
        EvaluationPeriods=3,
        Threshold=1.0,
        ComparisonOperator="LessThanThreshold",
    )
    boto3.client("secretsmanager", REGION).delete_secret(
        SecretId=outputs["adminCredentialsSecretArn"], RecoveryWindowInDays=7
    )
    path = tmp_path / "outputs.json"
    path.write_text(json.dumps(outputs), encoding="utf-8")
    result = CliRunner().invoke(main, ["cloud", "doctor", "--stack-outputs", str(path), "--json"])
    assert result.exit_code == 1, result.output
    assert SECRET_VALUE not in result.output
    failed = {(f["check"], f["name"]): f for f in json.loads(result.output) if not f["ok"]}
    for command in SERVICE_COMMANDS:
        ecs = failed[("ecs", command)]
        assert "the stack declares" in ecs["detail"] and "rolled the release back" in ecs["hint"]
    [subscription] = [f for (check, _), f in failed.items() if check == "subscription"]
    assert subscription["detail"] == "0 confirmed, 0 pending confirmation: no alarm reaches anyone"
    assert "set cormorant:alarmEmail" in subscription["hint"]
    [alarms] = [f for (check, _), f in failed.items() if check == "alarms"]
    assert alarms["detail"] == (
        "1 of 3 alarms do not notify the topic: cormorant-prod-rds-memory-4e5f"
    )
    [secret] = [f for (check, _), f in failed.items() if check == "secrets"]
    assert secret["detail"] == "scheduled for deletion" and "restore-secret" in secret["hint"]
    assert failed[("msk", "cormorant-prod")]["detail"] == "CREATING"
    assert failed[("topics", "cormorant-prod")]["detail"] == "not checked: the cluster is CREATING"
    # The same, for people: one line per check.
    lines = CliRunner().invoke(main, ["cloud", "doctor", "--stack-outputs", str(path)]).output
    assert "FAIL subscription cormorant-prod-alarms: 0 confirmed, 0 pending" in lines
    assert "OK   rds cormorant-prod-0001: available" in lines


def test_missing_topics_say_to_run_the_topics_task() -> None:
    finding = topics_finding("c", "mqtt.", {"mqtt.msg.all", "mqtt.client.acks"})
    assert not finding.ok and finding.detail.startswith("missing mqtt.msg.persisted, ")
    assert finding.hint == "cormorant cloud create-topics --stack-outputs <file>"


@pytest.mark.parametrize(
    ("states", "ok", "detail"),
    [
        ([("healthy", None), ("healthy", None)], True, "2 healthy"),
        ([("healthy", None), ("draining", "Target.DeregistrationInProgress")], True,
         "1 draining, 1 healthy"),
        ([("healthy", None), ("unhealthy", "Target.FailedHealthChecks")], False,
         "1 healthy, 1 unhealthy (Target.FailedHealthChecks)"),
        ([("initial", "Elb.RegistrationInProgress")], False,
         "1 initial (Elb.RegistrationInProgress)"),
        ([], False, "no targets"),
    ],
)  # fmt: skip
def test_target_health_verdicts(
    states: list[tuple[str, str | None]], ok: bool, detail: str
) -> None:
    targets = [
        {
            "Target": {"Id": f"10.40.0.{i}", "Port": 1883},
            "TargetHealth": {"State": state, **({"Reason": reason} if reason else {})},
        }
        for i, (state, reason) in enumerate(states)
    ]
    finding = target_finding("mqtt-1883", targets)
    assert (finding.ok, finding.detail) == (ok, detail)
    assert bool(finding.hint) is not ok


IMAGE = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/cormorant-prod@sha256:" + "a" * 64


def service(**changes: Any) -> dict[str, Any]:
    """A steady service as DescribeServices returns it, with ``changes``."""
    return {
        "serviceName": "ingest",
        "status": "ACTIVE",
        "runningCount": 3,
        "desiredCount": 3,
        "taskDefinition": "arn:aws:ecs:eu-west-1:123456789012:task-definition/ingest:7",
        "deployments": [{"status": "PRIMARY", "rolloutState": "COMPLETED"}],
    } | changes


@pytest.mark.parametrize(
    ("changes", "detail", "hint"),
    [
        ({}, "3/3 tasks running, deployment COMPLETED, image sha256:aaaaaaaaaaaa", ""),
        (
            {"deployments": [
                {"status": "PRIMARY", "rolloutState": "IN_PROGRESS"},
                {"status": "ACTIVE", "rolloutState": "FAILED",
                 "rolloutStateReason": "ECS deployment circuit breaker: tasks failed to start."},
            ]},
            "3/3 tasks running, deployment IN_PROGRESS; a deployment FAILED: ECS deployment "
            "circuit breaker: tasks failed to start.",
            "the deployment circuit breaker stopped it",
        ),
        (
            {"runningCount": 1, "deployments": [
                {"status": "PRIMARY", "rolloutState": "IN_PROGRESS"},
                {"status": "ACTIVE", "rolloutState": "COMPLETED"},
            ]},
            "1/3 tasks running, deployment IN_PROGRESS, 2 deployment(s)",
            "ECS is still deploying",
        ),
        ({"runningCount": 0, "desiredCount": 0}, "0/0 tasks running, deployment COMPLETED",
         "pulumi config rm cormorant:bootstrap"),
    ],
)  # fmt: skip
def test_service_verdicts(changes: dict[str, Any], detail: str, hint: str) -> None:
    finding = service_finding(service(**changes), IMAGE, IMAGE)
    assert finding.detail == detail
    assert finding.ok is (hint == "")
    assert hint in finding.hint


def test_only_a_confirmed_subscription_counts() -> None:
    pending = {"SubscriptionArn": "PendingConfirmation", "Protocol": "email"}
    confirmed = {
        "SubscriptionArn": "arn:aws:sns:eu-west-1:123456789012:alarms:0a1b2c3d",
        "Protocol": "email",
    }
    assert subscription_finding("alarms", [pending]) == Finding(
        "subscription", "alarms", False,
        "0 confirmed, 1 pending confirmation: no alarm reaches anyone",
        "follow the link AWS mailed to cormorant:alarmEmail (SNS deletes a subscription "
        "left unconfirmed for 48 hours: then pulumi refresh and pulumi up make it again)",
    )  # fmt: skip
    assert subscription_finding("alarms", [pending, confirmed]).ok
    assert "set cormorant:alarmEmail" in subscription_finding("alarms", []).hint
