"""The integrations stage's ways out (``integrationsEgress``), its own security group, its
MQTT bridges' address, and its MSK IAM permissions on the teams' clusters (mocks)."""

from __future__ import annotations

import pytest

from cormorant_infra import shared
from cormorant_infra.config import ConfigError, EgressRule, from_values, parse_egress
from tests.infra.conftest import INTEGRATIONS_EGRESS, TEAM_MSK_ARN, TEAM_ROLE_ARN
from tests.infra.mocks import Deployment, as_pulumi_config
from tests.infra.test_stack import (
    EGRESS_RULE,
    SERVICE,
    containers,
    environment,
    group_tier,
    policy_documents,
    read_as_the_service,
)

REQUIRED = {
    "imageDigest": "sha256:" + "ab" * 32,
    "imageTag": "0.1.0",
    "certificateArn": "arn:aws:acm:eu-west-1:123456789012:certificate/abc",
}


def test_egress_entries_are_parsed() -> None:
    assert [parse_egress(e) for e in INTEGRATIONS_EGRESS] == [
        EgressRule("203.0.113.0/24", None, 9094, 9094),
        EgressRule("10.60.0.0/16", None, 9092, 9098),
        EgressRule(None, "pl-0123456789abcdef0", 8883, 8883),
    ]
    assert parse_egress("2001:db8::/48:443") == EgressRule("2001:db8::/48", None, 443, 443)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("integrationsEgress", ["203.0.113.0/24"], "give a CIDR or prefix list id and a TCP port"),
        ("integrationsEgress", ["203.0.113.7/24:9094"], "has host bits set"),
        ("integrationsEgress", ["10.0.0.1:9094"], "give the network's prefix length"),
        ("integrationsEgress", ["kafka.example.com:9094"], "is not a network in CIDR notation"),
        ("integrationsEgress", ["10.0.0.0/8:0"], "ports are 1 to 65535, the lower first"),
        ("integrationsEgress", ["10.0.0.0/8:9098-9092"], "ports are 1 to 65535, the lower first"),
        ("integrationsEgress", ["10.0.0.0/8:all"], "is not a TCP port or range"),
        ("integrationsEgress", ["pl-xyz:443"], "is not a prefix list id"),
        ("integrationsEgress", ["10.0.0.0/8:1"] * 2, "an entry is given twice"),
        ("integrationsEgress", [f"10.0.0.0/8:{p}" for p in range(1, 42)], "at most 40 items"),
        (
            "integrationsMskClusterArns",
            ["arn:aws:kafka:eu-west-1:210987654321:topic/plant/5f0c/*"],
            "is not an MSK cluster ARN",
        ),
        (
            "integrationsAssumeRoleArns",
            ["arn:aws:iam::210987654321:user/exporter"],
            "is not an IAM role ARN",
        ),
    ],
)
def test_bad_integrations_settings_are_refused(key: str, value: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        from_values(as_pulumi_config({**REQUIRED, key: value}))
    assert f"cormorant:{key}" in str(caught.value)
    assert message in str(caught.value)


def test_only_the_integrations_stage_gets_the_ways_out(
    serverless: Deployment, dev: Deployment
) -> None:
    tiers = group_tier(serverless)
    services = {s.inputs["name"]: s for s in serverless.of_type(SERVICE)}
    [group] = services[shared.INTEGRATIONS_COMMAND].inputs["networkConfiguration"]["securityGroups"]
    assert tiers[group] == "integrations"
    others = [s for name, s in services.items() if name != shared.INTEGRATIONS_COMMAND]
    assert all(group not in s.inputs["networkConfiguration"]["securityGroups"] for s in others)
    addressed = {
        (
            tiers[r.inputs["securityGroupId"]],
            r.inputs.get("cidrIpv4") or r.inputs.get("cidrIpv6") or r.inputs.get("prefixListId"),
            int(r.inputs["fromPort"]),
            int(r.inputs["toPort"]),
        )
        for r in serverless.of_type(EGRESS_RULE)
        if "referencedSecurityGroupId" not in r.inputs
    }
    configured = {
        ("integrations", "203.0.113.0/24", 9094, 9094),
        ("integrations", "10.60.0.0/16", 9092, 9098),
        ("integrations", "pl-0123456789abcdef0", 8883, 8883),
    }
    # Every tier's only other way out is HTTPS (AWS's APIs; a webhook too).
    https = {(tier, "0.0.0.0/0", 443, 443) for tier in set(tiers.values())} & addressed
    assert {tier for tier, *_ in https} == {
        "ingest",
        "stages",
        "integrations",
        "admin",
        "analytics",
    }
    assert addressed == configured | https
    assert not [r for r in dev.of_type(EGRESS_RULE) if "-integrations-out-" in r.name]


def test_the_mqtt_bridges_publish_on_the_ingest_tasks_direct_listener(
    dev: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    stage = read_as_the_service(
        environment(containers(dev)[shared.INTEGRATIONS_COMMAND]), monkeypatch
    )
    assert stage.integrations_mqtt_host == "ingest.cormorant-dev.internal"
    assert stage.integrations_mqtt_port == shared.INGEST_DIRECT_MQTT_PORT
    # The ingest tasks bind that listener on every address (the integrations tier alone may
    # reach it, test_stack.test_tiers_reach_only_their_servers), with no PROXY header.
    ingest = read_as_the_service(environment(containers(dev)[shared.INGEST]), monkeypatch)
    assert (ingest.mqtt_host, ingest.mqtt_port) == ("0.0.0.0", stage.integrations_mqtt_port)
    assert stage.integrations_mqtt_port not in [listener.port for listener in ingest.listeners]


def test_the_integrations_task_role_writes_to_the_teams_msk_clusters(
    serverless: Deployment, dev: Deployment
) -> None:
    documents = policy_documents(serverless)
    statements = documents["cormorant-serverless-integrations-stage-task"]["Statement"]
    team = TEAM_MSK_ARN.split(":cluster/")[1]
    head = "arn:aws:kafka:eu-west-1:210987654321"
    granted = {
        (action, resource)
        for s in statements
        for action in s["Action"]
        for resource in s["Resource"]
        if resource.startswith((head, "arn:aws:iam::210987654321:"))
    }
    group = f"{head}:group/{team}/mqtt.cormorant-integrations.*"
    transactions = f"{head}:transactional-id/{team}/mqtt.cormorant-integrations.*"
    assert granted == {
        ("kafka-cluster:Connect", TEAM_MSK_ARN),
        ("kafka-cluster:WriteDataIdempotently", TEAM_MSK_ARN),
        ("kafka-cluster:DescribeTopic", f"{head}:topic/{team}/*"),
        ("kafka-cluster:WriteData", f"{head}:topic/{team}/*"),
        ("kafka-cluster:CreateTopic", f"{head}:topic/{team}/mqtt.msg.all"),
        ("kafka-cluster:CreateTopic", f"{head}:topic/{team}/mqtt.client.events"),
        ("kafka-cluster:AlterTransactionalId", transactions),
        ("kafka-cluster:DescribeTransactionalId", transactions),
        ("kafka-cluster:AlterGroup", group),
        ("kafka-cluster:DescribeGroup", group),
        ("sts:AssumeRole", TEAM_ROLE_ARN),
    }
    # No other role, and no stack without the key, reaches a team's cluster.
    for name, document in documents.items():
        if name != "cormorant-serverless-integrations-stage-task":
            assert "210987654321" not in str(document), name
    assert "210987654321" not in str(policy_documents(dev))
