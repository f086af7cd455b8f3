"""Password hashing with argon2id (argon2-cffi; RFC 9106), for MQTT_BASIC credentials.

Parameters follow OWASP's recommendation for argon2id (19 MiB of memory, 2 passes, one
lane): about 20 ms of one core per hash on the 2-core machine of bench/, so the ingest
nodes run every verification in a bounded thread pool (:mod:`.authenticate`), never on
the event loop. A hash carries its own parameters (PHC string format), so hashes made with
other parameters keep verifying.

A password is never stored or logged in clear: only :func:`hash_password`'s output is.
"""

from __future__ import annotations

import functools
import logging
import os

from argon2 import PasswordHasher, Type
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

log = logging.getLogger(__name__)

HASHER = PasswordHasher(time_cost=2, memory_cost=19_456, parallelism=1, type=Type.ID)
"""The argon2id parameters of new hashes: t=2, m=19 MiB, p=1 (OWASP)."""

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


@functools.cache
def _dummy_hash() -> str:
    return hash_password(os.urandom(16))


def verify_against_dummy(password: bytes) -> bool:
    """Spend what :func:`verify_password` spends, for a user name that has no credential,
    and return False: the time of a refusal does not tell whether the user name exists."""
    verify_password(_dummy_hash(), password)
    return False
