"""A PostgreSQL connection pool that migrates the schema on first use: what the message store
(:mod:`.postgres_store`) and the credential store (:mod:`services.common.auth.store`) share.

Every operation is one transaction within a timeout; losing the server, or no answer in
time, raises :class:`~.base.StoreUnavailable` naming the server without user or password.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool
from pydantic import SecretStr

from services.common.settings import Settings
from services.common.stores.base import StoreUnavailable
from services.common.stores.migrate import migrate

T = TypeVar("T")
Connection = psycopg.AsyncConnection[tuple[Any, ...]]


def public_address(dsn: str) -> str:
    """``host:port/dbname`` of ``dsn``, without user or password, for error messages."""
    params = conninfo_to_dict(dsn)
    host = params.get("host") or params.get("hostaddr") or "localhost"
    return f"{host}:{params.get('port') or 5432}/{params.get('dbname') or ''}"


@dataclass(frozen=True, slots=True)
class SecretsManagerPassword:
    """A password read from AWS Secrets Manager for each new connection: the ``password``
    key of the JSON secret ``secret_arn``, in the region the ARN names.

    A password that rotates (AWS, Secrets Manager User Guide, "Managed rotation": "During
    rotation, new connections that retrieve the secret may get the previous version of
    the credentials") is picked up by the next connection, without a restart; a connection
    the server refuses is retried by the pool with the secret read again.
    """

    secret_arn: str

    def read(self) -> str:
        """The current password (blocking: one GetSecretValue call). Raises
        ``psycopg.OperationalError`` when Secrets Manager cannot give it (the pool retries a
        connection that failed so), naming the secret, never its value."""
        import boto3
        from botocore.exceptions import BotoCoreError, ClientError

        region = self.secret_arn.split(":")[3]
        try:
            answer = boto3.client("secretsmanager", region_name=region).get_secret_value(
                SecretId=self.secret_arn
            )
            password: str = json.loads(answer["SecretString"])["password"]
        except (BotoCoreError, ClientError, KeyError, ValueError) as exc:
            raise psycopg.OperationalError(
                f"cannot read the PostgreSQL password from {self.secret_arn}: {type(exc).__name__}"
            ) from None
        return password


PostgresPassword = SecretStr | SecretsManagerPassword | None
"""A PostgreSQL password: none, fixed, or read from Secrets Manager at each connection."""


def password_of(settings: Settings) -> PostgresPassword:
    """The PostgreSQL password ``settings`` give: ``postgres_password_secret_arn`` (read at
    each connection) when set, else ``postgres_password``."""
    if settings.postgres_password_secret_arn is not None:
        return SecretsManagerPassword(settings.postgres_password_secret_arn)
    return settings.postgres_password


def connection_options(
    timeout: float, password: SecretStr | None, sslmode: str | None, sslrootcert: Path | None
) -> dict[str, Any]:
    """libpq connection parameters added to the DSN: timeout, password and TLS."""
    # libpq takes whole seconds and treats values below 2 as 2.
    options: dict[str, Any] = {"connect_timeout": max(2, math.ceil(timeout))}
    if password is not None:
        options["password"] = password.get_secret_value()
    if sslmode is not None:
        options["sslmode"] = sslmode
    if sslrootcert is not None:
        options["sslrootcert"] = str(sslrootcert)
    return options


class MigratedPool:
    """A psycopg pool of at most ``pool_size`` connections to ``dsn`` (a libpq connection
    string or URL; ``password``, ``sslmode``, ``sslrootcert``: :func:`connection_options`),
    named ``name`` in psycopg's pool log and in errors (``"message store"``; ``password``
    may also be a :class:`SecretsManagerPassword`, read for every new connection); ``timeout``
    (seconds) bounds each operation, waiting for a connection included. The pool opens and
    the schema is migrated (:func:`~.migrate.migrate`) on first use, so the constructor does
    no I/O. :attr:`address` is the server as ``host:port/dbname``, without credentials."""

    def __init__(
        self,
        dsn: str,
        *,
        name: str,
        timeout: float,
        pool_size: int,
        password: PostgresPassword = None,
        sslmode: str | None = None,
        sslrootcert: Path | None = None,
    ) -> None:
        self._dsn = dsn
        self.name = name
        self.timeout = timeout
        self.address = public_address(dsn)
        fixed = password if isinstance(password, SecretStr) else None
        self._static = connection_options(timeout, fixed, sslmode, sslrootcert)
        self._secret = password if isinstance(password, SecretsManagerPassword) else None
        self._pool: AsyncConnectionPool[Connection] = AsyncConnectionPool(
            dsn,
            min_size=1,
            max_size=pool_size,
            open=False,
            timeout=timeout,
            # The pool retries a lost connection with a doubling delay (1, 2, 4... s): after
            # a restart it could wait tens of seconds more than needed. Giving up after the
            # store's own timeout instead, it starts afresh (at 1 s) for the next caller.
            reconnect_timeout=timeout,
            kwargs=self._options if self._secret is not None else self._static,
            name=name,
        )
        self._ready = False
        self._ready_lock = asyncio.Lock()

    async def _options(self) -> dict[str, Any]:
        """The connection options of a new connection, with the password as it is now."""
        if self._secret is None:
            return self._static
        password = await asyncio.to_thread(self._secret.read)
        return {**self._static, "password": password}

    async def ensure_ready(self) -> None:
        """Open the pool and migrate the schema, once (again after a failed attempt)."""
        if self._ready:
            return
        async with self._ready_lock:
            if self._ready:
                return
            await self._pool.open(wait=False)
            async with self._pool.connection() as conn:
                await migrate(conn)
            self._ready = True

    async def run(
        self,
        what: str,
        body: Callable[[Connection], Awaitable[T]],
        timeout: float | None = None,
    ) -> T:
        """Run ``body`` in one transaction within the timeout (``timeout`` seconds if given,
        for a long batch; else the pool's). Raises :class:`~.base.StoreUnavailable` when
        the server cannot be reached or does not answer in time; any other
        ``psycopg.Error`` goes to the caller."""
        timeout = self.timeout if timeout is None else timeout
        try:
            async with asyncio.timeout(timeout):
                await self.ensure_ready()
                async with self._pool.connection() as conn, conn.transaction():
                    return await body(conn)
        except TimeoutError as exc:
            # Also when the server refuses connections: the pool keeps retrying in the
            # background (its log, psycopg.pool, has each attempt's error) until we give up.
            raise StoreUnavailable(
                f"PostgreSQL {self.name} at {self.address} is unavailable ({what}): no "
                f"connection or no answer within {timeout} s"
            ) from exc
        except psycopg.OperationalError as exc:
            # Connection refused or lost, no pooled connection in time (PoolTimeout),
            # server shutting down, statement cancelled.
            raise StoreUnavailable(
                f"PostgreSQL {self.name} at {self.address} is unavailable ({what}): {exc}"
            ) from exc

    async def connect_unpooled(self) -> Connection:
        """A new autocommit connection with the pool's options, outside the pool, for the
        caller to close: one held for long (LISTEN) would starve the pool. Raises
        ``psycopg.OperationalError`` when the server cannot be reached within the connect
        timeout (at least 2 s, libpq's floor)."""
        options = await self._options()
        return await psycopg.AsyncConnection.connect(self._dsn, autocommit=True, **options)

    async def close(self) -> None:
        """Close the pool's connections."""
        await self._pool.close()
