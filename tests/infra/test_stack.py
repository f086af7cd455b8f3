"""Every component of infra/ declares what it should, with the settings that matter (mocks)."""

from __future__ import annotations

import ipaddress
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from cormorant_infra import compute, kafka, shared
from cormorant_infra.config import NLB_TLS_IDLE_TIMEOUT_SECONDS
from cormorant_infra.network import TIERS
from services.cloud.outputs import StackOutputs
from services.command_names import SERVICE_COMMANDS
from services.common.drain import SHUTDOWN_FLUSH_SECONDS, DrainTiming
from services.common.kafka.admin import core_topic_specs
from services.common.mqtt.keep_alive import GRACE_FACTOR, IDLE_MARGIN_SECONDS
from services.common.settings import Settings
from services.common.versions import SPARK_VERSION, release_line
from spark_emr import emr
from spark_emr.settings import AnalyticsSettings
from tests.infra.conftest import ADMIN_CIDRS, METRICS_CIDRS, TLS_SECRET_ARN
from tests.infra.mocks import (
    ZONES,
    Deployment,
    Registered,
    is_secret_wrapper,
    stack_file_values,
    walk,
)

ROOT = Path(__file__).resolve().parents[2]

SERVICE = "aws:ecs/service:Service"
TASK_DEFINITION = "aws:ecs/taskDefinition:TaskDefinition"
INGRESS_RULE = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS_RULE = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
SECURITY_GROUP = "aws:ec2/securityGroup:SecurityGroup"
LISTENER = "aws:lb/listener:Listener"
TARGET_GROUP = "aws:lb/targetGroup:TargetGroup"
LOAD_BALANCER = "aws:lb/loadBalancer:LoadBalancer"
SCALING_TARGET = "aws:appautoscaling/target:Target"
SCALING_POLICY = "aws:appautoscaling/policy:Policy"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
ALARM = "aws:cloudwatch/metricAlarm:MetricAlarm"


def containers(deployment: Deployment) -> dict[str, dict[str, Any]]:
    """Each task definition's one container, by name (the service command)."""
    found = {}
    for definition in deployment.of_type(TASK_DEFINITION):
        [container] = json.loads(definition.inputs["containerDefinitions"])
        found[container["name"]] = container
    return found


def environment(container: dict[str, Any]) -> dict[str, str]:
    return {entry["name"]: entry["value"] for entry in container["environment"]}


def read_as_the_service(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The settings a service builds from the task's environment ``env``, and nothing else."""
    for name in os.environ:
        if name.startswith("CORMORANT_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return Settings(_env_file=None)  # type: ignore[call-arg]


def group_tier(deployment: Deployment) -> dict[str, str]:
    """Security group id → tier."""
    return {
        str(group.outputs["__id"]): group.name.rsplit("-", 1)[-1]
        for group in deployment.of_type(SECURITY_GROUP)
    }


def nlb_listeners(deployment: Deployment) -> dict[int, dict[str, Any]]:
    """The MQTT load balancer's listeners by port (not the admin load balancer's)."""
    [nlb] = [
        b for b in deployment.of_type(LOAD_BALANCER) if b.inputs["loadBalancerType"] == "network"
    ]
    return {
        int(listener.inputs["port"]): listener.inputs
        for listener in deployment.of_type(LISTENER)
        if listener.inputs["loadBalancerArn"] == nlb.outputs["arn"]
    }


def mqtt_target_group(deployment: Deployment) -> Registered:
    """The ingest tasks' MQTT target group (TCP, port 1883 or, passed through, 8883)."""
    [group] = [
        g
        for g in deployment.of_type(TARGET_GROUP)
        if g.inputs["protocol"] == "TCP" and g.inputs["port"] in (1883, 8883)
    ]
    return group


def policy_documents(deployment: Deployment) -> dict[str, dict[str, Any]]:
    """Every inline IAM policy, parsed, by logical name."""
    return {p.name: json.loads(p.inputs["policy"]) for p in deployment.of_type(ROLE_POLICY)}


# --- network -----------------------------------------------------------------------------


def test_subnets_public_and_private_in_three_zones(deployment: Deployment) -> None:
    subnets = deployment.of_type("aws:ec2/subnet:Subnet")
    public = [s for s in subnets if "-public-" in s.name]
    private = [s for s in subnets if "-private-" in s.name]
    assert sorted(s.inputs["availabilityZone"] for s in public) == ZONES
    assert sorted(s.inputs["availabilityZone"] for s in private) == ZONES
    assert not any(s.inputs.get("mapPublicIpOnLaunch") for s in subnets)
    vpc = ipaddress.ip_network(deployment.one("aws:ec2/vpc:Vpc").inputs["cidrBlock"])
    blocks = [ipaddress.ip_network(s.inputs["cidrBlock"]) for s in subnets]
    assert all(block.subnet_of(vpc) for block in blocks)
    assert not any(a.overlaps(b) for i, a in enumerate(blocks) for b in blocks[i + 1 :])


@pytest.mark.parametrize(("stack", "nat_gateways"), [("dev", 1), ("prod", 3)])
def test_nat_gateways_from_config(
    stack: str, nat_gateways: int, request: pytest.FixtureRequest
) -> None:
    deployment: Deployment = request.getfixturevalue(stack)
    nats = deployment.of_type("aws:ec2/natGateway:NatGateway")
    assert len(nats) == nat_gateways
    # Every private route table sends the internet to a NAT gateway; each gateway is used.
    private_routes = [
        r for r in deployment.of_type("aws:ec2/routeTable:RouteTable") if "-private-" in r.name
    ]
    assert len(private_routes) == 3
    used = {r.inputs["routes"][0]["natGatewayId"] for r in private_routes}
    assert used == {str(n.outputs["__id"]) for n in nats}


def test_s3_gateway_endpoint_on_private_routes(dev: Deployment) -> None:
    endpoint = dev.one("aws:ec2/vpcEndpoint:VpcEndpoint")
    assert endpoint.inputs["vpcEndpointType"] == "Gateway"
    assert endpoint.inputs["serviceName"] == "com.amazonaws.eu-west-1.s3"
    private_routes = {
        str(r.outputs["__id"])
        for r in dev.of_type("aws:ec2/routeTable:RouteTable")
        if "-private-" in r.name
    }
    assert set(endpoint.inputs["routeTableIds"]) == private_routes


def test_one_security_group_per_tier(deployment: Deployment) -> None:
    assert sorted(group_tier(deployment).values()) == sorted(TIERS)


def test_only_the_nlb_is_open_to_the_internet_and_only_on_mqtt_ports(
    deployment: Deployment,
) -> None:
    tiers = group_tier(deployment)
    open_rules = [r for r in deployment.of_type(INGRESS_RULE) if "cidrIpv4" in r.inputs]
    assert open_rules
    for rule in open_rules:
        tier, port = tiers[rule.inputs["securityGroupId"]], rule.inputs["fromPort"]
        assert rule.inputs["fromPort"] == rule.inputs["toPort"]
        if tier == "nlb":
            assert port in (shared.MQTT_PORT, shared.MQTT_TLS_PORT, shared.MQTT_WSS_PUBLIC_PORT)
            continue
        # Operators (the admin load balancer) and a Prometheus (the tasks' metrics): from
        # private ranges only.
        assert ipaddress.ip_network(rule.inputs["cidrIpv4"]).is_private, rule.name
        assert (tier, port) in {
            ("adminlb", 443),
            ("ingest", shared.HTTP_PORT),
            ("stages", shared.HTTP_PORT),
            ("integrations", shared.HTTP_PORT),
            ("admin", shared.ADMIN_PORT),
        }, rule.name
    # Every other ingress rule names the client tier's security group, never an address.
    for rule in deployment.of_type(INGRESS_RULE):
        assert ("cidrIpv4" in rule.inputs) != ("referencedSecurityGroupId" in rule.inputs)
    assert not any(
        "cidrBlocks" in rule or "ingress" in group.inputs
        for group in deployment.of_type(SECURITY_GROUP)
        for rule in group.inputs.get("ingress", [])
    )


def test_the_prod_stack_keeps_plaintext_mqtt_off_the_internet(
    prod: Deployment, dev: Deployment
) -> None:
    """Production serves MQTT over TLS only (8883, and WebSocket over TLS on 443); 1883 is
    neither an NLB listener nor open to any address. The dev stack keeps 1883 (trying
    Cormorant out), which the policy pack notes."""
    tls_ports = {shared.MQTT_TLS_PORT, shared.MQTT_WSS_PUBLIC_PORT}
    assert set(nlb_listeners(prod)) == tls_ports
    assert {port for _cidr, port in address_rules(prod, "nlb")} == tls_ports
    assert ("0.0.0.0/0", shared.MQTT_PORT) in address_rules(dev, "nlb")


def address_rules(deployment: Deployment, tier: str) -> set[tuple[str, int]]:
    """(CIDR, port) of every ingress rule of ``tier`` that names addresses."""
    tiers = group_tier(deployment)
    return {
        (r.inputs["cidrIpv4"], int(r.inputs["fromPort"]))
        for r in deployment.of_type(INGRESS_RULE)
        if "cidrIpv4" in r.inputs and tiers[r.inputs["securityGroupId"]] == tier
    }


def test_operators_and_prometheus_get_in_only_where_configured(
    dev: Deployment, prod: Deployment, serverless: Deployment
) -> None:
    # dev: no admin certificate, so no load balancer and no way in; no Prometheus.
    for tier in ("adminlb", "admin", "ingest", "stages", "integrations"):
        assert address_rules(dev, tier) == set(), tier
    # prod: operators from the VPC itself (the default).
    vpc = prod.one("aws:ec2/vpc:Vpc").inputs["cidrBlock"]
    assert address_rules(prod, "adminlb") == {(vpc, 443)}
    # serverless: the ranges its configuration lists, and nothing else.
    assert address_rules(serverless, "adminlb") == {(cidr, 443) for cidr in ADMIN_CIDRS}
    assert address_rules(serverless, "ingest") == {(c, shared.HTTP_PORT) for c in METRICS_CIDRS}
    assert address_rules(serverless, "stages") == {(c, shared.HTTP_PORT) for c in METRICS_CIDRS}
    assert address_rules(serverless, "integrations") == {
        (c, shared.HTTP_PORT) for c in METRICS_CIDRS
    }
    assert address_rules(serverless, "admin") == {(c, shared.ADMIN_PORT) for c in METRICS_CIDRS}


def test_tiers_reach_only_their_servers(dev: Deployment) -> None:
    tiers = group_tier(dev)
    paths = {
        (
            tiers[r.inputs["referencedSecurityGroupId"]],
            tiers[r.inputs["securityGroupId"]],
            int(r.inputs["fromPort"]),
        )
        for r in dev.of_type(INGRESS_RULE)
        if "referencedSecurityGroupId" in r.inputs
    }
    http, admin = shared.HTTP_PORT, shared.ADMIN_PORT
    assert paths == {
        ("nlb", "ingest", 1883),
        ("nlb", "ingest", shared.MQTT_WS_PORT),  # 443: WebSocket, TLS ended at the NLB
        ("nlb", "ingest", http),  # the target group's health check: /ready
        ("ingest", "kafka", 9096),
        ("ingest", "database", 5432),  # credentials, node id leases
        ("stages", "kafka", 9096),
        ("analytics", "kafka", 9096),
        ("stages", "cache", 6379),
        ("stages", "database", 5432),
        # The integrations stage: its integrations, and its MQTT bridges' way in.
        ("integrations", "kafka", 9096),
        ("integrations", "database", 5432),
        ("integrations", "ingest", shared.INGEST_DIRECT_MQTT_PORT),
        # The admin service: its load balancer's way in, and what it reads.
        ("adminlb", "admin", admin),
        ("admin", "ingest", http),
        ("admin", "stages", http),
        ("admin", "integrations", http),
        ("admin", "kafka", 9096),
        ("admin", "cache", 6379),
        ("admin", "database", 5432),
    }
    # Data stores send nothing out on their own.
    egress_tiers = {tiers[r.inputs["securityGroupId"]] for r in dev.of_type(EGRESS_RULE)}
    assert egress_tiers.isdisjoint({"kafka", "cache", "database"})


# --- kafka -------------------------------------------------------------------------------


def test_msk_provisioned(prod: Deployment) -> None:
    cluster = prod.one("aws:msk/cluster:Cluster").inputs
    assert cluster["kafkaVersion"] == "3.9.x" == shared.msk_kafka_version()
    assert cluster["numberOfBrokerNodes"] == 3
    assert cluster["encryptionInfo"]["encryptionInTransit"] == {
        "clientBroker": "TLS",
        "inCluster": True,
    }
    key = prod.named("aws:kms/key:Key", "cormorant-prod-key")
    assert key.inputs["enableKeyRotation"] is True
    assert cluster["encryptionInfo"]["encryptionAtRestKmsKeyArn"] == key.outputs["arn"]
    assert cluster["clientAuthentication"] == {
        "sasl": {"scram": True, "iam": False},
        "unauthenticated": False,
    }
    assert cluster["loggingInfo"]["brokerLogs"]["cloudwatchLogs"]["enabled"] is True
    assert len(cluster["brokerNodeGroupInfo"]["clientSubnets"]) == 3
    configuration = prod.one("aws:msk/configuration:Configuration").inputs
    properties = dict(line.split("=", 1) for line in configuration["serverProperties"].splitlines())
    assert properties["auto.create.topics.enable"] == "false"
    assert properties["default.replication.factor"] == "3"
    assert properties["min.insync.replicas"] == "2"
    assert (
        cluster["configurationInfo"]["arn"]
        == prod.one("aws:msk/configuration:Configuration").outputs["arn"]
    )


def test_scram_secret_for_msk(prod: Deployment) -> None:
    key = prod.named("aws:kms/key:Key", "cormorant-prod-key")
    [secret] = [s for s in prod.of_type("aws:secretsmanager/secret:Secret") if "scram" in s.name]
    assert secret.inputs["namePrefix"].startswith("AmazonMSK_")
    assert secret.inputs["kmsKeyId"] == key.outputs["arn"]
    association = prod.one("aws:msk/singleScramSecretAssociation:SingleScramSecretAssociation")
    assert association.inputs["secretArn"] == secret.outputs["arn"]
    [version] = [
        v
        for v in prod.of_type("aws:secretsmanager/secretVersion:SecretVersion")
        if "scram" in v.name
    ]
    assert is_secret_wrapper(version.inputs["secretString"])
    login = json.loads(version.inputs["secretString"]["value"])
    assert login["username"] == kafka.SCRAM_USERNAME
    assert login["password"] in prod.generated_secrets


def test_msk_serverless_with_iam(serverless: Deployment) -> None:
    cluster = serverless.one("aws:msk/serverlessCluster:ServerlessCluster").inputs
    assert cluster["clientAuthentication"] == {"sasl": {"iam": {"enabled": True}}}
    assert not serverless.of_type("aws:msk/cluster:Cluster")
    assert serverless.outputs["kafkaBootstrap"].endswith(":9098")
    env = environment(containers(serverless)["router"])
    assert env["CORMORANT_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
    assert env["CORMORANT_KAFKA_SASL_MECHANISM"] == "OAUTHBEARER"
    assert (
        "secrets" not in containers(serverless)["router"]
        or not containers(serverless)["router"]["secrets"]
    )


def test_msk_iam_task_roles_scoped_to_the_deployments_topics(serverless: Deployment) -> None:
    documents = policy_documents(serverless)
    router = documents["cormorant-serverless-router-task"]["Statement"]
    cluster_arn = serverless.outputs["mskClusterArn"]
    topics = [s for s in router if "kafka-cluster:WriteData" in s["Action"]]
    assert topics[0]["Resource"] == [cluster_arn.replace(":cluster/", ":topic/") + "/mqtt.*"]
    # Idempotent producers, and the router's Kafka transactions under the deployment's ids.
    [cluster] = [s for s in router if s["Resource"] == [cluster_arn]]
    assert "kafka-cluster:WriteDataIdempotently" in cluster["Action"]
    [transactions] = [s for s in router if "kafka-cluster:AlterTransactionalId" in s["Action"]]
    assert "kafka-cluster:DescribeTransactionalId" in transactions["Action"]
    assert transactions["Resource"] == [
        cluster_arn.replace(":cluster/", ":transactional-id/") + "/mqtt.*"
    ]
    # The Spark job only reads.
    spark = [
        action
        for statement in documents["cormorant-serverless-spark-job"]["Statement"]
        for action in statement["Action"]
        if action.startswith("kafka-cluster:")
    ]
    assert "kafka-cluster:ReadData" in spark and "kafka-cluster:WriteData" not in spark


# --- cache and database ------------------------------------------------------------------


def test_redis_replication_group(deployment: Deployment) -> None:
    group = deployment.one("aws:elasticache/replicationGroup:ReplicationGroup").inputs
    assert group["numCacheClusters"] >= 2
    assert group["automaticFailoverEnabled"] is True and group["multiAzEnabled"] is True
    assert group["atRestEncryptionEnabled"] is True and group["transitEncryptionEnabled"] is True
    assert is_secret_wrapper(group["authToken"])
    parameters = deployment.one("aws:elasticache/parameterGroup:ParameterGroup").inputs
    assert {"name": "maxmemory-policy", "value": "noeviction"} in parameters["parameters"]


def test_prod_redis_has_two_replicas_in_other_zones_and_device_persist_waits_for_one(
    prod: Deployment, dev: Deployment
) -> None:
    group = prod.one("aws:elasticache/replicationGroup:ReplicationGroup").inputs
    assert group["numCacheClusters"] == 3
    assert group["automaticFailoverEnabled"] is True and group["multiAzEnabled"] is True
    assert sorted(group["preferredCacheClusterAzs"]) == sorted(ZONES)
    # A write counts once a replica has it; after a failover the other replica confirms.
    assert environment(containers(prod)["device-persist"])["CORMORANT_REDIS_WAIT_REPLICAS"] == "1"
    # dev: one replica; waiting for it would stop every write until ElastiCache replaced a
    # failed node.
    dev_group = dev.one("aws:elasticache/replicationGroup:ReplicationGroup").inputs
    assert dev_group["numCacheClusters"] == 2
    assert len(set(dev_group["preferredCacheClusterAzs"])) == 2
    assert environment(containers(dev)["device-persist"])["CORMORANT_REDIS_WAIT_REPLICAS"] == "0"


@pytest.mark.parametrize(("stack", "production"), [("dev", False), ("prod", True)])
def test_rds_postgres(stack: str, production: bool, request: pytest.FixtureRequest) -> None:
    deployment: Deployment = request.getfixturevalue(stack)
    instance = deployment.one("aws:rds/instance:Instance").inputs
    assert instance["engine"] == "postgres"
    assert instance["storageEncrypted"] is True
    assert instance["publiclyAccessible"] is False
    assert instance["manageMasterUserPassword"] is True and "password" not in instance
    assert instance["multiAz"] is production
    assert instance["deletionProtection"] is production
    assert instance["skipFinalSnapshot"] is not production
    parameters = deployment.one("aws:rds/parameterGroup:ParameterGroup").inputs
    assert {"name": "rds.force_ssl", "value": "1"} in parameters["parameters"]


# --- compute -----------------------------------------------------------------------------


def test_one_fargate_service_per_service_command(deployment: Deployment) -> None:
    services = {s.inputs["name"]: s.inputs for s in deployment.of_type(SERVICE)}
    assert sorted(services) == sorted(SERVICE_COMMANDS)
    for service in services.values():
        assert service["launchType"] == "FARGATE"
        assert service["deploymentCircuitBreaker"] == {"enable": True, "rollback": True}
        assert service["networkConfiguration"]["assignPublicIp"] is False
    assert deployment.outputs["ecsServices"] == list(SERVICE_COMMANDS)


def test_every_service_has_its_log_group_and_autoscaling(deployment: Deployment) -> None:
    log_groups = {g.outputs["name"] for g in deployment.of_type("aws:cloudwatch/logGroup:LogGroup")}
    targets = {t.inputs["resourceId"]: t.inputs for t in deployment.of_type(SCALING_TARGET)}
    policies = deployment.of_type(SCALING_POLICY)
    cluster = deployment.outputs["ecsCluster"]
    for command, container in containers(deployment).items():
        options = container["logConfiguration"]["options"]
        assert container["logConfiguration"]["logDriver"] == "awslogs"
        assert options["awslogs-group"] in log_groups
        assert options["awslogs-group"].endswith(f"/{command}")
        if command in compute.ONE_OFF_COMMANDS:
            continue
        target = targets[f"service/{cluster}/{command}"]
        assert 1 <= target["minCapacity"] <= target["maxCapacity"]
        mine = [p for p in policies if p.inputs["resourceId"] == f"service/{cluster}/{command}"]
        kinds = {p.name.rsplit("-", 1)[-1] for p in mine}
        expected = {"cpu"} | (
            {"connections"}
            if command == "ingest"
            else {"lag"}
            if command in compute.LAG_TOPICS
            else set()
        )
        assert kinds == expected


def test_lag_scaling_watches_each_stages_own_consumer_group(prod: Deployment) -> None:
    names = shared.TopicNames("")
    for policy in prod.of_type(SCALING_POLICY):
        if not policy.name.endswith("-lag"):
            continue
        command = policy.name.removeprefix("cormorant-prod-").removesuffix("-lag")
        metrics = policy.inputs["targetTrackingScalingPolicyConfiguration"][
            "customizedMetricSpecification"
        ]["metrics"]
        [lag] = [m for m in metrics if m["id"] == "lag"]
        dimensions = {d["name"]: d["value"] for d in lag["metricStat"]["metric"]["dimensions"]}
        assert dimensions["Consumer Group"] == names.service_group(command)
        assert dimensions["Topic"] == getattr(names, compute.LAG_TOPICS[command])
        assert next(m for m in metrics if m.get("returnData"))["expression"] == "lag / tasks"


def test_ingest_scales_on_connections_per_task(prod: Deployment) -> None:
    [policy] = [p for p in prod.of_type(SCALING_POLICY) if p.name.endswith("ingest-connections")]
    config = policy.inputs["targetTrackingScalingPolicyConfiguration"]
    assert config["targetValue"] == 10_000
    [flows] = [m for m in config["customizedMetricSpecification"]["metrics"] if m["id"] == "flows"]
    assert flows["metricStat"]["metric"]["metricName"] == "ActiveFlowCount"


def test_task_environment_is_cormorants_settings(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    for command, container in containers(deployment).items():
        env = environment(container)
        names = [*env, *(s["name"] for s in container.get("secrets", []))]
        fields = {f"CORMORANT_{name.upper()}" for name in Settings.model_fields}
        assert set(names) <= fields, set(names) - fields
        assert env["CORMORANT_KAFKA_BOOTSTRAP"] == deployment.outputs["kafkaBootstrap"]
        assert env["CORMORANT_REPLICATION_FACTOR"] == "3"
        assert env["CORMORANT_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
        # What the service will read, validated as the service validates it (ECS adds
        # the secrets' values at task start).
        injected = {s["name"]: "<from Secrets Manager>" for s in container.get("secrets", [])}
        read = read_as_the_service({**env, **injected}, monkeypatch)
        assert read.kafka_bootstrap == deployment.outputs["kafkaBootstrap"]
        assert read.application_client_ids == []
        # The one image, by digest; the command picks what it runs.
        assert container["image"] == deployment.outputs["serviceImage"]
        assert container["command"][0] == command


def test_ingest_task_serves_mqtt_behind_the_nlb(dev: Deployment) -> None:
    ingest = containers(dev)["ingest"]
    env = environment(ingest)
    assert env["CORMORANT_MQTT_HOST"] == "0.0.0.0"
    # PROXY v2 as the target groups send it; taken from the VPC only (the NLB's addresses).
    vpc = ["10.40.0.0/16"]
    assert json.loads(env["CORMORANT_LISTENERS"]) == [
        {"kind": "mqtt", "port": shared.MQTT_PORT, "proxy_protocol": True,
         "proxy_trusted_cidrs": vpc},
        {"kind": "ws", "port": shared.MQTT_WS_PORT, "proxy_protocol": True,
         "proxy_trusted_cidrs": vpc},
    ]  # fmt: skip
    assert "CORMORANT_MQTT_PORT" not in env  # the direct port stays private (1884)
    assert env["CORMORANT_MAX_KEEP_ALIVE"] == "230"
    assert ingest["command"] == ["ingest", "--node-id-from-pool"]
    assert env["CORMORANT_INGEST_NODE_POOL_SIZE"] == "4"  # twice the ingest maxTasks (2)
    assert ingest["portMappings"] == [
        {"containerPort": 1883, "protocol": "tcp"},
        {"containerPort": shared.MQTT_WS_PORT, "protocol": "tcp"},
    ]
    [service] = [s for s in dev.of_type(SERVICE) if s.inputs["name"] == "ingest"]
    balancers = service.inputs["loadBalancers"]
    assert [b["containerPort"] for b in balancers] == [1883, shared.MQTT_WS_PORT]
    assert [b["targetGroupArn"] for b in balancers] == dev.outputs["targetGroupArns"]


def test_health_check_is_the_images(dev: Deployment) -> None:
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert compute.HEALTH_CHECK in dockerfile
    for command, container in containers(dev).items():
        if command in compute.ONE_OFF_COMMANDS:
            assert "healthCheck" not in container
        else:
            check = compute.ADMIN_HEALTH_CHECK if command == shared.ADMIN else compute.HEALTH_CHECK
            assert container["healthCheck"]["command"] == ["CMD-SHELL", check]
        if command not in compute.ONE_OFF_COMMANDS:
            # Every service serves /health, /ready and /metrics beyond its own loopback.
            assert environment(container)["CORMORANT_HTTP_HOST"] == "0.0.0.0"
    assert compute.RDS_CA_BUNDLE in dockerfile


def test_secrets_reach_tasks_only_as_secrets_manager_references(deployment: Deployment) -> None:
    for container in containers(deployment).values():
        env = environment(container)
        for name, value in env.items():
            if name.endswith("_SECRET_ARN"):  # where a task reads a secret itself
                assert value.startswith("arn:aws:secretsmanager:"), name
                continue
            assert not any(word in name for word in ("PASSWORD", "TOKEN", "SECRET"))
        for secret in container.get("secrets", []):
            assert secret["valueFrom"].startswith("arn:aws:secretsmanager:")


def test_store_secrets_only_where_the_store_is_read(
    dev: Deployment, serverless: Deployment
) -> None:
    # device_persist writes the DEVICE store; the admin service counts a session's messages.
    readers = {"device-persist", shared.ADMIN}
    redis = {c: [s["name"] for s in v.get("secrets", [])] for c, v in containers(dev).items()}
    for command, names in redis.items():
        assert ("CORMORANT_REDIS_PASSWORD" in names) == (command in readers), command
        # PostgreSQL: the admin service's users and audit trail (and the postgres store),
        # the ingest nodes' credentials and node id leases, the integrations, the migration
        # task; whose password the task reads itself (it may rotate).
        assert "CORMORANT_POSTGRES_PASSWORD" not in names
        env = environment(containers(dev)[command])
        has_postgres = "CORMORANT_POSTGRES_PASSWORD_SECRET_ARN" in env
        database_users = (
            shared.ADMIN,
            shared.INGEST,
            shared.INTEGRATIONS_COMMAND,
            shared.MIGRATE_COMMAND,
        )
        assert has_postgres == (command in database_users)
    env = environment(containers(dev)["device-persist"])
    assert env["CORMORANT_REDIS_URL"].startswith("rediss://master.")
    for command in readers:
        postgres = containers(serverless)[command]
        env = environment(postgres)
        assert env["CORMORANT_STORE_BACKEND"] == "postgres"
        assert env["CORMORANT_POSTGRES_SSLMODE"] == "verify-full"
        assert env["CORMORANT_POSTGRES_SSLROOTCERT"] == compute.RDS_CA_BUNDLE
        arn = env["CORMORANT_POSTGRES_PASSWORD_SECRET_ARN"]
        # The services' own login (the migration task writes it), read at each connection.
        assert ":secret:cormorant-serverless-postgres-cormorant-" in arn
        statements = policy_documents(serverless)[f"cormorant-serverless-{command}-task"]
        assert {
            "Effect": "Allow",
            "Action": ["secretsmanager:GetSecretValue"],
            "Resource": [arn],
        } in (statements["Statement"])
    # Each execution role reads exactly its own service's secrets.
    documents = policy_documents(dev)
    for command, names in redis.items():
        statements = documents[f"cormorant-dev-{command}-execution"]["Statement"]
        [read] = [s for s in statements if s["Action"] == ["secretsmanager:GetSecretValue"]]
        secret_arns = {
            s["valueFrom"].removesuffix(":username::").removesuffix(":password::")
            for s in containers(dev)[command]["secrets"]
        }
        assert set(read["Resource"]) == secret_arns, names


# --- ingress -----------------------------------------------------------------------------


def test_nlb_listeners_and_target_groups(dev: Deployment) -> None:
    nlb = dev.one(LOAD_BALANCER).inputs  # dev has no admin load balancer
    assert nlb["loadBalancerType"] == "network" and nlb["internal"] is False
    assert nlb["enableCrossZoneLoadBalancing"] is True
    listeners = nlb_listeners(dev)
    assert set(listeners) == {1883, 8883, 443}
    assert listeners[1883]["protocol"] == "TCP"
    assert listeners[8883]["protocol"] == "TLS"
    assert listeners[8883]["certificateArn"].startswith("arn:aws:acm:")
    assert listeners[8883]["sslPolicy"].startswith("ELBSecurityPolicy-TLS13")
    group = mqtt_target_group(dev)
    assert group.inputs["targetType"] == "ip" and group.inputs["protocol"] == "TCP"
    assert group.inputs["port"] == 1883
    # A task takes clients while its /ready says so (Kafka reached, state replayed).
    health = group.inputs["healthCheck"]
    assert (health["protocol"], health["port"], health["path"]) == (
        "HTTP",
        str(shared.HTTP_PORT),
        "/ready",
    )
    assert group.inputs["proxyProtocolV2"] is True
    assert listeners[8883]["defaultActions"][0]["targetGroupArn"] == group.outputs["arn"]
    dns = dev.outputs["nlbDnsName"]
    assert dev.outputs["mqttEndpoints"] == [
        f"mqtt://{dns}:1883",
        f"mqtts://{dns}:8883",
        f"wss://{dns}:443/mqtt",
    ]


def test_a_leaving_ingest_task_drains_within_what_ecs_and_the_nlb_allow(
    dev: Deployment,
) -> None:
    """ECS deregisters a leaving task, waits out the deregistration delay, sends SIGTERM
    and waits stopTimeout before a SIGKILL: the drain (its notice, then its paced
    disconnects within drain_seconds, then the last records) must fit after the SIGTERM,
    and the NLB must close no connection itself meanwhile."""
    timing = DrainTiming.of(shared.settings_for())  # the settings the tasks run with
    budget = timing.notice + timing.window + SHUTDOWN_FLUSH_SECONDS
    stop_timeouts = {name: c["stopTimeout"] for name, c in containers(dev).items()}
    assert budget < stop_timeouts[shared.INGEST] <= 120  # Fargate allows no more
    group = mqtt_target_group(dev).inputs
    assert group["connectionTermination"] is False  # not all at once after the delay
    assert group["deregistrationDelay"] >= timing.notice  # no new client by the SIGTERM
    [unhealthy] = group["targetHealthStates"]
    assert unhealthy["enableUnhealthyConnectionTermination"] is False
    assert unhealthy["unhealthyDrainingInterval"] >= stop_timeouts[shared.INGEST]
    # A drain by hand: the failed /ready is noticed within the notice.
    health = group["healthCheck"]
    assert health["interval"] * health["unhealthyThreshold"] <= timing.notice


def test_tls_passthrough_with_proxy_protocol(serverless: Deployment) -> None:
    listeners = nlb_listeners(serverless)
    assert set(listeners) == {8883, 443}
    for port in (8883, 443):
        assert listeners[port]["protocol"] == "TCP" and "certificateArn" not in listeners[port]
    group = mqtt_target_group(serverless)
    assert group.inputs["port"] == 8883 and group.inputs["proxyProtocolV2"] is True
    ingest = containers(serverless)["ingest"]
    assert ingest["portMappings"] == [
        {"containerPort": 8883, "protocol": "tcp"},
        {"containerPort": shared.MQTT_WSS_PORT, "protocol": "tcp"},
    ]
    env = environment(ingest)
    assert json.loads(env["CORMORANT_LISTENERS"]) == [
        # PROXY v2 as the target group sends it, taken from the VPC's addresses only
        {"kind": "mqtts", "port": 8883, "proxy_protocol": True,
         "proxy_trusted_cidrs": ["10.40.0.0/16"]},
        {"kind": "wss", "port": shared.MQTT_WSS_PORT, "proxy_protocol": True,
         "proxy_trusted_cidrs": ["10.40.0.0/16"]},
    ]  # fmt: skip
    assert env["CORMORANT_TLS_CLIENT_AUTH"] == "optional"
    secrets = {s["name"]: s["valueFrom"] for s in ingest["secrets"]}
    assert {name: secrets[name] for name in secrets if "TLS" in name} == {
        "CORMORANT_TLS_CERT_PEM": f"{TLS_SECRET_ARN}:certificate::",
        "CORMORANT_TLS_KEY_PEM": f"{TLS_SECRET_ARN}:privateKey::",
        "CORMORANT_TLS_CLIENT_CA_PEM": f"{TLS_SECRET_ARN}:clientCa::",
    }
    assert serverless.outputs["mqttEndpoints"] == [
        f"mqtts://{serverless.outputs['nlbDnsName']}:8883",
        f"wss://{serverless.outputs['nlbDnsName']}:443/mqtt",
    ]


def test_idle_timeout_and_keep_alive_agree(deployment: Deployment) -> None:
    timeouts = [
        NLB_TLS_IDLE_TIMEOUT_SECONDS
        if listener["protocol"] == "TLS"
        else listener["tcpIdleTimeoutSeconds"]
        for listener in nlb_listeners(deployment).values()
    ]
    keep_alive = int(environment(containers(deployment)["ingest"])["CORMORANT_MAX_KEEP_ALIVE"])
    assert keep_alive * GRACE_FACTOR + IDLE_MARGIN_SECONDS <= min(timeouts)


# --- admin access ------------------------------------------------------------------------


def test_admin_api_behind_an_internal_https_load_balancer(prod: Deployment) -> None:
    [alb] = [b for b in prod.of_type(LOAD_BALANCER) if b.inputs["loadBalancerType"] != "network"]
    assert alb.inputs["loadBalancerType"] == "application"
    assert alb.inputs["internal"] is True
    assert alb.inputs["dropInvalidHeaderFields"] is True
    private = {
        str(s.outputs["__id"])
        for s in prod.of_type("aws:ec2/subnet:Subnet")
        if "-private-" in s.name
    }
    assert set(alb.inputs["subnets"]) == private
    assert group_tier(prod)[alb.inputs["securityGroups"][0]] == "adminlb"
    [listener] = [
        each.inputs
        for each in prod.of_type(LISTENER)
        if each.inputs["loadBalancerArn"] == alb.outputs["arn"]
    ]
    certificate = stack_file_values("prod")["cormorant:adminCertificateArn"]
    assert (listener["port"], listener["protocol"]) == (443, "HTTPS")
    assert listener["certificateArn"] == certificate
    assert listener["sslPolicy"].startswith("ELBSecurityPolicy-TLS13")
    [group] = [g for g in prod.of_type(TARGET_GROUP) if g.inputs["protocol"] == "HTTP"]
    assert listener["defaultActions"] == [
        {"type": "forward", "targetGroupArn": group.outputs["arn"]}
    ]
    assert (group.inputs["port"], group.inputs["targetType"]) == (shared.ADMIN_PORT, "ip")
    assert group.inputs["healthCheck"]["path"] == "/ready"
    [service] = [s for s in prod.of_type(SERVICE) if s.inputs["name"] == shared.ADMIN]
    assert service.inputs["loadBalancers"] == [
        {
            "targetGroupArn": group.outputs["arn"],
            "containerName": shared.ADMIN,
            "containerPort": shared.ADMIN_PORT,
        }
    ]
    assert prod.outputs["adminUrl"] == f"https://{alb.outputs['dnsName']}/"


def test_no_admin_load_balancer_without_a_certificate(dev: Deployment) -> None:
    assert [b.inputs["loadBalancerType"] for b in dev.of_type(LOAD_BALANCER)] == ["network"]
    assert "adminUrl" not in dev.outputs
    [service] = [s for s in dev.of_type(SERVICE) if s.inputs["name"] == shared.ADMIN]
    assert service.inputs["loadBalancers"] == []
    # The service still runs, serving on its port to its own security group only.
    admin = containers(dev)[shared.ADMIN]
    assert admin["portMappings"] == [{"containerPort": shared.ADMIN_PORT, "protocol": "tcp"}]
    assert group_tier(dev)[service.inputs["networkConfiguration"]["securityGroups"][0]] == "admin"


def test_admin_credentials_come_from_secrets_manager(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    [secret] = [
        s for s in deployment.of_type("aws:secretsmanager/secret:Secret") if "admin" in s.name
    ]
    arn = secret.outputs["arn"]
    assert deployment.outputs["adminCredentialsSecretArn"] == arn
    [version] = [
        v
        for v in deployment.of_type("aws:secretsmanager/secretVersion:SecretVersion")
        if v.inputs["secretId"] == secret.outputs["__id"]
    ]
    # The stack's state keeps the login as a Pulumi secret (encrypted), never in clear.
    assert is_secret_wrapper(version.inputs["secretString"])
    login = json.loads(version.props["secretString"])
    assert login["username"] == "admin"
    assert login["password"] in deployment.generated_secrets
    admin = containers(deployment)[shared.ADMIN]
    env = environment(admin)
    assert env["CORMORANT_ADMIN_BOOTSTRAP_USER"] == "admin"
    [password] = [s for s in admin["secrets"] if s["name"] == "CORMORANT_ADMIN_BOOTSTRAP_PASSWORD"]
    assert password["valueFrom"] == f"{arn}:password::"
    # Only the admin task's execution role may read it.
    for name, document in policy_documents(deployment).items():
        readable = json.dumps(document)
        assert (arn in readable) == name.endswith(f"-{shared.ADMIN}-execution"), name
    # What the service reads from that environment: the user, the namespace of the tasks.
    settings = read_as_the_service(env, monkeypatch)
    assert settings.admin_bootstrap_user == "admin"
    assert settings.admin_host == "0.0.0.0"
    assert settings.cluster_dns_namespace == deployment.outputs["serviceDnsNamespace"]


def test_every_service_registers_its_tasks_in_dns(deployment: Deployment) -> None:
    namespace = deployment.one("aws:servicediscovery/privateDnsNamespace:PrivateDnsNamespace")
    assert namespace.inputs["name"] == deployment.outputs["serviceDnsNamespace"]
    assert namespace.inputs["vpc"] == deployment.one("aws:ec2/vpc:Vpc").outputs["__id"]
    registries = {
        r.outputs["arn"]: r.inputs
        for r in deployment.of_type("aws:servicediscovery/service:Service")
    }
    for service in deployment.of_type(SERVICE):
        registry = registries[service.inputs["serviceRegistries"]["registryArn"]]
        # <service>.<namespace>: what the admin service's cluster view resolves.
        assert registry["name"] == service.inputs["name"]
        assert registry["dnsConfig"]["namespaceId"] == namespace.outputs["__id"]
        assert registry["dnsConfig"]["dnsRecords"] == [{"ttl": 10, "type": "A"}]
    assert sorted(r["name"] for r in registries.values()) == sorted(SERVICE_COMMANDS)


def test_the_ecs_scrape_configuration_names_the_stacks_tasks(prod: Deployment) -> None:
    # monitoring/prometheus/ecs.yml as the stack exports it, its namespace filled in.
    config = yaml.safe_load(prod.outputs["prometheusConfig"])
    namespace = prod.outputs["serviceDnsNamespace"]
    for job in config["scrape_configs"]:
        [discovery] = job["dns_sd_configs"]
        service = job["job_name"]
        assert discovery["names"] == [f"{service}.{namespace}"]
        assert discovery["type"] == "A"
        expected = shared.ADMIN_PORT if service == shared.ADMIN else shared.HTTP_PORT
        assert discovery["port"] == expected
    assert sorted(j["job_name"] for j in config["scrape_configs"]) == sorted(SERVICE_COMMANDS)


# --- analytics and observability ---------------------------------------------------------


def test_archive_bucket(prod: Deployment) -> None:
    bucket = prod.one("aws:s3/bucket:Bucket").outputs["__id"]
    assert prod.one("aws:s3/bucketVersioning:BucketVersioning").inputs == {
        "bucket": bucket,
        "versioningConfiguration": {"status": "Enabled"},
    }
    [rule] = prod.one(
        "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
    ).inputs["rules"]
    assert rule["applyServerSideEncryptionByDefault"]["sseAlgorithm"] == "aws:kms"
    block = prod.one("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock").inputs
    assert all(
        block[k] is True
        for k in (
            "blockPublicAcls",
            "blockPublicPolicy",
            "ignorePublicAcls",
            "restrictPublicBuckets",
        )
    )
    [lifecycle] = prod.one(
        "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration"
    ).inputs["rules"]
    assert lifecycle["transitions"] == [{"days": 30, "storageClass": "STANDARD_IA"}]
    policy = json.loads(prod.one("aws:s3/bucketPolicy:BucketPolicy").inputs["policy"])
    assert policy["Statement"][0]["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    assert prod.outputs["archiveBucket"] == bucket


def test_emr_release_matches_the_pinned_spark(deployment: Deployment) -> None:
    application = deployment.one("aws:emrserverless/application:Application").inputs
    assert application["type"] == "spark"
    # The release the Spark jobs are built for (one definition: services/common/versions.py).
    assert application["releaseLabel"] == shared.EMR_RELEASE_LABEL
    spark = shared.EMR_RELEASE_SPARK[application["releaseLabel"]]
    assert release_line(spark) == release_line(SPARK_VERSION) == "3.5"
    assert application["autoStopConfiguration"]["enabled"] is True
    assert len(application["networkConfiguration"]["subnetIds"]) == 3


def test_emr_job_role_is_limited_to_the_archive_and_kafka(prod: Deployment) -> None:
    statements = policy_documents(prod)["cormorant-prod-spark-job"]["Statement"]
    bucket_arn = prod.one("aws:s3/bucket:Bucket").outputs["arn"]
    msk_secret = prod.named("aws:secretsmanager/secret:Secret", "cormorant-prod-scram").outputs[
        "arn"
    ]
    key = prod.named("aws:kms/key:Key", "cormorant-prod-key").outputs["arn"]
    for statement in statements:
        for resource in statement["Resource"]:
            assert resource in (bucket_arn, f"{bucket_arn}/*", msk_secret, key), resource


def test_iam_policies_never_allow_everything(deployment: Deployment) -> None:
    documents = policy_documents(deployment)
    assert documents
    for name, document in documents.items():
        for statement in document["Statement"]:
            assert statement["Effect"] == "Allow"
            assert "*" not in statement["Action"] and "NotAction" not in statement
            if statement["Resource"] == ["*"]:
                assert statement["Action"] == ["ecr:GetAuthorizationToken"], name


def test_alarms(prod: Deployment, serverless: Deployment) -> None:
    descriptions = [a.inputs["alarmDescription"] for a in prod.of_type(ALARM)]
    actions = {tuple(a.inputs["alarmActions"]) for a in prod.of_type(ALARM)}
    assert actions == {(prod.outputs["alarmTopicArn"],)}
    for needle, count in [
        ("fails the NLB health check", 2),  # 1883 (8883's too) and 8083 (443's)
        ("fewer tasks running than desired", len(SERVICE_COMMANDS)),
        ("Redis node", 2 * 3),
        ("PostgreSQL CPU", 1),
        ("PostgreSQL freeable memory", 1),
        ("data disk", 3),
        ("consumer lag", 2),
    ]:
        assert sum(needle in d for d in descriptions) == count, needle
    assert not any("data disk" in a.inputs["alarmDescription"] for a in serverless.of_type(ALARM))
    assert (
        prod.one("aws:sns/topicSubscription:TopicSubscription").inputs["endpoint"]
        == "oncall@example.com"
    )


# --- outputs and secrets -----------------------------------------------------------------


def test_outputs(deployment: Deployment) -> None:
    assert set(deployment.outputs) >= {
        "mqttEndpoints",
        "kafkaBootstrap",
        "archiveBucket",
        "emrApplicationId",
        "region",
        "ecsCluster",
        "ecsServices",
        "targetGroupArns",
        "mskClusterArn",
        "redisReplicationGroupId",
        "dbInstanceIdentifier",
        "topicsTaskDefinition",
        "migrateTaskDefinition",
    }
    assert deployment.secret_outputs == set()
    # What `cormorant cloud` reads from `pulumi stack output --json`.
    parsed = StackOutputs.parse(json.dumps(deployment.outputs))
    assert parsed.ecs_services == list(SERVICE_COMMANDS)
    assert parsed.log_groups[shared.TOPICS_COMMAND].endswith("/create-topics")


def test_outputs_give_the_spark_jobs_their_emr_target(
    deployment: Deployment, tmp_path: Path
) -> None:
    # What `cormorant analytics --emr --stack-outputs` reads from `pulumi stack output --json`.
    path = tmp_path / "outputs.json"
    path.write_text(json.dumps(deployment.outputs), encoding="utf-8")
    settings = AnalyticsSettings.model_construct(kafka_bootstrap="local:9092")
    target = emr.target_from(settings, path)
    outputs = deployment.outputs
    assert target == emr.EmrTarget(
        application_id=outputs["emrApplicationId"],
        job_role_arn=outputs["emrJobRoleArn"],
        bucket=outputs["archiveBucket"],
        region=outputs["region"],
        kafka_bootstrap=outputs["kafkaBootstrap"],
        kafka_secret_arn=outputs.get("kafkaScramSecretArn"),
        schedule_group=outputs["archiveScheduleGroup"],
        scheduler_role_arn=outputs["archiveSchedulerRoleArn"],
        glue_database=outputs["glueDatabase"],
    )
    # SCRAM (provisioned MSK): the secret the Spark job role may read; IAM (serverless): none.
    provisioned = bool(deployment.of_type("aws:msk/cluster:Cluster"))
    assert (target.kafka_secret_arn is not None) == provisioned
    if target.kafka_secret_arn is not None:
        [job_policy] = [
            d for n, d in policy_documents(deployment).items() if n.endswith("-spark-job")
        ]
        assert target.kafka_secret_arn in json.dumps(job_policy)


def test_generated_secrets_appear_only_as_pulumi_secrets(deployment: Deployment) -> None:
    assert deployment.generated_secrets  # the Redis AUTH token, and the SCRAM password
    for value in walk(deployment.outputs):
        assert not any(s in str(value) for s in deployment.generated_secrets)

    def clear_occurrences(value: Any) -> int:
        if is_secret_wrapper(value):
            return 0
        if isinstance(value, dict):
            return sum(clear_occurrences(v) for v in value.values())
        if isinstance(value, list):
            return sum(clear_occurrences(v) for v in value)
        return sum(s in str(value) for s in deployment.generated_secrets)

    for resource in deployment.resources:
        assert clear_occurrences(resource.inputs) == 0, resource.name


def test_the_topics_task_creates_the_projects_own_topics(
    serverless: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    topics = containers(serverless)[shared.TOPICS_COMMAND]
    assert topics["command"] == [shared.TOPICS_COMMAND]
    settings = read_as_the_service(environment(topics), monkeypatch)
    # The task runs `cormorant create-topics`, which creates these, with the stack's prefix.
    assert [s.name for s in core_topic_specs(settings)] == [
        "mqtt.msg.all",
        "mqtt.msg.persisted",
        "mqtt.client.acks",
        "mqtt.client.events",
        "mqtt.client.sessions",
        "mqtt.client.subscriptions",
        "mqtt.msg.retained",
        "mqtt.client.wills",
        "mqtt.msg.delayed",
    ]
    assert settings.replication_factor == kafka.REPLICATION_FACTOR
    assert serverless.outputs["topicsTaskDefinition"].endswith("create-topics:1")


def test_components_are_component_resources(dev: Deployment) -> None:
    components = [r.typ for r in dev.resources if r.typ.startswith("cormorant:")]
    assert sorted(components) == sorted(
        [
            *(
                f"cormorant:{kind}:{kind.capitalize()}"
                for kind in (
                    "network",
                    "images",
                    "kafka",
                    "cache",
                    "database",
                    "ingress",
                    "compute",
                    "analytics",
                    "observability",
                )
            ),
            "cormorant:admin:AdminAccess",
            "cormorant:lakehouse:Lakehouse",
        ]
    )


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_the_prometheus_configuration_scrapes_the_stacks_own_namespace(
    stack: str, request: pytest.FixtureRequest
) -> None:
    deployment: Deployment = request.getfixturevalue(stack)
    namespace = deployment.outputs["serviceDnsNamespace"]
    assert namespace == f"cormorant-{stack}.internal"
    [registered] = deployment.of_type(
        "aws:servicediscovery/privateDnsNamespace:PrivateDnsNamespace"
    )
    assert registered.inputs["name"] == namespace
    config = yaml.safe_load(deployment.outputs["prometheusConfig"])
    names = {
        job["job_name"]: [n for sd in job["dns_sd_configs"] for n in sd["names"]]
        for job in config["scrape_configs"]
    }
    assert names == {command: [f"{command}.{namespace}"] for command in SERVICE_COMMANDS}
    assert config["rule_files"] == ["rules.yml"]
