"""The whole deployment: the components wired together, and the stack's outputs.

``__main__.py`` calls :func:`build` with the stack's configuration and exports what it
returns; the tests call it under Pulumi's mocks.
"""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_aws as aws

from cormorant_infra.admin_access import AdminAccess
from cormorant_infra.analytics import Analytics
from cormorant_infra.cache import Cache
from cormorant_infra.compute import Compute
from cormorant_infra.config import StackConfig
from cormorant_infra.database import Database
from cormorant_infra.images import Images
from cormorant_infra.ingress import Ingress
from cormorant_infra.kafka import Kafka
from cormorant_infra.lakehouse import Lakehouse
from cormorant_infra.monitoring import prometheus_config
from cormorant_infra.network import Network
from cormorant_infra.observability import Observability


def build(config: StackConfig) -> dict[str, Any]:
    """Declare every resource of the stack; return its outputs (name → value).

    Outputs (what ``pulumi stack output --json`` prints and ``cormorant cloud`` and
    ``cormorant analytics --emr`` read): ``imageRepository`` (where a release is pushed)
    and ``serviceImage`` (``<imageRepository>@<imageDigest>``, what every task runs),
    ``mqttEndpoints``, ``nlbDnsName``,
    ``kafkaBootstrap``, ``archiveBucket``, ``emrApplicationId``, ``emrJobRoleArn``,
    ``sparkImage`` (the image to push), ``glueDatabase``, ``athenaWorkgroup``,
    ``archiveScheduleGroup``, ``archiveSchedulerRoleArn`` and, with SCRAM,
    ``kafkaScramSecretArn`` (the Spark jobs read their login there) for users and analysts
    (:func:`spark_emr.emr.target_from`); the names and ARNs ``cormorant
    cloud status`` checks (``region``, ``ecsCluster``, ``ecsServices``,
    ``targetGroupArns``, ``mskClusterArn``, ``redisReplicationGroupId``,
    ``dbInstanceIdentifier``) and what ``cormorant cloud create-topics`` runs
    (``topicsTaskDefinition``, ``taskSubnetIds``, ``taskSecurityGroupId``, ``logGroups``),
    and what ``cormorant cloud doctor`` adds (``topicPrefix``, ``alarmTopicArn``,
    ``alarmNamePrefix``); the ECS ones only once ``imageDigest`` is set (a new stack's
    first ``up`` declares no services);
    for operators, ``adminCredentialsSecretArn`` (the first admin login: the ARN, never the
    password), ``adminUrl`` (with ``adminCertificateArn``) and ``serviceDnsNamespace``
    (where a Prometheus finds the tasks: ``<service>.<namespace>``) with ``prometheusConfig``
    (``monitoring/prometheus/ecs.yml`` rendered with it,
    :func:`cormorant_infra.monitoring.prometheus_config`). They parse as
    :class:`services.cloud.outputs.StackOutputs`. None is secret.
    """
    name = f"cormorant-{pulumi.get_stack()}"
    region = aws.get_region().region
    network = Network(name, config, region)
    kafka = Kafka(name, config, network)
    cache = Cache(name, config, network)
    database = Database(name, config, network)
    ingress = Ingress(name, config, network)
    admin = AdminAccess(name, config, network)
    # Declared first: a new stack's first `up` (no imageDigest yet) makes the repository
    # early, so the release can be pushed while MSK is still being created.
    images = Images(name, config)
    compute = (
        None
        if images.service_image is None
        else Compute(name, config, region, images, network, kafka, cache, database, ingress, admin)
    )
    analytics = Analytics(name, config, network, kafka)
    lakehouse = Lakehouse(name, region, analytics)
    alarms = Observability(name, config, kafka, cache, database, ingress, compute)
    outputs: dict[str, Any] = {
        "imageRepository": images.repository_url,
        "mqttEndpoints": ingress.endpoints,
        "nlbDnsName": ingress.dns_name,
        "kafkaBootstrap": kafka.bootstrap,
        "archiveBucket": analytics.bucket_name,
        "emrApplicationId": analytics.application_id,
        "emrJobRoleArn": analytics.job_role_arn,
        "sparkImage": analytics.image_uri,
        "glueDatabase": lakehouse.database_name,
        "athenaWorkgroup": lakehouse.workgroup_name,
        "archiveScheduleGroup": lakehouse.schedule_group_name,
        "archiveSchedulerRoleArn": lakehouse.scheduler_role_arn,
        "region": region,
        "targetGroupArns": list(ingress.target_groups.values()),
        "mskClusterArn": kafka.cluster_arn,
        "topicPrefix": config.topic_prefix,
        "redisReplicationGroupId": cache.replication_group_id,
        "dbInstanceIdentifier": database.identifier,
        "alarmTopicArn": alarms.topic_arn,
        "alarmNamePrefix": f"{name}-",
        "adminCredentialsSecretArn": admin.credentials_secret_arn,
    }
    if compute is not None:
        outputs |= {
            "serviceImage": images.service_image,
            "ecsCluster": compute.cluster_name,
            "ecsServices": list(compute.service_names.values()),
            "topicsTaskDefinition": compute.topics_task_definition,
            "migrateTaskDefinition": compute.migrate_task_definition,
            "taskSubnetIds": compute.task_subnet_ids,
            "taskSecurityGroupId": compute.task_security_group,
            "logGroups": compute.log_groups,
            "serviceDnsNamespace": compute.dns_namespace,
            "prometheusConfig": prometheus_config(compute.dns_namespace),
        }
    if admin.url is not None:
        outputs["adminUrl"] = admin.url
    if kafka.scram_secret_arn is not None:
        outputs["kafkaScramSecretArn"] = kafka.scram_secret_arn
    return outputs
