"""The PostgreSQL schema migration runner (the message store, the credentials).

The schema is the SQL files ``migrations/NNNN_<name>.sql`` beside this module (package
data), applied in version order. Applied versions are recorded in ``schema_migrations``.
All pending files are applied in one transaction that first takes a transaction-level
advisory lock: two processes starting at once apply each file exactly once (the second
waits, then finds nothing pending), and a failing file leaves the schema as it was.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

import psycopg

#: The advisory lock key of schema migrations: the ASCII bytes of "cormoran" as a bigint,
#: a constant no other lock of this database is expected to use.
LOCK_KEY = int.from_bytes(b"cormoran", "big")

_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

_CREATE_TABLE = b"""
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


@dataclass(frozen=True, slots=True)
class Migration:
    """One schema file: its ``version`` (the 4-digit prefix), ``name`` and SQL text (bytes)."""

    version: int
    name: str
    sql: bytes


def load_migrations() -> list[Migration]:
    """The package's migration files, by version.

    Raises ``ValueError`` if two files share a version or a ``.sql`` file is misnamed.
    """
    folder = resources.files("services.common.stores").joinpath("migrations")
    found: dict[int, Migration] = {}
    for entry in folder.iterdir():
        if not entry.name.endswith(".sql"):
            continue
        match = _FILE_NAME.match(entry.name)
        if match is None:
            raise ValueError(f"migration file name {entry.name!r} is not NNNN_<name>.sql")
        version = int(match.group(1))
        if version in found:
            raise ValueError(f"two migration files have version {version}")
        found[version] = Migration(version, match.group(2), entry.read_bytes())
    return [found[version] for version in sorted(found)]


async def migrate(conn: psycopg.AsyncConnection[Any]) -> list[int]:
    """Apply the pending migrations on ``conn``; return the versions applied by this call.

    ``conn`` must not be inside a transaction. Raises ``psycopg.Error`` (nothing applied)
    if a file fails or the server is unreachable.

    When every migration is applied already, nothing is locked or created: the services
    log in as a role without DDL rights (:mod:`.service_role`), which could not even
    ``CREATE TABLE IF NOT EXISTS`` the version table; the migration task applies the files.
    """
    wanted = {migration.version for migration in load_migrations()}
    async with conn.transaction():
        cursor = await conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL")
        row = await cursor.fetchone()
        if row is not None and row[0]:
            cursor = await conn.execute("SELECT version FROM schema_migrations")
            if wanted <= {version for (version,) in await cursor.fetchall()}:
                return []
    applied_now: list[int] = []
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
        await conn.execute(_CREATE_TABLE)
        cursor = await conn.execute("SELECT version FROM schema_migrations")
        applied = {row[0] for row in await cursor.fetchall()}
        for migration in load_migrations():
            if migration.version in applied:
                continue
            await conn.execute(migration.sql)
            await conn.execute(
                "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
                (migration.version, migration.name),
            )
            applied_now.append(migration.version)
    return applied_now
