"""A deployed stack's outputs: what ``pulumi stack output --json`` prints for infra/.

``cormorant cloud`` reads them to find the deployment's resources; infra/ builds its outputs
under these names (its tests check that they parse here), so the two never drift apart.
"""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel


class OutputsError(ValueError):
    """The stack outputs are not JSON, or lack what ``cormorant cloud`` needs (named)."""


class StackOutputs(BaseModel):
    """The outputs of a Cormorant stack (camelCase in JSON: ``ecsCluster``).

    ``region``: the AWS region; ``ecs_cluster`` and ``ecs_services`` (names);
    ``target_group_arns`` (the NLB's); ``msk_cluster_arn``; ``redis_replication_group_id``;
    ``db_instance_identifier``; ``emr_application_id``; the one-off tasks
    (``topics_task_definition`` and ``migrate_task_definition`` ARNs, the latter absent
    from stacks of earlier releases; ``task_subnet_ids``, ``task_security_group_id``);
    ``log_groups`` (service command → CloudWatch log group); and what users connect to:
    ``mqtt_endpoints``, ``kafka_bootstrap``, ``archive_bucket``. What ``cormorant cloud
    doctor`` also checks, absent from stacks of earlier releases: ``service_image`` (the
    ``<repository>@sha256:...`` every task runs), ``topic_prefix``, ``alarm_topic_arn`` and
    ``alarm_name_prefix`` (the stack's alarms' names start with it),
    ``admin_credentials_secret_arn`` and ``kafka_scram_secret_arn``.
    """

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True
    )

    region: str
    ecs_cluster: str
    ecs_services: list[str]
    target_group_arns: list[str]
    msk_cluster_arn: str
    redis_replication_group_id: str
    db_instance_identifier: str
    emr_application_id: str
    topics_task_definition: str
    migrate_task_definition: str | None = None
    task_subnet_ids: list[str]
    task_security_group_id: str
    log_groups: dict[str, str]
    mqtt_endpoints: list[str]
    kafka_bootstrap: str
    archive_bucket: str
    service_image: str | None = None
    topic_prefix: str = ""
    alarm_topic_arn: str | None = None
    alarm_name_prefix: str | None = None
    admin_credentials_secret_arn: str | None = None
    kafka_scram_secret_arn: str | None = None

    @classmethod
    def parse(cls, text: str) -> StackOutputs:
        """Parse ``pulumi stack output --json`` text. Raises :class:`OutputsError` naming
        each missing or malformed output."""
        try:
            document = json.loads(text)
        except json.JSONDecodeError as exc:
            raise OutputsError(f"stack outputs are not JSON: {exc}") from None
        try:
            return cls.model_validate(document)
        except ValidationError as exc:
            problems = ", ".join(
                f"{'.'.join(str(p) for p in error['loc'])} ({error['msg'].lower()})"
                for error in exc.errors()
            )
            raise OutputsError(
                f"stack outputs lack what cormorant cloud needs: {problems} "
                "(is this `pulumi stack output --json` of Cormorant's infra/?)"
            ) from None
