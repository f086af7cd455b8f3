"""Admin users in the real PostgreSQL: the bootstrap user a deployment hands the admin
service through Secrets Manager (``admin_bootstrap_user``/``admin_bootstrap_password``); the
argon2id parameters of their passwords (production's by default, rehashed at login when the
settings change)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from argon2.profiles import RFC_9106_LOW_MEMORY
from pydantic import SecretStr

from services.admin.main import bootstrap_user, reach_postgres, users_of
from services.admin.users import AdminUsers, UserError
from services.common.settings import Settings
from services.common.stores.postgres_pool import Connection

FIRST = "first password, long enough"
SECOND = "another password, long enough"


#: argon2id of the least cost, as the test cluster has it (tests/servers.py): these tests
#: are about users, not hashes, but for the one that proves the production parameters.
CHEAP = {
    "admin_password_time_cost": 1,
    "admin_password_memory_kib": 8,
    "admin_password_parallelism": 1,
}


@pytest.fixture
async def users(postgres_server: str) -> AsyncIterator[AdminUsers]:
    """The admin users of the test PostgreSQL, tables migrated (cheap hashes)."""
    found = users_of(Settings(postgres_dsn=postgres_server, **CHEAP))
    await reach_postgres(found, 30)
    yield found
    await found.pool.close()


async def stored_hash(users: AdminUsers, username: str) -> str:
    """The password hash ``username`` has in PostgreSQL."""

    async def body(conn: Connection) -> str:
        cursor = await conn.execute(
            "SELECT password_hash FROM admin_users WHERE username = %s", (username,)
        )
        row = await cursor.fetchone()
        assert row is not None, username
        return str(row[0])

    return await users.pool.run("test: stored hash", body)


async def test_passwords_get_the_production_argon2id_parameters_by_default(
    users: AdminUsers, postgres_server: str
) -> None:
    name = f"ops-{uuid.uuid4().hex[:8]}"
    await users.add(name, FIRST)
    assert (await stored_hash(users, name)).startswith("$argon2id$v=19$m=8,t=1,p=1$")
    production = users_of(Settings(postgres_dsn=postgres_server))
    try:
        # The defaults are RFC 9106's second recommended set (argon2-cffi's own default).
        defaults = Settings()
        assert (
            defaults.admin_password_time_cost,
            defaults.admin_password_memory_kib,
            defaults.admin_password_parallelism,
        ) == (
            RFC_9106_LOW_MEMORY.time_cost,
            RFC_9106_LOW_MEMORY.memory_cost,
            RFC_9106_LOW_MEMORY.parallelism,
        )
        prefix = "$argon2id$v=19$m=65536,t=3,p=4$"
        assert await production.login(name, SECOND) is None
        assert (await stored_hash(users, name)).startswith("$argon2id$v=19$m=8,t=1,p=1$")
        # The first successful login under the production settings rehashes the password.
        assert await production.login(name, FIRST) is not None
        assert (await stored_hash(users, name)).startswith(prefix)
        assert await production.login(name, FIRST) is not None
        other = f"ops-{uuid.uuid4().hex[:8]}"
        await production.add(other, SECOND)
        assert (await stored_hash(users, other)).startswith(prefix)
    finally:
        await production.pool.close()


def bootstrap(username: str | None, password: str | None) -> Settings:
    """Settings as an admin task gets them from its environment and its ECS secret."""
    return Settings(
        admin_bootstrap_user=username,
        admin_bootstrap_password=None if password is None else SecretStr(password),
    )


async def test_the_bootstrap_user_is_created_once_and_then_left_alone(users: AdminUsers) -> None:
    name = f"ops-{uuid.uuid4().hex[:8]}"
    await bootstrap_user(bootstrap(name, FIRST), users)
    assert name in await users.names()
    assert await users.login(name, FIRST) is not None
    # An operator changes the password; the next start must not set it back.
    await users.set_password(name, SECOND)
    await bootstrap_user(bootstrap(name, FIRST), users)
    assert await users.login(name, FIRST) is None
    assert await users.login(name, SECOND) is not None
    assert (await users.names()).count(name) == 1


async def test_no_bootstrap_user_without_the_settings(users: AdminUsers) -> None:
    before = await users.names()
    await bootstrap_user(Settings(), users)
    assert await users.names() == before


@pytest.mark.parametrize(
    ("username", "password", "message"),
    [
        ("ops", None, "admin_bootstrap_user and admin_bootstrap_password go together"),
        (None, FIRST, "admin_bootstrap_user and admin_bootstrap_password go together"),
        ("ops-short", "short", "a password has at least 12 characters"),
    ],
)
async def test_a_half_or_bad_bootstrap_stops_the_start(
    users: AdminUsers, username: str | None, password: str | None, message: str
) -> None:
    before = await users.names()
    with pytest.raises(UserError, match=message):
        await bootstrap_user(bootstrap(username, password), users)
    assert await users.names() == before
