"""Admin access: who may reach the admin service (the operators' REST API and console) and
with what.

- **Its first login**: an admin user (``admin``) with a generated password, kept in a
  Secrets Manager secret (JSON ``{"username": ..., "password": ...}``) that the admin task
  receives as ECS secrets (``admin_bootstrap_user``/``admin_bootstrap_password``: the
  service creates that user at its first start, :func:`services.admin.main.bootstrap_user`).
  Operators read it with ``aws secretsmanager get-secret-value`` (the stack outputs its ARN,
  never the password) and then make their own users.
- **Its network path**, with ``adminCertificateArn`` only (bearer tokens never cross the
  network in clear): an internal application load balancer in the private subnets, HTTPS
  with that certificate, reachable from ``adminAllowedCidrs`` (the VPC itself by default: a
  VPN, a bastion, peered networks), never from the internet. Without a certificate there is
  no load balancer: the admin tasks take no connection from outside their security group.
"""

from __future__ import annotations

import pulumi
import pulumi_aws as aws
import pulumi_random as random

from cormorant_infra import shared
from cormorant_infra.config import StackConfig
from cormorant_infra.ingress import TLS_POLICY
from cormorant_infra.network import ADMIN_LB_PORT, Network

BOOTSTRAP_USER = "admin"
"""The admin user the deployment creates (``admin_bootstrap_user``)."""

PASSWORD_LENGTH = 32
"""Characters of the generated password (letters and digits: ~190 bits)."""


class AdminAccess(pulumi.ComponentResource):
    """The admin credentials' secret and, with a certificate, the internal HTTPS load balancer.

    Attributes: ``credentials_secret_arn`` (the secret's ARN); ``target_group_arn`` and
    ``url`` (``https://<dns name>/``), both None without ``adminCertificateArn``.
    """

    def __init__(
        self,
        name: str,
        config: StackConfig,
        network: Network,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("cormorant:admin:AdminAccess", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        password = random.RandomPassword(
            f"{name}-admin-password", length=PASSWORD_LENGTH, special=False, opts=child
        )
        secret = aws.secretsmanager.Secret(
            f"{name}-admin-credentials",
            name_prefix=f"{name}-admin-credentials-",
            description="Cormorant admin API and console: the first admin user's login",
            opts=child,
        )
        aws.secretsmanager.SecretVersion(
            f"{name}-admin-credentials",
            secret_id=secret.id,
            # A secret because the password is: the stack's state keeps it encrypted.
            secret_string=pulumi.Output.json_dumps(
                {"username": BOOTSTRAP_USER, "password": password.result}
            ),
            opts=child,
        )
        self.credentials_secret_arn: pulumi.Output[str] = secret.arn
        self.target_group_arn: pulumi.Output[str] | None = None
        self.url: pulumi.Output[str] | None = None
        if config.admin_certificate_arn:
            self._load_balancer(name, config, network)
        self.register_outputs(
            {"credentialsSecretArn": self.credentials_secret_arn, "url": self.url}
        )

    def _load_balancer(self, name: str, config: StackConfig, network: Network) -> None:
        child = pulumi.ResourceOptions(parent=self)
        balancer = aws.lb.LoadBalancer(
            f"{name}-admin",
            load_balancer_type="application",
            internal=True,
            subnets=network.private_subnet_ids,
            security_groups=[network.security_groups["adminlb"]],
            drop_invalid_header_fields=True,
            opts=child,
        )
        group = aws.lb.TargetGroup(
            f"{name}-admin",
            port=shared.ADMIN_PORT,
            protocol="HTTP",
            target_type="ip",
            vpc_id=network.vpc_id,
            deregistration_delay=30,
            # A task takes operators while Kafka and PostgreSQL answer it.
            health_check=aws.lb.TargetGroupHealthCheckArgs(
                protocol="HTTP",
                path="/ready",
                matcher="200",
                interval=15,
                healthy_threshold=2,
                unhealthy_threshold=3,
            ),
            opts=child,
        )
        aws.lb.Listener(
            f"{name}-admin",
            load_balancer_arn=balancer.arn,
            port=ADMIN_LB_PORT,
            protocol="HTTPS",
            certificate_arn=config.admin_certificate_arn,
            ssl_policy=TLS_POLICY,
            default_actions=[{"type": "forward", "target_group_arn": group.arn}],
            opts=child,
        )
        self.target_group_arn = group.arn
        self.url = pulumi.Output.concat("https://", balancer.dns_name, "/")
