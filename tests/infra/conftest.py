"""The stacks under test, each declared once per session under Pulumi's mocks.

``dev`` and ``prod`` are the repository's own stack files; ``serverless`` is prod with MSK
Serverless (IAM), TLS passed through to the tasks, PROXY protocol, the PostgreSQL message
store, operators and a Prometheus let in from given ranges, ways out and a team's MSK
cluster for the integrations: the other branch of every configuration choice.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.infra.mocks import Deployment, deploy, stack_file_values

ADMIN_CIDRS = ["172.16.8.0/22", "10.200.0.0/24"]
"""The serverless stack's operators (a client VPN's ranges)."""

METRICS_CIDRS = ["192.168.50.0/24"]
"""The serverless stack's Prometheus (a peered monitoring VPC)."""

INTEGRATIONS_EGRESS = ["203.0.113.0/24:9094", "10.60.0.0/16:9092-9098", "pl-0123456789abcdef0:8883"]
"""The serverless stack's ways out for its integrations: a team's Kafka over the internet,
a peered VPC's brokers, a managed prefix list's MQTT brokers."""

TEAM_MSK_ARN = (
    "arn:aws:kafka:eu-west-1:210987654321:cluster/plant/5f0c61a8-1111-2222-3333-444455556666-2"
)
"""The serverless stack's team MSK cluster (another account) its Kafka sinks write to with IAM."""

TEAM_ROLE_ARN = "arn:aws:iam::210987654321:role/cormorant-export"
"""A role of the team's account the serverless stack's integrations stage may assume."""

TLS_SECRET_ARN = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:cormorant-mqtt-tls-AbCdEf"
"""The Secrets Manager secret of the ingest tasks' certificate in the passthrough stack."""


def serverless_values() -> dict[str, Any]:
    """The prod stack file with every alternative switched on."""
    values = stack_file_values("prod")
    values.pop("cormorant:certificateArn")
    values |= {
        "cormorant:kafkaMode": "serverless",
        "cormorant:tlsMode": "passthrough",
        "cormorant:tlsCertificateSecretArn": TLS_SECRET_ARN,
        "cormorant:tlsClientAuth": "optional",
        "cormorant:proxyProtocolV2": True,
        "cormorant:storeBackend": "postgres",
        "cormorant:plainMqtt": False,
        "cormorant:nlbIdleTimeoutSeconds": 600,
        "cormorant:maxKeepAlive": 390,
        "cormorant:topicPrefix": "mqtt.",
        "cormorant:adminAllowedCidrs": ADMIN_CIDRS,
        "cormorant:metricsAllowedCidrs": METRICS_CIDRS,
        "cormorant:integrationsEgress": INTEGRATIONS_EGRESS,
        "cormorant:integrationsMskClusterArns": [TEAM_MSK_ARN],
        "cormorant:integrationsAssumeRoleArns": [TEAM_ROLE_ARN],
    }
    return values


@pytest.fixture(scope="session")
def dev() -> Deployment:
    """infra/Pulumi.dev.yaml, declared."""
    return deploy("dev", stack_file_values("dev"))


@pytest.fixture(scope="session")
def prod() -> Deployment:
    """infra/Pulumi.prod.yaml, declared."""
    return deploy("prod", stack_file_values("prod"))


@pytest.fixture(scope="session")
def serverless() -> Deployment:
    """prod with MSK Serverless, TLS passthrough, PROXY v2 and the PostgreSQL store."""
    return deploy("serverless", serverless_values())


@pytest.fixture(scope="session", params=["dev", "prod", "serverless"])
def deployment(request: pytest.FixtureRequest) -> Deployment:
    """Each of the three stacks in turn."""
    found: Deployment = request.getfixturevalue(request.param)
    return found
