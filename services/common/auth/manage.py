"""Managing credentials: what ``cormorant credentials`` and the admin API both call.

:class:`CredentialAdmin` validates what it is given (:func:`~.credentials.check_credential`,
the rules' syntax), hashes passwords (argon2id) and derives SCRAM secrets off the event loop,
generates device secrets (:meth:`CredentialAdmin.add_generated`: HMAC-SHA-256, see
:mod:`.passwords`),
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

from services.common.auth.authorize import ALLOW_ALL_RULE, Rule, parse_rules
from services.common.auth.certificates import CertificateMatch
from services.common.auth.credentials import (
    Credential,
    CredentialError,
    CredentialType,
    check_credential,
)
from services.common.auth.jwt_auth import JwtSettings
from services.common.auth.passwords import (
    MAX_PASSWORD_BYTES,
    MIN_PASSWORD_LENGTH,
    generate_secret,
    hash_password,
    hash_secret,
    password_length,
)
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
    form (:func:`~.authorize.parse_rules`; none: the credential may do nothing), and
    ``allow_all`` adds ``allow all #`` after them; ``password`` (bytes, any) is hashed for
    MQTT_BASIC and turned into SCRAM secrets for SCRAM, never stored as given, with
    ``scram_iterations`` PBKDF2 iterations (SCRAM only; None: each mechanism's default,
    :data:`~.scram.ITERATIONS`): an MQTT_BASIC credential needs one unless ``no_password``
    (it then authenticates by its Client Identifier alone). A JWT credential with
    public-key algorithms needs an audience unless ``jwt_no_audience`` (tokens of the same
    issuer meant for other services would be taken otherwise); ``strict_subscribe``: see
    :class:`~.credentials.Credential`."""

    name: str
    type: CredentialType
    kind: ClientKind = ClientKind.DEVICE
    rules: Sequence[object] = ()
    strict_subscribe: bool = False
    client_id: str | None = None
    username: str | None = None
    password: bytes | None = None
    certificate: CertificateMatch | None = None
    jwt: JwtSettings | None = None
    enabled: bool = True
    allow_all: bool = False
    no_password: bool = False
    scram_iterations: int | None = None
    jwt_no_audience: bool = False


@dataclass(frozen=True, slots=True)
class CredentialChanges:
    """Changes to a credential; a field left None is kept. ``rules`` replaces the whole
    list (``()`` removes every rule: nothing is then allowed), and ``allow_all`` adds
    ``allow all #`` after the new rules (alone if ``rules`` is None); ``password`` replaces
    the password (MQTT_BASIC, SCRAM) and ``remove_password`` removes it (MQTT_BASIC);
    ``client_id`` / ``username`` ``""`` remove them (MQTT_BASIC)."""

    kind: ClientKind | None = None
    rules: Sequence[object] | None = None
    strict_subscribe: bool | None = None
    client_id: str | None = None
    username: str | None = None
    password: bytes | None = None
    remove_password: bool = False
    certificate: CertificateMatch | None = None
    jwt: JwtSettings | None = None
    enabled: bool | None = None
    allow_all: bool = False


def _check_password(password: bytes, min_length: int) -> bytes:
    if len(password) > MAX_PASSWORD_BYTES:
        raise CredentialError(f"a password is at most {MAX_PASSWORD_BYTES} bytes (MQTT 1.5.6)")
    if password_length(password) < min_length:
        raise CredentialError(
            f"a password must be at least {min_length} characters "
            "(the setting credential_password_min_length)"
        )
    return password


def _rules(rules: Sequence[object], allow_all: bool) -> tuple[Rule, ...]:
    parsed = parse_rules(rules)
    return (*parsed, ALLOW_ALL_RULE) if allow_all else parsed


async def _secrets(
    credential_type: CredentialType,
    password: bytes,
    min_length: int,
    iterations: int | None = None,
) -> tuple[str | None, tuple[ScramSecret, ...]]:
    """(password hash, SCRAM secrets with ``iterations``: None for the defaults) of
    ``password`` for ``credential_type``, computed in a thread (argon2id: about 20 ms;
    PBKDF2: about 0.3 s per mechanism at the default counts). Raises
    :class:`CredentialError` for a password shorter than ``min_length`` characters or an
    iteration count out of bounds."""
    if credential_type not in (CredentialType.MQTT_BASIC, CredentialType.SCRAM):
        raise CredentialError(f"a {credential_type.value} credential has no password")
    _check_password(password, min_length)
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
    raise AssertionError(credential_type)


class CredentialAdmin:
    """Credential management over a :class:`~.store.CredentialStore`; passwords shorter
    than ``min_password_length`` characters (the setting ``credential_password_min_length``)
    are refused."""

    def __init__(
        self, store: CredentialStore, min_password_length: int = MIN_PASSWORD_LENGTH
    ) -> None:
        self.store = store
        self.min_password_length = min_password_length

    async def add(self, spec: CredentialSpec) -> Credential:
        """Create a credential from ``spec``; returns it as stored.

        Raises :class:`~.credentials.CredentialError` for an MQTT_BASIC credential without
        a password and without ``no_password`` (or with both), a password too short, and
        whatever :func:`~.credentials.check_credential` refuses.
        """
        credential = await self._built(spec)
        check_credential(credential)
        return await self.store.insert(credential)

    async def checked(self, spec: CredentialSpec) -> Credential:
        """The credential ``spec`` describes, its password hashed, checked as :meth:`add`
        checks it, not stored (an import checks every row before storing any). Raises
        what :meth:`add` raises, but no conflict."""
        credential = await self._built(spec)
        check_credential(credential)
        return credential

    async def _built(self, spec: CredentialSpec) -> Credential:
        """The credential ``spec`` describes, its password hashed (argon2id), not checked
        by :func:`~.credentials.check_credential` yet."""
        password_hash: str | None = None
        scram: tuple[ScramSecret, ...] = ()
        if spec.no_password and spec.password is not None:
            raise CredentialError("give a password or --no-password, not both")
        if spec.no_password and spec.type is not CredentialType.MQTT_BASIC:
            raise CredentialError("only an MQTT_BASIC credential may have no password")
        if spec.password is not None:
            password_hash, scram = await _secrets(
                spec.type, spec.password, self.min_password_length, spec.scram_iterations
            )
        elif spec.type is CredentialType.SCRAM:
            raise CredentialError("a SCRAM credential needs a password")
        elif (
            spec.type is CredentialType.MQTT_BASIC
            and not spec.no_password
            and (spec.client_id is not None or spec.username is not None)
        ):
            raise CredentialError(
                "an MQTT_BASIC credential needs a password (--password or --password-file), "
                "or --no-password to authenticate its client by its client id alone"
            )
        jwt = spec.jwt
        if jwt is not None and not jwt.hmac and jwt.audience is None and not spec.jwt_no_audience:
            raise CredentialError(
                "a public-key JWT credential needs an audience (--jwt-audience): its issuer "
                "signs tokens for other services too; --no-audience to accept any"
            )
        return Credential(
            id=uuid.uuid4(),
            name=spec.name,
            type=spec.type,
            kind=spec.kind,
            enabled=spec.enabled,
            rules=_rules(spec.rules, spec.allow_all),
            strict_subscribe=spec.strict_subscribe,
            client_id=spec.client_id,
            username=spec.username,
            password_hash=password_hash,
            certificate=spec.certificate,
            jwt=spec.jwt,
            scram=scram,
        )

    async def add_generated(self, spec: CredentialSpec) -> tuple[Credential, str]:
        """Create an MQTT_BASIC credential from ``spec`` with a new generated secret as its
        password (:func:`~.passwords.generate_secret`, stored as its salted HMAC-SHA-256
        only); returns the credential as stored and the secret, which the caller shows once
        and never logs (it cannot be recovered). Raises
        :class:`~.credentials.CredentialError` when ``spec`` is not MQTT_BASIC or gives a
        password or ``no_password``, and whatever :meth:`add` raises."""
        if spec.type is not CredentialType.MQTT_BASIC:
            raise CredentialError("only an MQTT_BASIC credential gets a generated secret")
        if spec.password is not None or spec.no_password:
            raise CredentialError("a generated secret replaces --password and --no-password")
        secret = generate_secret()
        password_hash = hash_secret(secret.encode("ascii"))
        credential = dataclasses.replace(
            await self._built(dataclasses.replace(spec, no_password=True)),
            password_hash=password_hash,
        )
        check_credential(credential)
        return await self.store.insert(credential), secret

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
        for name in ("kind", "certificate", "jwt", "enabled", "strict_subscribe"):
            value = getattr(changes, name)
            if value is not None:
                values[name] = value
        if changes.rules is not None or changes.allow_all:
            values["rules"] = _rules(changes.rules or (), changes.allow_all)
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
                current.type, changes.password, self.min_password_length, iterations
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
