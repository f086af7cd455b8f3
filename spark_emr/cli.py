"""``cormorant analytics archive | report | fetch-jars``: the Spark jobs from the command line.

Locally the jobs run on ``analytics_master`` (``local[*]``) against the configured Kafka;
with ``--emr`` the same jobs run on EMR Serverless (:mod:`spark_emr.emr`), the application,
role and bucket from ``--stack-outputs`` (``pulumi stack output --json > outputs.json``)
or the settings.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from services.common.kafka.names import TopicNames
from services.local.maven import FetchError
from spark_emr import jars, versions
from spark_emr.kafka_options import kafka_options_of
from spark_emr.settings import AnalyticsSettings

_STACK_OUTPUTS = click.option(
    "--stack-outputs",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="JSON of `pulumi stack output --json` (archive bucket, EMR application, job role).",
)
_EMR = click.option("--emr", is_flag=True, help="Run on EMR Serverless instead of locally.")

#: The namespace of the local Iceberg tables (in the archive directory's Hadoop catalog).
LOCAL_NAMESPACE = "cormorant"


def _topics(settings: AnalyticsSettings) -> dict[str, str]:
    from dataclasses import asdict

    from spark_emr.topics import archive_topics

    return asdict(archive_topics(TopicNames.from_settings(settings)))


def _kafka(settings: AnalyticsSettings, bootstrap: str | None = None) -> dict[str, str]:
    try:
        return kafka_options_of(settings, bootstrap)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc


def _scram(settings: AnalyticsSettings) -> bool:
    return (
        settings.kafka_security_protocol == "SASL_SSL"
        and settings.kafka_sasl_mechanism == "SCRAM-SHA-512"
    )


def _jars(settings: AnalyticsSettings) -> list[Path]:
    try:
        return jars.fetch_jars(settings.cache_dir)
    except FetchError as exc:
        raise click.ClickException(str(exc)) from exc


@contextmanager
def _spark(settings: AnalyticsSettings) -> Iterator[Any]:
    """The local SparkSession for one command, stopped at its end (a session that was
    already running in this process, a test's, is used and left running)."""
    from pyspark.sql import SparkSession

    from spark_emr.session import local_session

    running = SparkSession.getActiveSession()
    if running is not None:
        yield running
        return
    click.echo(f"starting Spark {versions.SPARK_VERSION} on {settings.analytics_master}")
    spark = local_session(settings.analytics_master, _jars(settings))
    try:
        yield spark
    finally:
        spark.stop()


def _boto(target: Any) -> tuple[Any, Any]:
    import boto3

    session = boto3.session.Session(region_name=target.region)
    return session.client("emr-serverless"), session.client("s3")


def _target(settings: AnalyticsSettings, stack_outputs: Path | None) -> Any:
    """The EMR Serverless target; a clear error (not a trace) when it is incomplete."""
    from spark_emr import emr

    try:
        return emr.target_from(settings, stack_outputs)
    except (ValueError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc


def _iceberg_on_emr(settings: AnalyticsSettings, target: Any) -> tuple[list[str], dict[str, str]]:
    """The job arguments and Spark settings of the Iceberg archive on EMR (the Glue
    database of the stack); none for the Parquet archive."""
    from spark_emr import emr

    if settings.archive_format != "iceberg":
        return [], {}
    if not target.glue_database:
        raise click.ClickException(
            "the Iceberg archive on EMR lives in a Glue database: pass --stack-outputs "
            "(glueDatabase) or set CORMORANT_ANALYTICS_GLUE_DATABASE"
        )
    namespace = f"{emr.GLUE_CATALOG}.{target.glue_database}"
    return ["--iceberg", namespace], emr.glue_catalog_conf(target.bucket)


def _iceberg_locally(settings: AnalyticsSettings, spark: Any, uri: str) -> str | None:
    """``catalog.namespace`` of the local Iceberg archive in ``uri``; None for Parquet."""
    from spark_emr.jobs.archive import local_catalog

    if settings.archive_format != "iceberg":
        return None
    return f"{local_catalog(spark, uri)}.{LOCAL_NAMESPACE}"


def _run_on_emr(
    settings: AnalyticsSettings, stack_outputs: Path | None, job: str, arguments: list[str]
) -> tuple[Any, Any, Any]:
    from spark_emr import emr
    from spark_emr.session import JOB_CONF

    target = _target(settings, stack_outputs)
    client, s3 = _boto(target)
    iceberg_arguments, iceberg_conf = _iceberg_on_emr(settings, target)
    spec = emr.JobSpec(
        job, [*arguments, *iceberg_arguments], JOB_CONF | emr.image_python_conf() | iceberg_conf
    )
    try:
        run_id = emr.submit(client, s3, target, spec, _jars(settings), progress=click.echo)
        emr.wait(
            client,
            target.application_id,
            run_id,
            poll_seconds=settings.emr_poll_seconds,
            progress=click.echo,
        )
    except emr.EmrError as exc:
        raise click.ClickException(str(exc)) from exc
    return target, client, s3


def _archive_arguments(
    settings: AnalyticsSettings, target: Any, uri: str, max_records_per_batch: int | None
) -> list[str]:
    """The command line of the archive job on EMR (``spark_emr/jobs/archive.py``)."""
    # No local CA file on EMR (MSK's certificates chain to public roots), and no SCRAM
    # password in the job run: its driver reads it from Secrets Manager.
    on_emr: dict[str, object] = {"kafka_ssl_cafile": None}
    if _scram(settings):
        on_emr["kafka_security_protocol"] = "SSL"
    options = _kafka(settings.model_copy(update=on_emr), target.kafka_bootstrap)
    arguments = [
        "--archive",
        uri,
        "--topics",
        json.dumps(_topics(settings)),
        "--kafka-options",
        json.dumps(options),
    ]
    if _scram(settings):
        if not target.kafka_secret_arn:
            raise click.ClickException(
                "SCRAM on EMR reads its credentials from Secrets Manager: set "
                "CORMORANT_ANALYTICS_KAFKA_SECRET_ARN (or a kafkaScramSecretArn output)"
            )
        arguments += ["--kafka-secret-arn", target.kafka_secret_arn]
    batch = max_records_per_batch or settings.archive_max_records_per_batch
    return [*arguments, "--max-records-per-batch", str(batch)]


@click.group()
def analytics() -> None:
    """PySpark jobs over the broker's stream: the Parquet archive and the report."""


@analytics.command("fetch-jars")
def fetch_jars() -> None:
    """Download the Spark Kafka connector's jars with Maven into the cache."""
    for jar in _jars(AnalyticsSettings()):
        click.echo(str(jar))


@analytics.command()
@_EMR
@_STACK_OUTPUTS
@click.option(
    "--archive",
    "archive_uri",
    help="Archive directory or URI (default: the "
    "archive_dir setting; with --emr s3://<bucket>/archive).",
)
@click.option(
    "--max-records-per-batch",
    type=click.IntRange(min=1),
    help="Bound each micro-batch (Kafka maxOffsetsPerTrigger; default: the "
    "archive_max_records_per_batch setting).",
)
def archive(
    emr: bool,
    stack_outputs: Path | None,
    archive_uri: str | None,
    max_records_per_batch: int | None,
) -> None:
    """Archive what is new in Kafka to Parquet (Structured Streaming, availableNow)."""
    settings = AnalyticsSettings()
    if emr:
        from spark_emr import emr as emr_module

        target = _target(settings, stack_outputs)
        uri = archive_uri or f"s3://{target.bucket}/{emr_module.ARCHIVE_PREFIX}"
        arguments = _archive_arguments(settings, target, uri, max_records_per_batch)
        _run_on_emr(settings, stack_outputs, "archive", arguments)
        click.echo(f"archive: {uri}")
        return
    from spark_emr.jobs import archive as job
    from spark_emr.kafka_admin import KafkaUnreachable

    uri = archive_uri or str(settings.archive_path())
    click.echo(f"archiving Kafka {settings.kafka_bootstrap} into {uri}")
    started = time.monotonic()
    with _spark(settings) as spark:
        try:
            results = job.run(
                spark,
                uri,
                job.ArchiveTopics(**_topics(settings)),
                _kafka(settings),
                max_records_per_batch=max_records_per_batch
                or settings.archive_max_records_per_batch,
                progress=click.echo,
                iceberg=_iceberg_locally(settings, spark, uri),
            )
        except KafkaUnreachable as exc:
            raise click.ClickException(str(exc)) from exc
    elapsed = time.monotonic() - started
    total = sum(r.rows for r in results.values())
    click.echo("")
    # Kafka records read, not rows: retained message and PUBREL requests are left out, and an
    # acknowledgement record holds many acknowledgements, each an ``acks`` row.
    click.echo(f"{'TABLE':<12}{'RECORDS':>12}  NOTE")
    for result in results.values():
        click.echo(f"{result.table:<12}{result.rows:>12,}  {result.note}")
    click.echo(f"\n{total:,} records archived in {elapsed:.1f} s: {uri}")
    lost = sum(r.lost for r in results.values())
    if lost:
        raise click.ClickException(
            f"{lost:,} records were gone from Kafka before any run archived them (retention): "
            f"recorded in {uri}/gaps; archive more often than the shortest topic retention"
        )


@analytics.command()
@_STACK_OUTPUTS
@click.option(
    "--every",
    "every_minutes",
    type=click.IntRange(min=1),
    default=15,
    show_default=True,
    help="Minutes between two archive runs (at most half the shortest topic retention).",
)
@click.option("--archive", "archive_uri", help="Archive URI (default: s3://<bucket>/archive).")
@click.option(
    "--max-records-per-batch",
    type=click.IntRange(min=1),
    help="Bound each micro-batch (Kafka maxOffsetsPerTrigger; default: the "
    "archive_max_records_per_batch setting).",
)
def schedule(
    stack_outputs: Path | None,
    every_minutes: int,
    archive_uri: str | None,
    max_records_per_batch: int | None,
) -> None:
    """Run the archive on EMR Serverless every N minutes (EventBridge Scheduler)."""
    import boto3

    from spark_emr import emr
    from spark_emr.session import JOB_CONF

    settings = AnalyticsSettings()
    retention = min(
        settings.downlink_retention_seconds,
        settings.app_retention_seconds,
        settings.msg_retention_seconds,
    )
    try:
        emr.check_interval(every_minutes, retention)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--every") from exc
    target = _target(settings, stack_outputs)
    if not target.schedule_group or not target.scheduler_role_arn:
        raise click.ClickException(
            "no schedule group or scheduler role: pass --stack-outputs (archiveScheduleGroup, "
            "archiveSchedulerRoleArn) or set CORMORANT_ANALYTICS_SCHEDULE_GROUP and "
            "CORMORANT_ANALYTICS_SCHEDULER_ROLE_ARN"
        )
    uri = archive_uri or f"s3://{target.bucket}/{emr.ARCHIVE_PREFIX}"
    arguments = _archive_arguments(settings, target, uri, max_records_per_batch)
    iceberg_arguments, iceberg_conf = _iceberg_on_emr(settings, target)
    spec = emr.JobSpec(
        "archive",
        [*arguments, *iceberg_arguments],
        JOB_CONF | emr.image_python_conf() | iceberg_conf,
    )
    session = boto3.session.Session(region_name=target.region)
    request = emr.stage(session.client("s3"), target, spec, _jars(settings), click.echo)
    try:
        arn = emr.schedule(
            session.client("scheduler"),
            request,
            every_minutes=every_minutes,
            group=target.schedule_group,
            role_arn=target.scheduler_role_arn,
        )
    except emr.EmrError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"archive into {uri} every {every_minutes} min: {arn}")


def _time(_ctx: click.Context, _param: click.Parameter, value: str | None) -> datetime | None:
    from spark_emr.jobs.report import parse_time

    if value is None:
        return None
    try:
        return parse_time(value)
    except ValueError as exc:
        raise click.BadParameter(f"{value!r} is not an ISO 8601 date or date-time") from exc


@analytics.command()
@_EMR
@_STACK_OUTPUTS
@click.option("--since", callback=_time, help="Start of the range, ISO 8601 (UTC unless given).")
@click.option("--until", callback=_time, help="End of the range (excluded), ISO 8601.")
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory for index.html, csv/ and tables/.",
)
@click.option("--archive", "archive_uri", help="Archive directory or URI (as for archive).")
@click.option(
    "--silent-hours",
    type=float,
    default=24.0,
    show_default=True,
    help="A client silent this long is listed as silent.",
)
@click.option(
    "--storm-reconnects",
    type=int,
    default=10,
    show_default=True,
    help="Reconnects within one minute that make a reconnect storm.",
)
def report(
    emr: bool,
    stack_outputs: Path | None,
    since: datetime | None,
    until: datetime | None,
    out_dir: Path,
    archive_uri: str | None,
    silent_hours: float,
    storm_reconnects: int,
) -> None:
    """Traffic, fleet and delivery report over the archive: Parquet, CSV and index.html."""
    from spark_emr.render import render

    if since and until and since >= until:
        raise click.BadParameter("--since must be before --until")
    settings = AnalyticsSettings()
    out_dir.mkdir(parents=True, exist_ok=True)
    if emr:
        from spark_emr import emr as emr_module

        target = _target(settings, stack_outputs)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        prefix = f"{emr_module.REPORTS_PREFIX}/{stamp}"
        arguments = [
            "--archive",
            archive_uri or f"s3://{target.bucket}/{emr_module.ARCHIVE_PREFIX}",
            "--out",
            f"s3://{target.bucket}/{prefix}",
            "--silent-hours",
            str(silent_hours),
            "--storm-reconnects",
            str(storm_reconnects),
        ]
        arguments += ["--since", since.isoformat()] if since else []
        arguments += ["--until", until.isoformat()] if until else []
        target, _, s3 = _run_on_emr(settings, stack_outputs, "report", arguments)
        files = emr_module.fetch_report(s3, target.bucket, prefix, out_dir)
        click.echo(f"fetched {len(files)} files from s3://{target.bucket}/{prefix}/")
    else:
        from spark_emr.jobs import report as job

        archive_path = archive_uri or str(settings.archive_path())
        click.echo(f"report over {archive_path} ({since or 'beginning'} → {until or 'now'}, UTC)")
        with _spark(settings) as spark:
            options = job.ReportOptions(since, until, silent_hours, storm_reconnects)
            iceberg = _iceberg_locally(settings, spark, archive_path)
            job.run(spark, archive_path, str(out_dir.resolve()), options, click.echo, iceberg)
    index = render(out_dir)
    click.echo(f"report: {index}")


@analytics.command()
@_EMR
@_STACK_OUTPUTS
@click.option("--archive", "archive_uri", help="Archive directory (as for archive; local).")
@click.option(
    "--keep-days",
    type=click.IntRange(min=1),
    help="Delete the partitions older than this many days (default: keep everything).",
)
@click.option(
    "--expire-hours",
    type=click.FloatRange(min=0),
    default=24.0,
    show_default=True,
    help="Expire the snapshots older than this (their unreferenced files go with them).",
)
def maintain(
    emr: bool,
    stack_outputs: Path | None,
    archive_uri: str | None,
    keep_days: int | None,
    expire_hours: float,
) -> None:
    """Iceberg archive maintenance: retention, compaction, snapshot expiry."""
    settings = AnalyticsSettings()
    if settings.archive_format != "iceberg":
        raise click.ClickException(
            "maintain applies to the Iceberg archive (CORMORANT_ARCHIVE_FORMAT=iceberg); a "
            "Parquet archive is kept whole"
        )
    arguments = ["--expire-hours", str(expire_hours)]
    arguments += ["--keep-days", str(keep_days)] if keep_days else []
    if emr:
        _run_on_emr(settings, stack_outputs, "maintain", arguments)
        return
    from spark_emr.jobs.archive import maintain as run_maintenance
    from spark_emr.jobs.maintain import cutoffs

    uri = archive_uri or str(settings.archive_path())
    keep, expire = cutoffs(keep_days, expire_hours)
    with _spark(settings) as spark:
        iceberg = _iceberg_locally(settings, spark, uri)
        assert iceberg is not None
        done = run_maintenance(
            spark, iceberg, delete_before=keep, expire_before=expire, progress=click.echo
        )
    if not done:
        click.echo(f"no Iceberg table in {uri}: run `archive` first")
