"""The ECS task an ingest node runs in: its task id names the node.

Every task of an autoscaled ECS service runs the same command with the same environment,
but each ingest node needs its own node id (it names the node's downlink topic). The ECS
task id is unique, and it is also the suffix of the task's CloudWatch log stream, so an
operator finds a node's logs by its id. ECS gives each container the URL of its task
metadata endpoint (version 4) in ``ECS_CONTAINER_METADATA_URI_V4``; ``GET <url>/task``
answers a JSON object whose ``TaskARN`` ends with the task id.
"""

from __future__ import annotations

import json
import os
import re
import urllib.request
from collections.abc import Mapping

METADATA_ENV = "ECS_CONTAINER_METADATA_URI_V4"
"""The environment variable ECS sets to the task metadata endpoint (v4) of a container."""

#: Seconds the metadata endpoint (link-local, on the task's own host) may take to answer.
METADATA_TIMEOUT = 5.0

_TASK_ARN = re.compile(
    r"^arn:aws[a-z-]*:ecs:[a-z0-9-]+:\d{12}:task/(?:[^/]+/)?([A-Za-z0-9_-]{1,64})$"
)


class NotInEcsTask(RuntimeError):
    """The process does not run in an ECS task (no metadata endpoint), or its answer is
    not a task's."""


def task_id_from_arn(task_arn: str) -> str:
    """The task id at the end of an ECS task ARN.

    Both ARN formats are accepted: ``arn:aws:ecs:<region>:<account>:task/<cluster>/<id>``
    and the older ``.../task/<id>``. Raises :class:`NotInEcsTask` for anything else.
    """
    match = _TASK_ARN.match(task_arn)
    if match is None:
        raise NotInEcsTask(f"not an ECS task ARN: {task_arn!r}")
    return match.group(1)


def task_id(environ: Mapping[str, str] = os.environ) -> str:
    """The id of the ECS task this process runs in, from the task metadata endpoint (v4).

    Raises :class:`NotInEcsTask` when ``ECS_CONTAINER_METADATA_URI_V4`` is not set, the
    endpoint does not answer within :data:`METADATA_TIMEOUT` seconds, or its answer has no
    task ARN.
    """
    base = environ.get(METADATA_ENV)
    if not base:
        raise NotInEcsTask(f"{METADATA_ENV} is not set: not running in an ECS task")
    try:
        with urllib.request.urlopen(f"{base}/task", timeout=METADATA_TIMEOUT) as answer:
            document = json.load(answer)
    except (OSError, ValueError) as exc:
        raise NotInEcsTask(f"ECS task metadata at {base}/task: {exc}") from exc
    arn = document.get("TaskARN") if isinstance(document, dict) else None
    if not isinstance(arn, str):
        raise NotInEcsTask(f"ECS task metadata at {base}/task has no TaskARN")
    return task_id_from_arn(arn)
