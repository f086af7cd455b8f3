"""The Iceberg archive's catalog, its readers and its schedule (docs/analytics.md).

- the Glue Data Catalog database of the Iceberg tables (``spark_emr``'s ``glue_catalog``),
  located under ``s3://<archive bucket>/iceberg/``; the Spark job role may create and
  update its tables, nothing else in Glue;
- the analysts' Athena workgroup (engine version 3, results in the archive bucket under
  ``athena-results/``, its settings enforced, a scan limit per query) and the report's
  questions saved in it as named queries (:data:`spark_emr.athena.QUERIES`);
- the schedule group and the role EventBridge Scheduler starts the archive's job runs as
  (``cormorant analytics schedule`` puts the schedule there: it uploads the job and knows
  its arguments): allowed to start job runs on the stack's application and to pass the
  job role to them, nothing else.
"""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from cormorant_infra import iam
from cormorant_infra.analytics import Analytics
from spark_emr.athena import QUERIES

ATHENA_ENGINE = "Athena engine version 3"
"""The Athena engine that reads Iceberg tables (version 2 does not)."""

BYTES_SCANNED_CUTOFF = 100 * 1024**3
"""The largest scan one Athena query of the workgroup may make (bytes): a query that
forgets its partition filter is cancelled instead of reading the whole archive."""


def glue_database_name(name: str) -> str:
    """The Glue database of stack ``name`` (``cormorant-prod`` → ``cormorant_prod_archive``):
    Glue and Athena want lower case, digits and underscores."""
    return f"{name.lower().replace('-', '_')}_archive"


class Lakehouse(pulumi.ComponentResource):
    """Glue database, Athena workgroup and named queries, schedule group and scheduler role.

    Attributes: ``database_name``, ``workgroup_name``, ``schedule_group_name``,
    ``scheduler_role_arn``.
    """

    def __init__(
        self,
        name: str,
        region: str,
        analytics: Analytics,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("cormorant:lakehouse:Lakehouse", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        bucket = analytics.bucket_name
        database = aws.glue.CatalogDatabase(
            f"{name}-archive",
            name=glue_database_name(name),
            description="Cormorant's archive of the MQTT stream: Iceberg tables "
            "(messages, events, deliveries, acks) written by spark_emr",
            location_uri=pulumi.Output.concat("s3://", bucket, "/iceberg/"),
            opts=child,
        )
        account = aws.get_caller_identity().account_id
        catalog_arn = f"arn:aws:glue:{region}:{account}:catalog"
        database_arn = pulumi.Output.concat(
            f"arn:aws:glue:{region}:{account}:database/", database.name
        )
        tables_arn = pulumi.Output.concat(
            f"arn:aws:glue:{region}:{account}:table/", database.name, "/*"
        )
        aws.iam.RolePolicy(
            f"{name}-spark-job-glue",
            role=analytics.job_role_name,
            policy=iam.document(
                [
                    iam.allow(
                        ["glue:GetDatabase", "glue:GetTable", "glue:GetTables"],
                        [catalog_arn, database_arn, tables_arn],
                    ),
                    iam.allow(
                        ["glue:CreateTable", "glue:UpdateTable", "glue:DeleteTable"],
                        [catalog_arn, database_arn, tables_arn],
                    ),
                ]
            ),
            opts=child,
        )

        workgroup = aws.athena.Workgroup(
            f"{name}-analysts",
            name=f"{name}-analysts",
            description="Analysts' SQL over the Cormorant archive (Iceberg, Glue)",
            configuration={
                "enforce_workgroup_configuration": True,
                "publish_cloudwatch_metrics_enabled": True,
                "bytes_scanned_cutoff_per_query": BYTES_SCANNED_CUTOFF,
                "engine_version": {"selected_engine_version": ATHENA_ENGINE},
                "result_configuration": {
                    "output_location": pulumi.Output.concat("s3://", bucket, "/athena-results/"),
                    "encryption_configuration": {"encryption_option": "SSE_S3"},
                },
            },
            force_destroy=True,
            opts=child,
        )
        for query in QUERIES:
            aws.athena.NamedQuery(
                f"{name}-{query.name}",
                name=query.name,
                description=query.description,
                workgroup=workgroup.name,
                database=database.name,
                query=database.name.apply(query.for_database),
                opts=child,
            )

        group = aws.scheduler.ScheduleGroup(
            f"{name}-analytics", name=f"{name}-analytics", opts=child
        )
        scheduler_role = iam.service_role(
            f"{name}-archive-schedule",
            "scheduler.amazonaws.com",
            [
                iam.allow(
                    ["emr-serverless:StartJobRun"],
                    [
                        analytics.application_arn,
                        pulumi.Output.concat(analytics.application_arn, "/jobruns/*"),
                    ],
                ),
                iam.allow(["iam:PassRole"], [analytics.job_role_arn]),
            ],
            child,
        )

        self.database_name: pulumi.Output[str] = database.name
        self.workgroup_name: pulumi.Output[str] = workgroup.name
        self.schedule_group_name: pulumi.Output[str] = group.name
        self.scheduler_role_arn: pulumi.Output[str] = scheduler_role.arn
        self.register_outputs({"database": self.database_name, "workgroup": self.workgroup_name})
