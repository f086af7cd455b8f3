"""The credential model: what a client may connect with, as its kind and its rules.

Every credential has an ``id`` (UUID), a unique ``name``, a :class:`CredentialType`, an
``enabled`` flag, the client's :class:`~services.common.records.ClientKind` (DEVICE or
APPLICATION: the delivery path of its sessions) and its authorization rules
(:mod:`.authorize`). What identifies the client depends on the type:

- ``MQTT_BASIC``: a Client Identifier and/or a User Name (at least one), and optionally a
  password (its hash only, argon2id for a chosen password, HMAC-SHA-256 for a generated
  secret: :mod:`.passwords`);
- ``X509``: a verified TLS client certificate (:class:`~.certificates.CertificateMatch`:
  fingerprint, or CN / SAN pattern);
- ``JWT``: a token issuer whose tokens come in the Password field (:mod:`.jwt_auth`);
- ``SCRAM``: a User Name and its salted SCRAM secrets for SCRAM-SHA-256 and SCRAM-SHA-512,
  used through MQTT 5 enhanced authentication (:mod:`.scram`).

:func:`check_credential` validates one; :func:`public_view` is what may be shown (never a
password hash, an HMAC secret or a SCRAM key).
"""

from __future__ import annotations

import enum
import re
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from services.common.auth.authorize import CLIENT_ID, Rule
from services.common.auth.certificates import CertificateMatch, parse_san_pattern
from services.common.auth.jwt_auth import JwtSettings, check_settings
from services.common.auth.passwords import PasswordScheme, scheme_of
from services.common.auth.scram import ScramSecret
from services.common.records import ClientKind

MAX_IDENTIFIER_BYTES = 1024
"""Longest Client Identifier or User Name a credential may name, in UTF-8 bytes (MQTT
allows 65,535; PostgreSQL indexes hold about 2.7 kB). A CONNECT with a longer one matches
no credential."""

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}$")
"""A credential's name: 1 to 128 letters, digits and ``_ . : @ -``, starting with a letter or
digit (it is typed on command lines and appears in URLs of the admin API)."""

_FINGERPRINT = re.compile(r"^[0-9a-f]{64}$")


class CredentialError(ValueError):
    """A credential that is invalid as given; the message names the field and the problem."""


class CredentialType(enum.Enum):
    """How a client proves who it is."""

    MQTT_BASIC = "MQTT_BASIC"
    X509 = "X509"
    JWT = "JWT"
    SCRAM = "SCRAM"


@dataclass(frozen=True, slots=True)
class Credential:
    """One credential (see the module). ``strict_subscribe`` refuses a SUBSCRIBE whose
    Topic Filter overlaps a denied subtree instead of withholding the denied topics
    (:class:`~.authorize.Grant`). ``created_at`` / ``updated_at`` are set by the store;
    ``revision`` grows by one with every change (the store's trigger)."""

    id: uuid.UUID
    name: str
    type: CredentialType
    kind: ClientKind = ClientKind.DEVICE
    enabled: bool = True
    rules: tuple[Rule, ...] = ()
    strict_subscribe: bool = False
    client_id: str | None = None
    username: str | None = None
    password_hash: str | None = None
    certificate: CertificateMatch | None = None
    jwt: JwtSettings | None = None
    scram: tuple[ScramSecret, ...] = field(default=())
    created_at: datetime | None = None
    updated_at: datetime | None = None
    revision: int = 0

    @property
    def password_scheme(self) -> PasswordScheme | None:
        """How :attr:`password_hash` was made (None: no password, or a hash of no known
        scheme, which :func:`check_credential` refuses)."""
        return None if self.password_hash is None else scheme_of(self.password_hash)

    def scram_secret(self, mechanism: str) -> ScramSecret | None:
        """The SCRAM secret for ``mechanism`` (``SCRAM-SHA-256`` / ``SCRAM-SHA-512``), if any."""
        for secret in self.scram:
            if secret.mechanism == mechanism:
                return secret
        return None


def _check_identifier(value: str | None, what: str) -> None:
    if value is None:
        return
    if not value:
        raise CredentialError(f"{what} must not be empty")
    if "\x00" in value or len(value.encode("utf-8", "surrogatepass")) > MAX_IDENTIFIER_BYTES:
        raise CredentialError(f"{what} must be at most {MAX_IDENTIFIER_BYTES} bytes, no U+0000")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise CredentialError(f"{what} is not valid UTF-8") from None


def _check_certificate(match: CertificateMatch | None) -> None:
    if match is None:
        raise CredentialError("an X509 credential needs a certificate fingerprint, CN or SAN")
    given = [v for v in (match.fingerprint, match.common_name, match.san) if v is not None]
    if len(given) != 1:
        raise CredentialError("give exactly one of certificate fingerprint, CN pattern or SAN")
    if match.fingerprint is not None and not _FINGERPRINT.match(match.fingerprint):
        raise CredentialError("a certificate fingerprint is 64 lowercase hex digits (SHA-256)")
    if not given[0]:
        raise CredentialError("a certificate pattern must not be empty")
    if match.san is not None:
        try:
            parse_san_pattern(match.san)
        except ValueError as exc:
            raise CredentialError(str(exc)) from None


def client_id_bound(credential: Credential) -> bool:
    """Whether authentication ties ``credential`` to the Client Identifier its client
    connects with, so that ``${client_id}`` in its rules names the client's own topics
    rather than any the client chooses: an MQTT_BASIC credential with a client id (the
    CONNECT must carry it), a JWT credential with a ``client_id_claim`` (the token must
    name it)."""
    if credential.type is CredentialType.MQTT_BASIC:
        return credential.client_id is not None
    if credential.type is CredentialType.JWT:
        return credential.jwt is not None and credential.jwt.client_id_claim is not None
    return False


def _check_client_id_rules(credential: Credential) -> None:
    if client_id_bound(credential):
        return
    for rule in credential.rules:
        if CLIENT_ID in rule.topic_filter.split("/"):
            how = {
                CredentialType.MQTT_BASIC: "give it a client id (--client-id)",
                CredentialType.JWT: "give it a client id claim (--jwt-client-id-claim)",
            }.get(credential.type, f"a {credential.type.value} credential cannot be")
            raise CredentialError(
                f"rule '{rule}' uses {CLIENT_ID}, but the credential is not bound to a "
                f"Client Identifier, so any client id would do: {how}; or write the rule "
                "with ${username}, which authentication binds"
            )


def check_credential(credential: Credential) -> None:
    """Raise :class:`CredentialError` if ``credential`` is not valid for its type.

    MQTT_BASIC: a Client Identifier or a User Name (or both), a password hash unless it has
    a Client Identifier (client-id-only authentication), no certificate, token or SCRAM
    fields. X509: a certificate match only. JWT: token settings
    PyJWT accepts (:func:`~.jwt_auth.check_settings`). SCRAM: a User Name and secrets for
    its mechanisms. Every type: a valid name, and ``${client_id}`` in its rules only when
    it is :func:`client_id_bound`.
    """
    if not NAME_PATTERN.match(credential.name):
        raise CredentialError(
            f"name {credential.name!r} must be 1-128 letters, digits or _.:@- "
            "(starting with a letter or digit)"
        )
    _check_identifier(credential.client_id, "client id")
    _check_identifier(credential.username, "user name")
    kind = credential.type
    extra = {
        "client id": credential.client_id is not None and kind is not CredentialType.MQTT_BASIC,
        "user name": credential.username is not None
        and kind not in (CredentialType.MQTT_BASIC, CredentialType.SCRAM),
        "password": credential.password_hash is not None and kind is not CredentialType.MQTT_BASIC,
        "certificate": credential.certificate is not None and kind is not CredentialType.X509,
        "JWT settings": credential.jwt is not None and kind is not CredentialType.JWT,
        "SCRAM secrets": bool(credential.scram) and kind is not CredentialType.SCRAM,
    }
    for what, present in extra.items():
        if present:
            raise CredentialError(f"a {kind.value} credential has no {what}")
    if kind is CredentialType.MQTT_BASIC:
        if credential.client_id is None and credential.username is None:
            raise CredentialError("an MQTT_BASIC credential needs a client id or a user name")
        if credential.password_hash is not None and credential.password_scheme is None:
            raise CredentialError("the password hash is of no known scheme")
        if credential.password_hash is None and credential.client_id is None:
            raise CredentialError(
                "an MQTT_BASIC credential without a password authenticates its client by "
                "its client id alone: it needs a client id"
            )
    elif kind is CredentialType.X509:
        _check_certificate(credential.certificate)
    elif kind is CredentialType.JWT:
        if credential.jwt is None:
            raise CredentialError("a JWT credential needs its token settings")
        try:
            check_settings(credential.jwt)
        except ValueError as exc:
            raise CredentialError(str(exc)) from None
    elif kind is CredentialType.SCRAM:
        if credential.username is None:
            raise CredentialError("a SCRAM credential needs a user name")
        if not credential.scram:
            raise CredentialError("a SCRAM credential needs a password")
    _check_client_id_rules(credential)


def public_view(credential: Credential) -> dict[str, Any]:
    """``credential`` as JSON-ready data without secrets: ``password`` says only whether one
    is set, an HMAC key is masked, SCRAM keys are left out (their mechanisms and iteration
    counts are shown)."""
    view: dict[str, Any] = {
        "id": str(credential.id),
        "name": credential.name,
        "type": credential.type.value,
        "enabled": credential.enabled,
        "kind": credential.kind.name,
        "rules": [str(rule) for rule in credential.rules],
        "strict_subscribe": credential.strict_subscribe,
    }
    if credential.type is CredentialType.MQTT_BASIC:
        view["client_id"] = credential.client_id
        view["username"] = credential.username
        view["password"] = "set" if credential.password_hash is not None else "none"
        scheme = credential.password_scheme
        view["password_scheme"] = None if scheme is None else scheme.value
    elif credential.type is CredentialType.SCRAM:
        view["username"] = credential.username
        view["scram"] = [
            {"mechanism": s.mechanism, "iterations": s.iterations} for s in credential.scram
        ]
    elif credential.type is CredentialType.X509 and credential.certificate is not None:
        view["certificate"] = credential.certificate.as_dict()
    elif credential.type is CredentialType.JWT and credential.jwt is not None:
        settings = credential.jwt
        view["jwt"] = {
            "algorithms": list(settings.algorithms),
            "key": "**********" if settings.hmac else settings.key,
            "audience": settings.audience,
            "issuer": settings.issuer,
            "client_id_claim": settings.client_id_claim,
            "username_claim": settings.username_claim,
            "leeway_seconds": settings.leeway_seconds,
            "max_age_seconds": settings.max_age_seconds,
            "jwks_url": settings.jwks_url,
        }
    for stamp in ("created_at", "updated_at"):
        value = getattr(credential, stamp)
        view[stamp] = None if value is None else value.isoformat()
    return view
