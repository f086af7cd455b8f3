"""Records that retention removes before the archive read them are found, counted, recorded
in the ``gaps`` table and shown by the report, never skipped in silence (the Kafka source's
``failOnDataLoss=false`` alone would hide them). Records are removed with Kafka's
DeleteRecords, as retention removes a log's oldest segments."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
from aiokafka.structs import TopicPartition
from pyspark.sql import SparkSession

from services.common.kafka.admin import TopicSpec, ensure_topics
from spark_emr.jobs import archive, report
from spark_emr.kafka_options import kafka_options
from tests.e2e.clients import unique

pytestmark = [pytest.mark.kafka]


async def _produce(bootstrap: str, topic: str, count: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for i in range(count):
            await producer.send_and_wait(topic, f"not an event {i}".encode(), key=b"gap")
    finally:
        await producer.stop()


async def _delete_before(bootstrap: str, topic: str, offset: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_records({TopicPartition(topic, 0): RecordsToDelete(offset)})
    finally:
        await admin.close()


def test_records_gone_before_a_run_are_reported_and_recorded(
    kafka_bootstrap: str, spark: SparkSession, tmp_path: Path
) -> None:
    topic = unique("gaps-events")
    asyncio.run(ensure_topics(kafka_bootstrap, [TopicSpec(topic, 1)]))
    topics = archive.ArchiveTopics(topic, topic, topic, topic, "x.", "y.", "z.")
    options = kafka_options(kafka_bootstrap)
    where = str(tmp_path / "archive")

    def run(lines: list[str]) -> archive.TableResult:
        results = archive.run(
            spark, where, topics, options, only=("events",), progress=lines.append
        )
        return results["events"]

    asyncio.run(_produce(kafka_bootstrap, topic, 5))
    first = run([])
    assert (first.rows, first.lost) == (5, 0)
    # Offsets 5..9 arrive, 5..7 are gone before the next run: 3 lost, 2 archived.
    asyncio.run(_produce(kafka_bootstrap, topic, 5))
    asyncio.run(_delete_before(kafka_bootstrap, topic, 8))
    lines: list[str] = []
    second = run(lines)
    assert (second.rows, second.lost) == (2, 3)
    assert second.note == "3 records lost before archiving (gaps table)"
    assert any(f"LOST 3 records of {topic} partition 0 (offsets 5-7)" in line for line in lines)
    gaps = archive.read_gaps(spark, where)
    assert gaps is not None
    assert [tuple(r) for r in gaps.drop("detected_at").collect()] == [("events", topic, 0, 5, 8, 3)]
    # A later run finds no new gap; the report carries the recorded one.
    assert run([]).lost == 0
    summary = report.run(
        spark, where, str(tmp_path / "report"), report.ReportOptions(), progress=lambda _: None
    )
    assert summary.lost_records == 3
    assert summary.tables["gaps"] == 1
    assert any("3 Kafka records were lost before archiving" in n for n in summary.notes)
