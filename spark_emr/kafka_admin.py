"""Which Kafka topics exist, asked through the Kafka client Spark's connector already ships.

The Spark jobs use it to tell "the topic does not exist" from "no new records" before they
start reading, and to find records that retention removed before a run read them. It goes
through the JVM (``org.apache.kafka.clients.admin.Admin``) with the
same options as the Kafka source, so it needs nothing beyond the connector's jars, locally
and on EMR, and authenticates the same way.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pyspark.sql import SparkSession

#: Seconds the topic listing may take before Kafka counts as unreachable.
LIST_TIMEOUT = 30


class KafkaUnreachable(RuntimeError):
    """Kafka did not answer the topic listing in time (wrong address, down, or refused)."""


def _admin(spark: SparkSession, options: dict[str, str], timeout: int) -> Any:
    """A JVM Kafka ``Admin`` for Spark Kafka source ``options`` (``kafka.``-prefixed)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    props = jvm.java.util.Properties()
    for name, value in options.items():
        if name.startswith("kafka."):
            props.put(name.removeprefix("kafka."), value)
    millis = str(timeout * 1000)
    props.put("default.api.timeout.ms", millis)
    props.put("request.timeout.ms", millis)
    return jvm.org.apache.kafka.clients.admin.Admin.create(props)


def _unreachable(options: dict[str, str], timeout: int, what: str, exc: Exception) -> Exception:
    java = getattr(exc, "java_exception", None)
    detail = str(java.toString()) if java is not None else str(exc).splitlines()[0]
    return KafkaUnreachable(
        f"Kafka at {options.get('kafka.bootstrap.servers')} did not {what} "
        f"within {timeout} s ({detail})"
    )


def existing_topics(
    spark: SparkSession, options: dict[str, str], timeout: int = LIST_TIMEOUT
) -> set[str]:
    """The names of the topics of the Kafka cluster that Spark Kafka source ``options``
    (``kafka.``-prefixed client configs) reach. Raises :class:`KafkaUnreachable` naming the
    bootstrap address and Kafka's error if it does not answer within ``timeout`` seconds."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    admin = _admin(spark, options, timeout)
    try:
        future = admin.listTopics().names()
        names = future.get(timeout, jvm.java.util.concurrent.TimeUnit.SECONDS)
        return {str(name) for name in names}
    except Exception as exc:  # py4j wraps the Java TimeoutException/ExecutionException
        raise _unreachable(options, timeout, "list its topics", exc) from exc
    finally:
        admin.close()


def earliest_offsets(
    spark: SparkSession,
    options: dict[str, str],
    partitions: Iterable[tuple[str, int]],
    timeout: int = LIST_TIMEOUT,
) -> dict[tuple[str, int], int]:
    """The earliest offset Kafka still holds of each (topic, partition) of ``partitions``
    (what retention or a deletion has not removed yet). Raises :class:`KafkaUnreachable`
    if Kafka does not answer within ``timeout`` seconds."""
    wanted = sorted(set(partitions))
    if not wanted:
        return {}
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    admin = _admin(spark, options, timeout)
    try:
        request = jvm.java.util.HashMap()
        keys = {}
        for topic, partition in wanted:
            key = jvm.org.apache.kafka.common.TopicPartition(topic, partition)
            keys[(topic, partition)] = key
            request.put(key, jvm.org.apache.kafka.clients.admin.OffsetSpec.earliest())
        answer = admin.listOffsets(request).all()
        found = answer.get(timeout, jvm.java.util.concurrent.TimeUnit.SECONDS)
        return {tp: int(found.get(key).offset()) for tp, key in keys.items()}
    except Exception as exc:  # py4j wraps the Java TimeoutException/ExecutionException
        raise _unreachable(options, timeout, "list its earliest offsets", exc) from exc
    finally:
        admin.close()
