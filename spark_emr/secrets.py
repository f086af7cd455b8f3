"""SCRAM credentials for a job run on EMR, read from AWS Secrets Manager by the driver.

A password must not travel in a job run's arguments or Spark parameters (EMR keeps and shows
them); MSK keeps SCRAM users as Secrets Manager secrets whose value is
``{"username": …, "password": …}``, and the job role may read them.
"""

from __future__ import annotations

import json
from typing import Any

from spark_emr.kafka_options import kafka_options


def with_scram_secret(options: dict[str, str], secret_arn: str | None) -> dict[str, str]:
    """``options`` with SCRAM authentication from secret ``secret_arn`` (None: unchanged).

    Raises ``ValueError`` if the secret lacks a user name or password, and botocore's
    ``ClientError`` if it cannot be read.
    """
    if not secret_arn:
        return options
    import boto3  # on the EMR driver only: boto3 ships with EMR's images

    client: Any = boto3.client("secretsmanager")
    secret = json.loads(client.get_secret_value(SecretId=secret_arn)["SecretString"])
    scram = kafka_options(
        options["kafka.bootstrap.servers"],
        "SASL_SSL",
        "SCRAM-SHA-512",
        username=secret.get("username"),
        password=secret.get("password"),
    )
    return options | scram
