"""The Spark jobs on EMR Serverless: package, upload, start, poll, fetch — with boto3.

:func:`package` zips ``spark_emr`` and the shared modules its jobs import (the record
decoder, :mod:`services.common.records`, and what that imports: never a copy); :func:`submit`
uploads the zip, the job's entry point and the connector's jars to the archive bucket,
starts the job run (``emr-serverless`` ``StartJobRun``: entry point, arguments, Spark
parameters, S3 log URI) and :func:`wait` polls ``GetJobRun`` until a terminal state,
reporting each change (botocore has no waiter for job runs). :func:`fetch_report` downloads
the report's CSV files and summary so that :mod:`spark_emr.render` can draw it here.

Where it runs comes from :class:`EmrTarget`: the Pulumi stack outputs of ``infra/``
(``pulumi stack output --json``) or the settings.
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import time
import zipfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spark_emr import versions
from spark_emr.settings import AnalyticsSettings

Progress = Callable[[str], None]

#: Job run states after which nothing changes (EMR Serverless JobRunState).
TERMINAL_STATES = frozenset({"SUCCESS", "FAILED", "CANCELLED"})

#: S3 key prefixes under the archive bucket.
PACKAGE_PREFIX = "cormorant/emr"
ARCHIVE_PREFIX = "archive"
REPORTS_PREFIX = "reports"
LOGS_PREFIX = "emr-logs"

_ROOT = Path(__file__).resolve().parent.parent

# Stack output names (infra/) and setting names that give each field; compared after
# dropping case, "_" and "-", so archiveBucket, archive_bucket and ARCHIVE-BUCKET all match.
_OUTPUT_NAMES = {
    "application_id": ("emrapplicationid", "emrserverlessapplicationid", "applicationid"),
    "job_role_arn": (
        "emrjobrolearn",
        "emrjobexecutionrolearn",
        "emrexecutionrolearn",
        "jobrolearn",
    ),
    "bucket": ("archivebucket", "archivebucketname", "analyticsbucket"),
    "region": ("region", "awsregion"),
    "kafka_bootstrap": ("kafkabootstrap", "kafkabootstrapbrokers", "bootstrapbrokers"),
    "kafka_secret_arn": ("kafkascramsecretarn", "scramsecretarn"),
    "schedule_group": ("archiveschedulegroup",),
    "glue_database": ("gluedatabase", "archivegluedatabase"),
    "scheduler_role_arn": ("archiveschedulerrolearn",),
}


class EmrError(RuntimeError):
    """An EMR Serverless job run could not be started, or did not succeed."""


@dataclass(frozen=True)
class EmrTarget:
    """Where and as whom the jobs run: the EMR Serverless application, the job runs' IAM
    role, the S3 bucket of the archive, packages, logs and reports, the AWS region, and
    how the jobs reach Kafka (bootstrap address; SCRAM secret ARN when SCRAM is used), and
    where the archive's schedule goes (EventBridge Scheduler group, the role it runs as),
    and the Glue Data Catalog database of the Iceberg tables."""

    application_id: str
    job_role_arn: str
    bucket: str
    region: str | None = None
    kafka_bootstrap: str | None = None
    kafka_secret_arn: str | None = None
    schedule_group: str | None = None
    scheduler_role_arn: str | None = None
    glue_database: str | None = None


def _normalized(name: str) -> str:
    return name.lower().replace("_", "").replace("-", "")


def target_from(settings: AnalyticsSettings, stack_outputs: Path | None = None) -> EmrTarget:
    """The :class:`EmrTarget` from ``stack_outputs`` (a ``pulumi stack output --json``
    file: a JSON object of output name → value) where given, else from ``settings``
    (``CORMORANT_EMR_APPLICATION_ID``, ``CORMORANT_EMR_JOB_ROLE_ARN``,
    ``CORMORANT_ARCHIVE_BUCKET``, ``CORMORANT_AWS_REGION``, ``CORMORANT_KAFKA_BOOTSTRAP``).

    Raises ``ValueError`` naming what is missing, or if the file is not a JSON object.
    """
    found: dict[str, str | None] = {
        "application_id": settings.emr_application_id,
        "job_role_arn": settings.emr_job_role_arn,
        "bucket": settings.archive_bucket,
        "region": settings.aws_region,
        "kafka_bootstrap": settings.kafka_bootstrap,
        "kafka_secret_arn": settings.analytics_kafka_secret_arn,
        "schedule_group": settings.analytics_schedule_group,
        "scheduler_role_arn": settings.analytics_scheduler_role_arn,
        "glue_database": settings.analytics_glue_database,
    }
    if stack_outputs is not None:
        outputs = json.loads(stack_outputs.read_text(encoding="utf-8"))
        if not isinstance(outputs, dict):
            raise ValueError(f"{stack_outputs}: not a JSON object of stack outputs")
        by_name = {_normalized(k): v for k, v in outputs.items() if isinstance(v, str)}
        for field_name, names in _OUTPUT_NAMES.items():
            for name in names:
                if name in by_name:
                    found[field_name] = by_name[name]
                    break
    missing = [k for k in ("application_id", "job_role_arn", "bucket") if not found[k]]
    if missing:
        raise ValueError(
            "EMR Serverless target incomplete, missing "
            + ", ".join(missing)
            + ": pass --stack-outputs (pulumi stack output --json) or set "
            "CORMORANT_EMR_APPLICATION_ID, CORMORANT_EMR_JOB_ROLE_ARN, CORMORANT_ARCHIVE_BUCKET"
        )
    return EmrTarget(**found)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# packaging


def _module_file(module: str) -> Path | None:
    base = _ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def _imports(path: Path) -> Iterable[str]:
    """The ``services.*`` modules ``path`` imports (``from X import y`` may name a module
    ``X.y`` or a name in ``X``: both are tried)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.startswith("services"))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("services"):
            yield str(node.module)
            yield from (f"{node.module}.{a.name}" for a in node.names)


def package_files() -> list[Path]:
    """The files of the job package: every module of ``spark_emr``, the shared modules they
    import (transitively), and the ``__init__.py`` of each package on the way."""
    files = set(_ROOT.joinpath("spark_emr").rglob("*.py"))
    pending = list(files)
    while pending:
        for module in _imports(pending.pop()):
            path = _module_file(module)
            if path is None or path in files:
                continue
            files.add(path)
            pending.append(path)
            parent = path.parent
            while parent != _ROOT:
                init = parent / "__init__.py"
                if init.exists() and init not in files:
                    files.add(init)
                    pending.append(init)
                parent = parent.parent
    return sorted(files)


def package() -> bytes:
    """The job package as zip bytes (``--py-files``); the same code gives the same bytes."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in package_files():
            info = zipfile.ZipInfo(str(path.relative_to(_ROOT)), date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, path.read_bytes())
    return buffer.getvalue()


# --------------------------------------------------------------------------------------------
# submission


@dataclass(frozen=True)
class JobSpec:
    """One job run: ``job`` is ``archive`` or ``report`` (``spark_emr/jobs/<job>.py``),
    ``arguments`` its command line, ``spark_conf`` extra Spark settings."""

    job: str
    arguments: Sequence[str]
    spark_conf: dict[str, str]


def _upload(s3: Any, bucket: str, key: str, body: bytes) -> str:
    """Put ``body`` at ``s3://bucket/key`` unless an object of the same size is there."""
    try:
        head = s3.head_object(Bucket=bucket, Key=key)
        if head["ContentLength"] == len(body):
            return f"s3://{bucket}/{key}"
    except s3.exceptions.ClientError:
        pass
    s3.put_object(Bucket=bucket, Key=key, Body=body)
    return f"s3://{bucket}/{key}"


def spark_submit_parameters(py_files: str, jars: Sequence[str], conf: dict[str, str]) -> str:
    """The ``sparkSubmitParameters`` string: ``--py-files``, ``--jars``, ``--conf k=v``…"""
    parts = [f"--py-files {py_files}", f"--jars {','.join(jars)}"]
    parts += [f"--conf {key}={value}" for key, value in conf.items()]
    return " ".join(parts)


#: The interpreter of the jobs' image (``spark_emr/image/Dockerfile``, its ``PYSPARK_PYTHON``).
IMAGE_PYTHON = "/usr/bin/python3.11"

#: EMR's own Iceberg runtime (EMR Serverless User Guide, "Using Apache Iceberg"): used on EMR
#: instead of uploading the local one (:data:`spark_emr.versions.ICEBERG_VERSION`).
EMR_ICEBERG_JAR = "/usr/share/aws/iceberg/lib/iceberg-spark3-runtime.jar"

#: The Spark catalog name of the Glue Data Catalog in the EMR job runs.
GLUE_CATALOG = "glue_catalog"

#: S3 key prefix of the Iceberg tables' data and metadata (the Glue database's location).
ICEBERG_PREFIX = "iceberg"


def glue_catalog_conf(bucket: str) -> dict[str, str]:
    """Spark settings of the Iceberg catalog :data:`GLUE_CATALOG` over the Glue Data
    Catalog, its tables' files under ``s3://<bucket>/iceberg/``."""
    key = f"spark.sql.catalog.{GLUE_CATALOG}"
    return {
        key: "org.apache.iceberg.spark.SparkCatalog",
        f"{key}.catalog-impl": "org.apache.iceberg.aws.glue.GlueCatalog",
        f"{key}.io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
        f"{key}.warehouse": f"s3://{bucket}/{ICEBERG_PREFIX}/",
    }


#: The Dockerfile of the EMR Serverless image the jobs run in (docs/analytics.md).
IMAGE_DOCKERFILE = _ROOT / "spark_emr" / "image" / "Dockerfile"


def image_python_conf() -> dict[str, str]:
    """Spark settings that run the driver's and the executors' Python with the image's
    :data:`IMAGE_PYTHON` (as EMR Serverless names them: ``spark.emr-serverless.driverEnv.*``
    for the driver, ``spark.executorEnv.*`` for the executors), whatever the image's
    environment says."""
    return {
        "spark.emr-serverless.driverEnv.PYSPARK_DRIVER_PYTHON": IMAGE_PYTHON,
        "spark.emr-serverless.driverEnv.PYSPARK_PYTHON": IMAGE_PYTHON,
        "spark.executorEnv.PYSPARK_PYTHON": IMAGE_PYTHON,
    }


def stage(
    s3: Any,
    target: EmrTarget,
    spec: JobSpec,
    jars: Sequence[Path],
    progress: Progress = print,
) -> dict[str, Any]:
    """Upload the package, ``spec``'s entry point and ``jars``; return the keyword arguments
    of ``StartJobRun`` (boto3's names, no ``clientToken``) that run them on ``target``.

    Uploads go under ``s3://<bucket>/cormorant/emr/<digest>/`` (the digest of the package,
    so runs of the same code share them); logs under ``s3://<bucket>/emr-logs/``.
    """
    from spark_emr.session import JOB_CONF

    code = package()
    digest = hashlib.sha256(code).hexdigest()[:16]
    prefix = f"{PACKAGE_PREFIX}/{digest}"
    progress(
        f"uploading the job package ({len(code) / 1024:.0f} KiB) and {len(jars)} jars "
        f"to s3://{target.bucket}/{prefix}/"
    )
    py_files = _upload(s3, target.bucket, f"{prefix}/cormorant.zip", code)
    entry = _upload(
        s3,
        target.bucket,
        f"{prefix}/{spec.job}.py",
        (_ROOT / "spark_emr" / "jobs" / f"{spec.job}.py").read_bytes(),
    )
    jar_uris = [
        _upload(s3, target.bucket, f"{prefix}/jars/{jar.name}", jar.read_bytes())
        for jar in jars
        if not jar.name.startswith("iceberg-spark-runtime")
    ] + [EMR_ICEBERG_JAR]
    conf = JOB_CONF | spec.spark_conf
    return {
        "applicationId": target.application_id,
        "executionRoleArn": target.job_role_arn,
        "name": f"cormorant-{spec.job}",
        "jobDriver": {
            "sparkSubmit": {
                "entryPoint": entry,
                "entryPointArguments": list(spec.arguments),
                "sparkSubmitParameters": spark_submit_parameters(py_files, jar_uris, conf),
            }
        },
        "configurationOverrides": {
            "monitoringConfiguration": {
                "s3MonitoringConfiguration": {"logUri": f"s3://{target.bucket}/{LOGS_PREFIX}/"}
            }
        },
        "tags": {"cormorant-job": spec.job, "spark-version": versions.SPARK_VERSION},
    }


def submit(
    emr: Any,
    s3: Any,
    target: EmrTarget,
    spec: JobSpec,
    jars: Sequence[Path],
    progress: Progress = print,
) -> str:
    """Upload the package, entry point and ``jars`` (:func:`stage`) and start ``spec``'s
    job run on ``target``; return the job run id. ``emr`` and ``s3`` are boto3 clients.

    Raises :class:`EmrError` if EMR refuses the run (botocore's ``ClientError`` message
    quoted).
    """
    request = stage(s3, target, spec, jars, progress)
    try:
        response = emr.start_job_run(**request)
    except emr.exceptions.ClientError as exc:
        raise EmrError(f"EMR Serverless refused the {spec.job} job run: {exc}") from exc
    run_id: str = response["jobRunId"]
    progress(f"job run {run_id} started on application {target.application_id}")
    return run_id


#: EventBridge Scheduler's universal target that calls EMR Serverless ``StartJobRun``.
START_JOB_RUN_TARGET = "arn:aws:scheduler:::aws-sdk:emrserverless:startJobRun"

#: The name of the archive's schedule (in the stack's schedule group).
ARCHIVE_SCHEDULE = "cormorant-archive"


def _pascal(value: Any) -> Any:
    """A boto3 request's keys in the API's PascalCase (what a universal target's input
    uses: ``applicationId`` → ``ApplicationId``); map keys of Spark settings and tags kept."""
    if isinstance(value, list):
        return [_pascal(v) for v in value]
    if not isinstance(value, dict):
        return value
    return {
        key[0].upper() + key[1:]: (item if key == "tags" else _pascal(item))
        for key, item in value.items()
    }


def check_interval(every_minutes: int, shortest_retention_seconds: int) -> None:
    """Raise ``ValueError`` unless runs ``every_minutes`` apart leave room for one missed or
    slow run before the shortest retention of the archived topics removes what no run
    has read yet (interval at most half that retention)."""
    if every_minutes * 60 * 2 > shortest_retention_seconds:
        raise ValueError(
            f"an archive every {every_minutes} min loses records: the shortest retention of "
            f"the archived topics is {shortest_retention_seconds // 60} min, so runs must be at "
            f"most {shortest_retention_seconds // 120} min apart (half of it: one late or failed "
            "run must not lose anything)"
        )


def schedule(
    scheduler: Any,
    request: dict[str, Any],
    *,
    every_minutes: int,
    group: str,
    role_arn: str,
) -> str:
    """Create (or update) the EventBridge Scheduler schedule :data:`ARCHIVE_SCHEDULE` in
    ``group`` that starts the job run ``request`` (:func:`stage`'s) every ``every_minutes``
    minutes as ``role_arn``; each start gets the schedule's execution id as its client token
    (so a retried start starts nothing twice). Returns the schedule's ARN. ``scheduler`` is
    a boto3 ``scheduler`` client; raises :class:`EmrError` if Scheduler refuses it."""
    body = _pascal(request) | {"ClientToken": "<aws.scheduler.execution-id>"}
    arguments = {
        "Name": ARCHIVE_SCHEDULE,
        "GroupName": group,
        "ScheduleExpression": f"rate({every_minutes} minutes)",
        "FlexibleTimeWindow": {"Mode": "OFF"},
        "Target": {
            "Arn": START_JOB_RUN_TARGET,
            "RoleArn": role_arn,
            "Input": json.dumps(body),
            "RetryPolicy": {"MaximumRetryAttempts": 3},
        },
        "State": "ENABLED",
    }
    try:
        try:
            response = scheduler.create_schedule(**arguments)
        except scheduler.exceptions.ConflictException:
            response = scheduler.update_schedule(**arguments)
    except scheduler.exceptions.ClientError as exc:
        raise EmrError(f"EventBridge Scheduler refused the archive's schedule: {exc}") from exc
    arn: str = response["ScheduleArn"]
    return arn


def wait(
    emr: Any,
    application_id: str,
    run_id: str,
    *,
    poll_seconds: float = 10.0,
    timeout: float = 6 * 3600.0,
    progress: Progress = print,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Poll ``GetJobRun`` every ``poll_seconds`` until the run reaches a terminal state,
    reporting each state change with the time since the first poll; return the final
    ``jobRun`` description.

    Raises :class:`EmrError` when the run ends FAILED or CANCELLED (its ``stateDetails``
    quoted) or ``timeout`` seconds pass.
    """
    started = time.monotonic()
    last = None
    while True:
        job_run: dict[str, Any] = emr.get_job_run(applicationId=application_id, jobRunId=run_id)[
            "jobRun"
        ]
        state = job_run["state"]
        if state != last:
            details = f" ({job_run['stateDetails']})" if job_run.get("stateDetails") else ""
            progress(f"[{time.monotonic() - started:6.0f} s] {run_id}: {state}{details}")
            last = state
        if state in TERMINAL_STATES:
            break
        if time.monotonic() - started > timeout:
            raise EmrError(f"job run {run_id} still {state} after {timeout:.0f} s")
        sleep(poll_seconds)
    if state != "SUCCESS":
        raise EmrError(
            f"job run {run_id} ended {state}: {job_run.get('stateDetails') or 'no details'}; "
            f"logs under the application's S3 log URI"
        )
    return job_run


def fetch_report(s3: Any, bucket: str, prefix: str, out: Path) -> list[Path]:
    """Download ``summary.json`` and ``csv/*.csv`` of the report at ``s3://bucket/prefix``
    into ``out``; return the files written. Raises :class:`EmrError` if there is none."""
    written: list[Path] = []
    paginator = s3.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket, Prefix=f"{prefix}/"):
        for item in page.get("Contents", []):
            relative = item["Key"][len(prefix) + 1 :]
            if relative != "summary.json" and not (
                relative.startswith("csv/") and relative.endswith(".csv")
            ):
                continue
            path = out / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read())
            written.append(path)
    if not any(p.name == "summary.json" for p in written):
        raise EmrError(f"no report at s3://{bucket}/{prefix}/ (summary.json missing)")
    return written
