"""The services' own PostgreSQL role (issue 24, finding 3) on the real PostgreSQL: the
migration task (``cormorant migrate-db``'s :func:`migrate_database`) creates it with least
privilege and its password in a Secrets Manager secret (moto's), a running store logs in as
it, and rotating the password under it leaves its new connections working."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import boto3
import psycopg
import pytest
from moto import mock_aws
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from services.cloud.migrate_db import migrate_database
from services.common.auth.store import CredentialStore
from services.common.stores.base import StoreUnavailable
from services.common.stores.postgres_pool import SecretsManagerPassword
from services.local.postgres import SUPERUSER
from tests.waiting import wait_for


@pytest.fixture
def secrets_manager(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """moto's Secrets Manager (eu-west-1), with dummy credentials."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.setenv(name, "testing")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with mock_aws():
        yield boto3.client("secretsmanager", region_name="eu-west-1")


def _as(dsn: str, user: str) -> str:
    return make_conninfo(**{**conninfo_to_dict(dsn), "user": user})


async def _reads(store: CredentialStore) -> bool:
    try:
        await store.list_all()
    except StoreUnavailable:
        return False
    return True


async def test_migration_task_makes_a_least_privilege_role_whose_rotation_services_follow(
    postgres_server: str, secrets_manager: object
) -> None:
    secrets = secrets_manager
    role = f"svc_{uuid.uuid4().hex[:8]}"
    arn = secrets.create_secret(Name=f"cormorant/{role}")["ARN"]  # type: ignore[attr-defined]
    # The master user's connection (here the local superuser, on RDS the master user).
    owner = await psycopg.AsyncConnection.connect(_as(postgres_server, SUPERUSER), autocommit=True)
    store = CredentialStore(
        _as(postgres_server, role), timeout=3.0, password=SecretsManagerPassword(arn)
    )
    try:
        first = await migrate_database(owner, secrets, arn, role)
        assert first.generated  # the secret had no value: the first run made one
        assert await store.list_all() is not None  # the running service, as its own role

        # Least privilege: rows yes, schema no.
        service = await psycopg.AsyncConnection.connect(
            _as(postgres_server, role), password=await _password(secrets, arn), autocommit=True
        )
        for ddl in ("CREATE TABLE intruder (a int)", "DROP TABLE mqtt_credentials"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                await service.execute(ddl)
        await service.close()

        rotated = await migrate_database(owner, secrets, arn, role, rotate=True)
        assert rotated.generated and rotated.applied == []
        # The rotation ends the connections opened with the old password (as a restarted
        # RDS instance would): the store's next connection must use the new one.
        await owner.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,)
        )
        await wait_for(lambda: _reads(store), "a new connection with the rotated password")
        again = await migrate_database(owner, secrets, arn, role)
        assert not again.generated  # an ordinary run keeps the stored password
    finally:
        await store.close()
        await owner.execute(f'DROP OWNED BY "{role}"')
        await owner.execute(f'DROP ROLE IF EXISTS "{role}"')
        await owner.close()


async def _password(secrets: object, arn: str) -> str:
    import json

    answer = secrets.get_secret_value(SecretId=arn)  # type: ignore[attr-defined]
    password: str = json.loads(answer["SecretString"])["password"]
    return password
