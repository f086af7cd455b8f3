"""What breaks a real `pulumi up` (or a later day) that the mocks could not show (issue 24).

One test per finding; each failed on the program before its fix.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict

import cormorant_policies as rules
from cormorant_infra import database, shared
from cormorant_infra.config import ConfigError, from_values
from services.common.kafka.admin import MSK_SERVERLESS_TOPIC_CONFIGS, core_topic_specs
from services.common.stores.postgres_pool import SecretsManagerPassword, password_of
from tests.infra.mocks import Deployment, as_pulumi_config, deploy, stack_file_values
from tests.infra.test_policies import check
from tests.infra.test_stack import (
    ALARM,
    INGRESS_RULE,
    SCALING_POLICY,
    SCALING_TARGET,
    SERVICE,
    TARGET_GROUP,
    containers,
    environment,
    group_tier,
    nlb_listeners,
    policy_documents,
    read_as_the_service,
)

KEY = "aws:kms/key:Key"
TOPIC = "aws:sns/topic:Topic"
LOG_GROUP = "aws:cloudwatch/logGroup:LogGroup"
ASSOCIATION = "aws:msk/singleScramSecretAssociation:SingleScramSecretAssociation"
SECRET_POLICY = "aws:secretsmanager/secretPolicy:SecretPolicy"
SECRET = "aws:secretsmanager/secret:Secret"
SECRET_VERSION = "aws:secretsmanager/secretVersion:SecretVersion"


def statements(document: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = json.loads(document)["Statement"]
    return found


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


# 1. Alarms never notified: CloudWatch cannot publish to a topic under alias/aws/sns.


def test_the_alarm_topics_key_lets_cloudwatch_publish(deployment: Deployment) -> None:
    topic = deployment.one(TOPIC).inputs
    [key] = [k for k in deployment.of_type(KEY) if k.outputs["arn"] == topic["kmsMasterKeyId"]]
    granted = {
        action
        for statement in statements(key.inputs["policy"])
        if statement["Principal"] == {"Service": "cloudwatch.amazonaws.com"}
        for action in as_list(statement["Action"])
    }
    assert granted >= {"kms:Decrypt", "kms:GenerateDataKey*"}
    assert check(rules.validate_encryption, rules.SNS, {"kmsMasterKeyId": "alias/aws/sns"})


# 2. A failed first deployment looked like success.


def test_services_wait_for_steady_state_and_for_kafka_to_let_them_in(
    deployment: Deployment,
) -> None:
    [ready] = deployment.of_type(ASSOCIATION) or deployment.of_type(
        "aws:msk/serverlessCluster:ServerlessCluster"
    )
    for service in deployment.of_type(SERVICE):
        assert service.inputs["waitForSteadyState"] is True, service.name
        assert ready.urn in service.dependencies, service.name


# 4. MSK needs GetSecretValue on the SCRAM secret.


def test_msk_may_read_the_scram_secret_before_it_is_associated(prod: Deployment) -> None:
    policy = prod.one(SECRET_POLICY)
    [statement] = statements(policy.inputs["policy"])
    assert statement["Principal"] == {"Service": "kafka.amazonaws.com"}
    assert statement["Action"] == "secretsmanager:GetSecretValue"
    assert policy.urn in prod.one(ASSOCIATION).dependencies


# 6. MSK Serverless refuses segment.ms (and every topic config but seven).


def test_topics_get_only_the_configs_their_kafka_accepts(
    serverless: Deployment, prod: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = environment(containers(serverless)[shared.TOPICS_COMMAND])
    settings = read_as_the_service(env, monkeypatch)
    assert settings.kafka_flavor == "msk-serverless"
    for spec in shared.topic_specs(settings):
        assert set(spec.configs) <= MSK_SERVERLESS_TOPIC_CONFIGS, spec
    assert {s.configs.get("cleanup.policy") for s in core_topic_specs(settings)} >= {"compact"}
    # Provisioned MSK keeps segment.ms, so compaction runs on quiet state topics.
    settings = read_as_the_service(environment(containers(prod)["router"]), monkeypatch)
    assert any("segment.ms" in spec.configs for spec in core_topic_specs(settings))


# 7. Client addresses were lost: IP targets over TCP/TLS do not preserve them.


def test_every_target_group_passes_the_client_address_on(deployment: Deployment) -> None:
    groups = [g for g in deployment.of_type(TARGET_GROUP) if g.inputs["targetType"] == "ip"]
    nlb_groups = [g for g in groups if g.inputs["protocol"] in ("TCP", "TLS")]
    assert nlb_groups
    for group in nlb_groups:
        assert group.inputs["proxyProtocolV2"] is True, group.name
    listeners = json.loads(environment(containers(deployment)["ingest"])["CORMORANT_LISTENERS"])
    assert all(listener["proxy_protocol"] for listener in listeners)
    without = {"targetType": "ip", "protocol": "TCP", "port": 1883, "proxyProtocolV2": False}
    assert check(rules.validate_client_addresses, rules.TARGET_GROUP, without)


# 8. No MQTT over WebSocket from the internet.


def test_mqtt_over_websocket_on_443(prod: Deployment) -> None:
    listener = nlb_listeners(prod)[shared.MQTT_WSS_PUBLIC_PORT]
    assert listener["protocol"] == "TLS"
    [group] = [
        g
        for g in prod.of_type(TARGET_GROUP)
        if g.outputs["arn"] == listener["defaultActions"][0]["targetGroupArn"]
    ]
    assert group.inputs["port"] == shared.MQTT_WS_PORT
    listeners = json.loads(environment(containers(prod)["ingest"])["CORMORANT_LISTENERS"])
    assert {"kind": "ws", "port": shared.MQTT_WS_PORT} in [
        {"kind": entry["kind"], "port": entry["port"]} for entry in listeners
    ]
    assert f"wss://{prod.outputs['nlbDnsName']}:443/mqtt" in prod.outputs["mqttEndpoints"]


# 9. Plaintext MQTT from the whole internet.


def test_no_plaintext_mqtt_from_the_internet_unless_asked_and_never_in_production(
    prod: Deployment,
) -> None:
    values = stack_file_values("dev")
    del values["cormorant:plainMqtt"]
    keys = {
        k.removeprefix("cormorant:"): v
        for k, v in as_pulumi_config(values).items()
        if k.startswith("cormorant:")
    }
    assert from_values(keys).plain_mqtt is False
    with pytest.raises(ConfigError, match="plaintext MQTT"):
        from_values(keys | {"plainMqtt": "true", "production": "true"})
    tiers = group_tier(prod)
    nlb_rules = [
        r for r in prod.of_type(INGRESS_RULE) if tiers[r.inputs["securityGroupId"]] == "nlb"
    ]
    assert nlb_rules
    assert all(r.inputs["tags"] == {shared.PRODUCTION_TAG: "true"} for r in nlb_rules)
    opened = {"cidrIpv4": "0.0.0.0/0", "ipProtocol": "tcp", "fromPort": 1883, "toPort": 1883}
    tagged = opened | {"tags": {shared.PRODUCTION_TAG: "true"}}
    validate = rules.validate_production_plaintext_mqtt
    assert check(validate, rules.SG_INGRESS, tagged)
    assert not check(validate, rules.SG_INGRESS, opened)
    [policy] = [p for p in rules.POLICIES if p.name == "no-plaintext-mqtt-in-production"]
    assert policy.enforcement_level is None  # mandatory, the pack's default


# 10. What an operator is missing.


def test_kafka_and_database_alarms(prod: Deployment) -> None:
    metrics = [a.inputs.get("metricName") for a in prod.of_type(ALARM)]
    assert metrics.count("OfflinePartitionsCount") == 1
    assert metrics.count("UnderMinIsrPartitionCount") == 3  # one per broker
    [storage] = [
        a.inputs for a in prod.of_type(ALARM) if a.inputs.get("metricName") == "FreeStorageSpace"
    ]
    assert storage["comparisonOperator"] == "LessThanThreshold"
    assert storage["threshold"] == 0.1 * 1000 * 1024**3  # 10 % of dbMaxAllocatedStorageGib


def test_msk_storage_grows_by_itself(prod: Deployment) -> None:
    [target] = [
        t.inputs for t in prod.of_type(SCALING_TARGET) if t.inputs["serviceNamespace"] == "kafka"
    ]
    assert target["scalableDimension"] == "kafka:broker-storage:VolumeSize"
    assert target["resourceId"] == prod.outputs["mskClusterArn"]
    assert target["maxCapacity"] == 2000
    [policy] = [
        p.inputs for p in prod.of_type(SCALING_POLICY) if p.inputs["serviceNamespace"] == "kafka"
    ]
    tracking = policy["targetTrackingScalingPolicyConfiguration"]
    metric = tracking["predefinedMetricSpecification"]["predefinedMetricType"]
    assert metric == "KafkaBrokerStorageUtilization" and 50 <= tracking["targetValue"] <= 60


def test_vpc_flow_logs(deployment: Deployment) -> None:
    flow = deployment.one("aws:ec2/flowLog:FlowLog").inputs
    assert flow["vpcId"] == deployment.one("aws:ec2/vpc:Vpc").outputs["__id"]
    assert flow["trafficType"] == "ALL"
    [group] = [
        g for g in deployment.of_type(LOG_GROUP) if g.outputs["arn"] == flow["logDestination"]
    ]
    assert group.inputs["retentionInDays"] > 0


def test_the_postgresql_log_group_expires(prod: Deployment) -> None:
    instance = prod.one("aws:rds/instance:Instance")
    name = f"/aws/rds/instance/{instance.inputs['identifier']}/postgresql"
    [group] = [g for g in prod.of_type(LOG_GROUP) if g.inputs.get("name") == name]
    assert group.inputs["retentionInDays"] == 90
    # Declared before the instance: RDS would otherwise create it, never to expire.
    assert group.urn in instance.dependencies


def test_stateful_resources_are_protected_in_production(prod: Deployment, dev: Deployment) -> None:
    protected = {r.typ for r in prod.resources if r.protect}
    assert protected == {
        "aws:msk/cluster:Cluster",
        "aws:elasticache/replicationGroup:ReplicationGroup",
        "aws:rds/instance:Instance",
        "aws:s3/bucket:Bucket",
        # The releases' images: a rollback needs them (issue 24, part 2).
        "aws:ecr/repository:Repository",
    }
    assert not any(r.protect for r in dev.resources)


def test_the_listeners_forward_where_the_tasks_listen(deployment: Deployment) -> None:
    """Every NLB listener's target group is one the ingest service registers with."""
    [ingest] = [s for s in deployment.of_type(SERVICE) if s.inputs["name"] == "ingest"]
    registered = {b["targetGroupArn"] for b in ingest.inputs["loadBalancers"]}
    forwarded = {
        listener["defaultActions"][0]["targetGroupArn"]
        for listener in nlb_listeners(deployment).values()
    }
    assert forwarded == registered


# 3. PostgreSQL logins broke after a week: RDS rotates the password ECS injected at start,
#    and the services logged in as the master user.


def test_services_log_in_as_their_own_role_that_the_migration_task_keeps(
    serverless: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    [instance] = serverless.of_type("aws:rds/instance:Instance")
    assert instance.inputs["username"] == database.MASTER_USERNAME != shared.SERVICE_ROLE
    [managed] = instance.outputs["masterUserSecrets"]
    master = managed["secretArn"]
    [login] = [s for s in serverless.of_type(SECRET) if s.name.endswith("-service-login")]
    versions = serverless.of_type(SECRET_VERSION)
    assert f"{login.name}-id" not in {v.inputs["secretId"] for v in versions}  # not in state
    own = login.outputs["arn"]
    for command in (shared.INGEST, "device-persist", shared.ADMIN):
        container = containers(serverless)[command]
        injected = {s["name"]: "<from Secrets Manager>" for s in container["secrets"]}
        settings = read_as_the_service({**environment(container), **injected}, monkeypatch)
        assert conninfo_to_dict(settings.postgres_dsn)["user"] == shared.SERVICE_ROLE
        # Read at each new connection: a rotated password reaches a running task.
        assert password_of(settings) == SecretsManagerPassword(own)
        assert "CORMORANT_POSTGRES_PASSWORD" not in {s["name"] for s in container["secrets"]}
        assert master not in json.dumps(container)
    task = containers(serverless)[shared.MIGRATE_COMMAND]
    assert task["command"] == [shared.MIGRATE_COMMAND] and "healthCheck" not in task
    settings = read_as_the_service(environment(task), monkeypatch)
    assert conninfo_to_dict(settings.postgres_dsn)["user"] == database.MASTER_USERNAME
    assert password_of(settings) == SecretsManagerPassword(master)
    assert settings.postgres_service_password_secret_arn == own
    assert serverless.outputs["migrateTaskDefinition"].endswith("migrate-db:1")
    # Only the migration task's role may read the master secret, or write the login.
    for name, document in policy_documents(serverless).items():
        granted = [s for s in document["Statement"] if master in json.dumps(s["Resource"])]
        put = "secretsmanager:PutSecretValue"
        writes = [s for s in document["Statement"] if put in s["Action"]]
        if name.endswith(f"-{shared.MIGRATE_COMMAND}-task"):
            assert granted and [w["Resource"] for w in writes] == [[own]]
        else:
            assert not granted and not writes, name


def test_the_bootstrap_up_starts_no_service_before_the_migration_task_ran() -> None:
    # The services' role exists only once `cormorant cloud migrate-db` ran: on the first
    # `up` they would fail to log in, and the circuit breaker would fail the deployment.
    first = deploy("dev-bootstrap", {**stack_file_values("dev"), "cormorant:bootstrap": True})
    assert {s.inputs["desiredCount"] for s in first.of_type(SERVICE)} == {0}
    ecs = [t for t in first.of_type(SCALING_TARGET) if t.inputs["serviceNamespace"] == "ecs"]
    assert len(ecs) == len(shared.SERVICE_COMMANDS)
    assert {t.inputs["minCapacity"] for t in ecs} == {0}
    assert first.outputs["migrateTaskDefinition"].endswith("migrate-db:1")
