"""The analytics pieces of issue 25 under Pulumi's mocks: the Spark jobs' image, an archive
bucket whose lifecycle never deletes what a reader lists, the Glue database and Athena
workgroup of the Iceberg archive with the report's questions saved, and the schedule's
group and role; the stack outputs give ``cormorant analytics`` all of them."""

from __future__ import annotations

import json
from pathlib import Path

from cormorant_infra.lakehouse import ATHENA_ENGINE, glue_database_name
from spark_emr import emr
from spark_emr.athena import QUERIES
from spark_emr.settings import AnalyticsSettings
from tests.infra.mocks import Deployment

APPLICATION = "aws:emrserverless/application:Application"


def test_the_application_runs_the_jobs_image_from_the_stacks_repository(
    deployment: Deployment,
) -> None:
    [repository] = [
        r for r in deployment.of_type("aws:ecr/repository:Repository") if "spark" in r.name
    ]
    image = deployment.one(APPLICATION).inputs["imageConfiguration"]["imageUri"]
    assert image == f"{repository.outputs['repositoryUrl']}:0.1.0"
    assert deployment.outputs["sparkImage"] == image
    assert repository.inputs["imageTagMutability"] == "IMMUTABLE"
    policy = json.loads(
        deployment.one("aws:ecr/repositoryPolicy:RepositoryPolicy").inputs["policy"]
    )
    [statement] = policy["Statement"]
    assert statement["Principal"] == {"Service": "emr-serverless.amazonaws.com"}
    assert set(statement["Action"]) == {
        "ecr:BatchGetImage",
        "ecr:DescribeImages",
        "ecr:GetDownloadUrlForLayer",
    }


def test_the_lifecycle_expires_logs_and_reports_never_the_archive(dev: Deployment) -> None:
    # dev sets archiveExpirationDays 90: before, one rule over the whole bucket deleted the
    # Parquet files that the file sink's _spark_metadata still listed.
    rules = dev.one("aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration").inputs[
        "rules"
    ]
    expiring = [r for r in rules if r.get("expiration")]
    assert sorted(r["filter"]["prefix"] for r in expiring) == [
        f"{emr.LOGS_PREFIX}/",
        f"{emr.REPORTS_PREFIX}/",
    ]
    assert all(r["expiration"]["days"] == 90 for r in expiring)
    [whole_bucket] = [r for r in rules if not r["filter"].get("prefix")]
    assert "expiration" not in whole_bucket
    assert whole_bucket["transitions"] == [{"days": 30, "storageClass": "STANDARD_IA"}]


def test_glue_database_and_athena_workgroup_of_the_iceberg_archive(prod: Deployment) -> None:
    bucket = prod.outputs["archiveBucket"]
    database = prod.one("aws:glue/catalogDatabase:CatalogDatabase").inputs
    assert database["name"] == glue_database_name("cormorant-prod") == "cormorant_prod_archive"
    assert database["locationUri"] == f"s3://{bucket}/{emr.ICEBERG_PREFIX}/"
    assert (
        emr.glue_catalog_conf(bucket)["spark.sql.catalog.glue_catalog.warehouse"]
        == (database["locationUri"])
    )
    workgroup = prod.one("aws:athena/workgroup:Workgroup").inputs["configuration"]
    assert workgroup["enforceWorkgroupConfiguration"] is True
    assert workgroup["engineVersion"]["selectedEngineVersion"] == ATHENA_ENGINE
    assert workgroup["bytesScannedCutoffPerQuery"] > 0
    assert workgroup["resultConfiguration"]["outputLocation"] == f"s3://{bucket}/athena-results/"
    queries = {q.inputs["name"]: q.inputs for q in prod.of_type("aws:athena/namedQuery:NamedQuery")}
    assert set(queries) == {q.name for q in QUERIES}
    for query in QUERIES:
        saved = queries[query.name]
        assert saved["database"] == "cormorant_prod_archive"
        assert saved["workgroup"] == prod.outputs["athenaWorkgroup"]
        assert '"cormorant_prod_archive".' in saved["query"] and "{" not in saved["query"]
        assert "date >= current_date" in saved["query"]  # each reads its partitions only
    # The job role may create and update the database's tables, and nothing else in Glue.
    glue = json.loads(
        prod.named("aws:iam/rolePolicy:RolePolicy", "cormorant-prod-spark-job-glue").inputs[
            "policy"
        ]
    )
    for statement in glue["Statement"]:
        assert all(a.startswith("glue:") for a in statement["Action"])
        for resource in statement["Resource"]:
            assert resource.endswith(("catalog", "database/cormorant_prod_archive", "archive/*"))


def test_the_scheduler_may_only_start_the_archive_job_runs(prod: Deployment) -> None:
    group = prod.one("aws:scheduler/scheduleGroup:ScheduleGroup").inputs
    assert prod.outputs["archiveScheduleGroup"] == group["name"]
    role = prod.named("aws:iam/role:Role", "cormorant-prod-archive-schedule")
    trust = json.loads(role.inputs["assumeRolePolicy"])
    assert trust["Statement"][0]["Principal"] == {"Service": "scheduler.amazonaws.com"}
    assert prod.outputs["archiveSchedulerRoleArn"] == role.outputs["arn"]
    policy = json.loads(
        prod.named("aws:iam/rolePolicy:RolePolicy", "cormorant-prod-archive-schedule").inputs[
            "policy"
        ]
    )
    application = prod.one(APPLICATION).outputs["arn"]
    assert {(tuple(s["Action"]), tuple(s["Resource"])) for s in policy["Statement"]} == {
        (("emr-serverless:StartJobRun",), (application, f"{application}/jobruns/*")),
        (("iam:PassRole",), (prod.outputs["emrJobRoleArn"],)),
    }


def test_the_outputs_give_analytics_its_schedule_and_catalog(
    deployment: Deployment, tmp_path: Path
) -> None:
    path = tmp_path / "outputs.json"
    path.write_text(json.dumps(deployment.outputs), encoding="utf-8")
    settings = AnalyticsSettings.model_construct(kafka_bootstrap="local:9092")
    target = emr.target_from(settings, path)
    assert target.schedule_group == deployment.outputs["archiveScheduleGroup"]
    assert target.scheduler_role_arn == deployment.outputs["archiveSchedulerRoleArn"]
    assert target.glue_database == deployment.outputs["glueDatabase"]
