"""Which Kafka topics exist, asked through the Kafka client Spark's connector already ships.

The Spark jobs use it to tell "the topic does not exist" from "no new records" before they
start reading. It goes through the JVM (``org.apache.kafka.clients.admin.Admin``) with the
same options as the Kafka source, so it needs nothing beyond the connector's jars, locally
and on EMR, and authenticates the same way.
"""

from __future__ import annotations

from pyspark.sql import SparkSession

#: Seconds the topic listing may take before Kafka counts as unreachable.
LIST_TIMEOUT = 30


class KafkaUnreachable(RuntimeError):
    """Kafka did not answer the topic listing in time (wrong address, down, or refused)."""


def existing_topics(
    spark: SparkSession, options: dict[str, str], timeout: int = LIST_TIMEOUT
) -> set[str]:
    """The names of the topics of the Kafka cluster that Spark Kafka source ``options``
    (``kafka.``-prefixed client configs) reach. Raises :class:`KafkaUnreachable` naming the
    bootstrap address and Kafka's error if it does not answer within ``timeout`` seconds."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    props = jvm.java.util.Properties()
    for name, value in options.items():
        if name.startswith("kafka."):
            props.put(name.removeprefix("kafka."), value)
    millis = str(timeout * 1000)
    props.put("default.api.timeout.ms", millis)
    props.put("request.timeout.ms", millis)
    admin = jvm.org.apache.kafka.clients.admin.Admin.create(props)
    try:
        future = admin.listTopics().names()
        names = future.get(timeout, jvm.java.util.concurrent.TimeUnit.SECONDS)
        return {str(name) for name in names}
    except Exception as exc:  # py4j wraps the Java TimeoutException/ExecutionException
        java = getattr(exc, "java_exception", None)
        detail = str(java.toString()) if java is not None else str(exc).splitlines()[0]
        raise KafkaUnreachable(
            f"Kafka at {options.get('kafka.bootstrap.servers')} did not list its topics "
            f"within {timeout} s ({detail})"
        ) from exc
    finally:
        admin.close()
