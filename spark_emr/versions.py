"""The Spark line Cormorant's analytics run on: one place for every version that must agree.

``infra/`` imports :data:`EMR_RELEASE_LABEL` for its EMR Serverless application, the
project pins ``pyspark==SPARK_VERSION`` (pyproject.toml, ``analytics`` extra), and
:mod:`spark_emr.jars` fetches the Kafka connector of the same version through Maven.
"""

from __future__ import annotations

#: Apache Spark release of ``pyspark`` and of the Kafka connector (EMR 7 runs Spark 3.5.x).
SPARK_VERSION = "3.5.7"

#: Scala binary version of Spark 3.5's published artifacts (``_2.12`` suffix).
SCALA_BINARY_VERSION = "2.12"

#: ``software.amazon.msk:aws-msk-iam-auth`` release: the SASL mechanism ``AWS_MSK_IAM``.
MSK_IAM_AUTH_VERSION = "2.3.2"

#: EMR Serverless release whose Spark is 3.5.x (EMR Serverless 7.9.0 runs Spark 3.5.5).
EMR_RELEASE_LABEL = "emr-7.9.0"

#: The Maven coordinates of the Structured Streaming Kafka source (``groupId:artifactId:version``).
KAFKA_CONNECTOR = f"org.apache.spark:spark-sql-kafka-0-10_{SCALA_BINARY_VERSION}:{SPARK_VERSION}"
