"""API keys of the HTTP publish API (:mod:`services.admin.publish_api`): a credential-like
object for HTTP clients, in PostgreSQL (table ``http_api_keys``, migration
``services/common/stores/migrations/0055_http_api_keys.sql``).

A key has a unique ``name``, the Client Identifier its messages are published as (the
``msg.all`` record key, so routing, No Local and the analytics see one publisher; default
``http-<name>``), authorization rules (:mod:`.authorize`, the credentials' syntax;
``${client_id}`` stands for that Client Identifier, ``${username}`` for nothing), and
the salted HMAC-SHA-256 of its secret (:func:`~.passwords.hash_secret`: the secret is a
256-bit random value the server generates, :func:`~.passwords.generate_secret`, so a slow
hash would add nothing, as for generated device secrets). The key a client sends is
``cmk_<id as 32 hex digits>.<secret>``: the id finds the row, the secret is verified in
constant time. It is shown once, when made; only its hash is stored, and it is never
logged. Deleting a key revokes it at once (every request looks its key up).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from services.common.auth.authorize import USERNAME, Rule, RuleError, parse_rules
from services.common.auth.credentials import MAX_IDENTIFIER_BYTES, NAME_PATTERN
from services.common.auth.passwords import generate_secret, hash_secret, verify
from services.common.clock import now_ms
from services.common.stores.postgres_pool import Connection, MigratedPool

T = TypeVar("T")

TOKEN_PREFIX = "cmk_"
"""What every API key starts with (so that secret scanners and people recognise one)."""

_TOKEN = re.compile(r"^cmk_([0-9a-f]{32})\.([A-Za-z0-9_-]{16,128})$")
_COLUMNS = "id, name, client_id, rules, key_hash, created_at, created_by"


class ApiKeyError(ValueError):
    """An API key that is invalid as given; the message names the field and the problem."""


class ApiKeyConflict(ValueError):
    """An API key with this name exists already."""


class ApiKeyNotFound(LookupError):
    """No API key has this name."""


@dataclass(frozen=True, slots=True)
class ApiKey:
    """One API key (see the module): ``key_hash`` is ``$hmac-sha256$<salt>$<digest>``;
    ``created_at_ms`` Unix milliseconds; ``created_by`` the admin user (``cli`` for the
    command line)."""

    id: uuid.UUID
    name: str
    client_id: str
    rules: tuple[Rule, ...]
    key_hash: str
    created_at_ms: int
    created_by: str

    def matches(self, secret: str) -> bool:
        """Whether ``secret`` is this key's (HMAC-SHA-256, compared in constant time)."""
        return verify(self.key_hash, secret.encode())


def token_of(key_id: uuid.UUID, secret: str) -> str:
    """The key a client sends: ``cmk_<id hex>.<secret>``."""
    return f"{TOKEN_PREFIX}{key_id.hex}.{secret}"


def parse_token(token: str) -> tuple[uuid.UUID, str] | None:
    """The id and secret of an API key as sent; None if ``token`` is not of that form."""
    match = _TOKEN.match(token)
    if match is None:
        return None
    return uuid.UUID(match.group(1)), match.group(2)


def new_api_key(
    name: str, rules: list[str], client_id: str | None = None, created_by: str = ""
) -> tuple[ApiKey, str]:
    """A new key (not stored yet) and the token to hand to its user (shown once).

    ``rules`` in the text form (``allow publish sensors/#``); ``client_id`` defaults to
    ``http-<name>``. Raises :class:`ApiKeyError` for an invalid name, client id or rule,
    or a rule naming ``${username}`` (an API key has no User Name).
    """
    if not NAME_PATTERN.match(name):
        raise ApiKeyError(
            f"name {name!r} must be 1-128 letters, digits or _.:@- (a letter or digit first)"
        )
    client_id = f"http-{name}" if client_id is None else client_id
    if not client_id or "\x00" in client_id:
        raise ApiKeyError("client id must not be empty nor hold U+0000")
    try:
        size = len(client_id.encode("utf-8"))
    except UnicodeEncodeError:
        raise ApiKeyError("client id is not valid UTF-8") from None
    if size > MAX_IDENTIFIER_BYTES:
        raise ApiKeyError(f"client id must be at most {MAX_IDENTIFIER_BYTES} bytes")
    try:
        parsed = parse_rules(rules)
    except RuleError as exc:
        raise ApiKeyError(str(exc)) from None
    for rule in parsed:
        if USERNAME in rule.topic_filter.split("/"):
            raise ApiKeyError(f"rule '{rule}' uses {USERNAME}: an API key has no user name")
    secret = generate_secret()
    key = ApiKey(
        uuid.uuid4(), name, client_id, parsed, hash_secret(secret.encode()), now_ms(), created_by
    )
    return key, token_of(key.id, secret)


def public_view(key: ApiKey) -> dict[str, Any]:
    """``key`` as the admin API and ``--json`` show it: never its hash."""
    return {
        "id": str(key.id),
        "name": key.name,
        "client_id": key.client_id,
        "rules": [str(rule) for rule in key.rules],
        "created_at": datetime.fromtimestamp(key.created_at_ms / 1000, UTC).isoformat(),
        "created_by": key.created_by,
    }


def _key(row: dict[str, Any]) -> ApiKey:
    created: datetime = row["created_at"]
    return ApiKey(
        row["id"],
        row["name"],
        row["client_id"],
        parse_rules(row["rules"]),
        row["key_hash"],
        round(created.timestamp() * 1000),
        row["created_by"],
    )


class ApiKeyStore:
    """The ``http_api_keys`` table, through ``pool`` (the credential store's:
    :attr:`services.common.auth.store.CredentialStore.pool`). Every method raises
    :class:`~services.common.stores.base.StoreUnavailable` when PostgreSQL cannot answer
    in time."""

    def __init__(self, pool: MigratedPool) -> None:
        self._pool = pool

    async def _run(self, what: str, body: Callable[[Connection], Awaitable[T]]) -> T:
        try:
            return await self._pool.run(what, body)
        except psycopg.errors.UniqueViolation:
            raise ApiKeyConflict("an API key with this name exists already") from None

    async def _select(self, what: str, where: str, params: tuple[Any, ...]) -> list[ApiKey]:
        async def body(conn: Connection) -> list[ApiKey]:
            cursor = conn.cursor(row_factory=dict_row)
            await cursor.execute(
                f"SELECT {_COLUMNS} FROM http_api_keys WHERE {where} ORDER BY name", params
            )
            return [_key(row) for row in await cursor.fetchall()]

        return await self._run(what, body)

    async def add(self, key: ApiKey) -> ApiKey:
        """Store ``key``; returns it as stored. Raises :class:`ApiKeyConflict`."""

        async def body(conn: Connection) -> ApiKey:
            cursor = conn.cursor(row_factory=dict_row)
            await cursor.execute(
                f"INSERT INTO http_api_keys ({_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s)"
                f" RETURNING {_COLUMNS}",
                (
                    key.id,
                    key.name,
                    key.client_id,
                    Jsonb([rule.to_json() for rule in key.rules]),
                    key.key_hash,
                    datetime.fromtimestamp(key.created_at_ms / 1000, UTC),
                    key.created_by,
                ),
            )
            row = await cursor.fetchone()
            assert row is not None
            return _key(row)

        return await self._run("add API key", body)

    async def list(self) -> list[ApiKey]:
        """Every API key, by name."""
        return await self._select("list API keys", "true", ())

    async def get(self, key_id: uuid.UUID) -> ApiKey | None:
        """The key with that id, if any."""
        found = await self._select("API key", "id = %s", (key_id,))
        return found[0] if found else None

    async def delete(self, name: str) -> ApiKey:
        """Delete (revoke) the key named ``name``; returns it. Raises :class:`ApiKeyNotFound`."""

        async def body(conn: Connection) -> ApiKey | None:
            cursor = conn.cursor(row_factory=dict_row)
            await cursor.execute(
                f"DELETE FROM http_api_keys WHERE name = %s RETURNING {_COLUMNS}", (name,)
            )
            row = await cursor.fetchone()
            return None if row is None else _key(row)

        deleted = await self._run("delete API key", body)
        if deleted is None:
            raise ApiKeyNotFound(f"no API key is named {name!r}")
        return deleted
