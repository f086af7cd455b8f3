"""Scale figures of the analytics jobs (spark_emr/): archive throughput and report time.

- **archive**: a backlog of ``--records`` PUBLISH records (64-byte payloads, 1,000
  publishers, the real ``m`` header, received over the last ``--hours`` hours) is written
  to ``msg.all`` of a private Kafka broker (the local cluster launcher, temporary
  directory, free ports) through Spark's Kafka sink (:func:`produce`; its time is reported
  apart); then the archive job (:func:`spark_emr.jobs.archive.run`, ``messages`` table)
  reads all of them into a fresh archive on ``local[2]``, ``--runs`` rounds; each round
  runs every configuration once (the rounds interleave them, so the machine's load falls
  on all alike): each ``--formats`` (``parquet``, the file sink; ``iceberg``, a local
  Hadoop catalog) with each ``--batch-sizes`` (``maxOffsetsPerTrigger``; 0: one
  micro-batch) and each ``--min-partitions`` (the Kafka source's ``minPartitions``; 0: one
  Spark task per Kafka partition). Reported per configuration: records/s over the run's
  wall time (query start, Kafka reads, pandas-UDF decoding, the writes and the commits
  included), each round's, median, min and max, and each round's load average (1 min,
  lowest and highest seen around its runs).
- **report**: an archive of ``--report-messages`` messages (10 million by default; 100,000
  publishers, 300,000 topics, spread over one day) and ``--report-events`` connection events
  is synthesized with Spark and committed through the file sink (so it reads as the
  archive job's output does); then :func:`spark_emr.jobs.report.run` computes every table
  over it on ``local[2]``. Reported: the report's wall time and each table's.
- **pruning**: the same synthesized archive spread over ``--days`` days (10 by default:
  10 million messages, a million a day); then ``--runs`` rounds of the report over one day
  (the middle one) and over the whole archive. Reported: each one's median wall time (the
  pruned report lists and opens one day's ``date``/``hour`` directories). With
  ``--pruning-archive DIR`` the synthesized archive stays in ``DIR`` and a later run of the
  same size reuses it instead of synthesizing it again.

Results are printed and appended as JSON lines to ``bench/results/analytics.jsonl``.
Run from the repository root: ``python bench/bench_analytics.py`` (``--skip`` any of
``archive``, ``report``, ``pruning``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench.bench_stores import free_port  # noqa: E402
from bench.bench_trie import cpu_model  # noqa: E402
from services.common import records  # noqa: E402
from services.common.kafka.names import TopicNames  # noqa: E402
from services.local import cluster  # noqa: E402
from services.local.settings import LocalSettings  # noqa: E402

RESULTS = REPO_ROOT / "bench" / "results" / "analytics.jsonl"


def _machine() -> dict[str, Any]:
    return {
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "load_average_1min": round(os.getloadavg()[0], 1),
        "command": " ".join(sys.argv),
    }


def produce(spark: Any, bootstrap: str, topic: str, count: int, hours: int) -> float:
    """Write ``count`` PUBLISH records to ``topic`` through Spark's Kafka sink; return the
    seconds the writing took.

    Each record is as the ingest nodes write it: key the publisher's Client Identifier
    (1,000 publishers), a 64-byte payload, the ``m`` header made by the shared encoder
    (:func:`services.common.records.encode_meta`, in a pandas UDF) with QoS ``i % 3`` and
    ``received_at`` spread over the last ``hours`` hours, so the backlog spans that many
    ``date``/``hour`` partitions. Two Spark tasks each write half of the records, both in
    time order, through the JVM's idempotent producer with large batches (1 MiB, 20 ms
    linger; no compression, as the services' producers): a Python producer sending record by
    record took 12 minutes for 2,000,000 records on this loaded machine.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.functions import pandas_udf

    def encode(topic: pd.Series, qos: pd.Series, at: pd.Series) -> pd.Series:
        return pd.Series(
            [
                records.encode_meta(records.PublishMeta(t, int(q), False, int(a)))
                for t, q, a in zip(topic, qos, at, strict=True)
            ]
        )

    meta = pandas_udf(encode, "binary")  # type: ignore[call-overload]
    half = (count + 1) // 2
    span_ms = hours * 3_600_000
    start_ms = int(time.time() * 1000) - span_ms
    # Task k writes ids [k * half, (k + 1) * half): both walk through the same times at once.
    at = (F.lit(start_ms) + (F.col("id") % half) * span_ms / half).cast("long")
    device = F.concat(F.lit("d"), (F.col("id") % 1000).cast("string"))
    frame = spark.range(0, count, 1, 2).select(
        device.cast("binary").alias("key"),
        F.lit(bytes(64)).alias("value"),
        F.array(
            F.struct(
                F.lit(records.HEADER_META).alias("key"),
                meta(
                    F.concat(F.lit("devices/"), device, F.lit("/telemetry")),
                    F.col("id") % 3,
                    at,
                ).alias("value"),
            )
        ).alias("headers"),
    )
    started = time.perf_counter()
    (
        frame.write.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", topic)
        .option("kafka.enable.idempotence", "true")
        .option("kafka.acks", "all")
        .option("kafka.batch.size", str(1 << 20))
        .option("kafka.linger.ms", "20")
        .option("kafka.buffer.memory", str(64 << 20))
        .save()
    )
    return time.perf_counter() - started


@dataclass(frozen=True)
class ArchiveConfig:
    """One way of running the archive: table ``format``, ``batch_size``
    (``maxOffsetsPerTrigger``; 0: unbounded) and ``min_partitions`` (0: Kafka's)."""

    format: str
    batch_size: int
    min_partitions: int

    def label(self) -> str:
        """A short name for the printout and the record."""
        batch = f"batches of {self.batch_size:,}" if self.batch_size else "one batch"
        tasks = f", minPartitions {self.min_partitions}" if self.min_partitions else ""
        return f"{self.format}, {batch}{tasks}"


def _archive_once(
    spark: Any, settings: LocalSettings, config: ArchiveConfig, count: int
) -> tuple[float, int]:
    """Archive ``msg.all`` into a fresh archive with ``config``; (seconds, micro-batches)."""
    from spark_emr.jobs import archive
    from spark_emr.kafka_options import kafka_options
    from spark_emr.topics import archive_topics

    topics = archive_topics(TopicNames.from_settings(settings))
    options = kafka_options(settings.kafka_bootstrap)
    if config.min_partitions:
        options["minPartitions"] = str(config.min_partitions)
    with tempfile.TemporaryDirectory(prefix="bench-archive-") as where:
        iceberg = None
        if config.format == "iceberg":
            iceberg = f"{archive.local_catalog(spark, where, 'bench')}.cormorant"
        started = time.perf_counter()
        result = archive.run(
            spark,
            where,
            topics,
            options,
            only=("messages",),
            max_records_per_batch=config.batch_size or None,
            progress=lambda _: None,
            iceberg=iceberg,
        )["messages"]
        elapsed = time.perf_counter() - started
    assert result.rows == count, result
    return elapsed, result.batches


def bench_archive(
    spark: Any,
    settings: LocalSettings,
    count: int,
    hours: int,
    runs: int,
    configs: list[ArchiveConfig],
) -> list[dict[str, Any]]:
    """Produce a backlog of ``count`` records over ``hours`` hours, then archive it ``runs``
    rounds of every one of ``configs`` (each round runs each configuration once, in order);
    one record per configuration."""
    names = TopicNames.from_settings(settings)
    load_before = os.getloadavg()[0]
    produce_seconds = produce(spark, settings.kafka_bootstrap, names.msg_all, count, hours)
    print(
        f"produced {count:,} records in {produce_seconds:.1f} s "
        f"({count / produce_seconds:,.0f} records/s, load average {load_before:.0f} before)"
    )
    rates: dict[ArchiveConfig, list[float]] = {c: [] for c in configs}
    batches: dict[ArchiveConfig, int] = {}
    round_loads: list[list[float]] = []
    for run in range(runs):
        loads = [os.getloadavg()[0]]
        for config in configs:
            elapsed, batches[config] = _archive_once(spark, settings, config, count)
            rates[config].append(count / elapsed)
            loads.append(os.getloadavg()[0])
            print(
                f"round {run + 1}, {config.label()}: {count:,} records in {elapsed:.1f} s "
                f"({batches[config]} batches): {rates[config][-1]:,.0f} records/s "
                f"(load average {loads[-1]:.0f})",
                flush=True,
            )
        round_loads.append(loads)
    return [
        _machine()
        | {
            "benchmark": "analytics.archive",
            "master": "local[2]",
            "format": config.format,
            "max_records_per_batch": config.batch_size or None,
            "min_partitions": config.min_partitions or None,
            "micro_batches": batches[config],
            "records": count,
            "payload_bytes": 64,
            "hours": hours,
            "msg_all_partitions": settings.msg_all_partitions,
            "produce_seconds": round(produce_seconds, 1),
            "records_per_second_median": round(statistics.median(rates[config])),
            "records_per_second_min": round(min(rates[config])),
            "records_per_second_max": round(max(rates[config])),
            "records_per_second": [round(r) for r in rates[config]],
            "runs": len(rates[config]),
            "load_average_by_round": [
                [round(min(loads), 1), round(max(loads), 1)] for loads in round_loads
            ],
        }
        for config in configs
    ]


def synthesize(spark: Any, where: str, messages: int, events: int, days: int = 1) -> None:
    """Write an archive of ``messages`` messages and ``events`` connection events, evenly
    over ``days`` days from 2026-11-01 (UTC), in the archive's layout: its schemas,
    partitioned by ``date`` and ``hour``, committed through the file sink
    (``_spark_metadata``)."""
    from pyspark.sql import functions as F

    from spark_emr.jobs import archive

    day = 86_400 * days
    start = int(datetime(2026, 11, 1, tzinfo=UTC).timestamp())
    ids = spark.range(messages)
    metric = F.element_at(
        F.array(F.lit("telemetry"), F.lit("status"), F.lit("alerts")),
        (F.col("id") % 3 + 1).cast("int"),
    )
    at = F.timestamp_seconds(F.lit(start) + F.col("id") * day / messages)
    staged = ids.select(
        F.concat(F.lit("devices/d"), F.col("id") % 100_000, F.lit("/"), metric).alias("topic"),
        F.concat(F.lit("d"), F.col("id") % 100_000).alias("client_id"),
        (F.col("id") % 3).cast("int").alias("qos"),
        (F.col("id") % 50 == 0).alias("retain"),
        (4 + F.col("id") % 2).cast("int").alias("protocol_version"),
        F.lit(None).cast("long").alias("message_expiry_interval"),
        F.lit(0).alias("properties_size"),
        F.lit(bytes(16)).alias("payload"),
        (16 + F.col("id") % 240).cast("int").alias("payload_size"),
        at.alias("received_at"),
        F.lit("msg.all").alias("kafka_topic"),
        (F.col("id") % 12).cast("int").alias("kafka_partition"),
        F.col("id").alias("kafka_offset"),
        at.alias("kafka_timestamp"),
        F.lit(None).cast("string").alias("record_error"),
        F.to_date(at).alias("date"),
        F.hour(at).alias("hour"),
    )
    pairs = spark.range(events // 2)
    connected = F.timestamp_seconds(F.lit(start) + F.col("id") * day / (events // 2))
    common = [
        F.concat(F.lit("d"), F.col("id") % 100_000).alias("client_id"),
        F.lpad(F.hex(F.col("id")), 32, "0").alias("connection_id"),
    ]
    causes = F.element_at(
        F.array(
            *[
                F.lit(c)
                for c in ("CLIENT_DISCONNECT", "CONNECTION_LOST", "KEEP_ALIVE_TIMEOUT", "TAKEOVER")
            ]
        ),
        (F.col("id") % 4 + 1).cast("int"),
    )
    both = pairs.select(
        *common, connected.alias("c"), causes.alias("cause"), (F.col("id") % 7200).alias("seconds")
    )
    event_rows = both.select(
        "client_id",
        F.lit("CONNECTED").alias("kind"),
        F.col("c").alias("at"),
        "connection_id",
        F.lit("NONE").alias("cause"),
        F.lit(0).alias("reason_code"),
    ).unionByName(
        both.select(
            "client_id",
            F.lit("DISCONNECTED").alias("kind"),
            (F.col("c") + F.make_dt_interval(secs=F.col("seconds"))).alias("at"),
            "connection_id",
            "cause",
            F.lit(0).alias("reason_code"),
        )
    )
    schema = archive.table_schema(spark, "events")
    filled = event_rows.select(
        *[
            F.col(f.name)
            if f.name in event_rows.columns
            else F.lit(None).cast(f.dataType).alias(f.name)
            for f in schema.fields
            if f.name not in ("date", "hour")
        ]
    )
    filled = (
        filled.withColumn("node_id", F.lit("node1"))
        .withColumn("client_address", F.lit("10.0.0.1:1234"))
        .withColumn("protocol_version", F.lit(5))
        .withColumn("date", F.to_date("at"))
        .withColumn("hour", F.hour("at"))
    )
    for table, frame in (("messages", staged), ("events", filled)):
        stage = f"{where}/_staging/{table}"
        frame.write.mode("overwrite").parquet(stage)
        query = (
            spark.readStream.schema(archive.table_schema(spark, table))
            .parquet(stage)
            .writeStream.format("parquet")
            .option("path", f"{where}/{table}")
            .option("checkpointLocation", f"{where}/_checkpoints/{table}")
            .partitionBy("date", "hour")
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()


def bench_report(spark: Any, messages: int, events: int) -> dict[str, Any]:
    """Time the report over a synthesized archive; return the record."""
    from spark_emr.jobs import report

    with tempfile.TemporaryDirectory(prefix="bench-report-") as where:
        started = time.perf_counter()
        synthesize(spark, where, messages, events)
        print(
            f"synthesized {messages:,} messages and {events:,} events "
            f"in {time.perf_counter() - started:.0f} s"
        )
        steps: dict[str, float] = {}
        last = [time.perf_counter()]

        def progress(line: str) -> None:
            print(line)
            if line.startswith("["):
                name = line.split("]", 1)[1].split()[0]
                now = time.perf_counter()
                steps[name] = round(now - last[0], 1)
                last[0] = now

        started = time.perf_counter()
        summary = report.run(spark, where, f"{where}/report", report.ReportOptions(), progress)
        elapsed = time.perf_counter() - started
    assert summary.messages == messages, summary
    return _machine() | {
        "benchmark": "analytics.report",
        "master": "local[2]",
        "messages": messages,
        "events": events,
        "seconds": round(elapsed, 1),
        "table_seconds": steps,
    }


def _synthesized(spark: Any, where: str, messages: int, events: int, days: int) -> None:
    """Synthesize the pruning archive in ``where`` unless an earlier run left one of the same
    size there (its ``_synthesized.json`` says so): a 10-million-row archive took 43 minutes
    to synthesize on this loaded machine, more than all the report rounds over it."""
    marker = Path(where) / "_synthesized.json"
    wanted = {"messages": messages, "events": events, "days": days}
    if marker.exists() and json.loads(marker.read_text(encoding="utf-8")) == wanted:
        print(f"reusing the archive synthesized in {where}: {wanted}")
        return
    if Path(where).exists() and any(Path(where).iterdir()):
        raise SystemExit(f"{where} holds something other than a synthesized archive of {wanted}")
    started = time.perf_counter()
    synthesize(spark, where, messages, events, days)
    marker.write_text(json.dumps(wanted), encoding="utf-8")
    print(
        f"synthesized {messages:,} messages and {events:,} events over {days} days "
        f"in {time.perf_counter() - started:.0f} s",
        flush=True,
    )


def bench_pruning(
    spark: Any, messages: int, events: int, days: int, runs: int, where: str
) -> dict[str, Any]:
    """Time the report over one day of a ``days``-day synthesized archive in ``where`` (made
    there unless an earlier run left it) against the report over all of it, ``runs``
    rounds; return the record."""
    from spark_emr.jobs import report

    first = datetime(2026, 11, 1)
    day = first + timedelta(days=days // 2)
    ranges = {
        "one_day": report.ReportOptions(day, day + timedelta(days=1)),
        "whole_archive": report.ReportOptions(),
    }
    seconds: dict[str, list[float]] = {name: [] for name in ranges}
    counted: dict[str, int] = {}
    loads = [os.getloadavg()[0]]
    _synthesized(spark, where, messages, events, days)
    with tempfile.TemporaryDirectory(prefix="bench-pruning-") as reports:
        for run in range(runs):
            for name, options in ranges.items():
                started = time.perf_counter()
                summary = report.run(
                    spark, where, f"{reports}/report-{name}", options, lambda _: None
                )
                seconds[name].append(time.perf_counter() - started)
                counted[name] = summary.messages
                loads.append(os.getloadavg()[0])
                print(
                    f"round {run + 1}, {name}: {summary.messages:,} messages reported in "
                    f"{seconds[name][-1]:.1f} s (load average {loads[-1]:.0f})",
                    flush=True,
                )
    assert counted["whole_archive"] == messages, counted
    assert counted["one_day"] == messages // days, counted
    return _machine() | {
        "benchmark": "analytics.report_pruning",
        "master": "local[2]",
        "messages": messages,
        "events": events,
        "days": days,
        "day": day.date().isoformat(),
        "runs": runs,
        "one_day_messages": counted["one_day"],
        "one_day_seconds_median": round(statistics.median(seconds["one_day"]), 1),
        "one_day_seconds": [round(s, 1) for s in seconds["one_day"]],
        "whole_archive_seconds_median": round(statistics.median(seconds["whole_archive"]), 1),
        "whole_archive_seconds": [round(s, 1) for s in seconds["whole_archive"]],
        "load_average_min": round(min(loads), 1),
        "load_average_max": round(max(loads), 1),
    }


def main() -> None:
    """Parse the options, run the benchmarks, print and record their results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--hours", type=int, default=6, help="hours the backlog spans")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--formats", default="parquet,iceberg")
    parser.add_argument(
        "--batch-sizes",
        default="100000,1000000,0",
        help="maxOffsetsPerTrigger values (0: none)",
    )
    parser.add_argument("--min-partitions", default="0", help="minPartitions values (0: none)")
    parser.add_argument("--report-messages", type=int, default=10_000_000)
    parser.add_argument("--report-events", type=int, default=1_000_000)
    parser.add_argument("--days", type=int, default=10, help="days of the pruning archive")
    parser.add_argument(
        "--pruning-archive",
        help="directory of the pruning archive, kept for the next run (default: a temporary one)",
    )
    parser.add_argument(
        "--skip", choices=["archive", "report", "pruning"], action="append", default=[]
    )
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    configs = [
        ArchiveConfig(f, int(b), int(m))
        for b in args.batch_sizes.split(",")
        for m in args.min_partitions.split(",")
        for f in args.formats.split(",")
    ]

    from spark_emr.jars import fetch_jars
    from spark_emr.session import local_session

    base = LocalSettings()
    spark = local_session(
        "local[2]", fetch_jars(base.cache_dir), shuffle_partitions=8, driver_memory="4g"
    )
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-analytics-") as state_dir:
        settings = cluster.local_settings(
            LocalSettings(
                state_dir=Path(state_dir),
                cache_dir=base.cache_dir,
                kafka_port=free_port(),
                kafka_controller_port=free_port(),
                topic_prefix="bench.",
            )
        )
        try:
            if "archive" not in args.skip:
                cluster.start_component(settings, "kafka")
                results += bench_archive(
                    spark, settings, args.records, args.hours, args.runs, configs
                )
        finally:
            cluster.stop_component(settings, "kafka")
    if "report" not in args.skip:
        results.append(bench_report(spark, args.report_messages, args.report_events))
    if "pruning" not in args.skip:
        with tempfile.TemporaryDirectory(prefix="bench-pruning-archive-") as temporary:
            results.append(
                bench_pruning(
                    spark,
                    args.report_messages,
                    args.report_events,
                    args.days,
                    args.runs,
                    args.pruning_archive or temporary,
                )
            )
    spark.stop()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with args.output.open("a", encoding="utf-8") as out:
        for result in results:
            print(json.dumps(result))
            out.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
