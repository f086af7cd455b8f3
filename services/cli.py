"""The ``cormorant`` command: run one service, or manage the local cluster.

Every service reads its settings from ``CORMORANT_*`` environment variables or the settings
file (see :mod:`services.common.settings`); options given here override them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import click

from services.api_keys_cli import api_keys
from services.blocked_cli import blocked
from services.cli_common import PASSWORD_FILE_HELP, alias, deprecated_option, read_secret
from services.cloud.cli import cloud
from services.command_names import (
    ADMIN_COMMAND,
    INTEGRATIONS_COMMAND,
    MIGRATE_COMMAND,
    TOPICS_COMMAND,
)
from services.common.versions import cormorant_version
from services.credentials_cli import credentials
from services.integrations_cli import integrations
from services.local.cli import down, fetch_kafka, status, up
from services.ops_cli import COMMANDS as OPERATOR_COMMANDS
from spark_emr.cli import analytics


def _apply(**overrides: object) -> None:
    """Export command-line overrides as ``CORMORANT_*`` variables before settings are read."""
    for name, value in overrides.items():
        if value is not None:
            os.environ[f"CORMORANT_{name.upper()}"] = str(value)


@click.group()
@click.version_option(cormorant_version(), prog_name="cormorant", message="%(prog)s %(version)s")
def main() -> None:
    """Cormorant: a Kafka-backed, horizontally scalable MQTT broker."""


@main.command()
@click.option("--node-id", help="This node's id (names its downlink topic).")
@click.option("--host", "mqtt_host", help="Address to bind the MQTT listener to.")
@click.option("--port", "mqtt_port", type=int, help="Port of the MQTT listener.")
@click.option(
    "--node-id-from-pool",
    is_flag=True,
    help="Claim a node id (ingest-1 ... ingest-<ingest_node_pool_size>) leased in "
    "PostgreSQL, so that every task of an autoscaled service is a node of its own and "
    "their downlink topics stay as few as the pool's ids.",
)
def ingest(
    node_id: str | None, mqtt_host: str | None, mqtt_port: int | None, node_id_from_pool: bool
) -> None:
    """Run an ingest node: the MQTT listener (connection container) of one node."""
    lease = None
    if node_id_from_pool:
        if node_id is not None:
            raise click.UsageError("--node-id and --node-id-from-pool exclude each other")
        from services.common.settings import Settings
        from services.common.stores.base import StoreUnavailable
        from services.ingest.node_lease import PoolExhausted, claim_node_id

        try:
            lease = claim_node_id(Settings())
        except (PoolExhausted, StoreUnavailable) as exc:
            raise click.ClickException(str(exc)) from exc
        node_id = lease.node_id
    _apply(node_id=node_id, mqtt_host=mqtt_host, mqtt_port=mqtt_port)
    from services.ingest.main import run

    run(lease)


@main.command()
def router() -> None:
    """Run a router: matches msg.all against subscriptions, writes downlink records."""
    from services.router.main import run

    run()


@main.command("device-persist")
def device_persist() -> None:
    """Run device_persist: stored messages of persistent DEVICE sessions (Redis/PostgreSQL)."""
    from services.device_persist.main import run

    run()


@main.command("app-delivery")
def app_delivery() -> None:
    """Run app_delivery: APPLICATION clients' messages from their Kafka topics."""
    from services.app_delivery.main import run

    run()


@main.command(INTEGRATIONS_COMMAND)
def integrations_stage() -> None:
    """Run the integrations stage: matching messages into other systems (a Kafka topic of
    another cluster), as `cormorant integrations` defines them."""
    from services.integrations.main import run

    run()


@main.command(ADMIN_COMMAND)
@click.option("--host", "admin_host", help="Address to bind (default: loopback).")
@click.option("--port", "admin_port", type=int, help="Port of the API and console.")
def admin(admin_host: str | None, admin_port: int | None) -> None:
    """Run the admin service: the REST API (/api, /docs) and the web console (/)."""
    _apply(admin_host=admin_host, admin_port=admin_port)
    from services.admin.main import run

    run()


@main.group("admin-users")
def admin_users() -> None:
    """Manage the admin API's users (kept in PostgreSQL, passwords as argon2id hashes)."""


def _users_call(call: str, *args: str) -> object:
    import asyncio

    from services.admin.main import users_of
    from services.admin.users import UserError
    from services.common.settings import get_settings
    from services.common.stores.base import StoreUnavailable

    async def go() -> object:
        users = users_of(get_settings())
        try:
            return await getattr(users, call)(*args)
        finally:
            await users.pool.close()

    try:
        return asyncio.run(go())
    except (UserError, StoreUnavailable) as exc:
        raise click.ClickException(str(exc)) from exc


def _new_password(password_file: str | None, password_stdin: bool) -> str:
    """The new password: from ``--password-file`` (or the deprecated ``--password-stdin``),
    else asked for twice."""
    if password_stdin:
        if password_file is not None:
            raise click.UsageError("--password-file and --password-stdin exclude each other")
        password_file = "-"
    if password_file is not None:
        return read_secret(password_file).decode("utf-8", "surrogateescape")
    password: str = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    return password


def _password_options(command: Callable[..., Any]) -> Callable[..., Any]:
    command = deprecated_option(
        "--password-stdin", "--password-file -", is_flag=True, help="Deprecated: --password-file -."
    )(command)
    return click.option(
        "--password-file", type=click.Path(allow_dash=True), help=PASSWORD_FILE_HELP
    )(command)


@admin_users.command("add")
@click.argument("username")
@_password_options
def admin_users_add(username: str, password_file: str | None, password_stdin: bool) -> None:
    """Create admin user USERNAME (the password is asked for twice without --password-file)."""
    _users_call("add", username, _new_password(password_file, password_stdin))
    click.echo(f"admin user {username} created")


@admin_users.command("set-password")
@click.argument("username")
@_password_options
def admin_users_set_password(
    username: str, password_file: str | None, password_stdin: bool
) -> None:
    """Change USERNAME's password (its tokens are revoked)."""
    _users_call("set_password", username, _new_password(password_file, password_stdin))
    click.echo(f"password of {username} changed")


@admin_users.command("delete")
@click.argument("username")
def admin_users_delete(username: str) -> None:
    """Delete admin user USERNAME and its tokens."""
    if not _users_call("remove", username):
        raise click.ClickException(f"no admin user {username}")
    click.echo(f"admin user {username} deleted")


admin_users.add_command(alias(admin_users_delete, "remove", "admin-users delete"))


@admin_users.command("list")
@click.option("--json", "as_json", is_flag=True, help='Print JSON: {"usernames": [...]}.')
def admin_users_list(as_json: bool) -> None:
    """List the admin users, by name."""
    names = _users_call("names")
    assert isinstance(names, list)
    if as_json:
        click.echo(json.dumps({"usernames": names}))
    elif not names:
        click.echo("no admin users (cormorant admin-users add NAME creates one)")
    else:
        for name in names:
            click.echo(name)


@main.command(TOPICS_COMMAND)
@click.option(
    "--timeout",
    type=float,
    default=120.0,
    show_default=True,
    help="Seconds to wait for Kafka to answer before giving up.",
)
def create_topics(timeout: float) -> None:
    """Create Cormorant's core Kafka topics that do not exist yet, then exit.

    Names, partitions and configs come from the settings (CORMORANT_TOPIC_PREFIX, the
    partition counts, CORMORANT_REPLICATION_FACTOR); existing topics are left as they are.
    Exits with status 1 when Kafka cannot be reached or refuses a topic.
    """
    import asyncio

    from aiokafka.errors import KafkaError

    from services.common.kafka.admin import core_topic_specs, ensure_topics, wait_for_kafka
    from services.common.kafka.security import client_security
    from services.common.settings import get_settings

    settings = get_settings()
    specs = core_topic_specs(settings)
    security = client_security(settings)

    async def create() -> list[str]:
        await wait_for_kafka(settings.kafka_bootstrap, timeout=timeout, security=security)
        return await ensure_topics(
            settings.kafka_bootstrap, specs, settings.replication_factor, security=security
        )

    try:
        created = asyncio.run(create())
    except (KafkaError, TimeoutError) as exc:
        raise click.ClickException(f"creating topics at {settings.kafka_bootstrap}: {exc}") from exc
    for spec in specs:
        state = "created" if spec.name in created else "exists"
        click.echo(f"{spec.name}  partitions={spec.partitions}  {state}")


@main.command(MIGRATE_COMMAND)
@click.option("--role", default="cormorant", show_default=True, help="The services' role.")
@click.option("--rotate", is_flag=True, help="Generate and set a new password for the role.")
def migrate_db(role: str, rotate: bool) -> None:
    """Apply the PostgreSQL schema migrations as the database owner (postgres_dsn and its
    password: on AWS the RDS master user), then create or update the services' own
    least-privilege role with the password in postgres_service_password_secret_arn.
    Exits with status 1 on failure.
    """
    import psycopg

    from services.cloud.migrate_db import MigrationFailed, run_migration
    from services.common.settings import get_settings

    settings = get_settings()
    secret_arn = settings.postgres_service_password_secret_arn
    if secret_arn is None:
        raise click.UsageError("CORMORANT_POSTGRES_SERVICE_PASSWORD_SECRET_ARN is not set")
    try:
        result = run_migration(settings, secret_arn, role, rotate)
    except (MigrationFailed, psycopg.Error) as exc:
        raise click.ClickException(f"migrating the database: {exc}") from exc
    applied = ", ".join(map(str, result.applied)) or "none pending"
    password = "a new password, stored in its secret" if result.generated else "its stored password"
    click.echo(f"migrations applied: {applied}; role {role}: {password}")


@main.command("settings")
def show_settings() -> None:
    """List every setting: environment variable, current value and meaning (the services'
    run-time settings first, then the local cluster launcher's, then the analytics')."""
    from services.common.settings import Settings
    from services.local.settings import LocalSettings
    from spark_emr.settings import AnalyticsSettings

    current = AnalyticsSettings()
    sections = {
        "services": list(Settings.model_fields),
        "local cluster": [n for n in LocalSettings.model_fields if n not in Settings.model_fields],
        "analytics": [
            n for n in AnalyticsSettings.model_fields if n not in LocalSettings.model_fields
        ],
    }
    for title, names in sections.items():
        click.echo(f"# {title}")
        for name in names:
            value = getattr(current, name)
            click.echo(f"CORMORANT_{name.upper()}={'' if value is None else value}")
            description = AnalyticsSettings.model_fields[name].description
            if description:
                click.echo(f"    {description}")


main.add_command(up)
main.add_command(down)
main.add_command(status)
main.add_command(fetch_kafka)
main.add_command(cloud)
main.add_command(analytics)
main.add_command(credentials)
main.add_command(blocked)
main.add_command(api_keys)
main.add_command(integrations)
for _command in OPERATOR_COMMANDS:
    main.add_command(_command)

if __name__ == "__main__":
    main()
