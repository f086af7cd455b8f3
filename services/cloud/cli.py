"""``cormorant cloud``: the deployed stack from the command line (status, doctor, the one-off
tasks).

Every command reads the stack's outputs, ``pulumi stack output --json`` of infra/, from a
file or standard input, and uses the AWS credentials of the environment (profile, variables
or role), in the stack's region.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import IO, Any

import click

from services.cli_common import deprecated_option
from services.cloud.outputs import OutputsError, StackOutputs


def _outputs_options(command: Callable[..., Any]) -> Callable[..., Any]:
    command = deprecated_option(
        "--outputs",
        "--stack-outputs",
        "old_outputs_file",
        type=click.File("r"),
        help="Deprecated: --stack-outputs.",
    )(command)
    return click.option(
        "--stack-outputs",
        "outputs_file",
        type=click.File("r"),
        help="The stack's outputs: `pulumi stack output --json` saved to a file, or - for "
        "standard input.",
    )(command)


def _read_outputs(source: IO[str] | None, old_source: IO[str] | None) -> StackOutputs:
    if source is not None and old_source is not None:
        raise click.UsageError("--stack-outputs and --outputs exclude each other")
    source = source or old_source
    if source is None:
        raise click.UsageError("missing option --stack-outputs (pulumi stack output --json)")
    try:
        return StackOutputs.parse(source.read())
    except OutputsError as exc:
        raise click.ClickException(str(exc)) from exc


@click.group()
def cloud() -> None:
    """Cormorant deployed on AWS with infra/ (Pulumi)."""


@cloud.command()
@_outputs_options
@click.option("--json", "as_json", is_flag=True, help="Print the checks as a JSON list.")
def status(outputs_file: IO[str] | None, old_outputs_file: IO[str] | None, as_json: bool) -> None:
    """Check every part of the deployed stack: ECS services, NLB targets, MSK, ElastiCache,
    RDS, EMR Serverless. Exits with status 1 when any part is not ok."""
    from botocore.exceptions import BotoCoreError

    from services.cloud.status import Clients, stack_status

    outputs = _read_outputs(outputs_file, old_outputs_file)
    try:
        checks = stack_status(outputs, Clients.for_region(outputs.region))
    except BotoCoreError as exc:
        raise click.ClickException(f"cannot ask AWS ({outputs.region}): {exc}") from exc
    if as_json:
        click.echo(json.dumps([check.as_dict() for check in checks], indent=2))
    else:
        rows = [("PART", "NAME", "OK", "STATE", "DETAIL")] + [
            (c.part, c.name, "ok" if c.ok else "NOT OK", c.state, c.detail) for c in checks
        ]
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            click.echo(
                "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            )
    if not all(check.ok for check in checks):
        sys.exit(1)


@cloud.command()
@_outputs_options
@click.option("--json", "as_json", is_flag=True, help="Print the findings as a JSON list.")
def doctor(outputs_file: IO[str] | None, old_outputs_file: IO[str] | None, as_json: bool) -> None:
    """Check that the deployed stack is ready for devices, with a hint for each failure:
    ECS services steady on the stack's image, the image in ECR, NLB targets healthy, MSK
    ACTIVE with its topics, ElastiCache and RDS available, alarms wired to a confirmed
    subscription, secrets present (never their values). One line per check; exits with
    status 1 on any FAIL."""
    from botocore.exceptions import BotoCoreError

    from services.cloud.doctor import DoctorClients, diagnose

    outputs = _read_outputs(outputs_file, old_outputs_file)
    try:
        findings = diagnose(outputs, DoctorClients.for_region(outputs.region))
    except BotoCoreError as exc:
        raise click.ClickException(f"cannot ask AWS ({outputs.region}): {exc}") from exc
    if as_json:
        click.echo(json.dumps([finding.as_dict() for finding in findings], indent=2))
    else:
        for finding in findings:
            click.echo(finding.line())
    if not all(finding.ok for finding in findings):
        sys.exit(1)


def _run_one_off(
    outputs_file: IO[str] | None,
    old_outputs_file: IO[str] | None,
    timeout: float,
    command: str,
    done: str,
) -> None:
    """Run the stack's one-off task with ``command`` (a service command of the image, on
    Fargate in the stack's network), wait up to ``timeout`` seconds for it, and print
    ``done`` with the task and where its log is. Raises :class:`click.ClickException`
    when the task fails or AWS refuses."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    from services.cloud.topics_task import TaskFailed, run_topics_task

    outputs = _read_outputs(outputs_file, old_outputs_file)
    ecs = boto3.client("ecs", region_name=outputs.region)
    try:
        result = run_topics_task(ecs, outputs, timeout, command)
    except (TaskFailed, ClientError, BotoCoreError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"{done} (task {result.task_arn})")
    click.echo(f"logs: {result.log_group} {result.log_stream}")


_TIMEOUT = click.option(
    "--timeout", type=float, default=600.0, show_default=True, help="Seconds to wait for the task."
)


@cloud.command("create-topics")
@_outputs_options
@_TIMEOUT
def create_topics(
    outputs_file: IO[str] | None, old_outputs_file: IO[str] | None, timeout: float
) -> None:
    """Run the stack's one-off topics task (`cormorant create-topics` on Fargate, in the
    stack's network) and wait until it has created the Kafka topics."""
    from services.command_names import TOPICS_COMMAND

    _run_one_off(outputs_file, old_outputs_file, timeout, TOPICS_COMMAND, "topics created")


@cloud.command("migrate-db")
@_outputs_options
@_TIMEOUT
def migrate_db(
    outputs_file: IO[str] | None, old_outputs_file: IO[str] | None, timeout: float
) -> None:
    """Run the stack's one-off migration task (`cormorant migrate-db` on Fargate): the
    PostgreSQL schema, and the services' own role with the password in its secret."""
    from services.command_names import MIGRATE_COMMAND

    _run_one_off(outputs_file, old_outputs_file, timeout, MIGRATE_COMMAND, "database migrated")
