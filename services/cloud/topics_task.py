"""``cormorant cloud create-topics`` and ``migrate-db``: run one of the stack's one-off tasks
on ECS and wait for it.

The topics task (infra/, compute) runs ``cormorant create-topics`` in the stack's network
with the stack's Kafka settings, so the topics are created by the project's own topic
administration; the migration task runs ``cormorant migrate-db`` (the PostgreSQL schema and
the services' own role). This starts one on Fargate in the private subnets, waits until it
stops and reports its exit code; a failure names the task's log stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from botocore.exceptions import WaiterError

from services.cloud.outputs import StackOutputs
from services.command_names import MIGRATE_COMMAND, TOPICS_COMMAND

#: Seconds between two looks at the task while it runs.
POLL_SECONDS = 5


class TaskFailed(RuntimeError):
    """The one-off task did not start, did not stop in time, or exited with an error (or
    the stack has no such task)."""


@dataclass(frozen=True)
class TaskResult:
    """A stopped one-off task: its ARN and the log group and stream of its output."""

    task_arn: str
    log_group: str
    log_stream: str


TASK_NAMES = {TOPICS_COMMAND: "topics", MIGRATE_COMMAND: "migration"}
"""What the messages call each one-off task (by its command)."""


def log_stream(task_arn: str, command: str = TOPICS_COMMAND) -> str:
    """The awslogs stream of the ``command`` container of task ``task_arn``:
    ``<stream prefix>/<container name>/<task id>`` (both are the command in infra/)."""
    return f"{command}/{command}/{task_arn.rsplit('/', 1)[-1]}"


def run_topics_task(
    ecs: Any, outputs: StackOutputs, timeout: float = 600.0, command: str = TOPICS_COMMAND
) -> TaskResult:
    """Run the one-off task of ``command`` (the topics task, or :data:`MIGRATE_COMMAND`'s)
    once and wait until it stops (``timeout`` seconds at most).

    Returns the stopped task's :class:`TaskResult` when its container exited with 0.
    Raises :class:`TaskFailed` with ECS's reason when the task could not be placed, did not
    stop in time, or exited otherwise; ``botocore.exceptions.ClientError`` when ECS refuses
    the request itself.
    """
    definition = (
        outputs.migrate_task_definition
        if command == MIGRATE_COMMAND
        else outputs.topics_task_definition
    )
    task_name = TASK_NAMES[command]
    if definition is None:
        raise TaskFailed(f"the stack has no {task_name} task: run `pulumi up` with this release")
    answer = ecs.run_task(
        cluster=outputs.ecs_cluster,
        taskDefinition=definition,
        launchType="FARGATE",
        count=1,
        startedBy="cormorant-cloud",
        networkConfiguration={
            "awsvpcConfiguration": {
                "subnets": outputs.task_subnet_ids,
                "securityGroups": [outputs.task_security_group_id],
                "assignPublicIp": "DISABLED",
            }
        },
    )
    if answer.get("failures") or not answer.get("tasks"):
        reasons = ", ".join(f"{f.get('arn', '')} {f.get('reason', '')}" for f in answer["failures"])
        raise TaskFailed(f"ECS did not start the {task_name} task: {reasons or 'no task returned'}")
    task_arn = answer["tasks"][0]["taskArn"]
    result = TaskResult(
        task_arn, outputs.log_groups.get(command, ""), log_stream(task_arn, command)
    )
    logs = f"logs: {result.log_group} {result.log_stream}"
    attempts = max(1, int(timeout / POLL_SECONDS))
    try:
        ecs.get_waiter("tasks_stopped").wait(
            cluster=outputs.ecs_cluster,
            tasks=[task_arn],
            WaiterConfig={"Delay": POLL_SECONDS, "MaxAttempts": attempts},
        )
    except WaiterError as exc:
        raise TaskFailed(
            f"the {task_name} task {task_arn} did not stop within {timeout:g} s; {logs}"
        ) from exc
    [task] = ecs.describe_tasks(cluster=outputs.ecs_cluster, tasks=[task_arn])["tasks"]
    container: dict[str, Any] = next(
        (c for c in task.get("containers", []) if c.get("name") == command), {}
    )
    exit_code = container.get("exitCode")
    if exit_code != 0:
        reason = container.get("reason") or task.get("stoppedReason", "unknown")
        raise TaskFailed(f"the {task_name} task exited with {exit_code} ({reason}); {logs}")
    return result
