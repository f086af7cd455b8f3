"""EMR Serverless submission (spark_emr/emr.py): packaging, uploads and the stored job run
against moto; the polling loop through state changes and failure with botocore's Stubber
(moto's job runs succeed at once); the CLI's --emr path end to end against moto."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from click.testing import CliRunner
from moto import mock_aws

from services.cli import main
from spark_emr import emr, versions
from spark_emr.settings import AnalyticsSettings

REGION = "eu-west-1"
BUCKET = "cormorant-archive-test"
ROLE = "arn:aws:iam::123456789012:role/cormorant-emr-job"


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Any, str]]:
    """moto's EMR Serverless and S3: (emr client, s3 client, application id)."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
    }.items():
        monkeypatch.setenv(name, value)
    with mock_aws():
        s3 = boto3.client("s3", region_name=REGION)
        s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
        client = boto3.client("emr-serverless", region_name=REGION)
        app = client.create_application(
            name="cormorant", releaseLabel=versions.EMR_RELEASE_LABEL, type="SPARK"
        )
        yield client, s3, app["applicationId"]


def test_the_package_holds_the_jobs_and_the_shared_decoder_only(tmp_path: Path) -> None:
    names = set(zipfile.ZipFile(_write(tmp_path / "p.zip", emr.package())).namelist())
    assert {
        "spark_emr/jobs/archive.py",
        "spark_emr/jobs/report.py",
        "spark_emr/decode.py",
        "services/common/records.py",
        "services/common/mqtt/properties.py",
        "services/__init__.py",
        "services/common/__init__.py",
    } <= names
    assert not [n for n in names if n.startswith(("services/ingest", "services/router"))]
    assert emr.package() == emr.package()  # reproducible: uploads are shared between runs


def test_the_decoder_imports_from_the_package_alone(tmp_path: Path) -> None:
    package = _write(tmp_path / "cormorant.zip", emr.package())
    probe = (
        f"import sys; sys.path.insert(0, {str(package)!r}); "
        "import services.common.records as r, spark_emr.jobs.archive as a; "
        f"assert r.__file__.startswith({str(package)!r}), r.__file__; "
        f"assert a.__file__.startswith({str(package)!r}), a.__file__"
    )
    # -P: the worktree (cwd) is not on sys.path, only the zip and site-packages are.
    subprocess.run([sys.executable, "-P", "-c", probe], cwd=tmp_path, check=True)


def test_submit_uploads_and_starts_the_job_run(aws: tuple[Any, Any, str], tmp_path: Path) -> None:
    client, s3, app_id = aws
    jar = _write(tmp_path / "spark-sql-kafka-0-10_2.12-3.5.7.jar", b"jar bytes")
    target = emr.EmrTarget(app_id, ROLE, BUCKET, REGION)
    spec = emr.JobSpec("report", ["--archive", f"s3://{BUCKET}/archive"], {"spark.x": "1"})
    lines: list[str] = []
    run_id = emr.submit(client, s3, target, spec, [jar], progress=lines.append)

    job_run = client.get_job_run(applicationId=app_id, jobRunId=run_id)["jobRun"]
    driver = job_run["jobDriver"]["sparkSubmit"]
    prefix = driver["entryPoint"].removesuffix("/report.py")
    assert driver["entryPoint"].startswith(f"s3://{BUCKET}/cormorant/emr/")
    assert driver["entryPointArguments"] == ["--archive", f"s3://{BUCKET}/archive"]
    parameters = driver["sparkSubmitParameters"].split(" ")
    assert parameters[:4] == [
        "--py-files",
        f"{prefix}/cormorant.zip",
        "--jars",
        # EMR's own Iceberg runtime, never an uploaded one.
        f"{prefix}/jars/{jar.name},{emr.EMR_ICEBERG_JAR}",
    ]
    assert {"spark.sql.session.timeZone=UTC", "spark.x=1"} <= set(parameters[5::2])
    assert job_run["configurationOverrides"]["monitoringConfiguration"] == {
        "s3MonitoringConfiguration": {"logUri": f"s3://{BUCKET}/emr-logs/"}
    }

    key = prefix.removeprefix(f"s3://{BUCKET}/")
    stored = {o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"]}
    assert stored == {f"{key}/cormorant.zip", f"{key}/report.py", f"{key}/jars/{jar.name}"}
    body = s3.get_object(Bucket=BUCKET, Key=f"{key}/report.py")["Body"].read()
    assert body == (Path(emr.__file__).parent / "jobs" / "report.py").read_bytes()
    assert s3.get_object(Bucket=BUCKET, Key=f"{key}/cormorant.zip")["Body"].read() == emr.package()
    assert any(run_id in line for line in lines)


def _job_run(state: str, details: str = "") -> dict[str, Any]:
    run: dict[str, Any] = {
        "applicationId": "app",
        "jobRunId": "run-1",
        "arn": "arn:aws:emr-serverless:eu-west-1:123456789012:/applications/app/jobruns/run-1",
        "createdBy": "arn:aws:iam::123456789012:user/analyst",
        "createdAt": 0,
        "updatedAt": 0,
        "executionRole": ROLE,
        "state": state,
        "releaseLabel": versions.EMR_RELEASE_LABEL,
        "jobDriver": {"sparkSubmit": {"entryPoint": "s3://b/report.py"}},
    }
    run["stateDetails"] = details or f"Job run is {state.lower()}"
    return {"jobRun": run}


def _stubbed(states: list[tuple[str, str]]) -> tuple[Any, Stubber]:
    client = boto3.client(
        "emr-serverless", region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x"
    )
    stubber = Stubber(client)
    for state, details in states:
        stubber.add_response(
            "get_job_run", _job_run(state, details), {"applicationId": "app", "jobRunId": "run-1"}
        )
    stubber.activate()
    return client, stubber


def test_wait_reports_each_state_change_until_success() -> None:
    client, stubber = _stubbed(
        [
            ("SUBMITTED", ""),
            ("PENDING", ""),
            ("PENDING", ""),
            ("SCHEDULED", ""),
            ("RUNNING", ""),
            ("RUNNING", ""),
            ("SUCCESS", ""),
        ]
    )
    lines: list[str] = []
    slept: list[float] = []
    final = emr.wait(
        client, "app", "run-1", poll_seconds=7, progress=lines.append, sleep=slept.append
    )
    assert final["state"] == "SUCCESS"
    assert [re.search(r"run-1: (\w+)", line).group(1) for line in lines] == [  # type: ignore[union-attr]
        "SUBMITTED",
        "PENDING",
        "SCHEDULED",
        "RUNNING",
        "SUCCESS",
    ]
    assert slept == [7] * 6
    stubber.assert_no_pending_responses()


@pytest.mark.parametrize("state", ["FAILED", "CANCELLED"])
def test_wait_raises_with_the_details_of_a_failed_run(state: str) -> None:
    client, stubber = _stubbed([("RUNNING", ""), (state, "Job failed, ExitCode: 1. py4j error")])
    with pytest.raises(emr.EmrError, match=f"run-1 ended {state}: Job failed, ExitCode: 1"):
        emr.wait(client, "app", "run-1", progress=lambda _: None, sleep=lambda _: None)
    stubber.assert_no_pending_responses()


def test_target_from_stack_outputs_or_settings(tmp_path: Path) -> None:
    outputs = _write(
        tmp_path / "outputs.json",
        json.dumps(
            {
                "archiveBucket": BUCKET,
                "emrApplicationId": "00abc",
                "emrJobRoleArn": ROLE,
                "kafkaBootstrap": "b-1:9098",
                "mqttEndpoint": "mqtt://nlb:1883",
            }
        ).encode(),
    )
    target = emr.target_from(AnalyticsSettings(aws_region=REGION), outputs)
    assert target == emr.EmrTarget("00abc", ROLE, BUCKET, REGION, "b-1:9098", None)
    from_settings = AnalyticsSettings(
        emr_application_id="00def", emr_job_role_arn=ROLE, archive_bucket="b2"
    )
    assert emr.target_from(from_settings).application_id == "00def"
    with pytest.raises(ValueError, match="missing application_id, job_role_arn, bucket"):
        emr.target_from(AnalyticsSettings())


def test_fetch_report_downloads_the_tables_and_summary(
    aws: tuple[Any, Any, str], tmp_path: Path
) -> None:
    _, s3, _ = aws
    for key, body in {
        "reports/r1/summary.json": b"{}",
        "reports/r1/csv/qos_mix.csv": b"qos,messages\n1,3\n",
        "reports/r1/tables/qos_mix/part-0.parquet": b"PAR1",
    }.items():
        s3.put_object(Bucket=BUCKET, Key=key, Body=body)
    files = emr.fetch_report(s3, BUCKET, "reports/r1", tmp_path)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in files) == [
        "csv/qos_mix.csv",
        "summary.json",
    ]
    with pytest.raises(emr.EmrError, match=r"summary\.json missing"):
        emr.fetch_report(s3, BUCKET, "reports/none", tmp_path)


def test_cli_archive_on_emr_submits_and_waits(
    aws: tuple[Any, Any, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, _, app_id = aws
    outputs = _write(
        tmp_path / "outputs.json",
        json.dumps(
            {
                "archive_bucket": BUCKET,
                "emr_application_id": app_id,
                "emr_job_role_arn": ROLE,
                "kafka_bootstrap": "b-1.msk:9098",
                "region": REGION,
            }
        ).encode(),
    )
    monkeypatch.setenv("CORMORANT_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("CORMORANT_KAFKA_SASL_MECHANISM", "OAUTHBEARER")  # MSK IAM
    monkeypatch.setenv("CORMORANT_TOPIC_PREFIX", "prod.")
    result = CliRunner().invoke(
        main, ["analytics", "archive", "--emr", "--stack-outputs", str(outputs)]
    )
    assert result.exit_code == 0, result.output
    assert "SUCCESS" in result.output
    [run] = client.list_job_runs(applicationId=app_id)["jobRuns"]
    driver = client.get_job_run(applicationId=app_id, jobRunId=run["id"])["jobRun"]["jobDriver"]
    arguments = driver["sparkSubmit"]["entryPointArguments"]
    assert arguments[:2] == ["--archive", f"s3://{BUCKET}/archive"]
    topics = json.loads(arguments[arguments.index("--topics") + 1])
    assert topics["msg_all"] == "prod.msg.all"
    options = json.loads(arguments[arguments.index("--kafka-options") + 1])
    assert options["kafka.bootstrap.servers"] == "b-1.msk:9098"
    assert options["kafka.sasl.mechanism"] == "AWS_MSK_IAM"
    # A first run over a large backlog commits in bounded micro-batches.
    batch = arguments[arguments.index("--max-records-per-batch") + 1]
    assert batch == str(AnalyticsSettings().archive_max_records_per_batch)
    jars = driver["sparkSubmit"]["sparkSubmitParameters"].split(" ")[3].split(",")
    assert any("spark-sql-kafka-0-10_2.12-3.5.7.jar" in j for j in jars)
    assert any("aws-msk-iam-auth" in j for j in jars)


def test_cli_archive_on_emr_with_scram_passes_the_secret_not_the_password(
    aws: tuple[Any, Any, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, _, app_id = aws
    secret_arn = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:AmazonMSK_cormorant-x"
    outputs = _write(
        tmp_path / "outputs.json",
        json.dumps(
            {
                "archiveBucket": BUCKET,
                "emrApplicationId": app_id,
                "emrJobRoleArn": ROLE,
                "kafkaBootstrap": "b-1.msk:9096",
                "kafkaScramSecretArn": secret_arn,
                "region": REGION,
            }
        ).encode(),
    )
    for name, value in {
        "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "KAFKA_SASL_USERNAME": "cormorant",
        "KAFKA_SASL_PASSWORD": "local-secret",
        "KAFKA_SSL_CAFILE": str(tmp_path / "local-ca.pem"),
    }.items():
        monkeypatch.setenv(f"CORMORANT_{name}", value)
    result = CliRunner().invoke(
        main, ["analytics", "archive", "--emr", "--stack-outputs", str(outputs)]
    )
    assert result.exit_code == 0, result.output
    [run] = client.list_job_runs(applicationId=app_id)["jobRuns"]
    driver = client.get_job_run(applicationId=app_id, jobRunId=run["id"])["jobRun"]["jobDriver"]
    arguments = driver["sparkSubmit"]["entryPointArguments"]
    assert arguments[arguments.index("--kafka-secret-arn") + 1] == secret_arn
    # TLS only: the driver adds the SCRAM login from the secret; no local CA file on EMR.
    options = json.loads(arguments[arguments.index("--kafka-options") + 1])
    assert options == {
        "kafka.bootstrap.servers": "b-1.msk:9096",
        "kafka.security.protocol": "SSL",
    }
    assert "local-secret" not in json.dumps(driver)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_cli_without_an_emr_target_says_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("EMR_APPLICATION_ID", "EMR_JOB_ROLE_ARN", "ARCHIVE_BUCKET"):
        monkeypatch.delenv(f"CORMORANT_{name}", raising=False)
    result = CliRunner().invoke(main, ["analytics", "archive", "--emr"])
    assert result.exit_code == 1
    assert "missing application_id, job_role_arn, bucket" in result.output
    assert "Traceback" not in result.output


def test_cli_schedule_starts_the_archive_every_n_minutes_within_the_retention(
    aws: tuple[Any, Any, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, _, app_id = aws
    scheduler = boto3.client("scheduler", region_name=REGION)
    scheduler.create_schedule_group(Name="cormorant-prod-analytics")
    scheduler_role = "arn:aws:iam::123456789012:role/cormorant-prod-archive-schedule"
    outputs = _write(
        tmp_path / "outputs.json",
        json.dumps(
            {
                "archiveBucket": BUCKET,
                "emrApplicationId": app_id,
                "emrJobRoleArn": ROLE,
                "kafkaBootstrap": "b-1.msk:9098",
                "region": REGION,
                "archiveScheduleGroup": "cormorant-prod-analytics",
                "archiveSchedulerRoleArn": scheduler_role,
            }
        ).encode(),
    )
    monkeypatch.setenv("CORMORANT_DOWNLINK_RETENTION_SECONDS", "3600")
    command = ["analytics", "schedule", "--stack-outputs", str(outputs)]
    # Downlink topics keep one hour: runs 45 minutes apart leave no room for a late run.
    result = CliRunner().invoke(main, [*command, "--every", "45"])
    assert result.exit_code == 2
    assert "at most 30 min apart" in result.output
    assert not scheduler.list_schedules()["Schedules"]

    result = CliRunner().invoke(main, [*command, "--every", "15"])
    assert result.exit_code == 0, result.output
    found = scheduler.get_schedule(Name=emr.ARCHIVE_SCHEDULE, GroupName="cormorant-prod-analytics")
    assert found["ScheduleExpression"] == "rate(15 minutes)"
    assert found["Target"]["Arn"] == "arn:aws:scheduler:::aws-sdk:emrserverless:startJobRun"
    assert found["Target"]["RoleArn"] == scheduler_role
    body = json.loads(found["Target"]["Input"])
    assert body["ApplicationId"] == app_id and body["ExecutionRoleArn"] == ROLE
    assert body["ClientToken"] == "<aws.scheduler.execution-id>"
    submit = body["JobDriver"]["SparkSubmit"]
    assert submit["EntryPoint"].startswith(f"s3://{BUCKET}/cormorant/emr/")
    assert submit["EntryPoint"].endswith("/archive.py")
    assert submit["EntryPointArguments"][:2] == ["--archive", f"s3://{BUCKET}/archive"]
    assert submit["EntryPointArguments"][-2] == "--max-records-per-batch"
    assert f"PYSPARK_PYTHON={emr.IMAGE_PYTHON}" in submit["SparkSubmitParameters"]
    # The staged files are there for every scheduled start.
    s3 = boto3.client("s3", region_name=REGION)
    key = submit["EntryPoint"].removeprefix(f"s3://{BUCKET}/")
    assert s3.head_object(Bucket=BUCKET, Key=key)["ContentLength"] > 0
    # Scheduling again updates the one schedule.
    result = CliRunner().invoke(main, [*command, "--every", "20"])
    assert result.exit_code == 0, result.output
    [only] = scheduler.list_schedules()["Schedules"]
    assert (
        scheduler.get_schedule(Name=only["Name"], GroupName=only["GroupName"])["ScheduleExpression"]
        == "rate(20 minutes)"
    )
