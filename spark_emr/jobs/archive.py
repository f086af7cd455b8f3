"""Kafka → Parquet archive of the broker's stream: Structured Streaming, ``availableNow``.

Each run reads what is new since the previous run (the checkpoint's offsets), writes it with
the file sink and stops: a re-run adds no rows, a run after more traffic adds exactly that
traffic (the file sink's exactly-once: readers see only files its ``_spark_metadata`` log
lists). Four tables, each its own query and checkpoint, partitioned by ``date`` and ``hour``
(UTC) of the event:

- ``messages`` ← ``msg.all``: every accepted PUBLISH (Will Messages included), payload kept;
- ``events`` ← ``client.events``: connects, disconnects, authentication failures,
  subscription changes, session expiries;
- ``deliveries`` ← ``msg.downlink.*``, ``msg.persisted``, ``msg.app.*``, ``msg.app-shared.*``:
  what the router routed and the stores sent, with their targets (no payload);
- ``acks`` ← ``client.acks``: one row per PUBACK / PUBREC / PUBCOMP of a stored delivery.

Layout: ``<archive>/<table>/date=…/hour=…/part-….parquet``, checkpoints beside them in
``<archive>/_checkpoints/<table>``. Records that do not decode are kept with ``record_error``
set (docs/analytics.md, "Archive schema"). Runs as ``spark-submit archive.py --archive URI …``
(EMR) or through :func:`run` (``cormorant analytics archive``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from services.common import records
from spark_emr import decode
from spark_emr.kafka_admin import LIST_TIMEOUT, earliest_offsets, existing_topics

Progress = Callable[[str], None]

CHECKPOINTS = "_checkpoints"

#: Exit status of the ``spark-submit`` entry point when records were lost before archiving.
LOSS_EXIT_STATUS = 3


@dataclass(frozen=True)
class ArchiveTopics:
    """The Kafka topics to archive, as resolved names (``TopicNames`` with the prefix).

    ``msg_all``, ``client_events`` and ``client_acks`` are topic names; ``downlink_prefix``
    and ``app_prefix``/``app_shared_prefix`` start the per-node and per-client topic names,
    ``msg_persisted`` is one topic: together they make the deliveries' subscription pattern.
    """

    msg_all: str
    client_events: str
    client_acks: str
    msg_persisted: str
    downlink_prefix: str
    app_prefix: str
    app_shared_prefix: str

    def deliveries_pattern(self) -> str:
        """A Java regular expression matching every topic of the ``deliveries`` table."""
        parts = [self.downlink_prefix, self.app_prefix, self.app_shared_prefix]
        quoted = "|".join(f"\\Q{p}\\E.+" for p in parts)
        return f"(\\Q{self.msg_persisted}\\E|{quoted})"


@dataclass
class TableResult:
    """What one run added to one table: ``rows``, the Kafka records it read (the table's
    rows but for the records a table leaves out, retained message and PUBREL requests, and
    ``acks``, one row per acknowledgement of a record), ``batches`` run, ``lost`` (Kafka
    records that retention removed before any run read them: see :class:`Gap`) and
    ``note`` (``"topic … does not exist"`` when there was nothing to read)."""

    table: str
    rows: int = 0
    batches: int = 0
    seconds: float = 0.0
    lost: int = 0
    note: str = ""


@dataclass(frozen=True)
class Gap:
    """Records of one Kafka partition that the archive will never hold: offsets
    [``from_offset``, ``to_offset``) were past where ``table``'s previous run stopped, and
    are no longer in Kafka (retention, or records deleted) when this run started."""

    table: str
    kafka_topic: str
    kafka_partition: int
    from_offset: int
    to_offset: int

    @property
    def records(self) -> int:
        """How many records were lost."""
        return self.to_offset - self.from_offset


#: The ``gaps`` table: one row per :class:`Gap`, with when the run found it.
GAPS_SCHEMA = StructType(
    [
        StructField("detected_at", TimestampType()),
        StructField("table", StringType()),
        StructField("kafka_topic", StringType()),
        StructField("kafka_partition", IntegerType()),
        StructField("from_offset", LongType()),
        StructField("to_offset", LongType()),
        StructField("records", LongType()),
    ]
)

GAPS = "gaps"


@dataclass(frozen=True)
class _Table:
    name: str
    subscription: dict[str, str]
    required_topic: str | None  # checked for existence first; None for a pattern
    transform: Callable[[DataFrame], DataFrame]
    extra: dict[str, str] = field(default_factory=dict)


def _header(key: str) -> Column:
    """The value of Kafka header ``key`` (its first occurrence), or null."""
    return F.expr(f"try_element_at(filter(headers, h -> h.key = '{key}'), 1).value")


def _has_header(key: str) -> Column:
    return F.expr(f"exists(headers, h -> h.key = '{key}')")


def _fields(struct: str, *names: str) -> list[Column]:
    """Fields ``names`` of struct column ``struct``, each as a column of the same name."""
    return [F.col(f"{struct}.{name}").alias(name) for name in names]


def _kafka_columns() -> list[Column]:
    return [
        F.col("topic").alias("kafka_topic"),
        F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"),
        F.col("timestamp").alias("kafka_timestamp"),
    ]


def _partitioned(df: DataFrame, when: Column) -> DataFrame:
    """``df`` with ``date`` and ``hour`` (UTC) of ``when``, the partition columns."""
    return df.withColumn("date", F.to_date(when)).withColumn("hour", F.hour(when))


def _error(*structs: Column) -> Column:
    """The first decoding error among ``structs``' ``error`` fields (null: all decoded)."""
    return F.coalesce(*[s["error"] for s in structs])


def messages(kafka: DataFrame) -> DataFrame:
    """``msg.all`` records → ``messages`` rows (retained message requests left out)."""
    df = kafka.where(~_has_header(records.HEADER_RETAINED_REQUEST)).withColumn(
        "m", decode.decode_meta(_header(records.HEADER_META))
    )
    received = F.coalesce(F.timestamp_millis(F.col("m.received_at_ms")), F.col("timestamp"))
    df = df.select(
        F.col("m.topic").alias("topic"),
        F.col("key").cast("string").alias("client_id"),
        *_fields(
            "m", "qos", "retain", "protocol_version", "message_expiry_interval", "properties_size"
        ),
        F.col("value").alias("payload"),
        F.length("value").alias("payload_size"),
        received.alias("received_at"),
        *_kafka_columns(),
        F.col("m.error").alias("record_error"),
    )
    return _partitioned(df, F.col("received_at"))


def events(kafka: DataFrame) -> DataFrame:
    """``client.events`` records → ``events`` rows."""
    df = kafka.withColumn("e", decode.decode_event(F.col("value")))
    at = F.coalesce(F.timestamp_millis(F.col("e.at_ms")), F.col("timestamp"))
    df = df.select(
        F.col("key").cast("string").alias("client_id"),
        F.col("e.kind").alias("kind"),
        at.alias("at"),
        *_fields(
            "e",
            "node_id",
            "client_address",
            "connection_id",
            "protocol_version",
            "reason_code",
            "cause",
            "persistent",
            "clean_start",
            "session_expiry_interval",
            "topic_filters",
            "filter_qos",
        ),
        *_kafka_columns(),
        F.col("e.error").alias("record_error"),
    )
    return _partitioned(df, F.col("at"))


def deliveries(topics: ArchiveTopics) -> Callable[[DataFrame], DataFrame]:
    """Routed and stored-delivery records → ``deliveries`` rows; ``stage`` is ``downlink``,
    ``persisted``, ``app`` or ``app-shared`` after the topic (PUBREL requests left out).
    A downlink record bundling a client's window of stored messages (header ``b``) gives
    one row per message, in order, each with its own ``m`` header, target and payload size;
    a garbage bundle gives one row with ``record_error``."""

    def transform(kafka: DataFrame) -> DataFrame:
        df = kafka.where(~_has_header(records.HEADER_RELEASES))
        df = df.withColumn(
            "b", decode.split_bundle(_header(records.HEADER_BUNDLE), F.col("value"))
        ).select("*", F.explode_outer("b.parts").alias("part"))
        # A bundled message's fields come from its part; any other record's from its headers.
        meta = F.coalesce(F.col("part.meta"), _header(records.HEADER_META))
        targets = F.coalesce(F.col("part.targets"), _header(records.HEADER_TARGETS))
        df = df.withColumn("m", decode.decode_meta(meta))
        df = df.withColumn("t", decode.decode_targets(targets))
        payload_size = F.coalesce(F.col("part.payload_size"), F.length("value"))
        kafka_topic = F.col("topic")
        stage = (
            F.when(kafka_topic == topics.msg_persisted, "persisted")
            .when(kafka_topic.startswith(topics.downlink_prefix), "downlink")
            .when(kafka_topic.startswith(topics.app_shared_prefix), "app-shared")
            .otherwise("app")
        )
        # msg.app-shared records carry no targets: their readers are chosen by Kafka.
        shared = kafka_topic.startswith(topics.app_shared_prefix)
        df = df.select(
            stage.alias("stage"),
            F.col("key").cast("string").alias("key"),
            *_fields("m", "topic", "qos"),
            F.timestamp_millis(F.col("m.received_at_ms")).alias("received_at"),
            F.col("timestamp").alias("routed_at"),
            F.col("m.message_expiry_interval").alias("message_expiry_interval"),
            payload_size.alias("payload_size"),
            F.col("t.client_ids").alias("target_client_ids"),
            F.col("t.qos").alias("target_qos"),
            F.col("t.packet_ids").alias("target_packet_ids"),
            F.col("t.dup").alias("target_dup"),
            *_kafka_columns(),
            F.coalesce(
                F.col("b.error"),
                F.when(shared, F.col("m.error")).otherwise(_error(F.col("m"), F.col("t"))),
            ).alias("record_error"),
        )
        return _partitioned(df, F.col("routed_at"))

    return transform


def acks(kafka: DataFrame) -> DataFrame:
    """``client.acks`` records → one ``acks`` row per acknowledgement (a garbage record: one
    row with ``record_error``)."""
    df = kafka.withColumn("a", decode.decode_acks(F.col("value")))
    pairs = F.arrays_zip(F.col("a.kinds").alias("kind"), F.col("a.packet_ids").alias("packet_id"))
    df = df.select(
        F.col("key").cast("string").alias("client_id"),
        F.col("a.session_id").alias("session_id"),
        F.explode_outer(pairs).alias("ack"),
        F.col("timestamp").alias("acked_at"),
        *_kafka_columns(),
        F.col("a.error").alias("record_error"),
    ).select(
        "client_id",
        "session_id",
        F.col("ack.kind").alias("kind"),
        F.col("ack.packet_id").alias("packet_id"),
        "acked_at",
        "kafka_topic",
        "kafka_partition",
        "kafka_offset",
        "kafka_timestamp",
        "record_error",
    )
    return _partitioned(df, F.col("acked_at"))


def tables(topics: ArchiveTopics) -> list[_Table]:
    """The archive's tables and where each comes from."""
    return [
        _Table("messages", {"subscribe": topics.msg_all}, topics.msg_all, messages),
        _Table("events", {"subscribe": topics.client_events}, topics.client_events, events),
        _Table(
            "deliveries",
            {"subscribePattern": topics.deliveries_pattern()},
            None,
            deliveries(topics),
        ),
        _Table("acks", {"subscribe": topics.client_acks}, topics.client_acks, acks),
    ]


TABLES = ("messages", "events", "deliveries", "acks")


def _join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *parts])


def _filesystem(spark: SparkSession, uri: str) -> tuple[Any, Any]:
    """(Hadoop ``FileSystem``, ``Path``) of ``uri`` (a path, ``s3://…``)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    path = jvm.org.apache.hadoop.fs.Path(uri)
    return path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()), path


def committed_offsets(spark: SparkSession, checkpoint: str) -> dict[tuple[str, int], int]:
    """Where the query of ``checkpoint`` resumes: the Kafka end offsets of its last
    committed micro-batch (Structured Streaming's ``offsets/<batch>`` log, whose third line
    is the Kafka source's ``{"topic": {"partition": offset}}``), by (topic, partition);
    empty for a query that never committed a batch."""
    fs, commits = _filesystem(spark, _join(checkpoint, "commits"))
    if not fs.exists(commits):
        return {}
    batches = [int(str(s.getPath().getName())) for s in fs.listStatus(commits)]
    batches = [b for b in batches if b >= 0]
    if not batches:
        return {}
    fs, path = _filesystem(spark, _join(checkpoint, "offsets", str(max(batches))))
    stream = fs.open(path)
    try:
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        text = str(jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
    finally:
        stream.close()
    source = json.loads(text.splitlines()[2])
    return {
        (topic, int(partition)): int(offset)
        for topic, partitions in source.items()
        for partition, offset in partitions.items()
    }


def find_gaps(
    spark: SparkSession,
    table: str,
    checkpoint: str,
    kafka_options: dict[str, str],
    present: set[str],
    list_timeout: int = LIST_TIMEOUT,
) -> list[Gap]:
    """The records ``table``'s next run cannot read any more: for each partition its
    checkpoint resumes from, Kafka's earliest offset past the resume offset. Partitions of
    topics that no longer exist (a deleted ``msg.app.*`` topic) are left out."""
    resume = {tp: o for tp, o in committed_offsets(spark, checkpoint).items() if tp[0] in present}
    earliest = earliest_offsets(spark, kafka_options, resume, list_timeout)
    return [
        Gap(table, topic, partition, resume[(topic, partition)], first)
        for (topic, partition), first in sorted(earliest.items())
        if first > resume[(topic, partition)]
    ]


def _record_gaps(spark: SparkSession, archive: str, gaps: list[Gap]) -> None:
    """Append ``gaps`` to the archive's ``gaps`` table (Parquet, ``<archive>/gaps``)."""
    now = datetime.now(UTC).replace(tzinfo=None)
    rows = [
        (now, g.table, g.kafka_topic, g.kafka_partition, g.from_offset, g.to_offset, g.records)
        for g in gaps
    ]
    spark.createDataFrame(rows, GAPS_SCHEMA).write.mode("append").parquet(_join(archive, GAPS))


def read_gaps(spark: SparkSession, archive: str) -> DataFrame | None:
    """The archive's ``gaps`` table, or None if no run ever found a gap."""
    fs, path = _filesystem(spark, _join(archive, GAPS))
    if not fs.exists(path):
        return None
    return spark.read.schema(GAPS_SCHEMA).parquet(_join(archive, GAPS))


def local_catalog(spark: SparkSession, warehouse: str, name: str = "archive") -> str:
    """Register an Iceberg Hadoop catalog over ``warehouse`` (a path or URI: its tables are
    ``<warehouse>/<namespace>/<table>``) in ``spark`` and return its name: ``name``, or
    ``name_<digest>`` when ``name`` already serves another warehouse in this session."""
    key = f"spark.sql.catalog.{name}"
    current = spark.conf.get(f"{key}.warehouse", None)
    if current is not None and current != warehouse:
        name = f"{name}_{hashlib.sha256(warehouse.encode()).hexdigest()[:8]}"
        key = f"spark.sql.catalog.{name}"
    spark.conf.set(key, "org.apache.iceberg.spark.SparkCatalog")
    spark.conf.set(f"{key}.type", "hadoop")
    spark.conf.set(f"{key}.warehouse", warehouse)
    return name


def _ensure_iceberg_table(spark: SparkSession, identifier: str, schema: StructType) -> None:
    """Create Iceberg table ``identifier`` (``catalog.namespace.table``) with ``schema``,
    partitioned by ``date`` and ``hour``, unless it exists (its namespace too)."""
    namespace = identifier.rsplit(".", 1)[0]
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {namespace}")
    if spark.catalog.tableExists(identifier):
        return
    (
        spark.createDataFrame([], schema)
        .writeTo(identifier)
        .using("iceberg")
        .partitionedBy(F.col("date"), F.col("hour"))
        .tableProperty("format-version", "2")
        .create()
    )


def _start(
    spark: SparkSession,
    table: _Table,
    archive: str,
    kafka_options: dict[str, str],
    max_records_per_batch: int | None,
    iceberg: str | None,
) -> StreamingQuery:
    reader = (
        spark.readStream.format("kafka")
        .options(**kafka_options)
        .options(**table.subscription)
        .option("startingOffsets", "earliest")
        .option("includeHeaders", "true")
        # The router writes in Kafka transactions: what an aborted one holds was never
        # delivered, and is routed again.
        .option("kafka.isolation.level", "read_committed")
        # Records that retention removed before this run were found and recorded as gaps
        # (find_gaps) before it started; deleted msg.app.* topics must not stop the run.
        .option("failOnDataLoss", "false")
    )
    if max_records_per_batch:
        reader = reader.option("maxOffsetsPerTrigger", str(max_records_per_batch))
    frame = table.transform(reader.load())
    writer = (
        frame.writeStream.queryName(f"archive-{table.name}")
        .option("checkpointLocation", _join(archive, CHECKPOINTS, table.name))
        .outputMode("append")
        .trigger(availableNow=True)
    )
    if iceberg is None:
        return (
            writer.format("parquet")
            .option("path", _join(archive, table.name))
            .partitionBy("date", "hour")
            .start()
        )
    identifier = f"{iceberg}.{table.name}"
    _ensure_iceberg_table(spark, identifier, frame.schema)
    # Each micro-batch is one Iceberg commit that records the query id and batch id, so a
    # batch replayed after a failure is not appended twice. Fanout: a batch's rows are not
    # sorted by partition.
    return writer.format("iceberg").option("fanout-enabled", "true").toTable(identifier)


def _watch(
    queries: dict[str, StreamingQuery], results: dict[str, TableResult], progress: Progress
) -> None:
    """Wait for every query to end, reporting each micro-batch as it completes."""
    seen: dict[str, int] = dict.fromkeys(queries, -1)
    started = time.monotonic()
    while True:
        for name, query in queries.items():
            for update in query.recentProgress:
                batch = int(update["batchId"])
                if batch <= seen[name]:
                    continue
                seen[name] = batch
                rows = int(update["numInputRows"])
                results[name].rows += rows
                results[name].batches += 1
                rate = update.get("processedRowsPerSecond") or 0.0
                progress(f"{name:<10} batch {batch}: {rows:,} records ({rate:,.0f} records/s)")
        if not any(q.isActive for q in queries.values()):
            break
        time.sleep(0.5)  # polling pace of the progress display, not a synchronisation
    for name, query in queries.items():
        query.awaitTermination()  # raises StreamingQueryException if the query failed
        results[name].seconds = time.monotonic() - started


def run(
    spark: SparkSession,
    archive: str,
    topics: ArchiveTopics,
    kafka_options: dict[str, str],
    *,
    only: tuple[str, ...] = TABLES,
    max_records_per_batch: int | None = None,
    list_timeout: int = LIST_TIMEOUT,
    progress: Progress = print,
    iceberg: str | None = None,
) -> dict[str, TableResult]:
    """Archive what is new in Kafka into ``archive`` (a path or URI: ``/dir``, ``s3://…``):
    Parquet tables under it, or with ``iceberg`` (``catalog.namespace``) the Iceberg tables
    ``<iceberg>.<table>``, checkpoints and the ``gaps`` table under ``archive`` either way.

    ``kafka_options`` come from :func:`spark_emr.kafka_options.kafka_options`; ``only``
    limits the tables; ``max_records_per_batch`` bounds each micro-batch
    (``maxOffsetsPerTrigger``); ``list_timeout`` (seconds) bounds the first request, which
    lists Kafka's topics. Returns each table's :class:`TableResult`. A topic that does
    not exist gives a result with a note, not an error. Records that retention removed
    before any run read them are counted in ``lost``, reported through ``progress`` and
    appended to the ``gaps`` table (:func:`find_gaps`) before the run reads on; raises
    :class:`~spark_emr.kafka_admin.KafkaUnreachable` if Kafka does not answer and
    ``pyspark.errors.StreamingQueryException`` if a query fails.
    """
    present = existing_topics(spark, kafka_options, list_timeout)
    results = {name: TableResult(name) for name in only}
    queries: dict[str, StreamingQuery] = {}
    for table in tables(topics):
        if table.name not in only:
            continue
        if table.required_topic is not None and table.required_topic not in present:
            results[table.name].note = f"topic {table.required_topic} does not exist"
            progress(f"{table.name:<10} skipped: topic {table.required_topic} does not exist")
            continue
        checkpoint = _join(archive, CHECKPOINTS, table.name)
        gaps = find_gaps(spark, table.name, checkpoint, kafka_options, present, list_timeout)
        if gaps:
            _record_gaps(spark, archive, gaps)
            results[table.name].lost = sum(g.records for g in gaps)
            for gap in gaps:
                progress(
                    f"{table.name:<10} LOST {gap.records:,} records of {gap.kafka_topic} "
                    f"partition {gap.kafka_partition} (offsets {gap.from_offset}-"
                    f"{gap.to_offset - 1}): gone from Kafka before they were archived"
                )
        queries[table.name] = _start(
            spark, table, archive, kafka_options, max_records_per_batch, iceberg
        )
    try:
        _watch(queries, results, progress)
    finally:
        for query in queries.values():
            if query.isActive:
                query.stop()
    for result in results.values():
        if result.lost:
            result.note = f"{result.lost:,} records lost before archiving (gaps table)"
        elif not result.note and result.rows == 0:
            result.note = "no new records"
    return results


#: The Kafka source's columns (Structured Streaming + Kafka Integration Guide), headers on.
KAFKA_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
        StructField(
            "headers",
            ArrayType(
                StructType([StructField("key", StringType()), StructField("value", BinaryType())])
            ),
        ),
    ]
)


def table_schema(spark: SparkSession, table: str) -> StructType:
    """The columns of archive ``table``: its transform applied to no Kafka records."""
    empty = spark.createDataFrame([], KAFKA_SCHEMA)
    sample = ArchiveTopics("a", "b", "c", "d", "e.", "f.", "g.")
    return next(t for t in tables(sample) if t.name == table).transform(empty).schema


def read_table(
    spark: SparkSession, archive: str, table: str, iceberg: str | None = None
) -> DataFrame | None:
    """The archived ``table`` as the file sink committed it (through ``_spark_metadata``),
    or with ``iceberg`` the Iceberg table ``<iceberg>.<table>``; None if no run has written
    it yet (an archived table without rows is an empty frame)."""
    if iceberg is not None:
        identifier = f"{iceberg}.{table}"
        return spark.table(identifier) if spark.catalog.tableExists(identifier) else None
    path = _join(archive, table)
    fs, metadata = _filesystem(spark, _join(path, "_spark_metadata"))
    if not fs.exists(metadata):
        return None
    return spark.read.schema(table_schema(spark, table)).parquet(path)


@dataclass
class Maintenance:
    """What :func:`maintain` did to one Iceberg table: rows ``deleted`` (partitions before
    the retention), data files ``rewritten`` into ``added`` ones, data files removed with
    the expired snapshots (``deleted_files``), and the ``snapshots`` left."""

    table: str
    deleted: int = 0
    rewritten: int = 0
    added: int = 0
    deleted_files: int = 0
    snapshots: int = 0


def maintain(
    spark: SparkSession,
    iceberg: str,
    *,
    delete_before: date | None = None,
    expire_before: datetime,
    progress: Progress = print,
) -> dict[str, Maintenance]:
    """Maintain the Iceberg tables ``<iceberg>.<table>`` (``iceberg`` is
    ``catalog.namespace``): delete the partitions dated before ``delete_before`` (retention,
    a metadata-only delete: whole partitions), compact the streaming runs' small files
    (``rewrite_data_files``), then expire the snapshots older than ``expire_before`` (naive
    UTC; the current one is always kept), which deletes the files no kept snapshot lists.
    Readers never see a file vanish under them: a snapshot's files go only with it."""
    catalog, namespace = iceberg.split(".", 1)
    done: dict[str, Maintenance] = {}
    for name in TABLES:
        identifier = f"{iceberg}.{name}"
        if not spark.catalog.tableExists(identifier):
            continue
        result = done[name] = Maintenance(name)
        if delete_before is not None:
            before = spark.table(identifier).where(F.col("date") < F.lit(delete_before)).count()
            spark.sql(f"DELETE FROM {identifier} WHERE date < DATE '{delete_before.isoformat()}'")
            result.deleted = before
        rewrite = spark.sql(
            # A partition's streaming runs leave a few small files each: two are enough
            # to compact (Iceberg's default waits for five).
            f"CALL {catalog}.system.rewrite_data_files(table => '{namespace}.{name}', "
            "options => map('min-input-files', '2'))"
        ).first()
        if rewrite is not None:
            result.rewritten = int(rewrite["rewritten_data_files_count"])
            result.added = int(rewrite["added_data_files_count"])
        expire = spark.sql(
            f"CALL {catalog}.system.expire_snapshots(table => '{namespace}.{name}', "
            f"older_than => TIMESTAMP '{expire_before.isoformat(sep=' ')}', retain_last => 1)"
        ).first()
        if expire is not None:
            result.deleted_files = int(expire["deleted_data_files_count"])
        snapshots = spark.sql(f"SELECT count(*) FROM {identifier}.snapshots").first()
        result.snapshots = 0 if snapshots is None else int(snapshots[0])
        progress(
            f"{name:<10} {result.deleted:,} rows deleted, {result.rewritten} files rewritten "
            f"into {result.added}, {result.deleted_files} data files removed"
        )
    return done


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="archive.py", description=__doc__.splitlines()[0])
    parser.add_argument("--archive", required=True, help="archive URI (s3://bucket/archive)")
    parser.add_argument("--topics", required=True, help="ArchiveTopics as JSON")
    parser.add_argument("--kafka-options", required=True, help="Kafka source options as JSON")
    parser.add_argument(
        "--kafka-secret-arn",
        help="Secrets Manager secret holding SCRAM "
        "credentials as JSON {username, password} (MSK's format)",
    )
    parser.add_argument("--max-records-per-batch", type=int)
    parser.add_argument(
        "--iceberg", help="catalog.namespace of the Iceberg tables (default: Parquet tables)"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """``spark-submit`` entry point: archive, print each table's result as JSON lines;
    exit status 3 (the job run FAILED) when records were lost before archiving."""
    from spark_emr.secrets import with_scram_secret

    args = _parse(sys.argv[1:] if argv is None else argv)
    spark = SparkSession.builder.appName("cormorant-archive").getOrCreate()
    options = with_scram_secret(json.loads(args.kafka_options), args.kafka_secret_arn)
    results = run(
        spark,
        args.archive,
        ArchiveTopics(**json.loads(args.topics)),
        options,
        max_records_per_batch=args.max_records_per_batch,
        iceberg=args.iceberg,
    )
    for result in results.values():
        print(json.dumps(result.__dict__))
    spark.stop()
    return LOSS_EXIT_STATUS if any(r.lost for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
