"""Ingress: the internet-facing Network Load Balancer in front of the ingest tasks.

Listeners: MQTT on 1883 (TCP, ``cormorant:plainMqtt``, off by default), MQTT over TLS on
8883 and MQTT over WebSocket over TLS on 443 (``wss://<host>/mqtt``, ``cormorant:websocket``),
either terminated at the NLB with an ACM certificate (``tlsMode: terminate``: the tasks see
plain MQTT on 1883 and plain WebSocket on 8083) or passed through to the tasks' own TLS
listeners (``tlsMode: passthrough``, 8883 and 8084, for mutual TLS: the tasks verify client
certificates, which X509 credentials match). Every target group sends PROXY protocol v2
(``cormorant:proxyProtocolV2``, on by default): the targets are IP addresses, and an IP
target group of TCP or TLS does not preserve the client's address (AWS, "Edit target group
attributes for your Network Load Balancer", Client IP preservation, default settings: "IP
type target groups (TCP, TLS): Disabled"), so without it every client would appear to come
from the NLB and the per-address limits would apply to the NLB's few addresses.
Targets are the ingest tasks' IP addresses, in every zone (cross-zone load balancing on),
checked with a GET of their ``/ready``. A task leaving drains (docs/operations/drain.md):
ECS deregisters it and waits out the deregistration delay (the drain's notice: the NLB
sends it no new connection by then) before its SIGTERM; the task then disconnects its
clients in paced batches within ``drain_seconds``. So the NLB closes no connection
itself: not at the end of the deregistration delay (``connection_termination`` off: all
of them at once would be the reconnect storm the drain avoids), and not when the
draining task's ``/ready`` fails (unhealthy targets' connections are left for the whole
drain, ``unhealthy_draining_interval``). The health check notices a failed ``/ready``
within the drain's notice, so a drain by hand (``cormorant drain``) gets no new client
either.

MQTT connections are long-lived and idle between PINGREQs: the listeners' idle timeout and
the broker's largest Keep Alive are kept consistent by :mod:`cormorant_infra.config`.
"""

from __future__ import annotations

import math
from typing import Any

import pulumi
import pulumi_aws as aws

from cormorant_infra import shared
from cormorant_infra.config import StackConfig
from cormorant_infra.network import Network, ingest_target_ports, nlb_listeners

TLS_POLICY = "ELBSecurityPolicy-TLS13-1-2-2021-06"
"""TLS 1.3 and 1.2 with forward-secret ciphers only."""

HEALTH_CHECK_INTERVAL_SECONDS = 5
"""Seconds between two health checks of a target (the NLB's least is 5)."""

UNHEALTHY_THRESHOLD = 2
"""Failed health checks in a row that take a target out of rotation (the NLB's least)."""

if shared.INGEST_DRAIN.notice < HEALTH_CHECK_INTERVAL_SECONDS * UNHEALTHY_THRESHOLD:
    raise ValueError("the NLB must notice a failed /ready within an ingest drain's notice")


class Ingress(pulumi.ComponentResource):
    """The NLB, its target groups (one per ingest port) and listeners.

    Attributes: ``dns_name``; ``endpoints`` (``mqtt://<dns>:1883``, ``mqtts://<dns>:8883``);
    ``target_groups`` (ingest container port → target group ARN); ``arn``,
    ``arn_suffix`` and ``target_group_suffixes`` (for CloudWatch dimensions).
    """

    def __init__(
        self,
        name: str,
        config: StackConfig,
        network: Network,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("cormorant:ingress:Ingress", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        nlb = aws.lb.LoadBalancer(
            f"{name}-nlb",
            load_balancer_type="network",
            internal=False,
            subnets=network.public_subnet_ids,
            security_groups=[network.security_groups["nlb"]],
            enable_cross_zone_load_balancing=True,
            enable_deletion_protection=config.nlb_deletion_protection,
            opts=child,
        )
        groups: dict[int, aws.lb.TargetGroup] = {}
        for port in ingest_target_ports(config):
            groups[port] = aws.lb.TargetGroup(
                f"{name}-mqtt-{port}",
                port=port,
                protocol="TCP",
                target_type="ip",
                vpc_id=network.vpc_id,
                proxy_protocol_v2=config.proxy_protocol_v2,
                # ECS sends SIGTERM once the delay is over: the task drains then.
                deregistration_delay=math.ceil(shared.INGEST_DRAIN.notice),
                connection_termination=False,
                target_health_states=[
                    aws.lb.TargetGroupTargetHealthStateArgs(
                        enable_unhealthy_connection_termination=False,
                        unhealthy_draining_interval=shared.INGEST_DRAIN.stop_seconds,
                    )
                ],
                # A task takes new clients while its /ready says so (Kafka answers, state
                # replayed, not draining); when every task fails it, the NLB sends to all
                # (fail open).
                health_check=aws.lb.TargetGroupHealthCheckArgs(
                    protocol="HTTP",
                    port=str(shared.HTTP_PORT),
                    path="/ready",
                    matcher="200",
                    interval=HEALTH_CHECK_INTERVAL_SECONDS,
                    healthy_threshold=3,
                    unhealthy_threshold=UNHEALTHY_THRESHOLD,
                ),
                opts=child,
            )

        suffixes = {
            shared.MQTT_PORT: "mqtt",
            shared.MQTT_TLS_PORT: "mqtts",
            shared.MQTT_WSS_PUBLIC_PORT: "wss",
        }
        for listener in nlb_listeners(config):
            protocol: dict[str, Any] = (
                {
                    "protocol": "TLS",
                    "certificate_arn": config.certificate_arn,
                    "ssl_policy": TLS_POLICY,
                }
                if listener.tls
                else {
                    "protocol": "TCP",
                    "tcp_idle_timeout_seconds": config.nlb_idle_timeout_seconds,
                }
            )
            aws.lb.Listener(
                f"{name}-{suffixes[listener.port]}",
                load_balancer_arn=nlb.arn,
                port=listener.port,
                default_actions=[
                    {"type": "forward", "target_group_arn": groups[listener.target_port].arn}
                ],
                **protocol,
                opts=child,
            )

        self.arn: pulumi.Output[str] = nlb.arn
        self.arn_suffix: pulumi.Output[str] = nlb.arn_suffix
        self.dns_name: pulumi.Output[str] = nlb.dns_name
        self.target_groups = {port: group.arn for port, group in groups.items()}
        self.target_group_suffixes = {port: group.arn_suffix for port, group in groups.items()}
        schemes = {shared.MQTT_PORT: ("mqtt", ""), shared.MQTT_TLS_PORT: ("mqtts", "")}
        schemes[shared.MQTT_WSS_PUBLIC_PORT] = ("wss", "/mqtt")
        self.endpoints = [
            pulumi.Output.concat(f"{scheme}://", nlb.dns_name, f":{listener.port}{path}")
            for listener in nlb_listeners(config)
            for scheme, path in [schemes[listener.port]]
        ]
        self.register_outputs({"dnsName": self.dns_name})
