"""Managing credentials: what ``cormorant credentials`` and the admin API both call.

:class:`CredentialAdmin` validates what it is given (:func:`~.credentials.check_credential`,
the rules' syntax), hashes passwords (argon2id) and derives SCRAM secrets off the event loop,
and stores the result; every change reaches the ingest nodes through the store's
notifications within a second. A credential is named by its name or its id (a UUID) in
every call (``ref``).

Errors: :class:`~.credentials.CredentialError` (invalid input, message names the field),
:class:`~.authorize.RuleError` (a bad rule), :class:`CredentialNotFound`,
:class:`~.store.CredentialConflict` (name or identity taken),
:class:`~services.common.stores.base.StoreUnavailable` (PostgreSQL).
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from services.common.auth.authorize import parse_rules
from services.common.auth.certificates import CertificateMatch
from services.common.auth.credentials import (
    Credential,
    CredentialError,
    CredentialType,
    check_credential,
)
from services.common.auth.jwt_auth import JwtSettings
from services.common.auth.passwords import MAX_PASSWORD_BYTES, hash_password
from services.common.auth.scram import (
    MAX_ITERATIONS,
    MECHANISMS,
    MIN_ITERATIONS,
    ScramSecret,
    derive_secret,
)
from services.common.auth.store import CredentialStore
from services.common.records import ClientKind


class CredentialNotFound(LookupError):
    """No credential has the name or id given."""


@dataclass(frozen=True, slots=True)
class CredentialSpec:
    """A new credential as an operator describes it. ``rules`` are rules in text or JSON
    form (:func:`~.authorize.parse_rules`); ``password`` (bytes, any) is hashed for
    MQTT_BASIC and turned into SCRAM secrets for SCRAM, never stored as given, with
    ``scram_iterations`` PBKDF2 iterations (SCRAM only; None: each mechanism's default,
    :data:`~.scram.ITERATIONS`). A JWT credential with public-key algorithms needs an
    audience unless ``jwt_no_audience`` (tokens of the same issuer meant for other services
    would be taken otherwise)."""

    name: str
    type: CredentialType
    kind: ClientKind = ClientKind.DEVICE
    rules: Sequence[object] = ()
    client_id: str | None = None
    username: str | None = None
    password: bytes | None = None
    certificate: CertificateMatch | None = None
    jwt: JwtSettings | None = None
    enabled: bool = True
    scram_iterations: int | None = None
    jwt_no_audience: bool = False


@dataclass(frozen=True, slots=True)
class CredentialChanges:
    """Changes to a credential; a field left None is kept. ``rules`` replaces the whole
    list (``()`` removes every rule: everything is then allowed); ``password`` replaces
    the password (MQTT_BASIC, SCRAM) and ``remove_password`` removes it (MQTT_BASIC);
    ``client_id`` / ``username`` ``""`` remove them (MQTT_BASIC)."""

    kind: ClientKind | None = None
    rules: Sequence[object] | None = None
    client_id: str | None = None
    username: str | None = None
    password: bytes | None = None
    remove_password: bool = False
    certificate: CertificateMatch | None = None
    jwt: JwtSettings | None = None
    enabled: bool | None = None


def _check_password(password: bytes) -> bytes:
    if len(password) > MAX_PASSWORD_BYTES:
        raise CredentialError(f"a password is at most {MAX_PASSWORD_BYTES} bytes (MQTT 1.5.6)")
    return password


async def _secrets(
    credential_type: CredentialType, password: bytes, iterations: int | None = None
) -> tuple[str | None, tuple[ScramSecret, ...]]:
    """(password hash, SCRAM secrets with ``iterations``: None for the defaults) of
    ``password`` for ``credential_type``, computed in a thread (argon2id: about 20 ms;
    PBKDF2: about 0.3 s per mechanism at the default counts). Raises
    :class:`CredentialError` for an iteration count out of bounds."""
    _check_password(password)
    if credential_type is CredentialType.MQTT_BASIC:
        if iterations is not None:
            raise CredentialError("only a SCRAM credential has an iteration count")
        return await asyncio.to_thread(hash_password, password), ()
    if credential_type is CredentialType.SCRAM:
        if iterations is not None and not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
            raise CredentialError(
                f"a SCRAM iteration count is {MIN_ITERATIONS:,} to {MAX_ITERATIONS:,} "
                f"(RFC 7677 asks at least 4,096), not {iterations:,}"
            )
        secrets = await asyncio.to_thread(
            lambda: tuple(
                derive_secret(mechanism, password, iterations=iterations)
                for mechanism in MECHANISMS
            )
        )
        return None, secrets
    raise CredentialError(f"a {credential_type.value} credential has no password")


class CredentialAdmin:
    """Credential management over a :class:`~.store.CredentialStore`."""

    def __init__(self, store: CredentialStore) -> None:
        self.store = store

    async def add(self, spec: CredentialSpec) -> Credential:
        """Create a credential from ``spec``; returns it as stored."""
        password_hash: str | None = None
        scram: tuple[ScramSecret, ...] = ()
        if spec.password is not None:
            password_hash, scram = await _secrets(spec.type, spec.password, spec.scram_iterations)
        elif spec.type is CredentialType.SCRAM:
            raise CredentialError("a SCRAM credential needs a password")
        jwt = spec.jwt
        if jwt is not None and not jwt.hmac and jwt.audience is None and not spec.jwt_no_audience:
            raise CredentialError(
                "a public-key JWT credential needs an audience (--jwt-audience): its issuer "
                "signs tokens for other services too; --no-audience to accept any"
            )
        credential = Credential(
            id=uuid.uuid4(),
            name=spec.name,
            type=spec.type,
            kind=spec.kind,
            enabled=spec.enabled,
            rules=parse_rules(spec.rules),
            client_id=spec.client_id,
            username=spec.username,
            password_hash=password_hash,
            certificate=spec.certificate,
            jwt=spec.jwt,
            scram=scram,
        )
        check_credential(credential)
        return await self.store.insert(credential)

    async def list(self, credential_type: CredentialType | None = None) -> list[Credential]:
        """Every credential (of one type, if given), by name."""
        return await self.store.list_all(credential_type)

    async def get(self, ref: str) -> Credential:
        """The credential named ``ref`` (a name, or an id). Raises :class:`CredentialNotFound`."""
        found = await self.store.get_by_name(ref)
        if found is None:
            try:
                credential_id = uuid.UUID(ref)
            except ValueError:
                credential_id = None
            if credential_id is not None:
                found = await self.store.get(credential_id)
        if found is None:
            raise CredentialNotFound(f"no credential named {ref!r}")
        return found

    async def update(self, ref: str, changes: CredentialChanges) -> Credential:
        """Apply ``changes`` to the credential ``ref``; returns it as stored. A change made
        by someone else meanwhile is not overwritten: the update is made again on it."""
        for _attempt in range(5):
            current = await self.get(ref)
            updated = await self._changed(current, changes)
            check_credential(updated)
            stored = await self.store.replace(updated)
            if stored is not None:
                return stored
        raise CredentialError(f"credential {ref!r} keeps changing; try again")

    async def _changed(self, current: Credential, changes: CredentialChanges) -> Credential:
        values: dict[str, object] = {}
        for name in ("kind", "certificate", "jwt", "enabled"):
            value = getattr(changes, name)
            if value is not None:
                values[name] = value
        if changes.rules is not None:
            values["rules"] = parse_rules(changes.rules)
        for name in ("client_id", "username"):
            value = getattr(changes, name)
            if value is not None:
                values[name] = value or None
        if changes.remove_password:
            if current.type is not CredentialType.MQTT_BASIC:
                raise CredentialError("only an MQTT_BASIC credential may have no password")
            values["password_hash"] = None
        if changes.password is not None:
            # A SCRAM credential keeps its iteration count (the first mechanism's: all alike).
            iterations = current.scram[0].iterations if current.scram else None
            values["password_hash"], values["scram"] = await _secrets(
                current.type, changes.password, iterations
            )
        return dataclasses.replace(current, **values)  # type: ignore[arg-type]

    async def set_enabled(self, ref: str, enabled: bool) -> Credential:
        """Enable or disable the credential ``ref``. Disabling disconnects its live clients
        (v5 DISCONNECT 0x98) and refuses its next CONNECTs (0x8A Banned)."""
        return await self.update(ref, CredentialChanges(enabled=enabled))

    async def delete(self, ref: str) -> Credential:
        """Delete the credential ``ref`` (its live clients are disconnected, v5 0x98);
        returns what it was."""
        credential = await self.get(ref)
        if not await self.store.delete(credential.id):
            raise CredentialNotFound(f"no credential named {ref!r}")
        return credential

    async def close(self) -> None:
        """Close the store's connections."""
        await self.store.close()
