"""Admin users, their bearer tokens and the audit trail, in PostgreSQL.

Passwords are kept as argon2id hashes (by default argon2-cffi's parameters, RFC 9106's
second recommended set; the ``admin_password_*`` settings, :func:`password_hasher`); a login
returns a random bearer token (32 bytes, URL-safe base64) that is kept only as its SHA-256
and expires after ``admin_token_ttl_seconds``.
Every mutating call of the admin API is written to ``admin_audit`` (who, what, on what,
when, its HTTP status). The tables are migrations of the shared schema
(``services/common/stores/migrations/0003_admin.sql``), applied by the shared pool
(:class:`~services.common.stores.postgres_pool.MigratedPool`) on first use.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from argon2 import PasswordHasher, Type
from argon2.exceptions import InvalidHashError, VerificationError
from psycopg.types.json import Jsonb

from services.common.auth.throttle import HashingPool
from services.common.settings import Settings
from services.common.stores.postgres_pool import Connection, MigratedPool

USERNAME = re.compile(r"^[A-Za-z0-9._@-]{1,64}$")
"""What an admin user name may be (the table checks it too)."""

MIN_PASSWORD_LENGTH = 12
"""The shortest password an admin user may have (NIST SP 800-63B asks at least 8)."""


def password_hasher(settings: Settings) -> PasswordHasher:
    """The argon2id hasher of admin passwords: ``settings``' ``admin_password_time_cost``
    (passes), ``admin_password_memory_kib`` (KiB) and ``admin_password_parallelism``
    (lanes); argon2-cffi's salt (16 bytes) and hash (32 bytes) lengths."""
    return PasswordHasher(
        time_cost=settings.admin_password_time_cost,
        memory_cost=settings.admin_password_memory_kib,
        parallelism=settings.admin_password_parallelism,
        type=Type.ID,
    )


class UserError(ValueError):
    """An admin user cannot be created or changed as asked (the message says why)."""


@dataclass(frozen=True, slots=True)
class Token:
    """A bearer token handed out at login: ``value`` (secret), ``username``, ``expires_at``."""

    value: str
    username: str
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One audited call: ``at`` (UTC), ``username``, ``action`` (``disconnect``...),
    ``target`` (a client id, a topic...), ``detail``, the HTTP ``status`` it answered."""

    id: int
    at: datetime
    username: str
    action: str
    target: str
    detail: dict[str, Any]
    status: int


def _token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


def check_password(password: str) -> None:
    """Raise :class:`UserError` unless ``password`` is long enough."""
    if len(password) < MIN_PASSWORD_LENGTH:
        raise UserError(f"a password has at least {MIN_PASSWORD_LENGTH} characters")


def check_new_user(username: str, password: str) -> None:
    """Raise :class:`UserError` unless ``username`` is a valid name and ``password`` long
    enough."""
    if not USERNAME.match(username):
        raise UserError(f"a user name is 1 to 64 of A-Z a-z 0-9 . _ @ -, not {username!r}")
    check_password(password)


class AdminUsers:
    """The admin users of one PostgreSQL database, reached through ``pool``. ``token_ttl``
    is how long a token lives (seconds). Every method raises
    :class:`~services.common.stores.base.StoreUnavailable` when PostgreSQL cannot answer
    in time.

    Passwords are hashed by ``hasher`` (default: argon2id with the default settings'
    parameters, :func:`password_hasher`) and verified in ``hashing`` (default: one thread,
    64 checks waiting at most), never on the event loop, so a storm of logins leaves every
    other request of the admin service its share of the loop; a check the pool refuses raises
    :class:`~services.common.auth.throttle.PoolBusy` or
    :class:`~services.common.auth.throttle.SourceBusy`."""

    def __init__(
        self,
        pool: MigratedPool,
        token_ttl: float,
        hashing: HashingPool | None = None,
        hasher: PasswordHasher | None = None,
    ) -> None:
        self.pool = pool
        self.token_ttl = token_ttl
        self.hashing = hashing or HashingPool(1, 64, 64, "admin-password")
        self.hasher = hasher or password_hasher(Settings())
        # Verified when a login names no user, so that it takes as long as one that does.
        self._dummy_hash = self.hasher.hash(secrets.token_urlsafe(16))

    async def _hash(self, password: str) -> str:
        return await self.hashing.run(None, lambda: self.hasher.hash(password))

    def _verify(self, stored: str | None, password: str) -> bool:
        """Whether ``password`` matches the hash ``stored``; for no stored hash (an unknown
        user) a dummy hash of the same parameters is verified, so that such a login takes
        as long as one that names a user, and False is returned. Runs in ``hashing``."""
        if stored is None:
            _check(self.hasher, self._dummy_hash, password)
            return False
        return _check(self.hasher, stored, password)

    async def add(self, username: str, password: str) -> None:
        """Create user ``username`` with ``password``. Raises :class:`UserError` for a bad
        name, a short password or a name already taken."""
        check_new_user(username, password)
        password_hash = await self._hash(password)

        async def body(conn: Connection) -> None:
            await conn.execute(
                "INSERT INTO admin_users (username, password_hash) VALUES (%s, %s)",
                (username, password_hash),
            )

        try:
            await self.pool.run("add admin user", body)
        except psycopg.errors.UniqueViolation as exc:
            raise UserError(f"user {username!r} exists already") from exc

    async def ensure(self, username: str, password: str) -> bool:
        """Create ``username`` with ``password`` unless it exists (then leave it as it is:
        its password may have been changed since). True if it was created. Raises
        :class:`UserError` for a bad name or a short password."""
        check_new_user(username, password)
        password_hash = await self._hash(password)

        async def body(conn: Connection) -> bool:
            cursor = await conn.execute(
                "INSERT INTO admin_users (username, password_hash) VALUES (%s, %s) "
                "ON CONFLICT (username) DO NOTHING",
                (username, password_hash),
            )
            return cursor.rowcount > 0

        return await self.pool.run("ensure admin user", body)

    async def set_password(self, username: str, password: str) -> None:
        """Change ``username``'s password and revoke its tokens. Raises :class:`UserError`
        for an unknown user or a short password."""
        check_password(password)
        password_hash = await self._hash(password)

        async def body(conn: Connection) -> None:
            cursor = await conn.execute(
                "UPDATE admin_users SET password_hash = %s WHERE username = %s",
                (password_hash, username),
            )
            if cursor.rowcount == 0:
                raise UserError(f"no user {username!r}")
            await conn.execute("DELETE FROM admin_tokens WHERE username = %s", (username,))

        await self.pool.run("set admin password", body)

    async def remove(self, username: str) -> bool:
        """Delete ``username`` and its tokens; False if there was no such user."""

        async def body(conn: Connection) -> bool:
            cursor = await conn.execute("DELETE FROM admin_users WHERE username = %s", (username,))
            return cursor.rowcount > 0

        return await self.pool.run("remove admin user", body)

    async def names(self) -> list[str]:
        """Every user name, sorted."""

        async def body(conn: Connection) -> list[str]:
            cursor = await conn.execute("SELECT username FROM admin_users ORDER BY username")
            return [str(row[0]) for row in await cursor.fetchall()]

        return await self.pool.run("list admin users", body)

    async def login(self, username: str, password: str, source: str | None = None) -> Token | None:
        """A new token if ``password`` is ``username``'s, else None (an unknown user costs
        a hash too, so timing does not tell which names exist). ``source``: the caller's IP
        address, whose share of the hashing pool the check takes."""

        async def stored_hash(conn: Connection) -> str | None:
            cursor = await conn.execute(
                "SELECT password_hash FROM admin_users WHERE username = %s", (username,)
            )
            row = await cursor.fetchone()
            return None if row is None else str(row[0])

        stored = await self.pool.run("login", stored_hash)
        if not await self.hashing.run(source, lambda: self._verify(stored, password)):
            return None
        assert stored is not None  # _verify is False without a stored hash
        token = secrets.token_urlsafe(32)
        expires_at = datetime.now(UTC) + timedelta(seconds=self.token_ttl)
        rehashed = await self._hash(password) if self.hasher.check_needs_rehash(stored) else None

        async def issue(conn: Connection) -> None:
            await conn.execute("DELETE FROM admin_tokens WHERE expires_at < now()")
            await conn.execute(
                "INSERT INTO admin_tokens (token_hash, username, expires_at) VALUES (%s, %s, %s)",
                (_token_hash(token), username, expires_at),
            )
            if rehashed is not None:
                await conn.execute(
                    "UPDATE admin_users SET password_hash = %s WHERE username = %s",
                    (rehashed, username),
                )

        await self.pool.run("login", issue)
        return Token(token, username, expires_at)

    async def user_of(self, token: str) -> str | None:
        """The user a valid, unexpired ``token`` belongs to, or None."""

        async def body(conn: Connection) -> str | None:
            cursor = await conn.execute(
                "SELECT username FROM admin_tokens WHERE token_hash = %s AND expires_at > now()",
                (_token_hash(token),),
            )
            row = await cursor.fetchone()
            return None if row is None else str(row[0])

        return await self.pool.run("check token", body)

    async def logout(self, token: str) -> None:
        """Revoke ``token``."""

        async def body(conn: Connection) -> None:
            await conn.execute(
                "DELETE FROM admin_tokens WHERE token_hash = %s", (_token_hash(token),)
            )

        await self.pool.run("logout", body)

    async def audit(
        self, username: str, action: str, target: str, detail: dict[str, Any], status: int
    ) -> None:
        """Record one mutating call, refused ones included: a ``target`` or ``detail`` text
        PostgreSQL cannot keep (U+0000, a lone surrogate, which JSON bodies can carry) is
        recorded escaped (``\\x00``, ``\\udc80``) rather than losing the entry."""

        async def body(conn: Connection) -> None:
            await conn.execute(
                "INSERT INTO admin_audit (username, action, target, detail, status) "
                "VALUES (%s, %s, %s, %s, %s)",
                (username, action, _storable(target), Jsonb(_storable_json(detail)), status),
            )

        await self.pool.run("audit", body)

    async def audit_trail(self, offset: int, limit: int) -> tuple[int, list[AuditEntry]]:
        """``(total, entries)``: the newest first, ``limit`` of them after ``offset``."""

        async def body(conn: Connection) -> tuple[int, list[AuditEntry]]:
            cursor = await conn.execute("SELECT count(*) FROM admin_audit")
            total_row = await cursor.fetchone()
            cursor = await conn.execute(
                "SELECT id, at, username, action, target, detail, status FROM admin_audit "
                "ORDER BY id DESC OFFSET %s LIMIT %s",
                (offset, limit),
            )
            rows = await cursor.fetchall()
            total = int(total_row[0]) if total_row is not None else 0
            return total, [AuditEntry(*row) for row in rows]

        return await self.pool.run("audit trail", body)

    async def ping(self) -> None:
        """One ``SELECT 1`` (the schema migrated first): readiness."""

        async def body(conn: Connection) -> None:
            await conn.execute("SELECT 1")

        await self.pool.run("ping", body)


def _storable(text: str) -> str:
    """``text`` with what PostgreSQL's ``text`` and ``jsonb`` refuse escaped: U+0000 as
    ``\\x00``, a lone surrogate as ``\\udXXX`` (backslashreplace); other text unchanged."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")


def _storable_json(value: Any) -> Any:
    if isinstance(value, str):
        return _storable(value)
    if isinstance(value, dict):
        return {_storable(str(key)): _storable_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_storable_json(item) for item in value]
    return value


def _check(hasher: PasswordHasher, encoded: str, password: str) -> bool:
    try:
        return hasher.verify(encoded, password)
    except (VerificationError, InvalidHashError):
        return False
