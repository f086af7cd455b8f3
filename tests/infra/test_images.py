"""Issue 24 part 2, images as code, under Pulumi's mocks: the stack's own ECR repository
(immutable tags, scan on push, KMS, a lifecycle policy) and every task run by digest."""

from __future__ import annotations

import json
from typing import Any

import pytest

import cormorant_policies as rules
from cormorant_infra import compute, images
from cormorant_infra.config import ConfigError, from_values
from services.command_names import SERVICE_COMMANDS
from tests.infra.mocks import Deployment, as_pulumi_config, deploy, stack_file_values
from tests.infra.test_policies import check
from tests.infra.test_stack import TASK_DEFINITION, containers, policy_documents

REPOSITORY = "aws:ecr/repository:Repository"
LIFECYCLE = "aws:ecr/lifecyclePolicy:LifecyclePolicy"
OTHER_DIGEST = "sha256:" + "0123456789abcdef" * 4


def services_repository(deployment: Deployment, stack: str) -> Any:
    return deployment.named(REPOSITORY, f"cormorant-{stack}")


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_the_repository_is_immutable_scanned_encrypted_and_pruned(
    stack: str, request: pytest.FixtureRequest
) -> None:
    deployment: Deployment = request.getfixturevalue(stack)
    repository = services_repository(deployment, stack)
    assert repository.inputs["name"] == f"cormorant-{stack}"
    assert repository.inputs["imageTagMutability"] == "IMMUTABLE"
    assert repository.inputs["imageScanningConfiguration"] == {"scanOnPush": True}
    assert repository.inputs["encryptionConfigurations"] == [{"encryptionType": "KMS"}]
    # A production repository is protected and never emptied by `pulumi destroy`.
    assert repository.protect is (stack == "prod")
    assert repository.inputs["forceDelete"] is (stack == "dev")
    assert deployment.outputs["imageRepository"] == repository.outputs["repositoryUrl"]
    [lifecycle] = [
        p for p in deployment.of_type(LIFECYCLE) if p.inputs["repository"] == f"cormorant-{stack}"
    ]
    untagged, newest = json.loads(lifecycle.inputs["policy"])["rules"]
    assert untagged["selection"] == {
        "tagStatus": "untagged",
        "countType": "sinceImagePushed",
        "countUnit": "days",
        "countNumber": images.UNTAGGED_DAYS,
    }
    # ECR evaluates a tagStatus "any" rule last: it must have the highest priority number.
    assert newest["rulePriority"] > untagged["rulePriority"]
    assert newest["selection"] == {
        "tagStatus": "any",
        "countType": "imageCountMoreThan",
        "countNumber": 30,
    }
    assert {rule["action"]["type"] for rule in (untagged, newest)} == {"expire"}


def test_every_task_runs_the_release_by_digest_from_the_stacks_repository(
    deployment: Deployment,
) -> None:
    [repository] = [r for r in deployment.of_type(REPOSITORY) if "spark" not in r.name]
    digest = stack_file_values("prod")["cormorant:imageDigest"]
    image = f"{repository.outputs['repositoryUrl']}@{digest}"
    assert deployment.outputs["serviceImage"] == image
    found = containers(deployment)
    assert set(found) == {*SERVICE_COMMANDS, *compute.ONE_OFF_COMMANDS}
    for command, container in found.items():
        # One image; the entry point is `cormorant`, the command says which one runs.
        assert container["image"] == image, command
        assert container["command"][0] == command
    # Every execution role may pull from that repository, and from no other.
    pulls = [
        statement["Resource"]
        for name, document in policy_documents(deployment).items()
        if name.endswith("-execution")
        for statement in document["Statement"]
        if "ecr:BatchGetImage" in statement["Action"]
    ]
    assert pulls == [[repository.outputs["arn"]]] * len(found)


def test_a_new_digest_is_a_new_revision_of_every_task_definition(dev: Deployment) -> None:
    values = stack_file_values("dev") | {"cormorant:imageDigest": OTHER_DIGEST}
    released = deploy("dev", values)

    def definitions(deployment: Deployment) -> dict[str, str]:
        return {
            d.name: d.inputs["containerDefinitions"] for d in deployment.of_type(TASK_DEFINITION)
        }

    before, after = definitions(dev), definitions(released)
    # A changed container definition is a new task definition revision: ECS deploys it.
    assert before.keys() == after.keys()
    assert all(before[name] != after[name] for name in before)
    assert all(json.loads(after[name])[0]["image"].endswith(OTHER_DIGEST) for name in after)


def refused(values: dict[str, Any]) -> str:
    raw = {
        key.removeprefix("cormorant:"): value
        for key, value in stack_file_values("dev").items()
        if key.startswith("cormorant:")
    }
    with pytest.raises(ConfigError) as caught:
        from_values(as_pulumi_config({**raw, **values}))
    return str(caught.value)


@pytest.mark.parametrize(
    ("digest", "says"),
    [
        ("0.1.0", "'0.1.0' is not an image digest: expected 'sha256:' and 64 lowercase hex"),
        ("sha256:abc", "'sha256:abc' is not an image digest"),
        ("sha256:" + "AB" * 32, "is not an image digest"),
        (
            "123456789012.dkr.ecr.eu-west-1.amazonaws.com/cormorant-dev@" + OTHER_DIGEST,
            "is an image reference, not a digest: set only the part after '@'",
        ),
    ],
)
def test_a_bad_digest_is_a_clear_error(digest: str, says: str) -> None:
    message = refused({"imageDigest": digest})
    assert "cormorant:imageDigest: " in message and says in message


def test_a_missing_digest_or_the_old_image_key_is_a_clear_error() -> None:
    values = stack_file_values("dev")
    del values["cormorant:imageDigest"]
    with pytest.raises(ConfigError, match="imageDigest is required: the digest of the release"):
        deploy("dev", values)
    message = refused({"image": "123456789012.dkr.ecr.eu-west-1.amazonaws.com/cormorant"})
    assert "cormorant:image: the stack makes its own image repository" in message


def test_a_new_stacks_first_up_makes_the_repositories_before_any_service() -> None:
    values = stack_file_values("dev") | {"cormorant:bootstrap": True}
    del values["cormorant:imageDigest"]
    first = deploy("dev", values)
    assert {r.name for r in first.of_type(REPOSITORY)} == {
        "cormorant-dev",
        "cormorant-dev-spark-image",
    }
    assert first.of_type(TASK_DEFINITION) == []
    assert first.of_type("aws:ecs/service:Service") == []
    assert "imageRepository" in first.outputs and "ecsCluster" not in first.outputs
    assert not any(
        "fewer tasks running" in alarm.inputs["alarmDescription"]
        for alarm in first.of_type("aws:cloudwatch/metricAlarm:MetricAlarm")
    )


def test_the_pack_refuses_tags_and_mutable_unscanned_repositories(dev: Deployment) -> None:
    [definition] = [d for d in dev.of_type(TASK_DEFINITION) if d.name == "cormorant-dev-router"]
    [container] = json.loads(definition.inputs["containerDefinitions"])
    assert check(rules.validate_images, rules.TASK_DEFINITION, definition.props) == []
    tagged = {**container, "image": container["image"].split("@")[0] + ":0.1.0-router"}
    assert check(
        rules.validate_images, rules.TASK_DEFINITION, {"containerDefinitions": json.dumps([tagged])}
    ) == [f"container router: image {tagged['image']} is not pinned by digest "
          "(<repository>@sha256:...)"]  # fmt: skip
    repository = services_repository(dev, "dev").props
    assert check(rules.validate_images, rules.ECR_REPOSITORY, repository) == []
    assert check(
        rules.validate_images,
        rules.ECR_REPOSITORY,
        {**repository, "imageTagMutability": "MUTABLE", "imageScanningConfiguration": {}},
    ) == [
        "ECR repository: tags are mutable (imageTagMutability IMMUTABLE)",
        "ECR repository: images are not scanned on push",
    ]
