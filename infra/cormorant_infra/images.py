"""Images: the ECR repository of Cormorant's image, and the image the services run by digest.

One image holds every ``cormorant`` command (Dockerfile; its entry point is ``cormorant``,
each task definition names its command), pushed to this stack's own repository. The
repository's tags are IMMUTABLE (a tag names one image forever), every push is scanned
(basic scanning, on push), it is encrypted with KMS (the AWS managed key ``aws/ecr``: every
use of the key is in CloudTrail), and a lifecycle policy expires untagged images after
:data:`UNTAGGED_DAYS` days and keeps the newest ``imagesKept`` images.

The tasks run ``<repository>@<imageDigest>``: a digest names content, so a new push is a new
task definition revision (and a deployment), a scale-out starts the very image the other
tasks run, and a rollback is the previous digest. The digest comes from the stack's
configuration (``cormorant:imageDigest``), not from a registry lookup by tag at preview time:
the first preview of a stack has no repository to look in, and a configured digest makes
``pulumi preview`` show exactly which image each task definition will run, from the stack
file alone (docs/deploy.md).
"""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pulumi_aws as aws

from cormorant_infra.config import StackConfig

UNTAGGED_DAYS = 7
"""Days after which an untagged image is expired: an interrupted push's, or one whose
release was only ever pushed by digest (push releases with a tag, docs/deploy.md)."""


def lifecycle_policy(images_kept: int) -> dict[str, Any]:
    """The repository's ECR lifecycle policy (``PutLifecyclePolicy``'s JSON document).

    Rule 1 expires untagged images :data:`UNTAGGED_DAYS` days after their push; rule 2
    keeps the ``images_kept`` most recently pushed images, tagged or not, and expires the
    rest. ECR evaluates a ``tagStatus: any`` rule last, so it must have the highest
    priority number (ECR User Guide, "Lifecycle policy properties").
    """
    return {
        "rules": [
            {
                "rulePriority": 1,
                "description": f"Expire untagged images after {UNTAGGED_DAYS} days",
                "selection": {
                    "tagStatus": "untagged",
                    "countType": "sinceImagePushed",
                    "countUnit": "days",
                    "countNumber": UNTAGGED_DAYS,
                },
                "action": {"type": "expire"},
            },
            {
                "rulePriority": 2,
                "description": f"Keep the {images_kept} newest images",
                "selection": {
                    "tagStatus": "any",
                    "countType": "imageCountMoreThan",
                    "countNumber": images_kept,
                },
                "action": {"type": "expire"},
            },
        ]
    }


class Images(pulumi.ComponentResource):
    """The stack's image repository and the image reference its tasks run.

    Attributes: ``repository_name``, ``repository_arn`` (what the execution roles may pull
    from), ``repository_url`` (``<account>.dkr.ecr.<region>.amazonaws.com/<name>``, where a
    release is pushed) and ``service_image`` (``<repository_url>@sha256:...``; ``None``
    while ``imageDigest`` is unset, in a new stack's first ``up``).
    """

    def __init__(
        self, name: str, config: StackConfig, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("cormorant:images:Images", name, None, opts)
        repository = aws.ecr.Repository(
            name,
            name=name,
            image_tag_mutability="IMMUTABLE",
            image_scanning_configuration={"scan_on_push": True},
            encryption_configurations=[{"encryption_type": "KMS"}],
            # A dev stack's `pulumi destroy` removes the repository with its images; a
            # production repository is protected and never emptied by the program.
            force_delete=not config.production,
            opts=pulumi.ResourceOptions(parent=self, protect=config.production),
        )
        aws.ecr.LifecyclePolicy(
            name,
            repository=repository.name,
            policy=json.dumps(lifecycle_policy(config.images_kept)),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.repository_name: pulumi.Output[str] = repository.name
        self.repository_arn: pulumi.Output[str] = repository.arn
        self.repository_url: pulumi.Output[str] = repository.repository_url
        self.service_image: pulumi.Output[str] | None = (
            None
            if config.image_digest is None
            else pulumi.Output.concat(repository.repository_url, "@", config.image_digest)
        )
        self.register_outputs({"repositoryUrl": self.repository_url})
