"""Kafka: Amazon MSK, provisioned with SASL/SCRAM or Serverless with IAM (``cormorant:kafkaMode``).

Provisioned: Kafka of the line Cormorant is tested with, brokers spread over the zones,
TLS between clients and brokers and between brokers, storage encrypted with a
customer-managed KMS key, broker logs in CloudWatch, and a configuration that refuses
automatic topic creation and keeps every acknowledged record on two replicas
(``min.insync.replicas=2`` with ``acks=all``). Clients log in with SCRAM-SHA-512; the
username and password live in a Secrets Manager secret (MSK requires the ``AmazonMSK_``
name prefix and a customer-managed key). Serverless: IAM authentication, nothing to size.

Topics are not Pulumi resources: the project's own topic administration creates them
(``cormorant create-topics``, the one-off ECS task of :mod:`cormorant_infra.compute`), so
names, partitions and compaction have one source of truth.
"""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws
import pulumi_random as random

from cormorant_infra import iam, shared
from cormorant_infra.config import StackConfig
from cormorant_infra.network import Network

SCRAM_USERNAME = "cormorant"

SERVER_PROPERTIES = {
    # Topics come from the topic administration only, with their partitions and configs.
    "auto.create.topics.enable": "false",
    "default.replication.factor": "3",
    # With acks=all, an acknowledged record is on at least two brokers.
    "min.insync.replicas": "2",
    "unclean.leader.election.enable": "false",
}
"""The brokers' configuration (server.properties) of a provisioned cluster."""

STORAGE_TARGET_PERCENT = 60.0
"""The brokers' disk use that storage autoscaling keeps them under (percent)."""

REPLICATION_FACTOR = 3
"""Replicas of every topic Cormorant creates (CORMORANT_REPLICATION_FACTOR); MSK Serverless
only accepts 3."""


def _scram_login(password: str) -> str:
    """The SCRAM secret's JSON: the username and password MSK reads."""
    return json.dumps({"username": SCRAM_USERNAME, "password": password})


def topic_arn_pattern(cluster_arn: str, kind: str, name_pattern: str) -> str:
    """The ARN pattern of a cluster's topics, groups or transactional ids for MSK IAM
    policies: ``arn:aws:kafka:<r>:<a>:cluster/<name>/<uuid>`` →
    ``...:<kind>/<name>/<uuid>/<pattern>`` with ``kind`` ``topic``, ``group`` or
    ``transactional-id``."""
    head, sep, tail = cluster_arn.partition(":cluster/")
    if not sep:
        raise ValueError(f"not an MSK cluster ARN: {cluster_arn}")
    return f"{head}:{kind}/{tail}/{name_pattern}"


class Kafka(pulumi.ComponentResource):
    """The MSK cluster and how clients reach it.

    Attributes: ``bootstrap`` (``host:port,...`` on the SCRAM or IAM port), ``cluster_arn``,
    ``cluster_name``; ``settings`` (setting name → value of the clients' security settings),
    ``secrets`` (setting name → Secrets Manager ``valueFrom``), ``secret_arns`` and
    ``kms_key_arns`` (what reading those secrets needs); ``scram_secret_arn`` (the SCRAM
    login's secret, None with IAM: the Spark jobs' driver reads it); ``iam`` (whether
    clients authenticate with IAM); ``ready`` (what must exist before a client can log in:
    the SCRAM secret's association, or the serverless cluster); :meth:`iam_statements` for
    the tasks' roles.
    """

    def __init__(
        self,
        name: str,
        config: StackConfig,
        network: Network,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("cormorant:kafka:Kafka", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.secret_arns: list[pulumi.Output[str]] = []
        self.kms_key_arns: list[pulumi.Output[str]] = []
        self.secrets: dict[str, pulumi.Output[str]] = {}
        self.scram_secret_arn: pulumi.Output[str] | None = None
        if config.kafka_iam:
            cluster = aws.msk.ServerlessCluster(
                f"{name}-serverless",
                cluster_name=name,
                client_authentication={"sasl": {"iam": {"enabled": True}}},
                vpc_configs=[
                    {
                        "subnet_ids": network.private_subnet_ids,
                        "security_group_ids": [network.security_groups["kafka"]],
                    }
                ],
                opts=child,
            )
            self.bootstrap: pulumi.Output[str] = cluster.bootstrap_brokers_sasl_iam
            self.cluster_arn: pulumi.Output[str] = cluster.arn
            self.cluster_name: pulumi.Output[str] = cluster.cluster_name
            self.settings: dict[str, str] = {
                "kafka_security_protocol": "SASL_SSL",
                "kafka_sasl_mechanism": "OAUTHBEARER",
                **config.kafka_settings,
            }
            self.ready: list[pulumi.Resource] = [cluster]
        else:
            self._provisioned(name, config, network)
        self.iam = config.kafka_iam
        self.register_outputs({"bootstrap": self.bootstrap, "clusterArn": self.cluster_arn})

    def _provisioned(self, name: str, config: StackConfig, network: Network) -> None:
        child = pulumi.ResourceOptions(parent=self)
        key = aws.kms.Key(
            f"{name}-key",
            description="Cormorant MSK: SCRAM secret and data at rest",
            enable_key_rotation=True,
            deletion_window_in_days=30,
            opts=child,
        )
        password = random.RandomPassword(
            f"{name}-scram-password", length=48, special=False, opts=child
        )
        secret = aws.secretsmanager.Secret(
            f"{name}-scram",
            # MSK only associates secrets whose name starts with AmazonMSK_.
            name_prefix=f"AmazonMSK_{name}-",
            kms_key_id=key.arn,
            description="Cormorant's SCRAM-SHA-512 login to MSK",
            opts=child,
        )
        aws.secretsmanager.SecretVersion(
            f"{name}-scram",
            secret_id=secret.id,
            # A secret: the provider marks secret_string so, and the password is one.
            secret_string=password.result.apply(_scram_login),
            opts=child,
        )
        # The policy MSK attaches when the secret is associated, declared so the state has
        # it (pulumi-aws, msk.ScramSecretAssociation: "a policy is required for the
        # aws.secretsmanager.Secret resource in order for Kafka to be able to read it";
        # its example grants kafka.amazonaws.com secretsmanager:getSecretValue).
        scram_policy = aws.secretsmanager.SecretPolicy(
            f"{name}-scram",
            secret_arn=secret.arn,
            policy=iam.document(
                [
                    {
                        "Sid": "AWSKafkaResourcePolicy",
                        "Effect": "Allow",
                        "Principal": {"Service": "kafka.amazonaws.com"},
                        "Action": "secretsmanager:GetSecretValue",
                        "Resource": secret.arn,
                    }
                ]
            ),
            opts=child,
        )
        configuration = aws.msk.Configuration(
            f"{name}-config",
            kafka_versions=[shared.msk_kafka_version()],
            server_properties="\n".join(f"{k}={v}" for k, v in SERVER_PROPERTIES.items()),
            opts=child,
        )
        logs = aws.cloudwatch.LogGroup(
            f"{name}-broker-logs",
            retention_in_days=config.log_retention_days,
            opts=child,
        )
        cluster = aws.msk.Cluster(
            f"{name}-cluster",
            cluster_name=name,
            kafka_version=shared.msk_kafka_version(),
            number_of_broker_nodes=config.kafka_brokers,
            broker_node_group_info={
                "instance_type": config.kafka_broker_instance_type,
                "client_subnets": network.private_subnet_ids,
                "security_groups": [network.security_groups["kafka"]],
                "storage_info": {
                    "ebs_storage_info": {"volume_size": config.kafka_broker_volume_gib}
                },
            },
            configuration_info={
                "arn": configuration.arn,
                "revision": configuration.latest_revision,
            },
            client_authentication={
                "sasl": {"scram": True, "iam": False},
                "unauthenticated": False,
            },
            encryption_info={
                "encryption_at_rest_kms_key_arn": key.arn,
                "encryption_in_transit": {"client_broker": "TLS", "in_cluster": True},
            },
            enhanced_monitoring=config.kafka_enhanced_monitoring,
            logging_info={
                "broker_logs": {"cloudwatch_logs": {"enabled": True, "log_group": logs.name}}
            },
            opts=pulumi.ResourceOptions(
                parent=self,
                protect=config.production,
                # Storage autoscaling grows the volumes; the program must not shrink
                # them back (MSK cannot) on the next `up`.
                ignore_changes=["brokerNodeGroupInfo.storageInfo.ebsStorageInfo.volumeSize"],
            ),
        )
        self._storage_autoscaling(name, config, cluster)
        association = aws.msk.SingleScramSecretAssociation(
            f"{name}-scram",
            cluster_arn=cluster.arn,
            secret_arn=secret.arn,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[scram_policy]),
        )
        self.bootstrap = cluster.bootstrap_brokers_sasl_scram
        self.cluster_arn = cluster.arn
        self.cluster_name = cluster.cluster_name
        self.settings = {
            "kafka_security_protocol": "SASL_SSL",
            "kafka_sasl_mechanism": "SCRAM-SHA-512",
            **config.kafka_settings,
        }
        # A task started before the association exists is refused by the brokers.
        self.ready = [association]
        self.secrets = {
            "kafka_sasl_username": iam.secret_key(secret.arn, "username"),
            "kafka_sasl_password": iam.secret_key(secret.arn, "password"),
        }
        self.secret_arns = [secret.arn]
        self.scram_secret_arn = secret.arn
        self.kms_key_arns = [key.arn]

    def _storage_autoscaling(
        self, name: str, config: StackConfig, cluster: aws.msk.Cluster
    ) -> None:
        """Grow the brokers' volumes before they fill, up to ``kafkaBrokerMaxVolumeGib``.

        AWS, MSK Developer Guide, "Auto-scaling policy details for Amazon MSK": the
        utilization target may be 10 % to 80 %, "We recommend that you set the Storage
        Utilization Target between 50% and 60%"; MSK then adds the larger of 10 GiB and
        10 %, at most once every six hours, and never shrinks a volume.
        """
        child = pulumi.ResourceOptions(parent=self)
        target = aws.appautoscaling.Target(
            f"{name}-storage",
            service_namespace="kafka",
            scalable_dimension="kafka:broker-storage:VolumeSize",
            resource_id=cluster.arn,
            min_capacity=1,
            max_capacity=config.kafka_broker_max_volume_gib,
            opts=child,
        )
        aws.appautoscaling.Policy(
            f"{name}-storage",
            policy_type="TargetTrackingScaling",
            service_namespace=target.service_namespace,
            scalable_dimension=target.scalable_dimension,
            resource_id=target.resource_id,
            target_tracking_scaling_policy_configuration={
                "target_value": STORAGE_TARGET_PERCENT,
                "disable_scale_in": True,
                "predefined_metric_specification": {
                    "predefined_metric_type": "KafkaBrokerStorageUtilization"
                },
            },
            opts=child,
        )

    def iam_statements(self, topic_prefix: str, *, write: bool) -> list[iam.Statement]:
        """What a task may do on the cluster with MSK IAM (none needed with SCRAM): connect,
        read the deployment's topics (``<topic_prefix>*``) and use consumer groups; with
        ``write`` also write (idempotently: every producer of the services is), create and
        delete topics and delete groups (the per-client ``msg.app`` topics and groups come
        and go), and use the deployment's transactional ids (``<topic_prefix>*``: the
        router's and the Will Message owners' Kafka transactions). Nothing outside the
        cluster."""
        if not self.iam:
            return []
        arn = self.cluster_arn
        cluster_actions = ["kafka-cluster:Connect", "kafka-cluster:DescribeCluster"]
        topic_actions = ["kafka-cluster:DescribeTopic", "kafka-cluster:ReadData"]
        group_actions = ["kafka-cluster:AlterGroup", "kafka-cluster:DescribeGroup"]
        statements: list[iam.Statement] = []
        if write:
            cluster_actions.append("kafka-cluster:WriteDataIdempotently")
            topic_actions += [
                "kafka-cluster:CreateTopic",
                "kafka-cluster:DeleteTopic",
                "kafka-cluster:DescribeTopicDynamicConfiguration",
                "kafka-cluster:WriteData",
            ]
            group_actions.append("kafka-cluster:DeleteGroup")
            statements.append(
                iam.allow(
                    [
                        "kafka-cluster:DescribeTransactionalId",
                        "kafka-cluster:AlterTransactionalId",
                    ],
                    [
                        arn.apply(
                            lambda a: topic_arn_pattern(a, "transactional-id", f"{topic_prefix}*")
                        )
                    ],
                )
            )
        return [
            iam.allow(cluster_actions, [arn]),
            iam.allow(
                topic_actions,
                [arn.apply(lambda a: topic_arn_pattern(a, "topic", f"{topic_prefix}*"))],
            ),
            iam.allow(
                group_actions,
                [arn.apply(lambda a: topic_arn_pattern(a, "group", "*"))],
            ),
            *statements,
        ]
