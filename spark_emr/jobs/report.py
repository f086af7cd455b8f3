"""Traffic, fleet and delivery tables over the archive (:mod:`spark_emr.jobs.archive`).

For a time range [``since``, ``until``) (UTC; open ends allowed) the job writes each table
as Parquet (``<out>/tables/<name>/``) and as one CSV file (``<out>/csv/<name>.csv``), plus
``<out>/summary.json``; :mod:`spark_emr.render` turns them into ``index.html``. Tables
(docs/analytics.md lists their columns):

- traffic: ``traffic_by_topic_level`` (messages and bytes at every topic level ``a``,
  ``a/b``, ``a/b/c``), ``traffic_by_client`` (top talkers first), ``traffic_by_hour``,
  ``qos_mix``, ``retained_share``, ``payload_sizes`` (power-of-two buckets);
- fleet: ``sessions`` (one row per connection), ``clients_connected_by_hour``,
  ``session_durations``, ``disconnect_reasons``, ``reconnects_by_minute`` (storms flagged),
  ``protocol_versions``, ``auth_failures`` (by client address), ``silent_clients``;
- delivery: ``latency`` (per stage: received → routed, → sent from a store, →
  acknowledged by the subscriber; percentiles), ``latency_histogram``, ``stored_backlog``,
  ``expired``;
- ``gaps``: Kafka records that retention removed before the archive read them (every gap
  the archive recorded; none: no table).

Runs as ``spark-submit report.py --archive URI --out URI [--since T] [--until T]`` (EMR)
or through :func:`run` (``cormorant analytics report``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from services.common.mqtt.reason_codes import ReasonCode
from spark_emr.jobs.archive import read_gaps, read_table

Progress = Callable[[str], None]

#: Rows of a per-client table kept in its CSV (the Parquet table has them all).
CSV_ROW_LIMIT = 1000

#: Seconds after a disconnect within which a connect of the same client is a reconnect.
RECONNECT_WINDOW_SECONDS = 60

_DURATION_BUCKETS = [
    (0, "< 1 s"),
    (1, "1-10 s"),
    (10, "10 s-1 min"),
    (60, "1-10 min"),
    (600, "10 min-1 h"),
    (3600, "1 h-1 day"),
    (86400, "≥ 1 day"),
]


@dataclass
class ReportOptions:
    """What to report on: [``since``, ``until``) in UTC (None: open), clients silent for
    ``silent_hours`` or more, ``storm_reconnects`` reconnects in a minute make a storm."""

    since: datetime | None = None
    until: datetime | None = None
    silent_hours: float = 24.0
    storm_reconnects: int = 10


@dataclass
class ReportSummary:
    """Totals of one report, written as ``summary.json``."""

    since: str | None
    until: str | None
    generated_at: str
    messages: int = 0
    bytes: int = 0
    publishers: int = 0
    topics: int = 0
    undecodable_records: int = 0
    connects: int = 0
    disconnects: int = 0
    auth_failures: int = 0
    clients_seen: int = 0
    lost_records: int = 0
    tables: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _in_range(column: Column, options: ReportOptions) -> Column:
    condition = F.lit(True)
    if options.since is not None:
        condition &= column >= F.lit(options.since)
    if options.until is not None:
        condition &= column < F.lit(options.until)
    return condition


def _partitions(options: ReportOptions, *, since: bool = True) -> Column:
    """A condition on the archive's partition columns alone (``date``, ``hour``: UTC, of the
    table's own time column) that keeps every partition of [``since``, ``until``) — ``since``
    ignored when ``since`` is False — so that Spark lists and opens only those directories
    (its ``PartitionFilters``) instead of the whole archive."""
    condition = F.lit(True)
    date, hour = F.col("date"), F.col("hour")
    if since and options.since is not None:
        day, at = F.lit(options.since.date()), F.lit(options.since.hour)
        condition &= (date > day) | ((date == day) & (hour >= at))
    if options.until is not None:
        day, at = F.lit(options.until.date()), F.lit(options.until.hour)
        condition &= (date < day) | ((date == day) & (hour <= at))
    return condition


def in_range(table: DataFrame, column: str, options: ReportOptions) -> DataFrame:
    """The rows of archive ``table`` whose ``column`` (the time its partitions are of) lies
    in the range, read from the range's partitions only."""
    return table.where(_partitions(options)).where(_in_range(F.col(column), options))


def _until(options: ReportOptions) -> Column:
    return F.lit(options.until) if options.until is not None else F.current_timestamp()


def _reason_names() -> Column:
    """A map Reason Code → name, from the shared package's ReasonCode (MQTT 5.0 2.4)."""
    pairs: list[Column] = []
    for code in ReasonCode:
        pairs += [F.lit(int(code)), F.lit(code.name)]
    return F.create_map(*pairs)


def _millis(later: Column, earlier: Column) -> Column:
    return (F.unix_micros(later) - F.unix_micros(earlier)) / 1000.0


# --------------------------------------------------------------------------------------------
# traffic


def traffic_tables(messages: DataFrame) -> dict[str, DataFrame]:
    """Traffic tables of decoded messages (``messages`` already limited to the range)."""
    levels = F.expr(
        "transform(sequence(1, size(split(topic, '/'))), "
        "i -> array_join(slice(split(topic, '/'), 1, i), '/'))"
    )
    by_level = (
        messages.select(F.posexplode(levels).alias("pos", "topic_prefix"), "payload_size")
        .groupBy((F.col("pos") + 1).alias("level"), "topic_prefix")
        .agg(F.count("*").alias("messages"), F.sum("payload_size").alias("bytes"))
        .orderBy("level", F.desc("messages"), "topic_prefix")
    )
    size_bucket = F.when(F.col("payload_size") == 0, F.lit(0)).otherwise(
        F.pow(F.lit(2), F.floor(F.log2(F.col("payload_size")))).cast("long")
    )
    return {
        "traffic_by_topic_level": by_level,
        "traffic_by_client": messages.groupBy("client_id")
        .agg(
            F.count("*").alias("messages"),
            F.sum("payload_size").alias("bytes"),
            F.countDistinct("topic").alias("topics"),
            F.min("received_at").alias("first_at"),
            F.max("received_at").alias("last_at"),
        )
        .orderBy(F.desc("messages"), "client_id"),
        "traffic_by_hour": messages.groupBy(F.date_trunc("hour", "received_at").alias("hour"))
        .agg(F.count("*").alias("messages"), F.sum("payload_size").alias("bytes"))
        .orderBy("hour"),
        "qos_mix": messages.groupBy("qos")
        .agg(F.count("*").alias("messages"), F.sum("payload_size").alias("bytes"))
        .orderBy("qos"),
        "retained_share": messages.groupBy("retain")
        .agg(F.count("*").alias("messages"), F.sum("payload_size").alias("bytes"))
        .orderBy("retain"),
        "payload_sizes": messages.groupBy(size_bucket.alias("size_from_bytes"))
        .agg(F.count("*").alias("messages"))
        .orderBy("size_from_bytes"),
    }


# --------------------------------------------------------------------------------------------
# fleet


def sessions_table(events: DataFrame, options: ReportOptions) -> DataFrame:
    """One row per connection: CONNECTED paired with the DISCONNECTED of the same
    connection id (none yet: ``disconnected_at`` null, duration up to ``until``), keeping
    connections that overlap the range."""
    connects = events.where(F.col("kind") == "CONNECTED").select(
        "client_id",
        "connection_id",
        F.col("at").alias("connected_at"),
        "node_id",
        "client_address",
        "protocol_version",
        "persistent",
    )
    disconnects = events.where(F.col("kind") == "DISCONNECTED").select(
        "client_id", "connection_id", F.col("at").alias("disconnected_at"), "cause", "reason_code"
    )
    joined = connects.join(disconnects, ["client_id", "connection_id"], "left")
    end = F.coalesce(F.col("disconnected_at"), _until(options))
    joined = joined.withColumn("duration_seconds", _millis(end, F.col("connected_at")) / 1000.0)
    overlap = F.lit(True)
    if options.since is not None:
        overlap &= end >= F.lit(options.since)
    if options.until is not None:
        overlap &= F.col("connected_at") < F.lit(options.until)
    return joined.where(overlap).orderBy("connected_at")


def fleet_tables(
    events_all: DataFrame, messages_all: DataFrame | None, options: ReportOptions
) -> dict[str, DataFrame]:
    """Fleet tables; ``events_all`` and ``messages_all`` are not limited to the range
    (sessions and last-seen times need what came before it)."""
    events_all = events_all.where(F.col("record_error").isNull())
    if options.until is not None:
        events_all = events_all.where(F.col("at") < F.lit(options.until))
    events = in_range(events_all, "at", options)
    sessions = sessions_table(events_all, options)
    hours = F.expr(
        "sequence(date_trunc('hour', connected_at), "
        "date_trunc('hour', duration_end), interval 1 hour)"
    )
    connected = (
        sessions.withColumn("duration_end", F.coalesce(F.col("disconnected_at"), _until(options)))
        .select("client_id", F.explode(hours).alias("hour"))
        .where(
            _in_range(
                F.col("hour"),
                ReportOptions(
                    since=None
                    if options.since is None
                    else options.since.replace(minute=0, second=0, microsecond=0),
                    until=options.until,
                ),
            )
        )
        .groupBy("hour")
        .agg(F.countDistinct("client_id").alias("clients"))
        .orderBy("hour")
    )
    bucket = F.lit(_DURATION_BUCKETS[0][1])
    for lower, label in _DURATION_BUCKETS[1:]:
        bucket = F.when(F.col("duration_seconds") >= lower, F.lit(label)).otherwise(bucket)
    order = F.create_map(
        *[x for i, (_, label) in enumerate(_DURATION_BUCKETS) for x in (F.lit(label), F.lit(i))]
    )
    durations = (
        sessions.where(F.col("disconnected_at").isNotNull())
        .groupBy(bucket.alias("duration"))
        .agg(F.count("*").alias("sessions"))
        .withColumn("order", order[F.col("duration")])
        .orderBy("order")
        .drop("order")
    )
    disconnects = events.where(F.col("kind") == "DISCONNECTED")
    reasons = (
        disconnects.groupBy("cause", "reason_code")
        .agg(F.count("*").alias("disconnects"))
        .withColumn(
            "reason",
            # 0x00 in a DISCONNECT is "Normal disconnection" (MQTT 5.0 3.14.2.1); a lost
            # connection has no Reason Code at all.
            F.when(F.col("cause") == "CONNECTION_LOST", F.lit(None))
            .when(F.col("reason_code") == 0, F.lit("NORMAL_DISCONNECTION"))
            .otherwise(_reason_names()[F.col("reason_code")]),
        )
        .select("cause", "reason_code", "reason", "disconnects")
        .orderBy(F.desc("disconnects"), "cause", "reason_code")
    )
    ordered = Window.partitionBy("client_id").orderBy("at", "kafka_offset")
    previous = (
        events_all.where(F.col("kind").isin("CONNECTED", "DISCONNECTED"))
        .withColumn("previous_kind", F.lag("kind").over(ordered))
        .withColumn("previous_at", F.lag("at").over(ordered))
        .where(F.col("kind") == "CONNECTED")
        .where(_in_range(F.col("at"), options))
    )
    # A client's first connect has no previous event: not a reconnect (false, not null, or a
    # minute of first connects only would count null reconnects, as Athena's count_if does not).
    is_reconnect = F.coalesce(
        (F.col("previous_kind") == "DISCONNECTED")
        & (_millis(F.col("at"), F.col("previous_at")) <= RECONNECT_WINDOW_SECONDS * 1000),
        F.lit(False),
    )
    reconnects = (
        previous.groupBy(F.date_trunc("minute", "at").alias("minute"))
        .agg(
            F.count("*").alias("connects"),
            F.sum(is_reconnect.cast("int")).alias("reconnects"),
        )
        .withColumn("storm", F.col("reconnects") >= options.storm_reconnects)
        .orderBy("minute")
    )
    connects = events.where(F.col("kind") == "CONNECTED")
    versions = (
        connects.groupBy("protocol_version")
        .agg(F.countDistinct("client_id").alias("clients"), F.count("*").alias("connects"))
        .orderBy("protocol_version")
    )
    host = F.regexp_extract("client_address", r"^\[?(.*?)\]?(:\d+)?$", 1)
    auth = (
        events.where(F.col("kind") == "AUTH_FAILED")
        .groupBy(host.alias("client_host"))
        .agg(
            F.count("*").alias("failures"),
            F.countDistinct("client_id").alias("client_ids"),
            F.min("at").alias("first_at"),
            F.max("at").alias("last_at"),
        )
        .orderBy(F.desc("failures"), "client_host")
    )
    seen = events_all.select("client_id", F.col("at").alias("seen_at"))
    if messages_all is not None:
        published = messages_all.where(F.col("record_error").isNull())
        if options.until is not None:
            published = published.where(F.col("received_at") < F.lit(options.until))
        seen = seen.unionByName(
            published.select("client_id", F.col("received_at").alias("seen_at"))
        )
    silent = (
        seen.groupBy("client_id")
        .agg(F.max("seen_at").alias("last_seen"))
        .withColumn("silent_hours", _millis(_until(options), F.col("last_seen")) / 3_600_000.0)
        .where(F.col("silent_hours") >= options.silent_hours)
        .orderBy(F.desc("silent_hours"), "client_id")
    )
    return {
        "sessions": sessions,
        "clients_connected_by_hour": connected,
        "session_durations": durations,
        "disconnect_reasons": reasons,
        "reconnects_by_minute": reconnects,
        "protocol_versions": versions,
        "auth_failures": auth,
        "silent_clients": silent,
    }


# --------------------------------------------------------------------------------------------
# delivery

_LATENCY_BUCKETS_MS = [0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000, 60000]


def delivery_tables(
    deliveries: DataFrame, acks: DataFrame | None, options: ReportOptions
) -> dict[str, DataFrame]:
    """Latency per stage, stored backlog and expired messages from the ``deliveries`` and
    ``acks`` tables (limited to the range by routing / acknowledgement time)."""
    deliveries = in_range(deliveries, "routed_at", options).where(F.col("record_error").isNull())
    targets = deliveries.select(
        "*", F.explode_outer(F.arrays_zip("target_client_ids", "target_packet_ids")).alias("t")
    ).select(
        "stage",
        "topic",
        "qos",
        "received_at",
        "routed_at",
        "message_expiry_interval",
        "key",
        F.col("t.target_client_ids").alias("subscriber"),
        F.coalesce(F.col("t.target_packet_ids"), F.lit(0)).alias("packet_id"),
    )
    from_store = (F.col("stage") == "downlink") & (F.col("packet_id") > 0)
    stage = F.when(from_store, F.lit("sent from store")).otherwise(
        F.concat(F.lit("routed to "), F.col("stage"))
    )
    # One row per record and stage for routing (a downlink record lists many subscribers).
    routed = (
        deliveries.where(F.col("stage") != "downlink")
        .union(
            deliveries.where(
                (F.col("stage") == "downlink") & ~F.exists("target_packet_ids", lambda p: p > 0)
            )
        )
        .select(
            F.concat(F.lit("routed to "), F.col("stage")).alias("stage"),
            _millis(F.col("routed_at"), F.col("received_at")).alias("latency_ms"),
        )
    )
    sent = targets.where(from_store).select(
        stage.alias("stage"),
        _millis(F.col("routed_at"), F.col("received_at")).alias("latency_ms"),
        "subscriber",
        "packet_id",
        "received_at",
        "routed_at",
        "topic",
    )
    frames = [routed]
    if acks is not None:
        acks = in_range(acks, "acked_at", options)
        done = acks.where(F.col("record_error").isNull()).where(
            F.col("kind").isin("PUBACK", "PUBCOMP")
        )
        # An acknowledgement answers the latest delivery of its Packet Identifier to that
        # client before it (Packet Identifiers are reused once acknowledged, MQTT 4.3).
        pairs = done.alias("a").join(
            sent.alias("s"),
            (F.col("a.client_id") == F.col("s.subscriber"))
            & (F.col("a.packet_id") == F.col("s.packet_id"))
            & (F.col("s.routed_at") <= F.col("a.acked_at")),
        )
        latest = Window.partitionBy("a.client_id", "a.packet_id", "a.acked_at", "a.kafka_offset")
        acked = (
            pairs.withColumn("latest", F.max("s.routed_at").over(latest))
            .where(F.col("s.routed_at") == F.col("latest"))
            .select(
                F.lit("acknowledged").alias("stage"),
                _millis(F.col("a.acked_at"), F.col("s.received_at")).alias("latency_ms"),
            )
        )
        frames.append(acked)
    frames.append(sent.select("stage", "latency_ms"))
    latencies = frames[0]
    for frame in frames[1:]:
        latencies = latencies.unionByName(frame)
    latencies = latencies.where(F.col("latency_ms").isNotNull())
    quantiles = F.percentile_approx("latency_ms", [0.5, 0.9, 0.99], 10000)
    latency = (
        latencies.groupBy("stage")
        .agg(
            F.count("*").alias("messages"),
            quantiles.alias("q"),
            F.max("latency_ms").alias("max_ms"),
        )
        .select(
            "stage",
            "messages",
            F.col("q")[0].alias("p50_ms"),
            F.col("q")[1].alias("p90_ms"),
            F.col("q")[2].alias("p99_ms"),
            "max_ms",
        )
        .orderBy("stage")
    )
    bucket = F.lit(_LATENCY_BUCKETS_MS[0])
    for lower in _LATENCY_BUCKETS_MS[1:]:
        bucket = F.when(F.col("latency_ms") >= lower, F.lit(lower)).otherwise(bucket)
    histogram = (
        latencies.groupBy("stage", bucket.alias("from_ms"))
        .agg(F.count("*").alias("messages"))
        .orderBy("stage", "from_ms")
    )
    persisted = targets.where(F.col("stage") == "persisted")
    stored = persisted.groupBy(F.col("key").alias("client_id")).agg(F.count("*").alias("stored"))
    if acks is not None:
        completed = (
            acks.where(F.col("record_error").isNull())
            .where(F.col("kind").isin("PUBACK", "PUBCOMP"))
            .groupBy("client_id")
            .agg(F.count("*").alias("acknowledged"))
        )
        stored = stored.join(completed, "client_id", "full").fillna(0)
    else:
        stored = stored.withColumn("acknowledged", F.lit(0))
    backlog = stored.withColumn(
        "backlog", F.greatest(F.col("stored") - F.col("acknowledged"), F.lit(0))
    ).orderBy(F.desc("backlog"), "client_id")
    deadline = F.col("received_at") + F.make_dt_interval(
        secs=F.col("message_expiry_interval").cast("decimal(18,6)")
    )
    with_expiry = persisted.where(F.col("message_expiry_interval").isNotNull()).select(
        F.col("key").alias("client_id"), "topic", "received_at", deadline.alias("expires_at")
    )
    delivered = sent.select(
        F.col("subscriber").alias("client_id"),
        "topic",
        "received_at",
        F.col("routed_at").alias("sent_at"),
    )
    expired = (
        with_expiry.join(delivered, ["client_id", "topic", "received_at"], "left")
        .groupBy("client_id", "topic", "received_at", "expires_at")
        .agg(F.min("sent_at").alias("first_sent_at"))
        .where(F.col("expires_at") < _until(options))
        .where(F.col("first_sent_at").isNull() | (F.col("first_sent_at") > F.col("expires_at")))
        .groupBy("client_id")
        .agg(F.count("*").alias("expired"), F.max("expires_at").alias("last_expired_at"))
        .orderBy(F.desc("expired"), "client_id")
    )
    return {
        "latency": latency,
        "latency_histogram": histogram,
        "stored_backlog": backlog,
        "expired": expired,
    }


# --------------------------------------------------------------------------------------------
# output


def _hadoop_write(spark: SparkSession, uri: str, text: str) -> None:
    """Write ``text`` (UTF-8) to ``uri`` through Hadoop's FileSystem (a path, s3://…)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    path = jvm.org.apache.hadoop.fs.Path(uri)
    fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    stream = fs.create(path, True)
    try:
        stream.write(bytearray(text.encode("utf-8")))
    finally:
        stream.close()


_PER_CLIENT = {
    "traffic_by_client",
    "silent_clients",
    "stored_backlog",
    "expired",
    "sessions",
    "auth_failures",
    "traffic_by_topic_level",
}


def _write(spark: SparkSession, out: str, name: str, frame: DataFrame) -> int:
    """Write ``frame`` as Parquet and CSV; return its row count."""
    base = out.rstrip("/")
    frame.write.mode("overwrite").parquet(f"{base}/tables/{name}")
    table = spark.read.parquet(f"{base}/tables/{name}")
    count = table.count()
    if name in _PER_CLIENT:
        table = table.limit(CSV_ROW_LIMIT)
    rows: Any = table.toPandas()  # a pandas.DataFrame
    _hadoop_write(spark, f"{base}/csv/{name}.csv", rows.to_csv(index=False))
    return count


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def run(
    spark: SparkSession,
    archive: str,
    out: str,
    options: ReportOptions,
    progress: Progress = print,
    iceberg: str | None = None,
) -> ReportSummary:
    """Compute every table over ``archive`` for ``options`` and write them under ``out``;
    with ``iceberg`` (``catalog.namespace``) the archive's tables are those Iceberg tables.

    Returns the :class:`ReportSummary` (also written as ``<out>/summary.json``). A missing
    or empty archive table gives empty tables and a note, not an error.
    """
    started = time.monotonic()
    summary = ReportSummary(
        since=_iso(options.since),
        until=_iso(options.until),
        generated_at=datetime.now().astimezone().isoformat(timespec="seconds"),
    )
    frames: dict[str, DataFrame] = {}
    messages_all = read_table(spark, archive, "messages", iceberg)
    if messages_all is not None:
        # Sessions and last-seen times need what came before the range, not after it.
        messages_all = messages_all.where(_partitions(options, since=False))
    if messages_all is None:
        summary.notes.append(f"no messages archived in {archive}: run `archive` first")
    else:
        messages = in_range(messages_all, "received_at", options)
        summary.undecodable_records = messages.where(F.col("record_error").isNotNull()).count()
        decoded = messages.where(F.col("record_error").isNull()).cache()
        totals = decoded.agg(
            F.count("*"),
            F.sum("payload_size"),
            F.countDistinct("client_id"),
            F.countDistinct("topic"),
        ).first()
        assert totals is not None
        summary.messages, summary.bytes = int(totals[0]), int(totals[1] or 0)
        summary.publishers, summary.topics = int(totals[2]), int(totals[3])
        frames |= traffic_tables(decoded)
    events_all = read_table(spark, archive, "events", iceberg)
    if events_all is not None:
        events_all = events_all.where(_partitions(options, since=False))
    if events_all is None:
        summary.notes.append("no client events archived: fleet tables are empty")
    else:
        frames |= fleet_tables(events_all, messages_all, options)
        counts = {
            row["kind"]: row["n"]
            for row in in_range(events_all, "at", options)
            .groupBy("kind")
            .agg(F.count("*").alias("n"))
            .collect()
        }
        summary.connects = int(counts.get("CONNECTED", 0))
        summary.disconnects = int(counts.get("DISCONNECTED", 0))
        summary.auth_failures = int(counts.get("AUTH_FAILED", 0))
        summary.clients_seen = (
            in_range(events_all, "at", options).select("client_id").distinct().count()
        )
    deliveries = read_table(spark, archive, "deliveries", iceberg)
    if deliveries is None:
        summary.notes.append("no deliveries archived: delivery tables are empty")
    else:
        frames |= delivery_tables(deliveries, read_table(spark, archive, "acks", iceberg), options)
    gaps = read_gaps(spark, archive)
    if gaps is not None:
        # Every gap ever found: when the lost records were written is unknown, and a gap
        # anywhere makes every total over its time short.
        frames["gaps"] = gaps.orderBy("detected_at", "table", "kafka_topic", "kafka_partition")
        summary.lost_records = int(gaps.agg(F.sum("records")).first()[0] or 0)  # type: ignore[index]
        summary.notes.append(
            f"{summary.lost_records:,} Kafka records were lost before archiving: "
            "retention removed them before a run read them (gaps table)"
        )
    for index, (name, frame) in enumerate(frames.items(), start=1):
        step = time.monotonic()
        summary.tables[name] = _write(spark, out, name, frame)
        progress(
            f"[{index:>2}/{len(frames)}] {name:<26} {summary.tables[name]:>10,} rows "
            f"({time.monotonic() - step:.1f} s)"
        )
    _hadoop_write(spark, f"{out.rstrip('/')}/summary.json", json.dumps(asdict(summary), indent=2))
    progress(f"report tables written to {out} in {time.monotonic() - started:.1f} s")
    return summary


def parse_time(text: str) -> datetime:
    """An ISO 8601 date or date-time (``2026-11-23``, ``2026-11-23T18:00``), UTC unless it
    names its offset; returned naive in UTC (Spark's session time zone). ``ValueError`` if
    it does not parse."""
    value = datetime.fromisoformat(text)
    if value.tzinfo is not None:
        from datetime import UTC

        value = value.astimezone(UTC).replace(tzinfo=None)
    return value


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="report.py", description=__doc__.splitlines()[0])
    parser.add_argument("--archive", required=True, help="archive URI (s3://bucket/archive)")
    parser.add_argument("--out", required=True, help="where the tables go (s3://…/reports/x)")
    parser.add_argument("--since", type=parse_time)
    parser.add_argument("--until", type=parse_time)
    parser.add_argument("--silent-hours", type=float, default=24.0)
    parser.add_argument("--storm-reconnects", type=int, default=10)
    parser.add_argument(
        "--iceberg", help="catalog.namespace of the Iceberg tables (default: Parquet tables)"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """``spark-submit`` entry point: write the report tables, print the summary as JSON."""
    args = _parse(sys.argv[1:] if argv is None else argv)
    spark = SparkSession.builder.appName("cormorant-report").getOrCreate()
    options = ReportOptions(args.since, args.until, args.silent_hours, args.storm_reconnects)
    summary = run(spark, args.archive, args.out, options, iceberg=args.iceberg)
    print(json.dumps(asdict(summary)))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
