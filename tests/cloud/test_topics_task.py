"""``cormorant cloud create-topics``: the one-off topics task started on ECS and waited for.

moto 5.2 cannot run an awsvpc (Fargate) task: its RunTask fails inside moto building the
task's network interface (``'NetworkInterface' object has no attribute
'private_dns_name'``). So ECS's two calls here, RunTask and DescribeTasks (which the
``tasks_stopped`` waiter polls), are answered with botocore's Stubber, with the shapes the
ECS API reference gives; the request parameters are checked against what the stack's
outputs say.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from services.cloud.outputs import StackOutputs
from services.cloud.topics_task import TaskFailed, log_stream, run_topics_task

CLUSTER = "cormorant-prod"
TASK_ARN = "arn:aws:ecs:eu-west-1:123456789012:task/cormorant-prod/0f1e2d3c4b5a69788796a5b4c3d2e1f0"
OUTPUTS = StackOutputs.model_validate(
    {
        "region": "eu-west-1",
        "ecsCluster": CLUSTER,
        "ecsServices": ["ingest"],
        "targetGroupArns": [],
        "mskClusterArn": "arn:aws:kafka:eu-west-1:123456789012:cluster/cormorant-prod/abc",
        "redisReplicationGroupId": "cormorant-prod",
        "dbInstanceIdentifier": "cormorant-prod-1",
        "emrApplicationId": "00f1",
        "topicsTaskDefinition": (
            "arn:aws:ecs:eu-west-1:123456789012:task-definition/cormorant-prod-create-topics:3"
        ),
        "taskSubnetIds": ["subnet-1", "subnet-2", "subnet-3"],
        "taskSecurityGroupId": "sg-stages",
        "logGroups": {"create-topics": "/cormorant/cormorant-prod/create-topics"},
        "mqttEndpoints": [],
        "kafkaBootstrap": "b-1:9096",
        "archiveBucket": "archive",
    }
)
RUN_TASK_REQUEST = {
    "cluster": CLUSTER,
    "taskDefinition": OUTPUTS.topics_task_definition,
    "launchType": "FARGATE",
    "count": 1,
    "startedBy": "cormorant-cloud",
    "networkConfiguration": {
        "awsvpcConfiguration": {
            "subnets": ["subnet-1", "subnet-2", "subnet-3"],
            "securityGroups": ["sg-stages"],
            "assignPublicIp": "DISABLED",
        }
    },
}


def task(status: str, **container: Any) -> dict[str, Any]:
    return {
        "taskArn": TASK_ARN,
        "lastStatus": status,
        "stoppedReason": "Essential container in task exited" if status == "STOPPED" else "",
        "containers": [{"name": "create-topics", **container}],
    }


@pytest.fixture
def ecs() -> Any:
    return boto3.client(
        "ecs",
        region_name="eu-west-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def test_runs_the_task_in_the_stacks_network_and_waits_for_its_exit(ecs: Any) -> None:
    stubber = Stubber(ecs)
    stubber.add_response(
        "run_task", {"tasks": [task("PROVISIONING")], "failures": []}, RUN_TASK_REQUEST
    )
    described = {"cluster": CLUSTER, "tasks": [TASK_ARN]}
    stubber.add_response("describe_tasks", {"tasks": [task("STOPPED", exitCode=0)]}, described)
    stubber.add_response("describe_tasks", {"tasks": [task("STOPPED", exitCode=0)]}, described)
    with stubber:
        result = run_topics_task(ecs, OUTPUTS, timeout=30)
    stubber.assert_no_pending_responses()
    assert result.task_arn == TASK_ARN
    assert result.log_group == "/cormorant/cormorant-prod/create-topics"
    assert result.log_stream == "create-topics/create-topics/0f1e2d3c4b5a69788796a5b4c3d2e1f0"


def test_a_failed_task_names_its_exit_code_and_logs(ecs: Any) -> None:
    stubber = Stubber(ecs)
    stubber.add_response("run_task", {"tasks": [task("PENDING")], "failures": []}, RUN_TASK_REQUEST)
    failed = {"tasks": [task("STOPPED", exitCode=1)]}
    stubber.add_response("describe_tasks", failed)
    stubber.add_response("describe_tasks", failed)
    with stubber, pytest.raises(TaskFailed) as caught:
        run_topics_task(ecs, OUTPUTS, timeout=30)
    assert str(caught.value) == (
        "the topics task exited with 1 (Essential container in task exited); logs: "
        f"/cormorant/cormorant-prod/create-topics {log_stream(TASK_ARN)}"
    )


def test_a_task_ecs_cannot_place(ecs: Any) -> None:
    stubber = Stubber(ecs)
    stubber.add_response(
        "run_task",
        {"tasks": [], "failures": [{"arn": "arn:subnet-1", "reason": "RESOURCE:ENI"}]},
        RUN_TASK_REQUEST,
    )
    with (
        stubber,
        pytest.raises(
            TaskFailed, match="ECS did not start the topics task: arn:subnet-1 RESOURCE:ENI"
        ),
    ):
        run_topics_task(ecs, OUTPUTS, timeout=30)


def test_the_command_reads_the_outputs(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from services.cli import main

    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps({"region": "eu-west-1"}), encoding="utf-8")
    result = CliRunner().invoke(main, ["cloud", "create-topics", "--stack-outputs", str(outputs)])
    assert result.exit_code == 1
    assert (
        "stack outputs lack what cormorant cloud needs: ecsCluster (field required)"
        in result.output
    )
