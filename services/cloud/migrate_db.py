"""``cormorant migrate-db``: the one-off migration task of a deployment (issue 24, finding 3).

Run by ECS (infra/ compute; ``cormorant cloud migrate-db`` starts it) after each deployment,
it logs in as the RDS master user (``postgres_dsn`` and ``postgres_password_secret_arn``:
the RDS-managed secret, read when the task starts), applies the schema migrations and
creates or updates the services' own role (:mod:`services.common.stores.service_role`)
with the password kept in the role's Secrets Manager secret. When that secret has no value
yet (the first run), or with ``--rotate``, a new password is generated and stored there
first, then set on the role: a service connection that tries the new password before the
role has it is refused, and the pool tries again with the secret read again. If the task
fails between the two, running it again (without ``--rotate``) sets the stored password.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import psycopg

from services.common.settings import Settings
from services.common.stores.postgres_pool import (
    SecretsManagerPassword,
    connection_options,
    password_of,
)
from services.common.stores.service_role import (
    migrate_and_grant,
    new_password,
    secret_document,
)


class MigrationFailed(RuntimeError):
    """The migration task could not read or store the service secret, or PostgreSQL refused
    a statement (the message names the secret or the server, never a password)."""


@dataclass(frozen=True, slots=True)
class MigrationResult:
    """What a run did: the migration versions ``applied``, and whether the service role's
    password was ``generated`` (first run or ``--rotate``)."""

    applied: list[int]
    generated: bool


def _stored_password(secrets: Any, secret_arn: str) -> str | None:
    """The password in service secret ``secret_arn``, or None if it has no value yet."""
    try:
        answer = secrets.get_secret_value(SecretId=secret_arn)
    except secrets.exceptions.ResourceNotFoundException:
        return None
    try:
        password = json.loads(answer["SecretString"])["password"]
    except (KeyError, ValueError, TypeError):
        return None
    return password if isinstance(password, str) and password else None


async def migrate_database(
    conn: psycopg.AsyncConnection[Any],
    secrets: Any,
    secret_arn: str,
    role: str,
    rotate: bool = False,
) -> MigrationResult:
    """Migrate on ``conn`` (the master user's, outside a transaction) and set role
    ``role``'s password from secret ``secret_arn`` (``secrets``: a boto3 Secrets Manager
    client), generating and storing a new one first if the secret has none or ``rotate``.

    Raises :class:`MigrationFailed` naming the secret when Secrets Manager refuses, and
    ``psycopg.Error`` when PostgreSQL does.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        password = (
            None if rotate else await asyncio.to_thread(_stored_password, secrets, secret_arn)
        )
        generated = password is None
        if password is None:
            password = new_password()
            document = secret_document(role, password)
            await asyncio.to_thread(
                secrets.put_secret_value, SecretId=secret_arn, SecretString=document
            )
    except (BotoCoreError, ClientError) as exc:
        raise MigrationFailed(f"service secret {secret_arn}: {type(exc).__name__}: {exc}") from None
    applied = await migrate_and_grant(conn, role, password)
    return MigrationResult(applied, generated)


async def connect_as_owner(settings: Settings) -> psycopg.AsyncConnection[Any]:
    """An autocommit connection to ``settings.postgres_dsn`` with its password (read from
    ``postgres_password_secret_arn`` when set) and TLS. Raises ``psycopg.OperationalError``."""
    password = password_of(settings)
    fixed = None if isinstance(password, SecretsManagerPassword) else password
    options = connection_options(
        settings.store_timeout_seconds, fixed, settings.postgres_sslmode,
        settings.postgres_sslrootcert,
    )  # fmt: skip
    if isinstance(password, SecretsManagerPassword):
        options["password"] = await asyncio.to_thread(password.read)
    return await psycopg.AsyncConnection.connect(settings.postgres_dsn, autocommit=True, **options)


def run_migration(settings: Settings, secret_arn: str, role: str, rotate: bool) -> MigrationResult:
    """The task's body (blocking): connect as the owner, :func:`migrate_database`, close.
    Raises :class:`MigrationFailed` or ``psycopg.Error``."""
    import boto3

    region = secret_arn.split(":")[3]
    secrets = boto3.client("secretsmanager", region_name=region)

    async def go() -> MigrationResult:
        conn = await connect_as_owner(settings)
        try:
            return await migrate_database(conn, secrets, secret_arn, role, rotate)
        finally:
            await conn.close()

    return asyncio.run(go())
