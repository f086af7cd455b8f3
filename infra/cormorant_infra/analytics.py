"""Analytics: the S3 archive of the message stream and the EMR Serverless application of spark_emr/.

The archive bucket is versioned, encrypted (SSE-KMS with the S3 bucket key), closed to
the public, reachable over TLS only, and ages its objects into cheaper storage
(``archiveInfrequentAccessDays``); ``archiveExpirationDays`` expires job logs and reports
only, never the archive's files (its ``_spark_metadata`` lists them). The EMR Serverless
Spark application runs the release whose Spark matches the version the Spark jobs pin
(checked by :mod:`cormorant_infra.config`) in the jobs' own image (an ECR repository of
this stack, tag ``imageTag``: Python 3.11 and the jobs' dependencies), in the private
subnets so it reaches MSK, stopping itself when idle. Its job role may use the archive
bucket and read Kafka (and, from :mod:`cormorant_infra.lakehouse`, the Glue database),
nothing else.
"""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from cormorant_infra import iam
from cormorant_infra.config import StackConfig
from cormorant_infra.kafka import Kafka
from cormorant_infra.network import Network

IDLE_STOP_MINUTES = 15
"""EMR Serverless stops the application's workers after this long without a job."""

EXPIRING_PREFIXES = ("emr-logs/", "reports/")
"""The bucket's prefixes that ``archiveExpirationDays`` applies to (spark_emr.emr's
LOGS_PREFIX and REPORTS_PREFIX): never the archive, whose files its metadata lists."""


class Analytics(pulumi.ComponentResource):
    """The archive bucket, the EMR Serverless application and its job runtime role.

    Attributes: ``bucket_name``, ``bucket_arn``, ``application_id``, ``application_arn``,
    ``job_role_arn``, ``job_role_name``,
    ``image_uri`` (the jobs' image: its ECR repository and the release's ``imageTag``).
    """

    def __init__(
        self,
        name: str,
        config: StackConfig,
        network: Network,
        kafka: Kafka,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("cormorant:analytics:Analytics", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        bucket = aws.s3.Bucket(
            f"{name}-archive",
            bucket_prefix=f"{name}-archive-",
            opts=pulumi.ResourceOptions(parent=self, protect=config.production),
        )
        aws.s3.BucketVersioning(
            f"{name}-archive",
            bucket=bucket.id,
            versioning_configuration={"status": "Enabled"},
            opts=child,
        )
        aws.s3.BucketServerSideEncryptionConfiguration(
            f"{name}-archive",
            bucket=bucket.id,
            rules=[
                {
                    "apply_server_side_encryption_by_default": {"sse_algorithm": "aws:kms"},
                    "bucket_key_enabled": True,
                }
            ],
            opts=child,
        )
        aws.s3.BucketPublicAccessBlock(
            f"{name}-archive",
            bucket=bucket.id,
            block_public_acls=True,
            block_public_policy=True,
            ignore_public_acls=True,
            restrict_public_buckets=True,
            opts=child,
        )
        aws.s3.BucketOwnershipControls(
            f"{name}-archive",
            bucket=bucket.id,
            rule={"object_ownership": "BucketOwnerEnforced"},
            opts=child,
        )
        aws.s3.BucketPolicy(
            f"{name}-archive",
            bucket=bucket.id,
            policy=iam.document(
                [
                    {
                        "Sid": "TlsOnly",
                        "Effect": "Deny",
                        "Principal": "*",
                        "Action": "s3:*",
                        "Resource": [bucket.arn, pulumi.Output.concat(bucket.arn, "/*")],
                        "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                    }
                ]
            ),
            opts=child,
        )
        # The archive's files live as long as the file sink's _spark_metadata lists them:
        # an expiration under it would delete files that every later read opens (and fails
        # on). Only what nothing lists expires: job logs, fetched reports, Athena results.
        rules = [
            aws.s3.BucketLifecycleConfigurationRuleArgs(
                id="age",
                status="Enabled",
                filter=aws.s3.BucketLifecycleConfigurationRuleFilterArgs(),
                transitions=[
                    aws.s3.BucketLifecycleConfigurationRuleTransitionArgs(
                        days=config.archive_infrequent_access_days, storage_class="STANDARD_IA"
                    )
                ],
                noncurrent_version_expiration=(
                    aws.s3.BucketLifecycleConfigurationRuleNoncurrentVersionExpirationArgs(
                        noncurrent_days=30
                    )
                ),
                abort_incomplete_multipart_upload=(
                    aws.s3.BucketLifecycleConfigurationRuleAbortIncompleteMultipartUploadArgs(
                        days_after_initiation=7
                    )
                ),
            )
        ]
        if config.archive_expiration_days is not None:
            rules += [
                aws.s3.BucketLifecycleConfigurationRuleArgs(
                    id=f"expire-{prefix.rstrip('/')}",
                    status="Enabled",
                    filter=aws.s3.BucketLifecycleConfigurationRuleFilterArgs(prefix=prefix),
                    expiration=aws.s3.BucketLifecycleConfigurationRuleExpirationArgs(
                        days=config.archive_expiration_days
                    ),
                )
                for prefix in EXPIRING_PREFIXES
            ]
        aws.s3.BucketLifecycleConfiguration(
            f"{name}-archive", bucket=bucket.id, rules=rules, opts=child
        )

        # The jobs' image (spark_emr/image/Dockerfile), pushed with the release's image tag;
        # EMR Serverless pulls it with its service principal (the repository policy).
        repository = aws.ecr.Repository(
            f"{name}-spark-image",
            image_tag_mutability="IMMUTABLE",
            image_scanning_configuration={"scan_on_push": True},
            opts=child,
        )
        aws.ecr.RepositoryPolicy(
            f"{name}-spark-image",
            repository=repository.name,
            policy=json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {
                            "Sid": "EmrServerlessPull",
                            "Effect": "Allow",
                            "Principal": {"Service": "emr-serverless.amazonaws.com"},
                            "Action": [
                                "ecr:BatchGetImage",
                                "ecr:DescribeImages",
                                "ecr:GetDownloadUrlForLayer",
                            ],
                        }
                    ],
                }
            ),
            opts=child,
        )
        image_uri = pulumi.Output.concat(repository.repository_url, ":", config.image_tag)

        application = aws.emrserverless.Application(
            f"{name}-spark",
            name=f"{name}-spark",
            type="spark",
            release_label=config.emr_release_label,
            network_configuration={
                "subnet_ids": network.private_subnet_ids,
                "security_group_ids": [network.security_groups["analytics"]],
            },
            maximum_capacity={
                "cpu": f"{config.emr_max_vcpu} vCPU",
                "memory": f"{config.emr_max_memory_gib} GB",
            },
            image_configuration={"image_uri": image_uri},
            auto_start_configuration={"enabled": True},
            auto_stop_configuration={"enabled": True, "idle_timeout_minutes": IDLE_STOP_MINUTES},
            opts=child,
        )

        statements = [
            iam.allow(["s3:GetBucketLocation", "s3:ListBucket"], [bucket.arn]),
            iam.allow(
                ["s3:DeleteObject", "s3:GetObject", "s3:PutObject"],
                [pulumi.Output.concat(bucket.arn, "/*")],
            ),
            *kafka.iam_statements(config.topic_prefix, write=False),
        ]
        if kafka.secret_arns:
            statements.append(iam.allow(["secretsmanager:GetSecretValue"], kafka.secret_arns))
        if kafka.kms_key_arns:
            statements.append(iam.allow(["kms:Decrypt"], kafka.kms_key_arns))
        role = iam.service_role(
            f"{name}-spark-job", "emr-serverless.amazonaws.com", statements, child
        )

        self.bucket_name: pulumi.Output[str] = bucket.bucket
        self.bucket_arn: pulumi.Output[str] = bucket.arn
        self.application_id: pulumi.Output[str] = application.id
        self.application_arn: pulumi.Output[str] = application.arn
        self.job_role_arn: pulumi.Output[str] = role.arn
        self.job_role_name: pulumi.Output[str] = role.name
        self.image_uri: pulumi.Output[str] = image_uri
        self.register_outputs({"bucket": self.bucket_name, "applicationId": self.application_id})
