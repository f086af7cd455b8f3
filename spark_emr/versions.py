"""The versions of the Spark jobs' own dependencies, beside the Spark line they run on.

:data:`SPARK_VERSION` (pyproject.toml pins ``pyspark`` to it, ``analytics`` extra) and
:data:`EMR_RELEASE_LABEL` (``infra/``'s EMR Serverless application) are defined once, in
:mod:`services.common.versions`, and re-exported here; :mod:`spark_emr.jars` fetches the
Kafka connector of the same Spark version and the MSK IAM login module through Maven.
"""

from __future__ import annotations

from services.common.versions import EMR_RELEASE_LABEL, SPARK_VERSION

__all__ = [
    "EMR_RELEASE_LABEL",
    "ICEBERG_VERSION",
    "KAFKA_CONNECTOR",
    "MSK_IAM_AUTH_VERSION",
    "SCALA_BINARY_VERSION",
    "SPARK_VERSION",
]

#: Scala binary version of Spark 3.5's published artifacts (``_2.12`` suffix).
SCALA_BINARY_VERSION = "2.12"

#: ``software.amazon.msk:aws-msk-iam-auth`` release: the SASL mechanism ``AWS_MSK_IAM``.
MSK_IAM_AUTH_VERSION = "2.3.2"

#: The Maven coordinates of the Structured Streaming Kafka source (``groupId:artifactId:version``).
KAFKA_CONNECTOR = f"org.apache.spark:spark-sql-kafka-0-10_{SCALA_BINARY_VERSION}:{SPARK_VERSION}"

#: ``org.apache.iceberg:iceberg-spark-runtime-3.5_2.12`` release of the local Iceberg tables
#: (on EMR the release's own Iceberg runtime is used: :data:`spark_emr.emr.EMR_ICEBERG_JAR`).
ICEBERG_VERSION = "1.10.0"
