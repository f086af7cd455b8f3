"""The policy pack (infra/policy): each rule called directly, and the whole pack on the stacks."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from pulumi_policy import (
    PolicyCustomTimeouts,
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
)

import cormorant_policies as rules
from services.common.versions import EMR_RELEASE_LABEL
from tests.infra.mocks import Deployment, Registered, unwrap

OPTIONS = PolicyResourceOptions(
    protect=False,
    ignore_changes=[],
    delete_before_replace=None,
    aliases=[],
    custom_timeouts=PolicyCustomTimeouts(0, 0, 0),
    additional_secret_outputs=[],
)


def resource_args(resource_type: str, props: dict[str, Any]) -> ResourceValidationArgs:
    return ResourceValidationArgs(
        resource_type, props, f"urn:test::{resource_type}", "test", OPTIONS, None
    )


def policy_resource(
    resource_type: str, props: dict[str, Any], name: str = "test"
) -> PolicyResource:
    return PolicyResource(
        resource_type,
        props,
        f"urn:test::{resource_type}::{name}",
        name,
        OPTIONS,
        None,
        None,
        [],
        {},
    )


def violations(validate: Callable[..., None], args: Any) -> list[str]:
    found: list[str] = []
    validate(args, lambda message, urn=None: found.append(message))
    return found


def check(validate: Callable[..., None], resource_type: str, props: dict[str, Any]) -> list[str]:
    return violations(validate, resource_args(resource_type, props))


def run_pack(deployment: Deployment) -> dict[str, list[str]]:
    """Every policy of the pack on ``deployment``: resource rules see each resource's inputs
    (as on a preview), stack rules every resource's final properties (as after an update)."""
    found: dict[str, list[str]] = {}
    after = [
        policy_resource(r.typ, unwrap(r.outputs), r.name)
        for r in deployment.resources
        if not r.typ.startswith("cormorant:")
    ]
    for policy in rules.POLICIES:
        messages: list[str] = []

        def report(message: str, urn: str | None = None, messages: list[str] = messages) -> None:
            messages.append(message)

        if isinstance(policy, ResourceValidationPolicy):
            for resource in deployment.resources:
                policy.validate(resource_args(resource.typ, resource.props), report)
        else:
            policy.validate(StackValidationArgs(after), report)
        if messages:
            found[policy.name] = messages
    return found


# --- the whole pack on the repository's stacks ----------------------------------------


def test_prod_and_the_alternatives_pass_every_rule(
    prod: Deployment, serverless: Deployment
) -> None:
    assert run_pack(prod) == {}
    assert run_pack(serverless) == {}


def test_dev_gets_only_the_advisory_notes(dev: Deployment) -> None:
    assert run_pack(dev) == {
        "database-multi-az": [
            "RDS: not Multi-AZ (a zone failure stops the database)",
            "RDS: deletion protection is off",
        ],
        "no-plaintext-mqtt-from-internet": [
            "plaintext MQTT (1883) is open to the whole internet: set cormorant:plainMqtt "
            "false (clients use 8883, TLS) or narrow cormorant:allowedCidrs"
        ],
    }
    for name in ("database-multi-az", "no-plaintext-mqtt-from-internet"):
        [policy] = [p for p in rules.POLICIES if p.name == name]
        assert policy.enforcement_level is not None
        assert policy.enforcement_level.value == "advisory"


@pytest.mark.parametrize(
    ("props", "noted"),
    [
        ({"cidrIpv4": "0.0.0.0/0", "ipProtocol": "tcp", "fromPort": 1883, "toPort": 1883}, True),
        ({"cidrIpv6": "::/0", "ipProtocol": "tcp", "fromPort": 1800, "toPort": 1900}, True),
        ({"cidrIpv4": "0.0.0.0/0", "ipProtocol": "-1"}, True),
        ({"cidrIpv4": "0.0.0.0/0", "ipProtocol": "tcp", "fromPort": 8883, "toPort": 8883}, False),
        ({"cidrIpv4": "198.51.100.0/24", "ipProtocol": "tcp", "fromPort": 1883, "toPort": 1883},
         False),
    ],
)  # fmt: skip
def test_plaintext_mqtt_rule(props: dict[str, Any], noted: bool) -> None:
    found = check(rules.validate_plaintext_mqtt, rules.SG_INGRESS, props)
    assert bool(found) is noted, found


def test_the_pack_catches_a_stack_gone_wrong(prod: Deployment) -> None:
    broken = Deployment(list(prod.resources), prod.outputs, prod.secret_outputs)
    for index, resource in enumerate(broken.resources):
        if resource.typ == rules.RDS:
            inputs = {**resource.inputs, "publiclyAccessible": True, "storageEncrypted": False}
            broken.resources[index] = Registered(
                resource.typ, resource.name, inputs, resource.outputs
            )
        if resource.typ == rules.LOAD_BALANCER and resource.inputs["internal"]:
            inputs = {**resource.inputs, "internal": False}
            broken.resources[index] = Registered(
                resource.typ, resource.name, inputs, resource.outputs
            )
    assert set(run_pack(broken)) == {
        "private-database",
        "encryption-everywhere",
        "private-admin-load-balancer",
    }


# --- each rule ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("props", "allowed"),
    [
        ({"cidrIpv4": "0.0.0.0/0", "ipProtocol": "tcp", "fromPort": 1883, "toPort": 1883}, True),
        ({"cidrIpv4": "0.0.0.0/0", "ipProtocol": "tcp", "fromPort": 8883, "toPort": 8883}, True),
        ({"cidrIpv4": "0.0.0.0/0", "ipProtocol": "tcp", "fromPort": 22, "toPort": 22}, False),
        ({"cidrIpv4": "0.0.0.0/0", "ipProtocol": "tcp", "fromPort": 1883, "toPort": 8883}, False),
        ({"cidrIpv4": "0.0.0.0/0", "ipProtocol": "-1"}, False),
        ({"cidrIpv6": "::/0", "ipProtocol": "tcp", "fromPort": 5432, "toPort": 5432}, False),
        ({"cidrIpv4": "10.0.0.0/8", "ipProtocol": "tcp", "fromPort": 22, "toPort": 22}, True),
        (
            {
                "referencedSecurityGroupId": "sg-1",
                "ipProtocol": "tcp",
                "fromPort": 9096,
                "toPort": 9096,
            },
            True,
        ),
    ],
)
def test_internet_ingress(props: dict[str, Any], allowed: bool) -> None:
    found = check(rules.validate_internet_ingress, rules.SG_INGRESS, props)
    assert (found == []) is allowed, found


def test_internet_ingress_inline_and_legacy_rules() -> None:
    inline = {
        "ingress": [
            {"protocol": "tcp", "fromPort": 6379, "toPort": 6379, "cidrBlocks": ["0.0.0.0/0"]}
        ]
    }
    assert check(rules.validate_internet_ingress, rules.SG, inline) == [
        "ingress from the whole internet on tcp 6379-6379: only MQTT (1883, 8883, 443) may be"
    ]
    legacy = {
        "type": "ingress",
        "protocol": "tcp",
        "fromPort": 1883,
        "toPort": 1883,
        "cidrBlocks": ["0.0.0.0/0"],
    }
    assert check(rules.validate_internet_ingress, rules.SG_RULE, legacy) == []
    egress = {**legacy, "type": "egress", "fromPort": 443, "toPort": 443}
    assert check(rules.validate_internet_ingress, rules.SG_RULE, egress) == []


def test_encryption_rules() -> None:
    assert check(
        rules.validate_encryption,
        rules.MSK,
        {
            "encryptionInfo": {
                "encryptionInTransit": {"clientBroker": "TLS_PLAINTEXT", "inCluster": False}
            },
            "clientAuthentication": {"unauthenticated": True},
        },
    ) == [
        "MSK: clients must use TLS (encryptionInTransit.clientBroker = TLS)",
        "MSK: traffic between brokers must be encrypted (inCluster)",
        "MSK: data at rest must use a customer-managed KMS key",
        "MSK: unauthenticated clients must be refused",
    ]
    assert check(rules.validate_encryption, rules.REDIS, {"atRestEncryptionEnabled": True}) == [
        "ElastiCache: encryption in transit (TLS) must be on",
        "ElastiCache: clients must authenticate (authToken)",
    ]
    assert check(rules.validate_encryption, rules.RDS, {"storageEncrypted": False}) == [
        "RDS: storage must be encrypted"
    ]
    assert check(
        rules.validate_encryption, rules.RDS_PARAMETERS, {"family": "postgres16", "parameters": []}
    ) == ["RDS: PostgreSQL must refuse connections without TLS (rds.force_ssl = 1)"]
    assert check(rules.validate_encryption, rules.SNS, {}) == [
        "SNS: the topic must be encrypted (kmsMasterKeyId)"
    ]
    for protocol in ("TLS", "HTTPS"):
        old_tls = {"protocol": protocol, "sslPolicy": "ELBSecurityPolicy-2016-08"}
        assert check(rules.validate_encryption, rules.LISTENER, old_tls) == [
            "load balancer: TLS and HTTPS listeners must use a TLS 1.3 security policy"
        ]
    assert check(rules.validate_encryption, rules.LISTENER, {"protocol": "HTTP"}) == [
        "load balancer: HTTP listeners carry bearer tokens in clear: use HTTPS"
    ]


def test_application_load_balancers_are_internal() -> None:
    validate = rules.validate_internal_application_balancers
    public = {"loadBalancerType": "application", "internal": False}
    assert check(validate, rules.LOAD_BALANCER, public) == [
        "application load balancer: must be internal (the admin API is private)"
    ]
    assert check(validate, rules.LOAD_BALANCER, {**public, "internal": True}) == []
    # The MQTT NLB is public on purpose.
    assert check(validate, rules.LOAD_BALANCER, {"loadBalancerType": "network"}) == []


def test_redis_failover_rule() -> None:
    assert check(
        rules.validate_high_availability,
        rules.REDIS,
        {
            "automaticFailoverEnabled": True,
            "multiAzEnabled": False,
            "numCacheClusters": 1,
        },
    ) == [
        "ElastiCache: automatic failover and Multi-AZ must be on",
        "ElastiCache: at least two nodes (a primary and a replica)",
    ]


def test_public_database_rule() -> None:
    assert check(rules.validate_private_database, rules.RDS, {"publiclyAccessible": True}) == [
        "RDS: the database must not be publicly accessible"
    ]
    assert check(rules.validate_private_database, rules.RDS, {"publiclyAccessible": False}) == []


@pytest.mark.parametrize(
    ("statement", "message"),
    [
        (
            {"Effect": "Allow", "Action": "*", "Resource": "*"},
            "IAM: a statement allows every action",
        ),
        (
            {"Effect": "Allow", "Action": ["s3:*"], "Resource": ["*"]},
            "IAM: a statement allows all of ['s3:*'] on every resource",
        ),
        (
            {"Effect": "Allow", "NotAction": ["iam:*"], "Resource": "*"},
            "IAM: Allow with NotAction/NotResource grants more than it names",
        ),
        ({"Effect": "Allow", "Action": ["ecr:GetAuthorizationToken"], "Resource": ["*"]}, None),
        ({"Effect": "Allow", "Action": ["s3:*"], "Resource": ["arn:aws:s3:::b/*"]}, None),
        ({"Effect": "Deny", "Action": "*", "Resource": "*"}, None),
    ],
)
def test_iam_rule(statement: dict[str, Any], message: str | None) -> None:
    policy = json.dumps({"Version": "2012-10-17", "Statement": [statement]})
    found = check(rules.validate_iam, "aws:iam/rolePolicy:RolePolicy", {"policy": policy})
    assert found == ([message] if message else [])


def test_iam_rule_refuses_a_policy_that_is_not_json() -> None:
    found = check(rules.validate_iam, "aws:iam/policy:Policy", {"policy": "{not json"})
    assert found == ["IAM: the policy is not a JSON policy document"]


def test_emr_release_rule() -> None:
    assert (
        check(
            rules.validate_emr_release, rules.EMR_APPLICATION, {"releaseLabel": EMR_RELEASE_LABEL}
        )
        == []
    )
    [message] = check(
        rules.validate_emr_release, rules.EMR_APPLICATION, {"releaseLabel": "emr-6.15.0"}
    )
    assert message.startswith("EMR: unknown EMR release 'emr-6.15.0'")


def _task(name: str, env: dict[str, str], logs: bool = True) -> PolicyResource:
    container: dict[str, Any] = {
        "name": name,
        "environment": [{"name": k, "value": v} for k, v in env.items()],
    }
    if logs:
        container["logConfiguration"] = {"logDriver": "awslogs"}
    return policy_resource(
        rules.TASK_DEFINITION, {"containerDefinitions": json.dumps([container])}, name
    )


def test_services_rule() -> None:
    resources = [
        policy_resource(rules.ECS_SERVICE, {"name": "router"}, "router"),
        policy_resource(rules.ECS_SERVICE, {"name": "ingest"}, "ingest"),
        policy_resource(rules.SCALING_TARGET, {"resourceId": "service/c/router"}),
        _task("router", {}),
        _task("ingest", {}, logs=False),
    ]
    assert violations(rules.validate_services, StackValidationArgs(resources)) == [
        "ECS service ingest: no autoscaling target",
        "container ingest: no CloudWatch log group",
    ]


@pytest.mark.parametrize(
    ("listeners", "keep_alive", "allowed"),
    [
        ([{"protocol": "TLS"}], "230", True),
        ([{"protocol": "TLS"}], "231", False),
        ([{"protocol": "TCP", "tcpIdleTimeoutSeconds": 600}], "390", True),
        ([{"protocol": "TCP", "tcpIdleTimeoutSeconds": 600}, {"protocol": "TLS"}], "390", False),
        ([{"protocol": "TCP"}], None, False),  # the settings' default: 65535 s
    ],
)
def test_keep_alive_rule(
    listeners: list[dict[str, Any]], keep_alive: str | None, allowed: bool
) -> None:
    env = {} if keep_alive is None else {"CORMORANT_MAX_KEEP_ALIVE": keep_alive}
    resources = [
        policy_resource(rules.LISTENER, props, f"l{i}") for i, props in enumerate(listeners)
    ]
    resources.append(_task("ingest", env))
    found = violations(rules.validate_keep_alive, StackValidationArgs(resources))
    assert (found == []) is allowed, found


def test_bucket_rule() -> None:
    resources = [
        policy_resource(rules.BUCKET, {"bucket": "archive"}, "archive"),
        policy_resource(rules.BUCKET, {"bucket": "open"}, "open"),
        policy_resource(rules.BUCKET_SSE, {"bucket": "archive"}),
        policy_resource(
            rules.BUCKET_PUBLIC,
            {
                "bucket": "archive",
                "blockPublicAcls": True,
                "blockPublicPolicy": True,
                "ignorePublicAcls": True,
                "restrictPublicBuckets": True,
            },
        ),
        policy_resource(rules.BUCKET_PUBLIC, {"bucket": "open", "blockPublicAcls": True}),
    ]
    assert violations(rules.validate_public_buckets, StackValidationArgs(resources)) == [
        "S3 bucket open: no default encryption",
        "S3 bucket open: public access is not fully blocked",
    ]
