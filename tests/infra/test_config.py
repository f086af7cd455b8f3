"""A bad stack configuration stops the program before any resource, with a clear message."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cormorant_infra import shared
from cormorant_infra.config import ConfigError, StackConfig, from_values
from services.common.mqtt.keep_alive import max_keep_alive_for_idle_timeout
from services.common.versions import SPARK_VERSION, release_line
from tests.infra.mocks import as_pulumi_config, deploy, stack_file_values

REQUIRED = {
    "imageDigest": "sha256:" + "ab" * 32,
    "imageTag": "0.1.0",
    "certificateArn": "arn:aws:acm:eu-west-1:123456789012:certificate/abc",
}


def config(**values: Any) -> StackConfig:
    """The configuration of ``values`` on top of the required keys, as Pulumi stores them."""
    raw = as_pulumi_config({**REQUIRED, **values})
    return from_values(raw)


def refused(**values: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        config(**values)
    return str(caught.value)


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_the_stack_files_are_valid(stack: str) -> None:
    values = {
        key.removeprefix("cormorant:"): value
        for key, value in stack_file_values(stack).items()
        if key.startswith("cormorant:")
    }
    parsed = from_values(as_pulumi_config(values))
    assert parsed.nat_gateways == (1 if stack == "dev" else 3)


def test_defaults() -> None:
    parsed = config()
    assert parsed.availability_zones == 3
    assert parsed.services["ingest"].min_tasks == 1
    assert parsed.max_keep_alive == 230 == max_keep_alive_for_idle_timeout(350)


def test_more_nat_gateways_than_zones() -> None:
    message = refused(natGateways=5)
    assert (
        "natGateways is 5 but there are 3 availability zones: at most one NAT gateway per zone"
        in message
    )


TLS_SECRET = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:mqtt-tls-AbCdEf"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"tlsMode": "passthrough"}, "tlsMode passthrough needs tlsCertificateSecretArn"),
        ({"tlsClientAuth": "required"}, "tlsClientAuth needs tlsMode passthrough"),
        (
            {"tlsMode": "passthrough", "tlsCertificateSecretArn": "mqtt-tls"},
            "tlsCertificateSecretArn",
        ),
    ],
)
def test_tls_passthrough_needs_the_tasks_certificate(values: dict[str, str], message: str) -> None:
    assert message in refused(**values)


def test_keep_alive_above_the_nlb_idle_rule() -> None:
    message = refused(maxKeepAlive=300)
    assert "maxKeepAlive 300 s is too long for the load balancer's 350 s idle timeout" in message
    assert "at most 230 s" in message


def test_keep_alive_rule_follows_the_tcp_idle_timeout_without_a_tls_listener() -> None:
    values = {
        **REQUIRED,
        "tlsMode": "passthrough",
        "tlsCertificateSecretArn": TLS_SECRET,
        "nlbIdleTimeoutSeconds": 120,
        "maxKeepAlive": 100,
    }
    values.pop("certificateArn")
    with pytest.raises(ConfigError, match=r"120 s idle timeout: .* at most 76 s"):
        from_values(as_pulumi_config(values))
    values["maxKeepAlive"] = 76
    assert from_values(as_pulumi_config(values)).max_keep_alive == 76


def test_unknown_key() -> None:
    assert "cormorant:natGateway: Extra inputs are not permitted" in refused(natGateway=1)


def test_wrong_types_and_ranges() -> None:
    message = refused(availabilityZones=4, redisNodes=1, kafkaMode="managed")
    assert "cormorant:availabilityZones: Input should be less than or equal to 3" in message
    assert "cormorant:redisNodes: Input should be greater than or equal to 2" in message
    assert "cormorant:kafkaMode: Input should be 'provisioned' or 'serverless'" in message


def test_a_production_redis_needs_two_replicas() -> None:
    message = refused(production=True, redisNodes=2)
    assert "a production stack's Redis needs redisNodes 3 or more" in message
    assert config(production=True, redisNodes=3).redis_nodes == 3
    assert config(production=True, redisNodes=2, storeBackend="postgres").redis_nodes == 2


def test_fargate_sizes() -> None:
    message = refused(services={"router": {"cpu": 256, "memory": 4096}})
    assert "cormorant:services.router: memory 4096 MiB is not allowed with cpu 256" in message
    assert "unknown services ['gateway']" in refused(services={"gateway": {}})


def test_more_tasks_than_partitions() -> None:
    message = refused(services={"router": {"maxTasks": 13}})
    assert (
        "services.router.maxTasks 13 is more than the 12 partitions its consumer group shares"
        in message
    )
    assert "CORMORANT_MSG_ALL_PARTITIONS" in message


def test_brokers_spread_evenly_over_zones() -> None:
    assert "kafkaBrokers 4 must be a multiple of availabilityZones 3" in refused(kafkaBrokers=4)


def test_tls_termination_needs_a_certificate() -> None:
    values = dict(REQUIRED)
    values.pop("certificateArn")
    with pytest.raises(ConfigError, match="tlsMode terminate needs certificateArn"):
        from_values(as_pulumi_config(values))


def test_network_values() -> None:
    assert "10.0.0.0/8 must be an IPv4 network with a /16 to /20 prefix" in refused(
        vpcCidr="10.0.0.0/8"
    )
    assert "is not a private address range" in refused(vpcCidr="8.8.0.0/16")
    assert "cormorant:allowedCidrs" in refused(allowedCidrs=["not-a-network"])
    assert "cormorant:logRetentionDays: 8 is not a CloudWatch Logs retention" in refused(
        logRetentionDays=8
    )


ADMIN_CERTIFICATE = "arn:aws:acm:eu-west-1:123456789012:certificate/admin"


def test_operators_and_prometheus_come_from_private_ranges_only() -> None:
    for key in ("adminAllowedCidrs", "metricsAllowedCidrs"):
        message = refused(adminCertificateArn=ADMIN_CERTIFICATE, **{key: ["0.0.0.0/0"]})
        assert (
            f"cormorant:{key}: 0.0.0.0/0 is not a private IPv4 range (RFC 1918): the admin "
            "API and the metrics are reached from the VPC and the networks joined to it "
            "(VPN, peering, Direct Connect) only, never from the internet"
        ) in message
        for outside in ("52.16.0.0/16", "100.64.0.0/10", "10.0.0.0/7", "fd00::/8"):
            assert f"{outside} is not a private IPv4 range" in refused(
                adminCertificateArn=ADMIN_CERTIFICATE, **{key: ["10.1.0.0/16", outside]}
            )
        assert f"cormorant:{key}: 'vpn' is not a network in CIDR notation" in refused(
            adminCertificateArn=ADMIN_CERTIFICATE, **{key: ["vpn"]}
        )
        # Host bits set: a typo that would let in another range than meant.
        assert "10.8.0.1/16 has host bits set" in refused(
            adminCertificateArn=ADMIN_CERTIFICATE, **{key: ["10.8.0.1/16"]}
        )
    parsed = config(
        adminCertificateArn=ADMIN_CERTIFICATE,
        adminAllowedCidrs=["10.8.0.0/16", "172.16.0.0/12"],
        metricsAllowedCidrs=["192.168.1.0/24"],
    )
    assert parsed.admin_allowed_cidrs == ["10.8.0.0/16", "172.16.0.0/12"]
    assert parsed.metrics_allowed_cidrs == ["192.168.1.0/24"]


def test_admin_ranges_need_the_admin_load_balancer() -> None:
    assert "adminAllowedCidrs needs adminCertificateArn" in refused(
        adminAllowedCidrs=["10.8.0.0/16"]
    )
    assert "cormorant:adminCertificateArn" in refused(adminCertificateArn="not-an-arn")
    assert config().admin_certificate_arn is None


def test_emr_release_must_run_the_pinned_spark_line(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "unknown EMR release 'emr-6.15.0'" in refused(emrReleaseLabel="emr-6.15.0")
    # A release of another Spark line (EMR 6.15 runs Spark 3.4.1) is refused by name.
    monkeypatch.setitem(shared.EMR_RELEASE_SPARK, "emr-6.15.0", "3.4.1")
    message = refused(emrReleaseLabel="emr-6.15.0")
    assert (
        f"emr-6.15.0 runs Spark 3.4.1, but the Spark jobs pin {SPARK_VERSION}: choose a "
        f"release of the Spark {release_line(SPARK_VERSION)} line"
    ) in message


def test_a_bad_value_fails_the_pulumi_program() -> None:
    values = stack_file_values("dev") | {"cormorant:natGateways": 5}
    with pytest.raises(ConfigError, match="natGateways is 5"):
        deploy("dev", values)


def test_the_deploy_page_documents_every_key() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "deploy.md").read_text(encoding="utf-8")
    for name, info in StackConfig.model_fields.items():
        assert f"`{info.alias or name}`" in page, info.alias
