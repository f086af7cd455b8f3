"""Settings of the analytics commands: Cormorant's settings plus where the archive lives,
which Spark runs the local jobs, and the EMR Serverless application they run on.

The jobs reach Kafka with Cormorant's own Kafka settings (``kafka_bootstrap``,
``kafka_security_protocol``, ``kafka_sasl_*``, ``kafka_ssl_cafile``:
:mod:`spark_emr.kafka_options`), and find the Spark connector's jars in the launcher's jar
cache (``cache_dir``, where the local Kafka's jars are too): analytics runs on the machine
of the local cluster launcher, so :class:`AnalyticsSettings` extends its
:class:`~services.local.settings.LocalSettings`. Like every setting, each is an environment
variable ``CORMORANT_<NAME>`` or a line of the settings file (:mod:`services.common.settings`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from services.local.settings import LocalSettings


class AnalyticsSettings(LocalSettings):
    """:class:`~services.local.settings.LocalSettings` and the analytics' own
    (``CORMORANT_``)."""

    archive_dir: Path | None = Field(
        None,
        description="Where `cormorant analytics archive` writes the local Parquet archive "
        "(default: <state_dir>/archive).",
    )
    archive_format: Literal["parquet", "iceberg"] = Field(
        "parquet",
        description="Table format of the archive: parquet (the file sink's tables in the "
        "archive directory) or iceberg (Iceberg tables, partitioned by date and hour: "
        "locally a Hadoop catalog in the archive directory, on EMR the stack's Glue Data "
        "Catalog database, which Athena queries).",
    )
    archive_max_records_per_batch: int = Field(
        1_000_000,
        ge=1,
        description="Kafka records in one micro-batch of each archive table "
        "(maxOffsetsPerTrigger; --max-records-per-batch overrides it): the first run over "
        "a large backlog commits in steps of this size instead of one batch that must "
        'finish whole (docs/analytics.md, "Scale figures").',
    )
    analytics_master: str = Field(
        "local[*]", description="Spark master of the local analytics jobs (local[N], spark://…)."
    )
    analytics_kafka_secret_arn: str | None = Field(
        None,
        description="On EMR with SCRAM-SHA-512 (kafka_security_protocol SASL_SSL): the "
        "Secrets Manager secret ({username, password}, MSK's format) the job's driver reads "
        "the credentials from (with --stack-outputs: its kafkaScramSecretArn).",
    )
    aws_region: str | None = Field(
        None, description="AWS region of the EMR Serverless application and the archive bucket."
    )
    archive_bucket: str | None = Field(
        None, description="S3 bucket of the archive, the job packages, logs and reports (EMR)."
    )
    emr_application_id: str | None = Field(
        None, description="EMR Serverless application that runs the jobs (--emr)."
    )
    emr_job_role_arn: str | None = Field(
        None, description="IAM role the EMR Serverless job runs assume (--emr)."
    )
    analytics_schedule_group: str | None = Field(
        None,
        description="EventBridge Scheduler group of the archive's schedule "
        "(`cormorant analytics schedule`; with --stack-outputs: its archiveScheduleGroup).",
    )
    analytics_scheduler_role_arn: str | None = Field(
        None,
        description="IAM role EventBridge Scheduler starts the archive's job runs as "
        "(with --stack-outputs: its archiveSchedulerRoleArn).",
    )
    analytics_glue_database: str | None = Field(
        None,
        description="Glue Data Catalog database of the Iceberg archive on EMR "
        "(with --stack-outputs: its glueDatabase).",
    )
    emr_poll_seconds: float = Field(
        10.0, gt=0, description="How often a submitted EMR job run's state is asked for."
    )

    def archive_path(self) -> Path:
        """The local archive directory: ``archive_dir`` or ``<state_dir>/archive``."""
        return self.archive_dir or self.state_dir / "archive"
