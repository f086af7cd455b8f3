"""The network: a VPC over 2-3 availability zones, subnets, NAT, and one security group per tier.

Public subnets hold the load balancer and the NAT gateways; everything else (ECS tasks,
MSK brokers, Redis, PostgreSQL, EMR Serverless workers) lives in private subnets with no
public address. Who may reach whom is written down here, in one place: only the NLB takes
traffic from the internet, on the MQTT ports; only the integrations stage goes out to the
addresses ``integrationsEgress`` lists (the teams' Kafka clusters, webhooks and MQTT
brokers), and to the ingest tasks' direct MQTT port (its MQTT bridges publish there); the
admin service's internal load balancer takes HTTPS from ``adminAllowedCidrs`` (the VPC by
default), and the tasks' metrics endpoints take ``metricsAllowedCidrs`` (nobody by
default), both private ranges only; each tier accepts its clients' security groups.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from cormorant_infra import iam, shared
from cormorant_infra.config import StackConfig

REDIS_PORT = 6379
POSTGRES_PORT = 5432
HTTPS_PORT = 443
KAFKA_SCRAM_PORT = 9096
"""MSK's port for TLS with SASL/SCRAM clients."""
KAFKA_IAM_PORT = 9098
"""MSK's port for TLS with IAM (SASL/OAUTHBEARER) clients."""

TIERS = (
    "nlb", "ingest", "stages", "integrations", "admin", "adminlb", "kafka", "cache", "database",
    "analytics",
)  # fmt: skip
"""One security group each: the load balancer, the ingest tasks, the Kafka-reading stages
(router, device_persist, app_delivery and the topics task), the integrations stage (the
only one with ways out to the teams' systems, ``integrationsEgress``), the admin service's
tasks and its internal load balancer, MSK, ElastiCache, RDS and EMR Serverless."""

ADMIN_LB_PORT = HTTPS_PORT
"""The admin load balancer's HTTPS port."""


@dataclass(frozen=True)
class Subnets:
    """The CIDR blocks of one availability zone's subnets."""

    public: str
    private: str


def subnet_plan(vpc_cidr: str, zones: int) -> list[Subnets]:
    """Split ``vpc_cidr`` into a private and a public subnet per zone.

    Private subnets take a quarter of the VPC each (they hold every task and data store);
    public ones share the last quarter (load balancer nodes and NAT gateways only).
    """
    vpc = ipaddress.IPv4Network(vpc_cidr)
    quarters = list(vpc.subnets(prefixlen_diff=2))
    publics = list(quarters[3].subnets(prefixlen_diff=2))
    return [Subnets(str(publics[i]), str(quarters[i])) for i in range(zones)]


def mqtt_listener_ports(config: StackConfig) -> list[int]:
    """The NLB's MQTT ports open to ``allowedCidrs``: 1883 (if plain MQTT is on), 8883, and
    443 (MQTT over WebSocket over TLS, if ``websocket`` is on)."""
    return [listener.port for listener in nlb_listeners(config)]


@dataclass(frozen=True)
class NlbListener:
    """One NLB listener: its public ``port``, whether TLS ends at the NLB (``tls``), and the
    ingest ``target_port`` it forwards to, where the ingest listener ``kind`` serves."""

    port: int
    tls: bool
    target_port: int
    kind: str


def nlb_listeners(config: StackConfig) -> list[NlbListener]:
    """The NLB's listeners. TLS ends at the NLB (``tlsMode: terminate``): 8883 and 443 go
    to the tasks' plain MQTT (1883) and WebSocket (8083) listeners; passed through: to their
    TLS listeners (8883 mqtts, 8084 wss)."""
    listeners = []
    if config.plain_mqtt:
        listeners.append(NlbListener(shared.MQTT_PORT, False, shared.MQTT_PORT, "mqtt"))
    if config.tls_listener:
        listeners.append(NlbListener(shared.MQTT_TLS_PORT, True, shared.MQTT_PORT, "mqtt"))
    else:
        listeners.append(NlbListener(shared.MQTT_TLS_PORT, False, shared.MQTT_TLS_PORT, "mqtts"))
    if config.websocket:
        public = shared.MQTT_WSS_PUBLIC_PORT
        if config.tls_listener:
            listeners.append(NlbListener(public, True, shared.MQTT_WS_PORT, "ws"))
        else:
            listeners.append(NlbListener(public, False, shared.MQTT_WSS_PORT, "wss"))
    return listeners


def ingest_listeners(config: StackConfig) -> dict[int, str]:
    """The ingest tasks' listeners the NLB forwards to: port → listener kind (``mqtt``,
    ``mqtts``, ``ws``, ``wss``), in the NLB listeners' order."""
    return {listener.target_port: listener.kind for listener in nlb_listeners(config)}


def ingest_target_ports(config: StackConfig) -> list[int]:
    """The ingest tasks' ports the NLB forwards to (:func:`ingest_listeners`' ports)."""
    return list(ingest_listeners(config))


class Network(pulumi.ComponentResource):
    """VPC, subnets, routes, NAT gateways, S3 gateway endpoint and the tiers' security groups.

    Attributes: ``vpc_id``; ``zones`` (the availability zones' names, in order);
    ``public_subnet_ids`` and ``private_subnet_ids`` (one per zone, in zone order);
    ``security_groups`` (tier name of :data:`TIERS` → security group id);
    ``kafka_port`` (9096 SCRAM or 9098 IAM).
    """

    def __init__(
        self,
        name: str,
        config: StackConfig,
        region: str,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("cormorant:network:Network", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        zones = aws.get_availability_zones(
            state="available",
            filters=[{"name": "opt-in-status", "values": ["opt-in-not-required"]}],
            opts=pulumi.InvokeOptions(parent=self),
        ).names[: config.availability_zones]
        if len(zones) < config.availability_zones:
            raise pulumi.RunError(
                f"the region has {len(zones)} availability zones, the stack asks for "
                f"{config.availability_zones} (cormorant:availabilityZones)"
            )

        vpc = aws.ec2.Vpc(
            f"{name}-vpc",
            cidr_block=config.vpc_cidr,
            enable_dns_hostnames=True,  # MSK, ElastiCache and RDS endpoints are DNS names
            enable_dns_support=True,
            tags={"Name": name},
            opts=child,
        )
        self._flow_logs(name, config, vpc)
        gateway = aws.ec2.InternetGateway(f"{name}-igw", vpc_id=vpc.id, opts=child)
        public_routes = aws.ec2.RouteTable(
            f"{name}-public",
            vpc_id=vpc.id,
            routes=[{"cidr_block": "0.0.0.0/0", "gateway_id": gateway.id}],
            tags={"Name": f"{name}-public"},
            opts=child,
        )

        public_subnets: list[aws.ec2.Subnet] = []
        private_subnets: list[aws.ec2.Subnet] = []
        for index, (zone, plan) in enumerate(
            zip(zones, subnet_plan(config.vpc_cidr, len(zones)), strict=True)
        ):
            public = aws.ec2.Subnet(
                f"{name}-public-{index}",
                vpc_id=vpc.id,
                cidr_block=plan.public,
                availability_zone=zone,
                map_public_ip_on_launch=False,  # only the NAT gateways get (elastic) addresses
                tags={"Name": f"{name}-public-{zone}"},
                opts=child,
            )
            aws.ec2.RouteTableAssociation(
                f"{name}-public-{index}",
                subnet_id=public.id,
                route_table_id=public_routes.id,
                opts=child,
            )
            private = aws.ec2.Subnet(
                f"{name}-private-{index}",
                vpc_id=vpc.id,
                cidr_block=plan.private,
                availability_zone=zone,
                map_public_ip_on_launch=False,
                tags={"Name": f"{name}-private-{zone}"},
                opts=child,
            )
            public_subnets.append(public)
            private_subnets.append(private)

        nats = []
        for index in range(config.nat_gateways):
            address = aws.ec2.Eip(f"{name}-nat-{index}", domain="vpc", opts=child)
            nats.append(
                aws.ec2.NatGateway(
                    f"{name}-nat-{index}",
                    allocation_id=address.id,
                    subnet_id=public_subnets[index].id,
                    tags={"Name": f"{name}-nat-{index}"},
                    opts=pulumi.ResourceOptions(parent=self, depends_on=[gateway]),
                )
            )
        private_route_ids = []
        for index, private in enumerate(private_subnets):
            # A zone without its own NAT gateway borrows another zone's (cheaper, less
            # available: natGateways = availabilityZones in production).
            routes = aws.ec2.RouteTable(
                f"{name}-private-{index}",
                vpc_id=vpc.id,
                routes=[{"cidr_block": "0.0.0.0/0", "nat_gateway_id": nats[index % len(nats)].id}],
                tags={"Name": f"{name}-private-{index}"},
                opts=child,
            )
            aws.ec2.RouteTableAssociation(
                f"{name}-private-{index}",
                subnet_id=private.id,
                route_table_id=routes.id,
                opts=child,
            )
            private_route_ids.append(routes.id)

        # S3 traffic (the archive, EMR logs, ECR's image layers) stays off the NAT gateways.
        aws.ec2.VpcEndpoint(
            f"{name}-s3",
            vpc_id=vpc.id,
            service_name=f"com.amazonaws.{region}.s3",
            vpc_endpoint_type="Gateway",
            route_table_ids=private_route_ids,
            opts=child,
        )

        self.kafka_port = KAFKA_IAM_PORT if config.kafka_iam else KAFKA_SCRAM_PORT
        groups = {
            tier: aws.ec2.SecurityGroup(
                f"{name}-{tier}",
                vpc_id=vpc.id,
                description=f"Cormorant {tier} tier",
                revoke_rules_on_delete=True,
                tags={"Name": f"{name}-{tier}"},
                opts=child,
            )
            for tier in TIERS
        }
        self._rules(name, config, groups)

        self.vpc_id = vpc.id
        self.zones: list[str] = list(zones)
        self.public_subnet_ids = [subnet.id for subnet in public_subnets]
        self.private_subnet_ids = [subnet.id for subnet in private_subnets]
        self.security_groups: dict[str, pulumi.Output[str]] = {
            tier: group.id for tier, group in groups.items()
        }
        self.register_outputs({"vpcId": self.vpc_id, "privateSubnetIds": self.private_subnet_ids})

    def _flow_logs(self, name: str, config: StackConfig, vpc: aws.ec2.Vpc) -> None:
        """Every flow of the VPC, accepted and rejected, to CloudWatch Logs (kept
        ``logRetentionDays``): who talked to whom, for an investigation."""
        child = pulumi.ResourceOptions(parent=self)
        logs = aws.cloudwatch.LogGroup(
            f"{name}-flow-logs",
            name=f"/cormorant/{name}/vpc-flow-logs",
            retention_in_days=config.log_retention_days,
            opts=child,
        )
        role = iam.service_role(
            f"{name}-flow-logs",
            "vpc-flow-logs.amazonaws.com",
            [
                iam.allow(
                    ["logs:CreateLogStream", "logs:DescribeLogStreams", "logs:PutLogEvents"],
                    [logs.arn, pulumi.Output.concat(logs.arn, ":log-stream:*")],
                )
            ],
            child,
        )
        aws.ec2.FlowLog(
            f"{name}-flow-logs",
            vpc_id=vpc.id,
            traffic_type="ALL",
            log_destination_type="cloud-watch-logs",
            log_destination=logs.arn,
            iam_role_arn=role.arn,
            opts=child,
        )

    def _rules(
        self, name: str, config: StackConfig, groups: dict[str, aws.ec2.SecurityGroup]
    ) -> None:
        """The only paths traffic may take between the tiers (and in from the internet)."""
        child = pulumi.ResourceOptions(parent=self)

        def between(client: str, server: str, port: int) -> None:
            aws.vpc.SecurityGroupEgressRule(
                f"{name}-{client}-to-{server}-{port}",
                security_group_id=groups[client].id,
                referenced_security_group_id=groups[server].id,
                ip_protocol="tcp",
                from_port=port,
                to_port=port,
                description=f"{client} to {server}",
                opts=child,
            )
            aws.vpc.SecurityGroupIngressRule(
                f"{name}-{server}-from-{client}-{port}",
                security_group_id=groups[server].id,
                referenced_security_group_id=groups[client].id,
                ip_protocol="tcp",
                from_port=port,
                to_port=port,
                description=f"{server} from {client}",
                opts=child,
            )

        # The policy pack holds a rule marked production to the production rules.
        tags = {shared.PRODUCTION_TAG: "true"} if config.production else None

        def from_cidrs(tier: str, label: str, cidrs: list[str], ports: list[int]) -> None:
            """Let ``cidrs`` (``label``: who they are) in on ``ports`` of ``tier``."""
            for port in ports:
                for index, cidr in enumerate(cidrs):
                    aws.vpc.SecurityGroupIngressRule(
                        f"{name}-{tier}-{label}-{port}-{index}",
                        security_group_id=groups[tier].id,
                        cidr_ipv4=cidr,
                        ip_protocol="tcp",
                        from_port=port,
                        to_port=port,
                        description=f"{label} from {cidr}",
                        tags=tags,
                        opts=child,
                    )

        from_cidrs("nlb", "mqtt", config.allowed_cidrs, mqtt_listener_ports(config))
        for port in ingest_target_ports(config):
            between("nlb", "ingest", port)
        # /ready (the NLB's target health), and /health, /ready and /metrics for the admin
        # service's cluster view, on every task's HTTP port.
        between("nlb", "ingest", shared.HTTP_PORT)
        for tier in ("ingest", "stages"):
            between("admin", tier, shared.HTTP_PORT)
        between("adminlb", "admin", shared.ADMIN_PORT)
        if config.admin_certificate_arn:
            # Operators reach the admin load balancer from the VPC itself unless told who.
            admins = config.admin_allowed_cidrs or [config.vpc_cidr]
            from_cidrs("adminlb", "operators", admins, [ADMIN_LB_PORT])
        # A Prometheus in the VPC (or in a network joined to it) scrapes every task.
        from_cidrs("ingest", "prometheus", config.metrics_allowed_cidrs, [shared.HTTP_PORT])
        from_cidrs("stages", "prometheus", config.metrics_allowed_cidrs, [shared.HTTP_PORT])
        from_cidrs("admin", "prometheus", config.metrics_allowed_cidrs, [shared.ADMIN_PORT])
        from_cidrs("integrations", "prometheus", config.metrics_allowed_cidrs, [shared.HTTP_PORT])
        between("admin", "integrations", shared.HTTP_PORT)
        for client in ("ingest", "stages", "integrations", "admin", "analytics"):
            between(client, "kafka", self.kafka_port)
        for client in ("stages", "admin"):
            between(client, "cache", REDIS_PORT)
        # The ingest nodes read the MQTT credentials and lease their node ids there; the
        # integrations stage reads the integrations.
        for client in ("ingest", "stages", "integrations", "admin"):
            between(client, "database", POSTGRES_PORT)
        # The MQTT bridges' reverse directions publish on the ingest tasks' direct MQTT
        # listener (no PROXY header: the NLB's listeners require one).
        between("integrations", "ingest", shared.INGEST_DIRECT_MQTT_PORT)
        self._integrations_egress(name, config, groups["integrations"])
        # AWS APIs the tasks need (ECR, Secrets Manager, CloudWatch Logs, STS), through the
        # NAT gateways: HTTPS out only (a webhook on 443 too).
        for tier in ("ingest", "stages", "integrations", "admin", "analytics"):
            aws.vpc.SecurityGroupEgressRule(
                f"{name}-{tier}-https",
                security_group_id=groups[tier].id,
                cidr_ipv4="0.0.0.0/0",
                ip_protocol="tcp",
                from_port=HTTPS_PORT,
                to_port=HTTPS_PORT,
                description="AWS APIs over HTTPS",
                opts=child,
            )

    def _integrations_egress(
        self, name: str, config: StackConfig, group: aws.ec2.SecurityGroup
    ) -> None:
        """One egress rule of the integrations stage's security group per
        ``integrationsEgress`` entry (a team's brokers, webhook or MQTT broker); no other
        tier gets them."""
        for index, rule in enumerate(config.integrations_egress_rules):
            destination = rule.prefix_list_id or rule.cidr
            ipv6 = rule.cidr is not None and ":" in rule.cidr
            aws.vpc.SecurityGroupEgressRule(
                f"{name}-integrations-out-{index}",
                security_group_id=group.id,
                cidr_ipv4=None if ipv6 else rule.cidr,
                cidr_ipv6=rule.cidr if ipv6 else None,
                prefix_list_id=rule.prefix_list_id,
                ip_protocol="tcp",
                from_port=rule.from_port,
                to_port=rule.to_port,
                description=f"integrations to {destination}",
                opts=pulumi.ResourceOptions(parent=self),
            )
