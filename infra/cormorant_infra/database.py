"""PostgreSQL: an RDS instance for credentials and metadata (and the alternative message store).

Private (no public address), encrypted at rest, TLS required (``rds.force_ssl``), its
master password generated and rotated by RDS in Secrets Manager (never in the stack's
state), Multi-AZ and deletion protection from the stack's configuration (on in prod), its
``postgresql`` log group declared with the stack's retention, and protected from
``pulumi destroy`` in a production stack.

The services do not log in as the master user (whose password RDS rotates every 7 days):
the one-off migration task (``cormorant migrate-db``, compute) logs in as the master user,
migrates the schema and creates the services' own least-privilege role
(:data:`~cormorant_infra.shared.SERVICE_ROLE`), whose password it generates into a secret
of its own, never in the stack's state.
"""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
import pulumi_aws as aws

from cormorant_infra import shared
from cormorant_infra.config import StackConfig
from cormorant_infra.network import POSTGRES_PORT, Network

DATABASE = "cormorant"
MASTER_USERNAME = "cormorant_admin"
"""The RDS master user: only the migration task logs in as it. (Not the services' role
name: that role is the one the migration task creates.)"""
CA_CERTIFICATE = "rds-ca-rsa2048-g1"
"""The RDS CA of the server certificate; its root is in the images' RDS bundle."""


def _managed_secret_arn(secrets: Sequence[aws.rds.outputs.InstanceMasterUserSecret]) -> str:
    """The ARN of the secret RDS manages for the master user."""
    arn = secrets[0].secret_arn if secrets else None
    if arn is None:
        raise pulumi.RunError("RDS returned no managed master user secret")
    return arn


class Database(pulumi.ComponentResource):
    """The RDS PostgreSQL instance.

    Attributes: ``dsn`` (the services': ``postgresql://cormorant@<host>:5432/cormorant``,
    no password), ``password_secret_arn`` (their role's secret: JSON with ``username`` and
    ``password``, written by the migration task), ``master_dsn`` and
    ``master_secret_arn`` (the RDS-managed secret) for the migration task only,
    ``identifier``.
    """

    def __init__(
        self,
        name: str,
        config: StackConfig,
        network: Network,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("cormorant:database:Database", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        major = config.db_engine_version.split(".")[0]
        subnets = aws.rds.SubnetGroup(
            f"{name}-subnets", subnet_ids=network.private_subnet_ids, opts=child
        )
        parameters = aws.rds.ParameterGroup(
            f"{name}-params",
            family=f"postgres{major}",
            parameters=[{"name": "rds.force_ssl", "value": "1"}],
            opts=child,
        )
        identifier = f"{name}-postgres"
        # RDS writes the exported PostgreSQL log to this group, creating it (never to
        # expire) unless it exists: declared first, with the stack's retention.
        logs = aws.cloudwatch.LogGroup(
            f"{name}-postgresql-log",
            name=f"/aws/rds/instance/{identifier}/postgresql",
            retention_in_days=config.log_retention_days,
            opts=child,
        )
        instance = aws.rds.Instance(
            f"{name}-postgres",
            identifier=identifier,
            engine="postgres",
            engine_version=config.db_engine_version,
            instance_class=config.db_instance_class,
            allocated_storage=config.db_allocated_storage_gib,
            max_allocated_storage=config.db_max_allocated_storage_gib,
            storage_type="gp3",
            storage_encrypted=True,
            db_name=DATABASE,
            username=MASTER_USERNAME,
            manage_master_user_password=True,
            port=POSTGRES_PORT,
            multi_az=config.db_multi_az,
            publicly_accessible=False,
            deletion_protection=config.db_deletion_protection,
            skip_final_snapshot=not config.db_deletion_protection,
            final_snapshot_identifier=f"{name}-final" if config.db_deletion_protection else None,
            backup_retention_period=config.db_backup_retention_days,
            copy_tags_to_snapshot=True,
            auto_minor_version_upgrade=True,
            ca_cert_identifier=CA_CERTIFICATE,
            parameter_group_name=parameters.name,
            db_subnet_group_name=subnets.name,
            vpc_security_group_ids=[network.security_groups["database"]],
            enabled_cloudwatch_logs_exports=["postgresql"],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[logs], protect=config.production),
        )
        self.identifier: pulumi.Output[str] = instance.identifier
        self.dsn: pulumi.Output[str] = pulumi.Output.concat(
            f"postgresql://{shared.SERVICE_ROLE}@", instance.address, f":{POSTGRES_PORT}/{DATABASE}"
        )
        self.master_dsn: pulumi.Output[str] = pulumi.Output.concat(
            f"postgresql://{MASTER_USERNAME}@", instance.address, f":{POSTGRES_PORT}/{DATABASE}"
        )
        self.master_secret_arn: pulumi.Output[str] = instance.master_user_secrets.apply(
            _managed_secret_arn
        )
        # Its value comes from the migration task (generated there, never in the state).
        service_secret = aws.secretsmanager.Secret(
            f"{name}-service-login",
            name_prefix=f"{name}-postgres-{shared.SERVICE_ROLE}-",
            description="The PostgreSQL login of Cormorant's services (cormorant migrate-db)",
            opts=child,
        )
        self.password_secret_arn: pulumi.Output[str] = service_secret.arn
        self.register_outputs({"dsn": self.dsn})
