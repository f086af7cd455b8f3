"""Observability: CloudWatch alarms on what breaks a broker, sent to one SNS topic.

Alarms: unhealthy NLB targets, an ECS service running fewer tasks than it wants, RDS and
ElastiCache CPU and memory, RDS free storage, MSK broker disk use, offline partitions and
partitions under ``min.insync.replicas``, and the router's and device_persist's consumer
lag (messages accepted but not yet routed or stored). The topic is encrypted with a
customer managed KMS key whose policy lets CloudWatch publish. Logs are per service
(:mod:`cormorant_infra.compute`); the services' own metrics are
scraped from their ``/metrics`` (``monitoring/prometheus/ecs.yml``).
"""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from cormorant_infra import iam, shared
from cormorant_infra.cache import Cache
from cormorant_infra.compute import LAG_TOPICS, Compute
from cormorant_infra.config import StackConfig
from cormorant_infra.database import Database
from cormorant_infra.ingress import Ingress
from cormorant_infra.kafka import Kafka

CPU_PERCENT = 80.0
MEMORY_PERCENT = 80.0
DISK_PERCENT = 80.0
RDS_FREEABLE_MEMORY_BYTES = 256 * 1024 * 1024
GIB = 1024**3
RDS_FREE_STORAGE_FRACTION = 0.1
"""Free storage (of the autoscaling ceiling ``dbMaxAllocatedStorageGib``) below which the
database is about to run out: autoscaling cannot grow it further."""
LAG_RECORDS = 100_000.0
"""Consumer lag (records) that, held for 10 minutes, means a stage cannot keep up."""


class Observability(pulumi.ComponentResource):
    """The SNS topic (optionally mailed to ``alarmEmail``) and the alarms (the ECS ones
    only with ``compute``: a new stack's first ``up`` has no services yet).

    Attributes: ``topic_arn``, ``alarm_names`` (every alarm's logical name).
    """

    def __init__(
        self,
        name: str,
        config: StackConfig,
        kafka: Kafka,
        cache: Cache,
        database: Database,
        ingress: Ingress,
        compute: Compute | None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("cormorant:observability:Observability", name, None, opts)
        self._name = name
        child = pulumi.ResourceOptions(parent=self)
        topic = aws.sns.Topic(
            f"{name}-alarms", kms_master_key_id=self._alarm_key(name).arn, opts=child
        )
        if config.alarm_email:
            aws.sns.TopicSubscription(
                f"{name}-alarms-email",
                topic=topic.arn,
                protocol="email",
                endpoint=config.alarm_email,
                opts=child,
            )
        self.topic_arn: pulumi.Output[str] = topic.arn
        self.alarm_names: list[str] = []

        for port, suffix in ingress.target_group_suffixes.items():
            self._alarm(
                f"unhealthy-targets-{port}",
                f"An ingest task fails the NLB health check on port {port}",
                namespace="AWS/NetworkELB",
                metric="UnHealthyHostCount",
                dimensions={"LoadBalancer": ingress.arn_suffix, "TargetGroup": suffix},
                statistic="Maximum",
                threshold=0,
                periods=3,
            )
        # No services before the first image (a new stack's first up): nothing to count,
        # and a missing count would be breaching.
        if compute is not None:
            for command in shared.SERVICE_COMMANDS:
                self._tasks_below_desired(command, compute)
        for member in cache.member_ids:
            for metric, threshold in (
                ("EngineCPUUtilization", CPU_PERCENT),
                ("DatabaseMemoryUsagePercentage", MEMORY_PERCENT),
            ):
                self._alarm(
                    f"redis-{metric}-{member[-3:]}",
                    f"Redis node {member}: {metric} above {threshold:g} %",
                    namespace="AWS/ElastiCache",
                    metric=metric,
                    dimensions={"CacheClusterId": member},
                    statistic="Average",
                    threshold=threshold,
                    periods=3,
                )
        self._alarm(
            "rds-cpu",
            f"PostgreSQL CPU above {CPU_PERCENT:g} %",
            namespace="AWS/RDS",
            metric="CPUUtilization",
            dimensions={"DBInstanceIdentifier": database.identifier},
            statistic="Average",
            threshold=CPU_PERCENT,
            periods=3,
        )
        self._alarm(
            "rds-memory",
            "PostgreSQL freeable memory below 256 MiB",
            namespace="AWS/RDS",
            metric="FreeableMemory",
            dimensions={"DBInstanceIdentifier": database.identifier},
            statistic="Minimum",
            threshold=RDS_FREEABLE_MEMORY_BYTES,
            periods=3,
            comparison="LessThanThreshold",
        )
        self._alarm(
            "rds-storage",
            f"PostgreSQL free storage below {RDS_FREE_STORAGE_FRACTION:.0%} of its ceiling",
            namespace="AWS/RDS",
            metric="FreeStorageSpace",
            dimensions={"DBInstanceIdentifier": database.identifier},
            statistic="Minimum",
            threshold=RDS_FREE_STORAGE_FRACTION * config.db_max_allocated_storage_gib * GIB,
            periods=5,
            comparison="LessThanThreshold",
        )
        if not config.kafka_iam:  # MSK Serverless manages its own storage and partitions
            # An offline partition has no leader: nothing is written to or read from it.
            self._alarm(
                "msk-offline-partitions",
                "MSK: partitions without a leader (OfflinePartitionsCount above 0)",
                namespace="AWS/Kafka",
                metric="OfflinePartitionsCount",
                dimensions={"Cluster Name": kafka.cluster_name},
                statistic="Maximum",
                threshold=0,
                periods=2,
            )
            for broker in range(1, config.kafka_brokers + 1):
                # Below min.insync.replicas, writes with acks=all are refused.
                self._alarm(
                    f"msk-under-min-isr-{broker}",
                    f"MSK broker {broker}: partitions below min.insync.replicas",
                    namespace="AWS/Kafka",
                    metric="UnderMinIsrPartitionCount",
                    dimensions={"Cluster Name": kafka.cluster_name, "Broker ID": str(broker)},
                    statistic="Maximum",
                    threshold=0,
                    periods=2,
                )
                self._alarm(
                    f"msk-disk-{broker}",
                    f"MSK broker {broker}: data disk above {DISK_PERCENT:g} % used",
                    namespace="AWS/Kafka",
                    metric="KafkaDataLogsDiskUsed",
                    dimensions={"Cluster Name": kafka.cluster_name, "Broker ID": str(broker)},
                    statistic="Maximum",
                    threshold=DISK_PERCENT,
                    periods=2,
                )
        names = shared.TopicNames(config.topic_prefix)
        for command, attribute in LAG_TOPICS.items():
            self._alarm(
                f"lag-{command}",
                f"{command} falls behind: consumer lag above {LAG_RECORDS:,.0f} records",
                namespace="AWS/Kafka",
                metric="SumOffsetLag",
                dimensions={
                    "Cluster Name": kafka.cluster_name,
                    "Consumer Group": names.service_group(command),
                    "Topic": getattr(names, attribute),
                },
                statistic="Maximum",
                threshold=LAG_RECORDS,
                periods=10,
            )
        self.register_outputs({"topicArn": self.topic_arn})

    def _alarm_key(self, name: str) -> aws.kms.Key:
        """The alarm topic's customer managed key, which CloudWatch may use.

        AWS, SNS Developer Guide, "Enable compatibility between event sources from AWS
        services and encrypted topics": a service that publishes to an encrypted topic
        (CloudWatch alarms among them) needs ``kms:GenerateDataKey*`` and ``kms:Decrypt``
        in the key's policy; the AWS managed key ``alias/aws/sns`` has a policy nobody can
        change, so alarms on a topic under it never arrive.
        """
        account = aws.get_caller_identity(opts=pulumi.InvokeOptions(parent=self)).account_id
        return aws.kms.Key(
            f"{name}-alarms",
            description="Cormorant alarm topic (SNS), usable by CloudWatch alarms",
            enable_key_rotation=True,
            deletion_window_in_days=30,
            policy=iam.document(
                [
                    {
                        # The account administers the key (the default key policy).
                        "Sid": "Account",
                        "Effect": "Allow",
                        "Principal": {"AWS": f"arn:aws:iam::{account}:root"},
                        "Action": "kms:*",
                        "Resource": "*",
                    },
                    {
                        "Sid": "CloudWatchAlarms",
                        "Effect": "Allow",
                        "Principal": {"Service": "cloudwatch.amazonaws.com"},
                        "Action": ["kms:Decrypt", "kms:GenerateDataKey*"],
                        "Resource": "*",
                        "Condition": {"StringEquals": {"aws:SourceAccount": account}},
                    },
                ]
            ),
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _alarm(
        self,
        name: str,
        description: str,
        *,
        namespace: str,
        metric: str,
        dimensions: dict[str, pulumi.Input[str]],
        statistic: str,
        threshold: float,
        periods: int,
        comparison: str = "GreaterThanThreshold",
    ) -> None:
        self.alarm_names.append(name)
        aws.cloudwatch.MetricAlarm(
            f"{self._name}-{name}",
            alarm_description=description,
            namespace=namespace,
            metric_name=metric,
            dimensions=dimensions,
            statistic=statistic,
            period=60,
            evaluation_periods=periods,
            threshold=threshold,
            comparison_operator=comparison,
            treat_missing_data="notBreaching",
            alarm_actions=[self.topic_arn],
            ok_actions=[self.topic_arn],
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _tasks_below_desired(self, command: str, compute: Compute) -> None:
        """Running tasks below the desired count for 5 minutes (failing health checks,
        crash loops, no capacity): Container Insights' two counts compared."""
        name = f"tasks-below-desired-{command}"
        self.alarm_names.append(name)
        dimensions: dict[str, pulumi.Input[str]] = {
            "ClusterName": compute.cluster_name,
            "ServiceName": command,
        }

        def count(query_id: str, metric: str) -> aws.cloudwatch.MetricAlarmMetricQueryArgsDict:
            query: aws.cloudwatch.MetricAlarmMetricQueryMetricArgsDict = {
                "namespace": "ECS/ContainerInsights",
                "metric_name": metric,
                "dimensions": dimensions,
                "period": 60,
                "stat": "Average",
            }
            return {"id": query_id, "metric": query, "return_data": False}

        aws.cloudwatch.MetricAlarm(
            f"{self._name}-{name}",
            alarm_description=f"{command}: fewer tasks running than desired",
            metric_queries=[
                count("desired", "DesiredTaskCount"),
                count("running", "RunningTaskCount"),
                {
                    "id": "missing",
                    "expression": "desired - running",
                    "label": "tasks missing",
                    "return_data": True,
                },
            ],
            evaluation_periods=5,
            threshold=0,
            comparison_operator="GreaterThanThreshold",
            treat_missing_data="breaching",
            alarm_actions=[self.topic_arn],
            ok_actions=[self.topic_arn],
            opts=pulumi.ResourceOptions(parent=self),
        )
