"""Credentials in PostgreSQL (table ``mqtt_credentials``, migrations
``services/common/stores/migrations/0002_credentials.sql`` and ``0030_password_scheme.sql``),
and their change notifications.

Every insert, update and delete of a credential is announced, once committed, on the
PostgreSQL channel :data:`CHANNEL` by a trigger (so plain SQL changes are announced too):
a JSON :class:`Change` naming the credential, the operation, its types before and after, and
the lookup keys it had and has (:func:`lookup_key`). :meth:`CredentialStore.listen` follows
them, for the ingest nodes' caches (:mod:`.cache`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg.rows import dict_row

from services.common.auth.authorize import parse_rules
from services.common.auth.certificates import CertificateMatch
from services.common.auth.credentials import Credential, CredentialType
from services.common.auth.jwt_auth import JwtSettings
from services.common.auth.scram import ScramSecret
from services.common.records import ClientKind
from services.common.settings import Settings
from services.common.stores.notifications import follow
from services.common.stores.postgres_pool import (
    Connection,
    MigratedPool,
    PostgresPassword,
    password_of,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

CHANNEL = "cormorant_credentials"
"""The PostgreSQL NOTIFY channel of credential changes."""

_COLUMNS = (
    "id, name, type, enabled, kind, client_id, username, fingerprint, rules, details, "
    "revision, created_at, updated_at"
)


class CredentialConflict(ValueError):
    """A credential with the same name or the same identity (user name and client id,
    SCRAM user name, certificate fingerprint) exists already."""


def lookup_key(prefix: str, value: str) -> str:
    """The cache key of a lookup: SHA-256 (hex) of ``prefix`` (``u:`` user name, ``c:``
    client id, ``f:`` fingerprint) and ``value``, as the notification trigger computes it."""
    return hashlib.sha256(f"{prefix}{value}".encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Change:
    """One announced change: credential ``id``, ``op`` (INSERT, UPDATE, DELETE), its
    ``types`` before and/or after, and the lookup ``keys`` (:func:`lookup_key`) it had and
    has."""

    id: uuid.UUID
    op: str
    types: frozenset[CredentialType]
    keys: frozenset[str]

    @classmethod
    def parse(cls, payload: str) -> Change:
        """The change a notification's payload describes. Raises ``ValueError`` on garbage."""
        try:
            data = json.loads(payload)
            return cls(
                uuid.UUID(str(data["id"])),
                str(data["op"]),
                frozenset(CredentialType(t) for t in data["types"]),
                frozenset(str(k) for k in data["keys"]),
            )
        except (KeyError, TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not a credential change: {exc!r}") from None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _details(credential: Credential) -> dict[str, Any]:
    details: dict[str, Any] = {}
    if credential.strict_subscribe:
        details["strict_subscribe"] = True
    if credential.password_hash is not None:
        details["password_hash"] = credential.password_hash
    if credential.certificate is not None:
        if credential.certificate.common_name is not None:
            details["common_name"] = credential.certificate.common_name
        if credential.certificate.san is not None:
            details["san"] = credential.certificate.san
    if credential.jwt is not None:
        settings = credential.jwt
        details["jwt"] = {
            "algorithms": list(settings.algorithms),
            "key": settings.key,
            "audience": settings.audience,
            "issuer": settings.issuer,
            "client_id_claim": settings.client_id_claim,
            "username_claim": settings.username_claim,
            "leeway_seconds": settings.leeway_seconds,
            "max_age_seconds": settings.max_age_seconds,
            "jwks_url": settings.jwks_url,
        }
    if credential.scram:
        details["scram"] = [
            {
                "mechanism": s.mechanism,
                "salt": _b64(s.salt),
                "iterations": s.iterations,
                "stored_key": _b64(s.stored_key),
                "server_key": _b64(s.server_key),
            }
            for s in credential.scram
        ]
    return details


def _credential(row: dict[str, Any]) -> Credential:
    details: dict[str, Any] = row["details"]
    certificate = None
    if row["fingerprint"] is not None or "common_name" in details or "san" in details:
        certificate = CertificateMatch(
            row["fingerprint"], details.get("common_name"), details.get("san")
        )
    jwt_settings = None
    if "jwt" in details:
        j = details["jwt"]
        jwt_settings = JwtSettings(
            tuple(j["algorithms"]),
            j["key"],
            j.get("audience"),
            j.get("issuer"),
            j.get("client_id_claim"),
            j.get("username_claim"),
            int(j.get("leeway_seconds", 0)),
            j.get("max_age_seconds"),
            j.get("jwks_url"),
        )
    scram = tuple(
        ScramSecret(
            s["mechanism"],
            base64.b64decode(s["salt"]),
            int(s["iterations"]),
            base64.b64decode(s["stored_key"]),
            base64.b64decode(s["server_key"]),
        )
        for s in details.get("scram", ())
    )
    return Credential(
        id=row["id"],
        name=row["name"],
        type=CredentialType(row["type"]),
        kind=ClientKind[row["kind"]],
        enabled=row["enabled"],
        rules=parse_rules(row["rules"]),
        strict_subscribe=bool(details.get("strict_subscribe", False)),
        client_id=row["client_id"],
        username=row["username"],
        password_hash=details.get("password_hash"),
        certificate=certificate,
        jwt=jwt_settings,
        scram=scram,
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        revision=row["revision"],
    )


def _values(credential: Credential) -> dict[str, Any]:
    certificate = credential.certificate
    scheme = credential.password_scheme
    return {
        "id": credential.id,
        "name": credential.name,
        "type": credential.type.value,
        "enabled": credential.enabled,
        "kind": credential.kind.name,
        "client_id": credential.client_id,
        "username": credential.username,
        "fingerprint": None if certificate is None else certificate.fingerprint,
        "rules": json.dumps([rule.to_json() for rule in credential.rules]),
        "details": json.dumps(_details(credential)),
        "password_scheme": None if scheme is None else scheme.value,
    }


class CredentialStore:
    """The ``mqtt_credentials`` table, through a psycopg pool.

    ``dsn`` and the connection options are the message store's
    (:class:`~services.common.stores.postgres_store.PostgresMessageStore`): ``password``,
    ``sslmode``, ``sslrootcert``; ``timeout`` (seconds) bounds each operation, waiting for a
    connection included (:class:`~services.common.stores.postgres_pool.MigratedPool`).
    Every method raises :class:`~services.common.stores.base.StoreUnavailable` when
    PostgreSQL cannot answer in time.
    """

    def __init__(
        self,
        dsn: str,
        *,
        timeout: float = 5.0,
        pool_size: int = 4,
        password: PostgresPassword = None,
        sslmode: str | None = None,
        sslrootcert: Path | None = None,
    ) -> None:
        self._pool = MigratedPool(
            dsn,
            name="credential store",
            timeout=timeout,
            pool_size=pool_size,
            password=password,
            sslmode=sslmode,
            sslrootcert=sslrootcert,
        )

    @property
    def pool(self) -> MigratedPool:
        """The store's connection pool (what :class:`~.blocked_store.BlockedStore` shares)."""
        return self._pool

    @classmethod
    def from_settings(cls, settings: Settings) -> CredentialStore:
        """The store at ``settings.postgres_dsn`` with the PostgreSQL settings' password and
        TLS, ``store_timeout_seconds`` per operation."""
        return cls(
            settings.postgres_dsn,
            timeout=settings.store_timeout_seconds,
            password=password_of(settings),
            sslmode=settings.postgres_sslmode,
            sslrootcert=settings.postgres_sslrootcert,
        )

    async def _run(self, what: str, body: Callable[[Connection], Awaitable[T]]) -> T:
        try:
            return await self._pool.run(what, body)
        except psycopg.errors.UniqueViolation as exc:
            raise CredentialConflict(_conflict_message(exc)) from None

    async def _select(self, what: str, where: str, params: tuple[Any, ...]) -> list[Credential]:
        async def body(conn: Connection) -> list[Credential]:
            cursor = conn.cursor(row_factory=dict_row)
            await cursor.execute(
                f"SELECT {_COLUMNS} FROM mqtt_credentials WHERE {where} ORDER BY name",
                params,
            )
            return [_credential(row) for row in await cursor.fetchall()]

        return await self._run(what, body)

    async def insert(self, credential: Credential) -> Credential:
        """Store a new credential; returns it as stored. Raises :class:`CredentialConflict`."""
        values = _values(credential)

        async def body(conn: Connection) -> Credential:
            cursor = conn.cursor(row_factory=dict_row)
            await cursor.execute(
                f"INSERT INTO mqtt_credentials ({', '.join(values)})"
                f" VALUES ({', '.join('%(' + k + ')s' for k in values)}) RETURNING {_COLUMNS}",
                values,
            )
            row = await cursor.fetchone()
            assert row is not None
            return _credential(row)

        return await self._run("insert", body)

    async def insert_all(
        self, credentials: Sequence[Credential], commit: bool = True, timeout: float = 120.0
    ) -> dict[int, str]:
        """Store new credentials in one transaction, all or none: returns the conflicts
        (index in ``credentials`` → what it conflicts with: a stored credential, or an
        earlier one of ``credentials``), and stores nothing when there is one or when
        ``commit`` is false (a dry run). ``timeout``: seconds the whole batch may take."""
        rows = [_values(c) for c in credentials]
        if not rows:
            return {}
        columns = list(rows[0])
        # ON CONFLICT DO NOTHING: a conflicting row (any unique index: name, MQTT_BASIC
        # identity, SCRAM user name, fingerprint) returns no id, and the batch goes on.
        statement = (
            f"INSERT INTO mqtt_credentials ({', '.join(columns)})"
            f" VALUES ({', '.join('%(' + k + ')s' for k in columns)})"
            " ON CONFLICT DO NOTHING RETURNING id"
        )

        async def body(conn: Connection) -> dict[int, str]:
            cursor = conn.cursor()
            await cursor.executemany(statement, rows, returning=True)
            refused: list[int] = []
            for index in range(len(rows)):
                if await cursor.fetchone() is None:
                    refused.append(index)
                cursor.nextset()
            conflicts: dict[int, str] = {}
            if refused:
                names = [credentials[i].name for i in refused]
                await cursor.execute(
                    "SELECT name FROM mqtt_credentials WHERE name = ANY(%s)", (names,)
                )
                taken = {row[0] for row in await cursor.fetchall()}
                for index in refused:
                    conflicts[index] = (
                        "a credential with this name exists already"
                        if credentials[index].name in taken
                        else "a credential with this identity (MQTT_BASIC user name and "
                        "client id, SCRAM user name, or certificate fingerprint) exists already"
                    )
            if conflicts or not commit:
                raise _RolledBack(conflicts)
            return conflicts

        try:
            return await self._pool.run("insert all", body, timeout)
        except _RolledBack as rolled_back:
            return rolled_back.conflicts

    async def replace(self, credential: Credential) -> Credential | None:
        """Store ``credential`` over the one with its id, if that one's revision is still
        ``credential.revision``; returns it as stored (its revision one higher), or None if
        it is gone or changed meanwhile. Raises :class:`CredentialConflict`."""
        values = _values(credential)
        values["revision"] = credential.revision
        columns = [k for k in values if k not in ("id", "revision")]

        async def body(conn: Connection) -> Credential | None:
            cursor = conn.cursor(row_factory=dict_row)
            await cursor.execute(
                f"UPDATE mqtt_credentials SET {', '.join(f'{k} = %({k})s' for k in columns)}"
                f" WHERE id = %(id)s AND revision = %(revision)s RETURNING {_COLUMNS}",
                values,
            )
            row = await cursor.fetchone()
            return None if row is None else _credential(row)

        return await self._run("update", body)

    async def delete(self, credential_id: uuid.UUID) -> bool:
        """Delete a credential; False if there was none with that id."""

        async def body(conn: Connection) -> bool:
            cursor = await conn.execute(
                "DELETE FROM mqtt_credentials WHERE id = %s", (credential_id,)
            )
            return cursor.rowcount == 1

        return await self._run("delete", body)

    async def get(self, credential_id: uuid.UUID) -> Credential | None:
        """The credential with that id, if any."""
        found = await self._select("get", "id = %s", (credential_id,))
        return found[0] if found else None

    async def get_by_name(self, name: str) -> Credential | None:
        """The credential with that name, if any."""
        found = await self._select("get", "name = %s", (name,))
        return found[0] if found else None

    async def list_all(self, credential_type: CredentialType | None = None) -> list[Credential]:
        """Every credential (of one type, if given), by name."""
        if credential_type is None:
            return await self._select("list", "true", ())
        return await self._select("list", "type = %s", (credential_type.value,))

    async def by_username(self, username: str) -> list[Credential]:
        """The credentials naming ``username`` (MQTT_BASIC and SCRAM)."""
        return await self._select("lookup", "username = %s", (username,))

    async def by_client_id(self, client_id: str) -> list[Credential]:
        """The MQTT_BASIC credentials naming ``client_id`` and no user name."""
        return await self._select("lookup", "client_id = %s AND username IS NULL", (client_id,))

    async def client_ids(self, limit: int) -> list[str] | None:
        """Every client id that finds a credential by itself (what :meth:`by_client_id`
        looks for), or None when there are more than ``limit``."""

        async def body(conn: Connection) -> list[str] | None:
            cursor = await conn.execute(
                "SELECT client_id FROM mqtt_credentials"
                " WHERE client_id IS NOT NULL AND username IS NULL LIMIT %s",
                (limit + 1,),
            )
            found = [row[0] for row in await cursor.fetchall()]
            return None if len(found) > limit else found

        return await self._run("lookup", body)

    async def by_fingerprint(self, fingerprint: str) -> list[Credential]:
        """The X509 credential of the certificate with that SHA-256 fingerprint, if any."""
        return await self._select("lookup", "fingerprint = %s", (fingerprint,))

    async def patterns_and_issuers(self) -> list[Credential]:
        """The credentials no key finds: X509 ones by CN/SAN pattern, and JWT issuers."""
        where = "(type = 'X509' AND fingerprint IS NULL) OR type = 'JWT'"
        return await self._select("lookup", where, ())

    async def listen(
        self,
        on_change: Callable[[Change], None],
        on_connected: Callable[[], None],
        also: Mapping[str, Callable[[], None]] | None = None,
    ) -> None:
        """Follow the change notifications until cancelled: ``on_connected()`` each time
        the listening connection is (re)established (notifications sent while it was down
        are lost: the caller forgets what it cached), then ``on_change`` for each change.
        ``also`` maps further channels to what a notification on each calls (the blocked
        clients', :data:`.blocked_store.CHANNEL`), on the same connection. A payload that
        is not a change is logged and passed over. Reconnects after
        :data:`~services.common.stores.notifications.RECONNECT_SECONDS` when PostgreSQL is
        lost (logged: :func:`~services.common.stores.notifications.follow`)."""
        others = dict(also or {})

        def on_notification(notification: psycopg.Notify) -> None:
            if notification.channel in others:
                others[notification.channel]()
                return
            try:
                change = Change.parse(notification.payload)
            except ValueError as exc:
                log.warning("ignoring a notification on %s: %s", CHANNEL, exc)
                return
            on_change(change)

        await follow(
            self._pool, [CHANNEL, *others], on_notification, on_connected, "credential changes"
        )

    async def close(self) -> None:
        """Close the pool's connections."""
        await self._pool.close()


class _RolledBack(Exception):
    """Ends a transaction of :meth:`CredentialStore.insert_all` without committing it."""

    def __init__(self, conflicts: dict[int, str]) -> None:
        super().__init__("rolled back")
        self.conflicts = conflicts


def _conflict_message(exc: psycopg.errors.UniqueViolation) -> str:
    constraint = exc.diag.constraint_name or ""
    what = {
        "mqtt_credentials_name_key": "a credential with this name",
        "mqtt_credentials_basic_identity": "an MQTT_BASIC credential with this user name and "
        "client id",
        "mqtt_credentials_scram_username": "a SCRAM credential with this user name",
        "mqtt_credentials_fingerprint": "an X509 credential with this fingerprint",
        "mqtt_credentials_pkey": "a credential with this id",
    }.get(constraint, "an identical credential")
    return f"{what} exists already"
