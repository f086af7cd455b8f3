"""The services' own PostgreSQL role, made and kept by the migration task (issue 24, finding 3).

On AWS the services used to log in as the RDS master user, whose password RDS rotates every
7 days. Now a one-off migration task (``cormorant migrate-db``, infra/ compute) logs in as
the master user, applies the schema migrations (:func:`~.migrate.migrate`), then creates or
updates the least-privilege role the services log in as (``cormorant`` by default): it may
connect, use schema ``public``, read and write the rows of its tables and use their
sequences, and nothing else (no DDL, no other role, no superuser rights). Its password lives
in a Secrets Manager secret of its own, which the services read for every new connection
(:class:`~.postgres_pool.SecretsManagerPassword`), so a rotated password reaches them
without a restart: a connection refused with the old one is retried with the secret read
again.

The password is sent to the server only as a SCRAM-SHA-256 verifier (RFC 7677, as
PostgreSQL stores it), so no statement log or ``pg_stat_statements`` ever holds it in clear.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from typing import Any

import psycopg
from psycopg import sql

from services.common.stores.migrate import migrate

SERVICE_ROLE = "cormorant"
"""The role the services log in as (``postgres_dsn``'s user on AWS)."""

SCRAM_ITERATIONS = 4096
"""PBKDF2 iterations of the verifier: PostgreSQL's default (``scram_iterations``)."""


def scram_verifier(password: str, salt: bytes | None = None) -> str:
    """The SCRAM-SHA-256 verifier of ``password`` in PostgreSQL's format
    (``SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>``, base64; RFC 5802
    section 3, RFC 7677). ``salt``: 16 random bytes unless given."""
    salt = secrets.token_bytes(16) if salt is None else salt
    salted = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, SCRAM_ITERATIONS)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.digest(salted, b"Server Key", "sha256")

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode("ascii")

    return f"SCRAM-SHA-256${SCRAM_ITERATIONS}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


async def migrate_and_grant(
    conn: psycopg.AsyncConnection[Any], role: str, password: str
) -> list[int]:
    """Apply the pending migrations on ``conn`` (an owner's connection, outside any
    transaction), then create or update ``role``: LOGIN with ``password``, the rights the
    services need on today's tables and sequences, no others. Returns the versions applied.

    Idempotent: run after every deployment, it grants on tables that new migrations added.
    Raises ``psycopg.Error`` (the role then as it was) if the owner lacks the rights
    (CREATEROLE) or the server fails.
    """
    applied = await migrate(conn)
    name = sql.Identifier(role)
    verifier = sql.Literal(scram_verifier(password))
    async with conn.transaction():
        cursor = await conn.execute(
            "SELECT current_database(), EXISTS (SELECT 1 FROM pg_roles WHERE rolname = %s)",
            (role,),
        )
        row = await cursor.fetchone()
        assert row is not None  # a SELECT without FROM returns one row
        database, exists = row
        verb = "ALTER" if exists else "CREATE"
        await conn.execute(
            sql.SQL(
                "{verb} ROLE {name} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT "
                "PASSWORD {verifier}"
            ).format(verb=sql.SQL(verb), name=name, verifier=verifier)
        )
        for statement in (
            "GRANT CONNECT ON DATABASE {database} TO {name}",
            "GRANT USAGE ON SCHEMA public TO {name}",
            "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {name}",
            "GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {name}",
        ):
            await conn.execute(
                sql.SQL(statement).format(database=sql.Identifier(database), name=name)
            )
    return applied


def new_password() -> str:
    """A new service password: 32 random bytes, URL-safe base64 (43 characters)."""
    return secrets.token_urlsafe(32)


def secret_document(role: str, password: str) -> str:
    """The service secret's value: JSON with ``username`` and ``password`` (the shape the
    services read, as RDS's own secrets have it)."""
    return json.dumps({"username": role, "password": password})
