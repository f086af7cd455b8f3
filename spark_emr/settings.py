"""Settings of the analytics commands: Cormorant's settings plus where the archive lives,
how the Spark jobs reach Kafka, and the EMR Serverless application they run on.

Like every setting, each is an environment variable ``CORMORANT_<NAME>`` or a line of the
settings file (:mod:`services.common.settings`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr

from services.common.settings import Settings


class AnalyticsSettings(Settings):
    """:class:`~services.common.settings.Settings` and the analytics' own (``CORMORANT_``)."""

    archive_dir: Path | None = Field(
        None,
        description="Where `cormorant analytics archive` writes the local Parquet archive "
        "(default: <state_dir>/archive).",
    )
    analytics_master: str = Field(
        "local[*]", description="Spark master of the local analytics jobs (local[N], spark://…)."
    )
    analytics_kafka_auth: Literal["none", "scram", "iam"] = Field(
        "none",
        description="How the Spark jobs authenticate to Kafka: none (PLAINTEXT, or TLS with "
        "analytics_kafka_tls), scram (SASL_SSL SCRAM-SHA-512, MSK port 9096) or iam "
        "(SASL_SSL AWS_MSK_IAM, MSK port 9098).",
    )
    analytics_kafka_tls: bool = Field(
        False, description="With analytics_kafka_auth=none: connect to Kafka over TLS."
    )
    analytics_kafka_username: str | None = Field(
        None, description="SCRAM user name of the Spark jobs (analytics_kafka_auth=scram)."
    )
    analytics_kafka_password: SecretStr | None = Field(
        None, description="SCRAM password of the Spark jobs (from the environment, never logged)."
    )
    analytics_kafka_secret_arn: str | None = Field(
        None,
        description="On EMR with analytics_kafka_auth=scram: the Secrets Manager secret "
        "({username, password}, MSK's format) the job's driver reads the credentials from.",
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
    emr_python_archive: str | None = Field(
        None,
        description="S3 URI of a packed Python 3.11 environment with pandas and pyarrow "
        "(venv-pack) for the EMR jobs, when the application's image has none.",
    )
    emr_poll_seconds: float = Field(
        10.0, gt=0, description="How often a submitted EMR job run's state is asked for."
    )

    def archive_path(self) -> Path:
        """The local archive directory: ``archive_dir`` or ``<state_dir>/archive``."""
        return self.archive_dir or self.state_dir / "archive"
