"""Password hashing for MQTT_BASIC credentials: argon2id (argon2-cffi; RFC 9106) for
passwords people choose, a salted HMAC-SHA-256 for secrets the server generates.

Each stored hash names its :class:`PasswordScheme` as its first ``$``-field (PHC string
format), and the credential record says it too (column ``password_scheme``).

**argon2id** (:data:`PasswordScheme.ARGON2ID`, the default). Parameters follow OWASP's
recommendation for argon2id (19 MiB of memory, 2 passes, one lane): about 20 ms of one
core per hash on the 2-core machine of bench/, so the ingest nodes run every verification
in a bounded thread pool (:mod:`.authenticate`), never on the event loop. A hash carries
its own parameters (PHC string format), so hashes made with other parameters keep
verifying.

**HMAC-SHA-256** (:data:`PasswordScheme.HMAC_SHA256`), only for the 256-bit random
secrets :func:`generate_secret` makes (``cormorant credentials add --generate-secret``):
``$hmac-sha256$<salt>$<HMAC-SHA-256(key=salt, message=secret)>``, a random 16-byte salt,
both unpadded base64. A verification takes a few µs, so it runs on the event loop and a
reconnect storm of such clients costs no argon2id at all. Why that is safe: a slow hash is
there for the attacker who holds the stored hashes (a stolen database or backup) and
guesses offline, and it only helps when the guesses can succeed, i.e. for passwords people
choose, which come from a small space (a few billion likely ones cost an attacker minutes
at SHA-256 speed and years at argon2id's). A generated secret has 2^256 possible values:
even at 10^12 guesses per second on GPUs, finding one takes about 10^57 years, so a slower
hash adds nothing, and the salt keeps identical secrets from having identical hashes and
precomputed tables from being of use. The same hash on a chosen password would hand it to
such an attacker: hence only generated secrets get it (EMQX and Mosquitto offer salted
SHA-256 likewise; they leave the choice to the operator).

A password is never stored or logged in clear: only :func:`hash_password`'s and
:func:`hash_secret`'s outputs are.
"""

from __future__ import annotations

import base64
import binascii
import enum
import functools
import hashlib
import hmac
import logging
import os
import secrets

from argon2 import PasswordHasher, Type
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

log = logging.getLogger(__name__)

HASHER = PasswordHasher(time_cost=2, memory_cost=19_456, parallelism=1, type=Type.ID)
"""The argon2id parameters of new hashes: t=2, m=19 MiB, p=1 (OWASP)."""

SECRET_BYTES = 32
"""Random bytes in a generated secret (256 bits)."""

SALT_BYTES = 16
"""Random bytes of salt in an HMAC-SHA-256 hash (128 bits, as argon2-cffi's default)."""


class PasswordScheme(enum.Enum):
    """How a credential's password is hashed: its name in the PHC string and in the
    ``password_scheme`` column."""

    ARGON2ID = "argon2id"
    HMAC_SHA256 = "hmac-sha256"


def scheme_of(encoded: str) -> PasswordScheme | None:
    """The scheme a stored hash ``encoded`` names in its first ``$``-field (None: none
    known)."""
    name = encoded.split("$", 2)[1] if encoded.startswith("$") and encoded.count("$") > 1 else ""
    try:
        return PasswordScheme(name)
    except ValueError:
        return None


MAX_PASSWORD_BYTES = 65_535
"""The longest password MQTT can carry (Binary Data, MQTT 1.5.6)."""

MIN_PASSWORD_LENGTH = 12
"""The default shortest password a credential may be given, in characters (the setting
``credential_password_min_length``; OWASP's and NIST SP 800-63B's advice for passwords
that are not the only factor, rounded up for machine-held secrets)."""


def password_length(password: bytes) -> int:
    """The length of ``password`` in characters: its UTF-8 characters, each byte that is not
    UTF-8 counting as one."""
    return len(password.decode("utf-8", "surrogateescape"))


def hash_password(password: bytes) -> str:
    """The argon2id hash (PHC string, ``$argon2id$v=19$m=19456,t=2,p=1$...``) of ``password``
    (any bytes). Takes about 20 ms of CPU: call it off the event loop."""
    return HASHER.hash(password)


def verify_password(encoded: str, password: bytes) -> bool:
    """Whether ``password`` matches the argon2 hash ``encoded``. Never raises: a hash that is
    not a valid argon2 hash is logged (without the password) and verifies nothing. About
    20 ms of CPU: call it off the event loop."""
    try:
        return HASHER.verify(encoded, password)
    except VerifyMismatchError:
        return False
    except (InvalidHashError, VerificationError) as exc:
        log.error("stored password hash is not a valid argon2 hash: %s", type(exc).__name__)
        return False


def generate_secret() -> str:
    """A new secret for a client: :data:`SECRET_BYTES` random bytes (:mod:`secrets`, the
    operating system's CSPRNG) as unpadded URL-safe base64 (43 ASCII characters), which is
    what the client sends as its Password."""
    return secrets.token_urlsafe(SECRET_BYTES)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)


def hash_secret(secret: bytes) -> str:
    """The salted HMAC-SHA-256 hash (``$hmac-sha256$<salt>$<digest>``) of a generated
    ``secret`` (see the module: never for a password someone chose)."""
    salt = secrets.token_bytes(SALT_BYTES)
    digest = hmac.new(salt, secret, hashlib.sha256).digest()
    return f"${PasswordScheme.HMAC_SHA256.value}${_b64(salt)}${_b64(digest)}"


def _verify_secret(encoded: str, secret: bytes) -> bool:
    try:
        _empty, _scheme, salt, digest = encoded.split("$")
        expected = _unb64(digest)
        given = hmac.new(_unb64(salt), secret, hashlib.sha256).digest()
    except (ValueError, binascii.Error):
        log.error("stored password hash is not a valid %s hash", PasswordScheme.HMAC_SHA256.value)
        return False
    return hmac.compare_digest(expected, given)


def verify(encoded: str, password: bytes) -> bool:
    """Whether ``password`` matches ``encoded``, by the scheme it names: argon2id (about
    20 ms of CPU: call it off the event loop) or HMAC-SHA-256 (a few µs, compared in
    constant time with :func:`hmac.compare_digest`). Never raises: a hash of no known
    scheme is logged (without the password) and verifies nothing."""
    scheme = scheme_of(encoded)
    if scheme is PasswordScheme.HMAC_SHA256:
        return _verify_secret(encoded, password)
    return verify_password(encoded, password)


@functools.cache
def _dummy_hash() -> str:
    return hash_password(os.urandom(16))


def verify_against_dummy(password: bytes) -> bool:
    """Spend what :func:`verify_password` spends, for a user name that has no credential,
    and return False: the time of a refusal does not tell whether the user name exists."""
    verify_password(_dummy_hash(), password)
    return False
