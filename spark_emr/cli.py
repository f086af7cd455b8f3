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


def _run_on_emr(
    settings: AnalyticsSettings, stack_outputs: Path | None, job: str, arguments: list[str]
) -> tuple[Any, Any, Any]:
    from spark_emr import emr
    from spark_emr.session import JOB_CONF

    target = _target(settings, stack_outputs)
    client, s3 = _boto(target)
    spec = emr.JobSpec(job, arguments, JOB_CONF | emr.image_python_conf())
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
    help="Bound each micro-batch (Kafka maxOffsetsPerTrigger).",
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
        if max_records_per_batch:
            arguments += ["--max-records-per-batch", str(max_records_per_batch)]
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
                max_records_per_batch=max_records_per_batch,
                progress=click.echo,
            )
        except KafkaUnreachable as exc:
            raise click.ClickException(str(exc)) from exc
    elapsed = time.monotonic() - started
    total = sum(r.rows for r in results.values())
    click.echo("")
    click.echo(f"{'TABLE':<12}{'NEW ROWS':>12}  NOTE")
    for result in results.values():
        click.echo(f"{result.table:<12}{result.rows:>12,}  {result.note}")
    click.echo(f"\n{total:,} records archived in {elapsed:.1f} s: {uri}")


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
            job.run(spark, archive_path, str(out_dir.resolve()), options, progress=click.echo)
    index = render(out_dir)
    click.echo(f"report: {index}")
