"""The ingest node's id from its ECS task (services/cloud/ecs_task.py)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from services.cli import main
from services.cloud.ecs_task import NotInEcsTask, task_id, task_id_from_arn
from services.common.settings import Settings


@pytest.mark.parametrize(
    ("arn", "expected"),
    [
        (
            "arn:aws:ecs:eu-west-1:123456789012:task/cormorant-prod/0f1e2d3c4b5a69788796a5b4c3d2e1f0",
            "0f1e2d3c4b5a69788796a5b4c3d2e1f0",
        ),
        (
            "arn:aws:ecs:us-east-1:123456789012:task/1234abcd-12ab-34cd-56ef-1234567890ab",
            "1234abcd-12ab-34cd-56ef-1234567890ab",
        ),
        ("arn:aws-cn:ecs:cn-north-1:123456789012:task/c/abc", "abc"),
    ],
)
def test_task_id_from_arn_is_a_valid_node_id(arn: str, expected: str) -> None:
    assert task_id_from_arn(arn) == expected
    assert Settings(node_id=task_id_from_arn(arn)).node_id == expected


@pytest.mark.parametrize(
    "arn",
    [
        "",
        "arn:aws:ecs:eu-west-1:123456789012:service/cormorant/router",
        "arn:aws:ecs:eu-west-1:123456789012:task/cluster/id with space",
        "arn:aws:s3:::bucket",
    ],
)
def test_anything_but_a_task_arn_is_refused(arn: str) -> None:
    with pytest.raises(NotInEcsTask, match="not an ECS task ARN"):
        task_id_from_arn(arn)


def test_outside_ecs_there_is_no_task_id() -> None:
    with pytest.raises(NotInEcsTask, match="ECS_CONTAINER_METADATA_URI_V4 is not set"):
        task_id({})


def test_node_id_options_exclude_each_other() -> None:
    result = CliRunner().invoke(main, ["ingest", "--node-id", "n1", "--node-id-from-pool"])
    assert result.exit_code == 2
    assert "--node-id and --node-id-from-pool exclude each other" in result.output
