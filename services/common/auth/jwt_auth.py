"""JWT credentials: the Password field of CONNECT carries a JSON Web Token (RFC 7519),
verified with PyJWT against the keys a JWT credential holds.

A JWT credential stands for one token issuer: its verification key (an HMAC secret, an
RSA / EC / Ed25519 public key in PEM, or the HTTPS URL of a JSON Web Key Set, RFC 7517 5,
whose keys :mod:`.jwks` fetches and picks by the token's ``kid``), the algorithms it signs
with, and optionally the audience (``aud``) and issuer (``iss``) its tokens must name.
``exp`` is required and, with ``nbf``, checked against the clock (with
:attr:`JwtSettings.leeway_seconds`). The claims named by ``client_id_claim`` must equal the
CONNECT's Client Identifier; the claim named by ``username_claim`` (default ``sub``) is the
client's User Name, which a CONNECT User Name must not contradict (:mod:`.authenticate`).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import jwt

HMAC_ALGORITHMS = frozenset(("HS256", "HS384", "HS512"))
PUBLIC_KEY_ALGORITHMS = frozenset(
    ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
)

_SHAPE = re.compile(rb"^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$")

MIN_HMAC_SECRET_BYTES = 32
"""The shortest HMAC secret a JWT credential may have (UTF-8 bytes): RFC 7518 3.2 asks a key
at least as long as the hash (HS256: 32 bytes); a short one can be found by trying."""

MAX_TOKEN_BYTES = 16_384
"""Longer passwords are not taken for tokens (a JWT of a few claims is well under 2 KiB)."""


DEFAULT_USERNAME_CLAIM = "sub"
"""The claim a token's User Name comes from when a credential names none (RFC 7519 4.1.2:
the principal that is the subject of the token)."""


class TokenError(ValueError):
    """A token that does not verify: malformed, wrong signature, expired, not yet valid,
    wrong audience or issuer, or a required claim missing. The message says which."""


class JwksUnavailable(Exception):
    """A JWT credential's JSON Web Key Set could not be fetched (network, TLS, HTTP status,
    not a key set). The message says why; it never holds a token."""


class NotThisIssuer(TokenError):
    """The token is not signed with this credential's key or algorithms: another JWT
    credential may verify it."""


@dataclass(frozen=True, slots=True)
class JwtSettings:
    """What a JWT credential verifies tokens with.

    ``algorithms``: the JWS algorithms accepted, all HMAC (``HS*``, ``key`` is the shared
    secret) or all public-key (``RS*``, ``PS*``, ``ES*``, ``EdDSA``; ``key`` is a PEM public
    key): never both, so a public key can never be used as an HMAC secret. ``audience`` /
    ``issuer``: the ``aud`` / ``iss`` tokens must carry (None: not checked).
    ``client_id_claim``: the claim that must equal the CONNECT's Client Identifier (None: not
    checked; ``${client_id}`` rules then refused). ``username_claim``: the claim that is the
    client's User Name, ``${username}`` (None: :data:`DEFAULT_USERNAME_CLAIM`, and a token
    without it has no User Name; named: a token without it is refused).
    ``leeway_seconds``: clock skew allowed on ``exp``, ``nbf`` and ``iat``.
    ``max_age_seconds``: tokens must carry ``iat`` (issued at, RFC 7519 4.1.6) no older
    than this (None: not checked). ``jwks_url``: instead of a ``key`` (then empty), the
    ``https://`` URL of the issuer's JSON Web Key Set (RFC 7517 5); public-key algorithms
    only.
    """

    algorithms: tuple[str, ...]
    key: str
    audience: str | None = None
    issuer: str | None = None
    client_id_claim: str | None = None
    username_claim: str | None = None
    leeway_seconds: int = 0
    max_age_seconds: int | None = None
    jwks_url: str | None = None

    @property
    def hmac(self) -> bool:
        """True when the key is a shared secret (HS* algorithms), which is never shown."""
        return bool(self.algorithms) and self.algorithms[0] in HMAC_ALGORITHMS


def check_settings(settings: JwtSettings) -> None:
    """Raise ``ValueError`` naming the problem if ``settings`` cannot verify tokens: no or
    unknown algorithms, HMAC and public-key algorithms mixed, neither or both of a key and a
    JWKS URL, a JWKS URL that is not ``https://`` with a host or that comes with HMAC
    algorithms, an HMAC secret shorter than :data:`MIN_HMAC_SECRET_BYTES`, a maximum age
    below 1 second, or a key that PyJWT cannot load for the algorithms."""
    algorithms = set(settings.algorithms)
    if not algorithms:
        raise ValueError("a JWT credential needs at least one algorithm")
    unknown = algorithms - HMAC_ALGORITHMS - PUBLIC_KEY_ALGORITHMS
    if unknown:
        raise ValueError(f"unknown JWT algorithms: {', '.join(sorted(unknown))}")
    if algorithms & HMAC_ALGORITHMS and algorithms & PUBLIC_KEY_ALGORITHMS:
        raise ValueError("JWT algorithms mix HMAC (HS*) and public-key ones")
    if settings.jwks_url is not None:
        if settings.key:
            raise ValueError("a JWT credential has a key or a JWKS URL, not both")
        check_jwks_url(settings.jwks_url)
        if settings.hmac:
            raise ValueError("a JWKS URL serves public keys: HMAC (HS*) algorithms do not apply")
    elif not settings.key:
        raise ValueError("a JWT credential needs a key or a JWKS URL")
    if settings.hmac and len(settings.key.encode("utf-8")) < MIN_HMAC_SECRET_BYTES:
        raise ValueError(
            f"a JWT HMAC secret has at least {MIN_HMAC_SECRET_BYTES} bytes (RFC 7518 3.2), "
            f"not {len(settings.key.encode('utf-8'))}"
        )
    if settings.leeway_seconds < 0:
        raise ValueError("JWT leeway must be >= 0 seconds")
    if settings.max_age_seconds is not None and settings.max_age_seconds < 1:
        raise ValueError("a JWT maximum token age is at least 1 second")
    for name in algorithms if settings.jwks_url is None else ():
        algorithm = jwt.get_algorithm_by_name(name)
        try:
            algorithm.prepare_key(settings.key)
        except (jwt.InvalidKeyError, ValueError, TypeError) as exc:
            raise ValueError(f"the JWT key does not suit {name}: {exc}") from None


def check_jwks_url(url: str) -> None:
    """Raise ``ValueError`` unless ``url`` is an ``https://`` URL with a host and no user
    information: keys fetched over plain HTTP could be anyone's, and a password in the URL
    would be shown wherever the credential is."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise ValueError(f"the JWKS URL is not a URL: {exc}") from None
    if parts.scheme.lower() != "https":
        raise ValueError("a JWKS URL must be https:// (keys over plain HTTP could be anyone's)")
    if not parts.hostname:
        raise ValueError("the JWKS URL has no host")
    if parts.username is not None or parts.password is not None:
        raise ValueError("the JWKS URL must not hold a user name or password")


def looks_like_token(password: bytes) -> bool:
    """Whether ``password`` has a compact JWS's shape (three base64url parts)."""
    return len(password) <= MAX_TOKEN_BYTES and _SHAPE.match(password) is not None


def verify_token(
    token: bytes, settings: JwtSettings, key: jwt.PyJWK | None = None
) -> dict[str, Any]:
    """The claims of ``token`` if it verifies with ``settings`` at the current time, with
    ``key`` (the key its ``kid`` names in the credential's JWKS) when given, else with
    ``settings.key``.

    Raises :class:`NotThisIssuer` when the signature or algorithm is not this credential's
    (checked first), else :class:`TokenError` naming the reason (never the token itself).
    """
    try:
        claims: dict[str, Any] = jwt.decode(
            token.decode("ascii"),
            settings.key if key is None else key,
            algorithms=list(settings.algorithms),
            audience=settings.audience,
            issuer=settings.issuer,
            leeway=settings.leeway_seconds,
            options={
                "require": ["exp"] if settings.max_age_seconds is None else ["exp", "iat"],
                "verify_aud": settings.audience is not None,
            },
        )
    except jwt.ExpiredSignatureError:
        raise TokenError("token expired (exp)") from None
    except jwt.ImmatureSignatureError:
        raise TokenError("token not valid yet (nbf, or iat in the future)") from None
    except jwt.InvalidAudienceError:
        raise TokenError("token audience (aud) is not the credential's") from None
    except jwt.InvalidIssuerError:
        raise TokenError("token issuer (iss) is not the credential's") from None
    except jwt.MissingRequiredClaimError as exc:
        raise TokenError(f"token lacks the {exc.claim!r} claim") from None
    except (jwt.InvalidSignatureError, jwt.InvalidAlgorithmError):
        raise NotThisIssuer("token signature does not verify") from None
    except (jwt.InvalidTokenError, UnicodeDecodeError) as exc:
        raise TokenError(f"malformed token ({type(exc).__name__})") from None
    if settings.max_age_seconds is not None:
        issued = claims["iat"]  # required above; PyJWT checked it is a number
        age = time.time() - float(issued)
        if age > settings.max_age_seconds + settings.leeway_seconds:
            raise TokenError(f"token older than {settings.max_age_seconds} s (iat)")
    return claims
