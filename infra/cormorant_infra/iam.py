"""IAM roles and their policy documents: statements in, JSON out (once their ARNs are known).

Every policy of the stack is built here from explicit actions on explicit resources, so the
tests and the policy pack can parse it and check that no statement allows ``*`` on ``*``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pulumi
import pulumi_aws as aws

Statement = dict[str, Any]
"""One IAM policy statement; values may be Pulumi inputs (ARNs known only after creation)."""


def allow(actions: Sequence[str], resources: Sequence[pulumi.Input[str]]) -> Statement:
    """A statement allowing ``actions`` on ``resources`` (both non-empty, no ``*`` action)."""
    if not actions or not resources:
        raise ValueError("a statement needs actions and resources")
    if "*" in actions:
        raise ValueError("no statement allows every action")
    return {"Effect": "Allow", "Action": sorted(actions), "Resource": list(resources)}


def document(statements: Sequence[Statement]) -> pulumi.Output[str]:
    """The policy document (JSON text, version 2012-10-17) of ``statements``."""
    return pulumi.Output.json_dumps({"Version": "2012-10-17", "Statement": list(statements)})


def assume_role_policy(service: str) -> str:
    """The trust policy letting AWS service ``service`` (``ecs-tasks.amazonaws.com``)
    assume a role."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": {"Service": service},
                    "Action": "sts:AssumeRole",
                }
            ],
        }
    )


def service_role(
    name: str,
    service: str,
    statements: Sequence[Statement],
    opts: pulumi.ResourceOptions,
) -> aws.iam.Role:
    """A role AWS service ``service`` assumes, allowed ``statements`` only (an inline
    policy ``name``; none when there are no statements)."""
    role = aws.iam.Role(name, assume_role_policy=assume_role_policy(service), opts=opts)
    if statements:
        aws.iam.RolePolicy(name, role=role.id, policy=document(statements), opts=opts)
    return role


def secret_key(secret_arn: pulumi.Input[str], key: str) -> pulumi.Output[str]:
    """The ECS ``valueFrom`` of one key of a JSON secret: ``<arn>:<key>::`` (the current
    version). ECS reads it at task start; the value never appears in the task definition."""
    return pulumi.Output.concat(secret_arn, ":", key, "::")
