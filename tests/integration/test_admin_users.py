"""Admin users in the real PostgreSQL: the bootstrap user a deployment hands the admin
service through Secrets Manager (``admin_bootstrap_user``/``admin_bootstrap_password``)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from pydantic import SecretStr

from services.admin.main import bootstrap_user, reach_postgres, users_of
from services.admin.users import AdminUsers, UserError
from services.common.settings import Settings

FIRST = "first password, long enough"
SECOND = "another password, long enough"


@pytest.fixture
async def users(postgres_server: str) -> AsyncIterator[AdminUsers]:
    """The admin users of the test PostgreSQL, tables migrated."""
    found = users_of(Settings(postgres_dsn=postgres_server))
    await reach_postgres(found, 30)
    yield found
    await found.pool.close()


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
