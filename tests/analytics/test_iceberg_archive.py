"""The archive as Iceberg tables (a local Hadoop catalog, the Glue Data Catalog on EMR):
written exactly once from the Kafka offsets, read by a plain Spark SQL query, reported on,
and maintained (retention by deleting old partitions, compaction, snapshot expiry) without
a file going missing under a reader."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from services.common.kafka.admin import TopicSpec, ensure_topics
from spark_emr.jobs import archive, report
from spark_emr.kafka_options import kafka_options
from tests.analytics.test_archive_gaps import _produce
from tests.e2e.clients import unique

pytestmark = [pytest.mark.kafka]


def test_iceberg_tables_written_once_queried_with_sql_and_maintained(
    kafka_bootstrap: str, spark: SparkSession, tmp_path: Path
) -> None:
    topic = unique("iceberg-events")
    asyncio.run(ensure_topics(kafka_bootstrap, [TopicSpec(topic, 2)]))
    topics = archive.ArchiveTopics(topic, topic, topic, topic, "x.", "y.", "z.")
    where = str(tmp_path / "archive")
    catalog = archive.local_catalog(spark, where)
    namespace = f"{catalog}.cormorant"
    table = f"{namespace}.events"

    def run() -> archive.TableResult:
        return archive.run(
            spark,
            where,
            topics,
            kafka_options(kafka_bootstrap),
            only=("events",),
            progress=lambda _: None,
            iceberg=namespace,
        )["events"]

    def count() -> int:
        row = spark.sql(f"SELECT count(*) FROM {table}").first()
        assert row is not None
        return int(row[0])

    asyncio.run(_produce(kafka_bootstrap, topic, 6))
    assert run().rows == 6
    assert count() == 6
    assert run().rows == 0 and count() == 6  # a re-run adds nothing
    asyncio.run(_produce(kafka_bootstrap, topic, 4))
    assert run().rows == 4
    keys = spark.sql(f"SELECT DISTINCT kafka_partition, kafka_offset FROM {table}").count()
    assert keys == count() == 10  # no record twice
    spec = spark.sql(f"SELECT partition FROM {table}.partitions").schema["partition"]
    assert [f.name for f in spec.dataType.fields] == ["date", "hour"]  # type: ignore[attr-defined]

    summary = report.run(
        spark, where, str(tmp_path / "report"), report.ReportOptions(), lambda _: None, namespace
    )
    assert summary.clients_seen == 1  # every record has the key "gap"
    assert summary.notes[0].startswith("no messages archived")

    # Compaction and expiry: the same rows, one current snapshot, the replaced files gone.
    files = spark.sql(f"SELECT count(*) FROM {table}.files").first()
    assert files is not None and int(files[0]) >= 2
    now = datetime.now(UTC).replace(tzinfo=None)
    done = archive.maintain(
        spark, namespace, expire_before=now + timedelta(seconds=1), progress=lambda _: None
    )
    assert done["events"].rewritten == int(files[0]) and done["events"].added == 1
    assert done["events"].snapshots == 1 and done["events"].deleted_files == int(files[0])
    assert count() == 10
    data = Path(where, "cormorant", "events", "data")
    assert len(list(data.rglob("*.parquet"))) == 1
    # Retention: partitions before the cutoff go, and their files with the expired snapshot.
    tomorrow = (now + timedelta(days=1)).date()
    done = archive.maintain(
        spark,
        namespace,
        delete_before=tomorrow,
        expire_before=datetime.now(UTC).replace(tzinfo=None) + timedelta(seconds=1),
        progress=lambda _: None,
    )
    assert done["events"].deleted == 10 and count() == 0
    assert not list(data.rglob("*.parquet"))
