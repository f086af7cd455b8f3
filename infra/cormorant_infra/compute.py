"""Compute: an ECS cluster on Fargate, one service per Cormorant service, one one-off topics task.

Each service (``services/command_names.py`` ``SERVICE_COMMANDS``) runs the release's one
image by digest (:mod:`~cormorant_infra.images`: ``<repository>@sha256:...``, whose entry
point is ``cormorant``) with its command as the container's command, its own log group, an
execution role that may pull only that repository and read only that service's secrets (ECS
injects them at start), a task role with only
the Kafka permissions it needs (MSK IAM; none with SCRAM), deployment circuit breaker with
rollback, and target-tracking autoscaling: CPU for all; connections per task for ingest;
consumer lag per task for the router and device_persist, whose consumer groups hold the
backlog. app_delivery's lag is per APPLICATION client, so it scales on CPU. Every task
registers in a private DNS namespace (Cloud Map: ``<service>.<name>.internal``, one A
record per task), where the admin service and a Prometheus find them; each serves
``/health``, ``/ready`` and ``/metrics`` on ``http_port`` (the admin service on
``admin_port``, behind :class:`~cormorant_infra.admin_access.AdminAccess`'s load balancer).

The topics task runs ``cormorant create-topics`` once per deployment (``cormorant cloud
create-topics`` starts it), creating the core topics from the project's own specs. The
migration task runs ``cormorant migrate-db`` after each deployment (``cormorant cloud
migrate-db``): the schema, and the services' own PostgreSQL role and its login secret
(:mod:`~cormorant_infra.database`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_aws as aws
from pulumi_aws.appautoscaling import (
    PolicyTargetTrackingScalingPolicyConfigurationArgsDict,
    PolicyTargetTrackingScalingPolicyConfigurationCustomizedMetricSpecificationMetricArgsDict,
)

from cormorant_infra import environment, iam, shared
from cormorant_infra.admin_access import BOOTSTRAP_USER, AdminAccess
from cormorant_infra.cache import Cache
from cormorant_infra.config import ServiceSize, StackConfig
from cormorant_infra.database import Database
from cormorant_infra.images import Images
from cormorant_infra.ingress import Ingress
from cormorant_infra.kafka import REPLICATION_FACTOR, Kafka, topic_arn_pattern
from cormorant_infra.network import Network, ingest_listeners

HEALTH_CHECK = "python -m services.common.probe /health"
"""The container health check, as the Dockerfile's HEALTHCHECK: a GET of the service's own
``/health`` (alive: its event loop answers) on ``http_port``."""

ADMIN_HEALTH_CHECK = "python -m services.common.probe --admin /health"
"""The admin container's health check (its ``/health`` is on ``admin_port``)."""

RDS_CA_BUNDLE = "/etc/ssl/certs/rds-global-bundle.pem"
"""Where the images hold the RDS certificate authorities (Dockerfile)."""

STOP_TIMEOUT_SECONDS = 60
"""How long ECS waits after SIGTERM before a SIGKILL, for every task but ingest's: the
services stop their consumers and producers."""

FARGATE_MAX_STOP_TIMEOUT = 120
"""The longest ``stopTimeout`` Fargate accepts (ECS task definition parameters)."""

INGEST_STOP_TIMEOUT_SECONDS = shared.INGEST_DRAIN.stop_seconds
"""How long ECS waits after SIGTERM for an ingest task: it drains (its notice, then its
clients disconnected in paced batches within ``drain_seconds``), stores their Will Messages
and session records, and exits (:attr:`~services.common.drain.DrainTiming.stop_seconds`)."""
if INGEST_STOP_TIMEOUT_SECONDS > FARGATE_MAX_STOP_TIMEOUT:
    raise ValueError(
        f"an ingest task's drain takes up to {INGEST_STOP_TIMEOUT_SECONDS} s, more than "
        f"Fargate's stopTimeout allows ({FARGATE_MAX_STOP_TIMEOUT} s): lower drain_seconds"
    )

ECS_TASKS = "ecs-tasks.amazonaws.com"
"""The service principal that assumes ECS task and execution roles."""

LAG_TOPICS = {"router": "msg_all", "device-persist": "msg_persisted"}
"""The services that scale (and alarm) on consumer lag → the topic (a TopicNames
attribute) they consume in their consumer group."""

TOPICS_TASK_SIZE = ServiceSize(cpu=256, memory=512)
"""The one-off tasks' size: an admin client's (or a migration's) few requests."""

ONE_OFF_COMMANDS = frozenset({shared.TOPICS_COMMAND, shared.MIGRATE_COMMAND})
"""The one-off tasks' commands: they exit when done (no health check)."""


@dataclass
class TaskSpec:
    """What one task definition runs: command, tier (security group), settings and secrets."""

    command: str
    tier: str
    settings: dict[str, pulumi.Input[Any]]
    secrets: dict[str, pulumi.Input[str]]
    secret_arns: list[pulumi.Input[str]]
    kms_key_arns: list[pulumi.Input[str]]
    read_secret_arns: list[pulumi.Input[str]] = field(default_factory=list)
    """Secrets the task's code reads itself (its task role may), not injected by ECS."""
    write_secret_arns: list[pulumi.Input[str]] = field(default_factory=list)
    """Secrets the task's code reads and writes (the migration task: the services' login)."""
    write_kafka: bool = True
    statements: list[iam.Statement] = field(default_factory=list)
    """More of the task role's statements (the integrations stage: the teams' MSK clusters)."""
    args: list[str] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)
    target_groups: dict[int, pulumi.Input[str]] = field(default_factory=dict)


class Compute(pulumi.ComponentResource):
    """The ECS cluster, its services with autoscaling, and the topics task definition.

    Attributes: ``cluster_name``, ``service_names`` (command → ECS service name),
    ``topics_task_definition`` (ARN), ``task_subnet_ids`` and ``task_security_group`` (how
    to run the topics task), ``log_groups`` (command → log group name),
    ``dns_namespace`` (the tasks' private DNS namespace).

    Raises ``ValueError`` when ``images`` has no ``service_image`` (``imageDigest`` unset).
    """

    def __init__(
        self,
        name: str,
        config: StackConfig,
        region: str,
        images: Images,
        network: Network,
        kafka: Kafka,
        cache: Cache,
        database: Database,
        ingress: Ingress,
        admin_access: AdminAccess,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        if images.service_image is None:
            raise ValueError("the services need an image: cormorant:imageDigest is unset")
        super().__init__("cormorant:compute:Compute", name, None, opts)
        self._name = name
        self._images = images
        self._image = images.service_image
        self._config = config
        self._region = region
        self._network = network
        self._kafka = kafka
        child = pulumi.ResourceOptions(parent=self)
        cluster = aws.ecs.Cluster(
            f"{name}-cluster",
            name=name,
            # Container Insights publishes RunningTaskCount, which the autoscaling and
            # alarms divide and compare by.
            settings=[{"name": "containerInsights", "value": "enabled"}],
            opts=child,
        )
        self.cluster_name: pulumi.Output[str] = cluster.name
        self.log_groups: dict[str, pulumi.Output[str]] = {}
        self.service_names: dict[str, str] = {}
        # Every service's tasks in DNS (<service>.<namespace>, one A record per task): the
        # admin service and Prometheus find them there.
        self.dns_namespace = f"{name}.internal"
        namespace = aws.servicediscovery.PrivateDnsNamespace(
            f"{name}-services",
            name=self.dns_namespace,
            vpc=network.vpc_id,
            description="Cormorant's service tasks",
            opts=child,
        )
        self._namespace_id = namespace.id
        self._admin_access = admin_access

        for spec in self._specs(cache, database):
            task_definition = self._task_definition(spec)
            self._service(spec, cluster, task_definition, ingress)
        topics = self._topics_spec()
        self.topics_task_definition: pulumi.Output[str] = self._task_definition(topics).arn
        migrate = self._migrate_spec(database)
        self.migrate_task_definition: pulumi.Output[str] = self._task_definition(migrate).arn
        self.task_subnet_ids = network.private_subnet_ids
        self.task_security_group = network.security_groups["stages"]
        self.register_outputs({"clusterName": self.cluster_name})

    # --- what each task runs ---------------------------------------------------------------

    def _common(self) -> dict[str, pulumi.Input[Any]]:
        config = self._config
        return {
            # /health, /ready and /metrics, for the load balancer, the admin service and
            # Prometheus inside the VPC (the security groups say who).
            "http_host": "0.0.0.0",
            "kafka_bootstrap": self._kafka.bootstrap,
            **self._kafka.settings,
            "topic_prefix": config.topic_prefix,
            "replication_factor": REPLICATION_FACTOR,
            "log_level": config.log_level,
            "application_client_ids": config.application_client_ids,
        }

    def _specs(self, cache: Cache, database: Database) -> list[TaskSpec]:
        """One :class:`TaskSpec` per service command, least privilege each."""
        config, kafka = self._config, self._kafka
        specs = []
        for command in shared.SERVICE_COMMANDS:
            spec = TaskSpec(
                command=command,
                tier="stages",
                settings=self._common(),
                secrets=dict(kafka.secrets),
                secret_arns=list(kafka.secret_arns),
                kms_key_arns=list(kafka.kms_key_arns),
            )
            if command == shared.INGEST:
                self._ingest(spec)
                # The MQTT credentials, and the node id leases (finding 5 of issue 24).
                self._postgres(spec, database)
            if command == shared.INTEGRATIONS_COMMAND:
                # The integrations are defined in PostgreSQL (services/integrations/).
                self._postgres(spec, database)
                self._integrations(spec)
            if command in ("device-persist", shared.ADMIN):
                # The admin service reads the DEVICE store (stored messages of a session)
                # and keeps its users and audit trail in PostgreSQL.
                spec.settings["store_backend"] = config.store_backend
                if config.store_backend == "redis":
                    spec.settings["redis_url"] = cache.url
                    spec.settings["redis_wait_replicas"] = cache.wait_replicas
                    spec.secrets["redis_password"] = cache.auth_secret_arn
                    spec.secret_arns.append(cache.auth_secret_arn)
                if config.store_backend == "postgres" or command == shared.ADMIN:
                    self._postgres(spec, database)
            if command == shared.ADMIN:
                access = self._admin_access
                spec.tier = "admin"
                spec.settings |= {
                    "admin_host": "0.0.0.0",
                    "admin_port": shared.ADMIN_PORT,
                    "cluster_dns_namespace": self.dns_namespace,
                    "admin_bootstrap_user": BOOTSTRAP_USER,
                }
                spec.secrets["admin_bootstrap_password"] = iam.secret_key(
                    access.credentials_secret_arn, "password"
                )
                spec.secret_arns.append(access.credentials_secret_arn)
                spec.ports = [shared.ADMIN_PORT]
                if access.target_group_arn is not None:
                    spec.target_groups = {shared.ADMIN_PORT: access.target_group_arn}
            specs.append(spec)
        return specs

    def _ingest(self, spec: TaskSpec) -> None:
        """The ingest task: one listener per NLB target port, PROXY protocol v2 exactly
        when the target groups send it (and taken from the VPC's addresses only); with TLS
        passed through, the certificate and key (and client CA for mutual TLS) from the
        Secrets Manager secret as PEM text."""
        config = self._config
        spec.tier = "ingest"
        spec.args = ["--node-id-from-pool"]
        kinds = ingest_listeners(config)
        spec.ports = list(kinds)
        spec.settings |= {
            # Node ids (and so downlink topics) bounded: a rolling deploy (maximum 200 %)
            # runs the old and the new tasks at once.
            "ingest_node_pool_size": 2 * config.services[shared.INGEST].max_tasks,
            "mqtt_host": "0.0.0.0",
            "listeners": [
                {
                    "kind": kinds[port],
                    "port": port,
                    "proxy_protocol": config.proxy_protocol_v2,
                    # A PROXY header is taken from the NLB only, whose addresses are the
                    # VPC's: anyone else in reach could claim any client address.
                    "proxy_trusted_cidrs": [config.vpc_cidr],
                }
                for port in spec.ports
            ],
            "max_keep_alive": config.max_keep_alive,
        }
        arn = config.tls_certificate_secret_arn
        if config.tls_mode == "passthrough" and arn is not None:
            keys = {"tls_cert_pem": "certificate", "tls_key_pem": "privateKey"}
            if config.tls_client_auth != "none":
                spec.settings["tls_client_auth"] = config.tls_client_auth
                keys["tls_client_ca_pem"] = "clientCa"
            spec.secrets |= {name: iam.secret_key(arn, key) for name, key in keys.items()}
            spec.secret_arns.append(arn)

    def _integrations(self, spec: TaskSpec) -> None:
        """The integrations stage: its own security group (the only one with the ways out
        of ``integrationsEgress``); its MQTT bridges publish on the ingest tasks' direct
        MQTT listener, found in the tasks' DNS namespace (one A record per ingest task);
        its task role may write with MSK IAM to the clusters of
        ``integrationsMskClusterArns`` and assume the roles of
        ``integrationsAssumeRoleArns`` (a Kafka sink's ``aws_role_arn``)."""
        spec.tier = "integrations"
        spec.settings |= {
            "integrations_mqtt_host": f"{shared.INGEST}.{self.dns_namespace}",
            "integrations_mqtt_port": shared.INGEST_DIRECT_MQTT_PORT,
        }
        config = self._config
        spec.statements += integrations_msk_statements(
            config.integrations_msk_cluster_arns, config.topic_prefix
        )
        if config.integrations_assume_role_arns:
            spec.statements.append(
                iam.allow(["sts:AssumeRole"], list(config.integrations_assume_role_arns))
            )

    def _postgres(self, spec: TaskSpec, database: Database) -> None:
        """PostgreSQL for ``spec``'s task, over verified TLS: the password is read from its
        secret at each new connection (it may rotate; ECS would inject it once, at task
        start), so the task role may read that secret."""
        spec.settings |= {
            "postgres_dsn": database.dsn,
            "postgres_sslmode": "verify-full",
            "postgres_sslrootcert": RDS_CA_BUNDLE,
            "postgres_password_secret_arn": database.password_secret_arn,
        }
        spec.read_secret_arns.append(database.password_secret_arn)

    def _migrate_spec(self, database: Database) -> TaskSpec:
        """The migration task: the master user's login (read from RDS's secret when it
        starts), the services' login secret to create or rotate; no Kafka writes."""
        spec = self._topics_spec()
        spec.command = shared.MIGRATE_COMMAND
        spec.write_kafka = False
        spec.settings |= {
            "postgres_dsn": database.master_dsn,
            "postgres_sslmode": "verify-full",
            "postgres_sslrootcert": RDS_CA_BUNDLE,
            "postgres_password_secret_arn": database.master_secret_arn,
            "postgres_service_password_secret_arn": database.password_secret_arn,
        }
        spec.read_secret_arns.append(database.master_secret_arn)
        spec.write_secret_arns.append(database.password_secret_arn)
        return spec

    def _topics_spec(self) -> TaskSpec:
        kafka = self._kafka
        return TaskSpec(
            command=shared.TOPICS_COMMAND,
            tier="stages",
            settings=self._common(),
            secrets=dict(kafka.secrets),
            secret_arns=list(kafka.secret_arns),
            kms_key_arns=list(kafka.kms_key_arns),
        )

    # --- resources ---------------------------------------------------------------------

    def _execution_role(self, spec: TaskSpec, log_group: aws.cloudwatch.LogGroup) -> aws.iam.Role:
        """The role ECS uses to start the task: pull its image, write its log group, read
        its own secrets. Nothing else."""
        statements = [
            iam.allow(
                ["logs:CreateLogStream", "logs:PutLogEvents"],
                [pulumi.Output.concat(log_group.arn, ":log-stream:*")],
            )
        ]
        # GetAuthorizationToken has no resource-level permissions: AWS requires "*".
        statements.append(iam.allow(["ecr:GetAuthorizationToken"], ["*"]))
        statements.append(
            iam.allow(
                [
                    "ecr:BatchCheckLayerAvailability",
                    "ecr:BatchGetImage",
                    "ecr:GetDownloadUrlForLayer",
                ],
                [self._images.repository_arn],
            )
        )
        if spec.secret_arns:
            statements.append(iam.allow(["secretsmanager:GetSecretValue"], spec.secret_arns))
        if spec.kms_key_arns:
            statements.append(iam.allow(["kms:Decrypt"], spec.kms_key_arns))
        return iam.service_role(
            f"{self._name}-{spec.command}-execution",
            ECS_TASKS,
            statements,
            pulumi.ResourceOptions(parent=self),
        )

    def _task_role(self, spec: TaskSpec) -> aws.iam.Role:
        """The role the service's code runs as: Kafka with MSK IAM, and the secrets it reads
        itself (the PostgreSQL password); nothing otherwise."""
        statements = self._kafka.iam_statements(self._config.topic_prefix, write=spec.write_kafka)
        statements += spec.statements
        if spec.read_secret_arns:
            statements.append(iam.allow(["secretsmanager:GetSecretValue"], spec.read_secret_arns))
        if spec.write_secret_arns:
            statements.append(
                iam.allow(
                    ["secretsmanager:GetSecretValue", "secretsmanager:PutSecretValue"],
                    spec.write_secret_arns,
                )
            )
        return iam.service_role(
            f"{self._name}-{spec.command}-task",
            ECS_TASKS,
            statements,
            pulumi.ResourceOptions(parent=self),
        )

    def _task_definition(self, spec: TaskSpec) -> aws.ecs.TaskDefinition:
        config = self._config
        child = pulumi.ResourceOptions(parent=self)
        log_group = aws.cloudwatch.LogGroup(
            f"{self._name}-{spec.command}",
            name=f"/cormorant/{self._name}/{spec.command}",
            retention_in_days=config.log_retention_days,
            opts=child,
        )
        self.log_groups[spec.command] = log_group.name
        size = config.services.get(spec.command, TOPICS_TASK_SIZE)
        container = pulumi.Output.all(
            environment=environment.environment(spec.settings, spec.secrets),
            secrets=environment.secrets(spec.secrets),
            log_group=log_group.name,
            image=self._image,
        ).apply(lambda parts: [self._container(spec, parts)])
        return aws.ecs.TaskDefinition(
            f"{self._name}-{spec.command}",
            family=f"{self._name}-{spec.command}",
            network_mode="awsvpc",
            requires_compatibilities=["FARGATE"],
            cpu=str(size.cpu),
            memory=str(size.memory),
            runtime_platform={
                "operating_system_family": "LINUX",
                "cpu_architecture": config.cpu_architecture,
            },
            execution_role_arn=self._execution_role(spec, log_group).arn,
            task_role_arn=self._task_role(spec).arn,
            container_definitions=pulumi.Output.json_dumps(container),
            opts=child,
        )

    def _container(self, spec: TaskSpec, parts: dict[str, Any]) -> dict[str, Any]:
        """The container definition of ``spec`` (ECS RegisterTaskDefinition's shape)."""
        container: dict[str, Any] = {
            "name": spec.command,
            "image": parts["image"],
            # The image's entry point is `cormorant`; the command picks the service.
            "command": [spec.command, *spec.args],
            "essential": True,
            "environment": parts["environment"],
            "secrets": parts["secrets"],
            "logConfiguration": {
                "logDriver": "awslogs",
                "options": {
                    "awslogs-group": parts["log_group"],
                    "awslogs-region": self._region,
                    "awslogs-stream-prefix": spec.command,
                },
            },
            "stopTimeout": (
                INGEST_STOP_TIMEOUT_SECONDS
                if spec.command == shared.INGEST
                else STOP_TIMEOUT_SECONDS
            ),
        }
        if spec.ports:
            container["portMappings"] = [
                {"containerPort": port, "protocol": "tcp"} for port in spec.ports
            ]
        if spec.command not in ONE_OFF_COMMANDS:  # a one-off task exits when done
            check = ADMIN_HEALTH_CHECK if spec.command == shared.ADMIN else HEALTH_CHECK
            container["healthCheck"] = {
                "command": ["CMD-SHELL", check],
                "interval": 15,
                "timeout": 5,
                "retries": 3,
                "startPeriod": 90,
            }
        return container

    def _service(
        self,
        spec: TaskSpec,
        cluster: aws.ecs.Cluster,
        task_definition: aws.ecs.TaskDefinition,
        ingress: Ingress,
    ) -> None:
        config, name = self._config, self._name
        size = config.services[spec.command]
        groups = ingress.target_groups if spec.command == shared.INGEST else spec.target_groups
        load_balancers: list[aws.ecs.ServiceLoadBalancerArgsDict] = [
            {
                "target_group_arn": groups[port],
                "container_name": spec.command,
                "container_port": port,
            }
            for port in spec.ports
            if port in groups
        ]
        registry = aws.servicediscovery.Service(
            f"{name}-{spec.command}",
            name=spec.command,
            dns_config={
                "namespace_id": self._namespace_id,
                "dns_records": [{"ttl": 10, "type": "A"}],
                "routing_policy": "MULTIVALUE",
            },
            health_check_custom_config={"failure_threshold": 1},
            force_destroy=True,
            opts=pulumi.ResourceOptions(parent=self),
        )
        service = aws.ecs.Service(
            f"{name}-{spec.command}",
            name=spec.command,
            cluster=cluster.arn,
            task_definition=task_definition.arn,
            desired_count=0 if config.bootstrap else size.min_tasks,
            launch_type="FARGATE",
            network_configuration={
                "subnets": self._network.private_subnet_ids,
                "security_groups": [self._network.security_groups[spec.tier]],
                "assign_public_ip": False,
            },
            load_balancers=load_balancers,
            service_registries={"registry_arn": registry.arn},
            health_check_grace_period_seconds=120 if load_balancers else None,
            deployment_circuit_breaker={"enable": True, "rollback": True},
            deployment_minimum_healthy_percent=100,
            deployment_maximum_percent=200,
            enable_execute_command=False,
            propagate_tags="SERVICE",
            # `up` waits until the service runs its tasks healthy (`aws ecs wait
            # services-stable`), so a deployment the circuit breaker stops or rolls back
            # fails `up` instead of looking like success (pulumi-aws, ecs.Service,
            # wait_for_steady_state: "this provider will wait for the service to reach a
            # steady state ... before continuing. Default false").
            wait_for_steady_state=True,
            opts=pulumi.ResourceOptions(
                parent=self,
                # No task starts before Kafka lets it in (the SCRAM secret's association).
                depends_on=[*self._kafka.ready, *([ingress] if load_balancers else [])],
                # Autoscaling owns the task count once the service exists.
                ignore_changes=["desiredCount"],
            ),
        )
        self.service_names[spec.command] = spec.command
        self._autoscaling(spec, cluster, service, ingress)

    def _autoscaling(
        self,
        spec: TaskSpec,
        cluster: aws.ecs.Cluster,
        service: aws.ecs.Service,
        ingress: Ingress,
    ) -> None:
        config, name = self._config, self._name
        size = config.services[spec.command]
        child = pulumi.ResourceOptions(parent=self)
        target = aws.appautoscaling.Target(
            f"{name}-{spec.command}",
            service_namespace="ecs",
            scalable_dimension="ecs:service:DesiredCount",
            resource_id=pulumi.Output.concat("service/", cluster.name, "/", service.name),
            # Raised from 0 after the bootstrap `up`: Application Auto Scaling then starts
            # the tasks up to the new minimum.
            min_capacity=0 if config.bootstrap else size.min_tasks,
            max_capacity=size.max_tasks,
            opts=child,
        )

        def policy(kind: str, target_value: float, metrics: list[_Query] | None = None) -> None:
            tracking: _Tracking = {
                "target_value": target_value,
                "scale_in_cooldown": 300,
                "scale_out_cooldown": 60,
            }
            if metrics is None:
                tracking["predefined_metric_specification"] = {
                    "predefined_metric_type": "ECSServiceAverageCPUUtilization"
                }
            else:
                tracking["customized_metric_specification"] = {"metrics": metrics}
            aws.appautoscaling.Policy(
                f"{name}-{spec.command}-{kind}",
                policy_type="TargetTrackingScaling",
                service_namespace=target.service_namespace,
                scalable_dimension=target.scalable_dimension,
                resource_id=target.resource_id,
                target_tracking_scaling_policy_configuration=tracking,
                opts=child,
            )

        policy("cpu", config.cpu_target_percent)
        running = _query(
            "tasks",
            "ECS/ContainerInsights",
            "RunningTaskCount",
            {"ClusterName": cluster.name, "ServiceName": service.name},
            "Average",
        )
        if spec.command == shared.INGEST:
            flows = _query(
                "flows",
                "AWS/NetworkELB",
                "ActiveFlowCount",
                {"LoadBalancer": ingress.arn_suffix},
                "Average",
            )
            per_task = _ratio("flows / tasks", "connections per task")
            policy("connections", config.connections_per_ingest_task, [flows, running, per_task])
        elif spec.command in LAG_TOPICS:
            names = shared.TopicNames(config.topic_prefix)
            lag = _query(
                "lag",
                "AWS/Kafka",
                "SumOffsetLag",
                {
                    "Cluster Name": self._kafka.cluster_name,
                    "Consumer Group": names.service_group(spec.command),
                    "Topic": getattr(names, LAG_TOPICS[spec.command]),
                },
                "Maximum",
            )
            per_task = _ratio("lag / tasks", "lag per task")
            policy("lag", config.consumer_lag_per_task, [lag, running, per_task])


def integrations_msk_statements(cluster_arns: list[str], topic_prefix: str) -> list[iam.Statement]:
    """The integrations stage's Kafka sinks' MSK IAM permissions on the teams' clusters
    ``cluster_arns`` (docs/integrations/kafka.md, "Amazon MSK with IAM"): connect and
    write idempotently; describe and write any topic (the sinks' topics are templates);
    create only the empty topics named like ``msg.all`` and ``client.events`` that hold
    the transactions' offsets; use only the stage's consumer groups and transactional ids
    (``<topic_prefix>cormorant-integrations.*``). No statement without a cluster."""
    if not cluster_arns:
        return []
    names = shared.TopicNames(topic_prefix)
    ours = f"{names.service_group(shared.INTEGRATIONS_SERVICE)}.*"

    def each(kind: str, pattern: str) -> list[pulumi.Input[str]]:
        return [topic_arn_pattern(arn, kind, pattern) for arn in cluster_arns]

    return [
        iam.allow(
            ["kafka-cluster:Connect", "kafka-cluster:WriteDataIdempotently"], list(cluster_arns)
        ),
        iam.allow(["kafka-cluster:DescribeTopic", "kafka-cluster:WriteData"], each("topic", "*")),
        iam.allow(
            ["kafka-cluster:CreateTopic"],
            [
                *each("topic", names.msg_all),
                *each("topic", names.client_events),
            ],
        ),
        iam.allow(
            ["kafka-cluster:AlterTransactionalId", "kafka-cluster:DescribeTransactionalId"],
            each("transactional-id", ours),
        ),
        iam.allow(["kafka-cluster:AlterGroup", "kafka-cluster:DescribeGroup"], each("group", ours)),
    ]


_Tracking = PolicyTargetTrackingScalingPolicyConfigurationArgsDict
_Query = PolicyTargetTrackingScalingPolicyConfigurationCustomizedMetricSpecificationMetricArgsDict


def _query(
    query_id: str,
    namespace: str,
    metric: str,
    dimensions: dict[str, pulumi.Input[str]],
    stat: str,
) -> _Query:
    """One CloudWatch metric of a target tracking policy's metric math (not returned)."""
    return {
        "id": query_id,
        "metric_stat": {
            "metric": {
                "namespace": namespace,
                "metric_name": metric,
                "dimensions": [{"name": key, "value": value} for key, value in dimensions.items()],
            },
            "stat": stat,
        },
        "return_data": False,
    }


def _ratio(expression: str, label: str) -> _Query:
    """The metric math expression a target tracking policy tracks (per running task)."""
    return {"id": "per_task", "expression": expression, "label": label, "return_data": True}
