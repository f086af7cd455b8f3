"""Every component of infra/ declares what it should, with the settings that matter (mocks)."""

from __future__ import annotations

import ipaddress
import json
import os
from pathlib import Path
from typing import Any

import pytest

from cormorant_infra import compute, kafka, shared
from cormorant_infra.config import NLB_TLS_IDLE_TIMEOUT_SECONDS
from cormorant_infra.network import TIERS
from services.cli import SERVICE_COMMANDS
from services.cloud.outputs import StackOutputs
from services.common.kafka.admin import core_topic_specs
from services.common.mqtt.keep_alive import GRACE_FACTOR, IDLE_MARGIN_SECONDS
from services.common.settings import Settings
from services.common.versions import SPARK_VERSION, release_line
from spark_emr import emr
from spark_emr.settings import AnalyticsSettings
from tests.infra.mocks import ZONES, Deployment, is_secret_wrapper, walk

ROOT = Path(__file__).resolve().parents[2]

SERVICE = "aws:ecs/service:Service"
TASK_DEFINITION = "aws:ecs/taskDefinition:TaskDefinition"
INGRESS_RULE = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS_RULE = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
SECURITY_GROUP = "aws:ec2/securityGroup:SecurityGroup"
LISTENER = "aws:lb/listener:Listener"
TARGET_GROUP = "aws:lb/targetGroup:TargetGroup"
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
        assert tiers[rule.inputs["securityGroupId"]] == "nlb"
        assert rule.inputs["fromPort"] == rule.inputs["toPort"]
        assert rule.inputs["fromPort"] in (shared.MQTT_PORT, shared.MQTT_TLS_PORT)
    # Every other ingress rule names the client tier's security group, never an address.
    for rule in deployment.of_type(INGRESS_RULE):
        assert ("cidrIpv4" in rule.inputs) != ("referencedSecurityGroupId" in rule.inputs)
    assert not any(
        "cidrBlocks" in rule or "ingress" in group.inputs
        for group in deployment.of_type(SECURITY_GROUP)
        for rule in group.inputs.get("ingress", [])
    )


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
    assert paths == {
        ("nlb", "ingest", 1883),
        ("ingest", "kafka", 9096),
        ("stages", "kafka", 9096),
        ("analytics", "kafka", 9096),
        ("stages", "cache", 6379),
        ("stages", "database", 5432),
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
    key = prod.one("aws:kms/key:Key")
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
    key = prod.one("aws:kms/key:Key")
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
        if command == shared.TOPICS_COMMAND:
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
        # What the service will read, validated as the service validates it.
        read = read_as_the_service(env, monkeypatch)
        assert read.kafka_bootstrap == deployment.outputs["kafkaBootstrap"]
        assert read.application_client_ids == []
        assert container["image"].endswith(
            f":0.1.0-{'topics' if command == shared.TOPICS_COMMAND else command}"
        )


def test_ingest_task_serves_mqtt_behind_the_nlb(dev: Deployment) -> None:
    ingest = containers(dev)["ingest"]
    env = environment(ingest)
    assert env["CORMORANT_MQTT_HOST"] == "0.0.0.0"
    assert env["CORMORANT_MQTT_PORT"] == str(shared.MQTT_PORT)
    assert env["CORMORANT_MAX_KEEP_ALIVE"] == "230"
    assert ingest["command"] == ["--node-id-from-ecs-task"]
    assert ingest["portMappings"] == [{"containerPort": 1883, "protocol": "tcp"}]
    [service] = [s for s in dev.of_type(SERVICE) if s.inputs["name"] == "ingest"]
    [balancer] = service.inputs["loadBalancers"]
    assert balancer["containerPort"] == 1883
    assert balancer["targetGroupArn"] == dev.outputs["targetGroupArns"][0]


def test_health_check_is_the_images(dev: Deployment) -> None:
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert compute.HEALTH_CHECK.replace('"', '\\"') in dockerfile
    for command, container in containers(dev).items():
        if command == shared.TOPICS_COMMAND:
            assert "healthCheck" not in container
        else:
            assert container["healthCheck"]["command"] == ["CMD-SHELL", compute.HEALTH_CHECK]
    assert compute.RDS_CA_BUNDLE in dockerfile


def test_secrets_reach_tasks_only_as_secrets_manager_references(deployment: Deployment) -> None:
    for container in containers(deployment).values():
        env = environment(container)
        for name in env:
            assert not any(word in name for word in ("PASSWORD", "TOKEN", "SECRET"))
        for secret in container.get("secrets", []):
            assert secret["valueFrom"].startswith("arn:aws:secretsmanager:")


def test_store_secrets_only_in_device_persist(dev: Deployment, serverless: Deployment) -> None:
    redis = {c: [s["name"] for s in v.get("secrets", [])] for c, v in containers(dev).items()}
    assert "CORMORANT_REDIS_PASSWORD" in redis["device-persist"]
    assert all(
        "CORMORANT_REDIS_PASSWORD" not in v for c, v in redis.items() if c != "device-persist"
    )
    env = environment(containers(dev)["device-persist"])
    assert env["CORMORANT_REDIS_URL"].startswith("rediss://master.")
    postgres = containers(serverless)["device-persist"]
    env = environment(postgres)
    assert env["CORMORANT_STORE_BACKEND"] == "postgres"
    assert env["CORMORANT_POSTGRES_SSLMODE"] == "verify-full"
    assert env["CORMORANT_POSTGRES_SSLROOTCERT"] == compute.RDS_CA_BUNDLE
    [password] = [s for s in postgres["secrets"] if s["name"] == "CORMORANT_POSTGRES_PASSWORD"]
    assert password["valueFrom"].endswith(":password::")
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
    nlb = dev.one("aws:lb/loadBalancer:LoadBalancer").inputs
    assert nlb["loadBalancerType"] == "network" and nlb["internal"] is False
    assert nlb["enableCrossZoneLoadBalancing"] is True
    listeners = {
        int(listener.inputs["port"]): listener.inputs for listener in dev.of_type(LISTENER)
    }
    assert listeners[1883]["protocol"] == "TCP"
    assert listeners[8883]["protocol"] == "TLS"
    assert listeners[8883]["certificateArn"].startswith("arn:aws:acm:")
    assert listeners[8883]["sslPolicy"].startswith("ELBSecurityPolicy-TLS13")
    [group] = dev.of_type(TARGET_GROUP)
    assert group.inputs["targetType"] == "ip" and group.inputs["protocol"] == "TCP"
    assert group.inputs["port"] == 1883
    assert group.inputs["healthCheck"]["protocol"] == "TCP"
    assert group.inputs["deregistrationDelay"] == 30
    assert group.inputs["proxyProtocolV2"] is False
    assert listeners[8883]["defaultActions"][0]["targetGroupArn"] == group.outputs["arn"]
    assert dev.outputs["mqttEndpoints"] == [
        f"mqtt://{dev.outputs['nlbDnsName']}:1883",
        f"mqtts://{dev.outputs['nlbDnsName']}:8883",
    ]


def test_tls_passthrough_with_proxy_protocol(serverless: Deployment) -> None:
    listeners = {
        int(listener.inputs["port"]): listener.inputs for listener in serverless.of_type(LISTENER)
    }
    assert list(listeners) == [8883]
    assert listeners[8883]["protocol"] == "TCP" and "certificateArn" not in listeners[8883]
    [group] = serverless.of_type(TARGET_GROUP)
    assert group.inputs["port"] == 8883 and group.inputs["proxyProtocolV2"] is True
    assert containers(serverless)["ingest"]["portMappings"] == [
        {"containerPort": 8883, "protocol": "tcp"}
    ]
    assert serverless.outputs["mqttEndpoints"] == [
        f"mqtts://{serverless.outputs['nlbDnsName']}:8883"
    ]


def test_idle_timeout_and_keep_alive_agree(deployment: Deployment) -> None:
    timeouts = [
        NLB_TLS_IDLE_TIMEOUT_SECONDS
        if listener.inputs["protocol"] == "TLS"
        else listener.inputs["tcpIdleTimeoutSeconds"]
        for listener in deployment.of_type(LISTENER)
    ]
    keep_alive = int(environment(containers(deployment)["ingest"])["CORMORANT_MAX_KEEP_ALIVE"])
    assert keep_alive * GRACE_FACTOR + IDLE_MARGIN_SECONDS <= min(timeouts)


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
    key = prod.one("aws:kms/key:Key").outputs["arn"]
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
        ("fails the NLB health check", 1),
        ("fewer tasks running than desired", len(SERVICE_COMMANDS)),
        ("Redis node", 2 * 3),
        ("PostgreSQL CPU", 1),
        ("PostgreSQL freeable memory", 1),
        ("data disk", 3),
        ("consumer lag", 2),
    ]:
        assert sum(needle in d for d in descriptions) == count, needle
    assert not any("data disk" in a.inputs["alarmDescription"] for a in serverless.of_type(ALARM))
    assert prod.one("aws:sns/topic:Topic").inputs["kmsMasterKeyId"] == "alias/aws/sns"
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
    assert topics["image"].endswith(":0.1.0-topics")
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
    ]
    assert settings.replication_factor == kafka.REPLICATION_FACTOR
    assert serverless.outputs["topicsTaskDefinition"].endswith("create-topics:1")


def test_components_are_component_resources(dev: Deployment) -> None:
    components = [r.typ for r in dev.resources if r.typ.startswith("cormorant:")]
    assert sorted(components) == sorted(
        f"cormorant:{kind}:{kind.capitalize()}"
        for kind in (
            "network",
            "kafka",
            "cache",
            "database",
            "ingress",
            "compute",
            "analytics",
            "observability",
        )
    )
