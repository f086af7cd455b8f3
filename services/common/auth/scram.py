"""SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677), the server side, sans-IO.

Used by MQTT 5 enhanced authentication (MQTT 5.0 4.12): the Authentication Method is the
SASL mechanism name, the Authentication Data carries the SCRAM messages.

- :func:`derive_secret` makes what a credential stores: salt, iteration count, StoredKey and
  ServerKey (never the password, never SaltedPassword);
- :class:`ScramExchange` runs one exchange: :meth:`~ScramExchange.client_first` parses the
  client-first-message (the user name is then known, so the caller can look the credential
  up), :meth:`~ScramExchange.server_first` answers with the salt and a nonce,
  :meth:`~ScramExchange.client_final` checks the proof and returns the server-final-message.

Channel binding is not supported (gs2 flag ``n``, or ``y``: the client supports it but thinks
the server does not); SASLprep is reduced to NFKC normalisation of the user name, and the
user name's ``=2C``/``=3D`` escapes are decoded (RFC 5802 5.1). Every malformed message
raises :class:`ScramError`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import unicodedata
from dataclasses import dataclass

MECHANISMS = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
"""The SASL mechanism names supported (RFC 7677 and its SHA-512 sibling) and their hashes."""

ITERATIONS = {"SCRAM-SHA-256": 600_000, "SCRAM-SHA-512": 210_000}
"""PBKDF2 iterations of new secrets by default, per mechanism: OWASP's Password Storage
Cheat Sheet (PBKDF2-HMAC-SHA256: 600,000; PBKDF2-HMAC-SHA512: 210,000). A client pays the
same count once per connection (the server only compares keys): about 0.3 s of one core of
bench/'s machine for SHA-256 (a client may cache its SaltedPassword per salt and count)."""

MIN_ITERATIONS = 4096
"""The fewest PBKDF2 iterations a credential may have: RFC 7677's minimum (RFC 5802 5.1)."""

MAX_ITERATIONS = 10_000_000
"""The most PBKDF2 iterations a credential may have (each client connect pays them)."""

NONCE_BYTES = 18
"""Random bytes of the server's part of the nonce (24 base64 characters)."""


class ScramError(ValueError):
    """A SCRAM message that is malformed or out of order, or a proof that does not verify."""


@dataclass(frozen=True, slots=True)
class ScramSecret:
    """What a SCRAM credential stores for one mechanism (RFC 5802 3): ``salt`` (bytes),
    ``iterations`` (PBKDF2 count), ``stored_key`` = H(ClientKey), ``server_key`` =
    HMAC(SaltedPassword, "Server Key")."""

    mechanism: str
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


def _hash_name(mechanism: str) -> str:
    try:
        return MECHANISMS[mechanism]
    except KeyError:
        raise ScramError(f"unsupported SCRAM mechanism {mechanism!r}") from None


def _hmac(name: str, key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, name).digest()


def derive_secret(
    mechanism: str, password: bytes, salt: bytes | None = None, iterations: int | None = None
) -> ScramSecret:
    """The :class:`ScramSecret` of ``password`` (bytes; a text password is its UTF-8 form)
    for ``mechanism`` (a key of :data:`MECHANISMS`), with a fresh 16-byte salt unless one is
    given. PBKDF2 with ``iterations`` rounds (default: :data:`ITERATIONS` of the mechanism):
    run it off any event loop. Raises :class:`ScramError` for an unknown mechanism or an
    iteration count outside [:data:`MIN_ITERATIONS`, :data:`MAX_ITERATIONS`]."""
    name = _hash_name(mechanism)
    salt = os.urandom(16) if salt is None else salt
    iterations = ITERATIONS[mechanism] if iterations is None else iterations
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ScramError(
            f"a SCRAM iteration count is {MIN_ITERATIONS:,} to {MAX_ITERATIONS:,}, "
            f"not {iterations:,}"
        )
    salted = hashlib.pbkdf2_hmac(name, password, salt, iterations)
    client_key = _hmac(name, salted, b"Client Key")
    return ScramSecret(
        mechanism=mechanism,
        salt=salt,
        iterations=iterations,
        stored_key=hashlib.new(name, client_key).digest(),
        server_key=_hmac(name, salted, b"Server Key"),
    )


def _attributes(message: str) -> list[tuple[str, str]]:
    out = []
    for part in message.split(","):
        if len(part) < 2 or part[1] != "=" or not part[0].isalpha():
            raise ScramError(f"malformed SCRAM attribute {part[:20]!r}")
        out.append((part[0], part[2:]))
    return out


def _decode_username(value: str) -> str:
    if "=" in value.replace("=2C", "").replace("=3D", ""):
        raise ScramError("malformed escape in the SCRAM user name")
    return unicodedata.normalize("NFKC", value.replace("=2C", ",").replace("=3D", "="))


class ScramExchange:
    """One SCRAM exchange, server side, for ``mechanism`` (a key of :data:`MECHANISMS`).

    Raises :class:`ScramError` for an unknown mechanism. ``nonce`` (tests only) fixes the
    server's part of the nonce.
    """

    __slots__ = (
        "_bare_client_first",
        "_client_nonce",
        "_gs2_header",
        "_hash",
        "_nonce",
        "_secret",
        "_server_first",
        "mechanism",
        "username",
    )

    def __init__(self, mechanism: str, nonce: str | None = None) -> None:
        self._hash = _hash_name(mechanism)
        self.mechanism = mechanism
        self.username = ""
        self._nonce = nonce or base64.b64encode(os.urandom(NONCE_BYTES)).decode()
        self._client_nonce = ""
        self._gs2_header = ""
        self._bare_client_first = ""
        self._server_first = ""
        self._secret: ScramSecret | None = None

    def client_first(self, data: bytes) -> str:
        """Parse the client-first-message; return the user name it names (RFC 5802 7).

        Raises :class:`ScramError` if it is malformed, asks for channel binding (``p=``) or
        an authorization identity, or carries mandatory extensions.
        """
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ScramError("client-first-message is not UTF-8") from None
        parts = text.split(",", 2)
        if len(parts) != 3:
            raise ScramError("client-first-message lacks its GS2 header")
        flag, authzid, bare = parts
        if flag not in ("n", "y"):
            raise ScramError("channel binding is not supported")
        if authzid:
            raise ScramError("an authorization identity is not supported")
        attributes = _attributes(bare)
        if len(attributes) < 2 or attributes[0][0] != "n" or attributes[1][0] != "r":
            raise ScramError("client-first-message must start with n= and r=")
        if any(key == "m" for key, _ in attributes):
            raise ScramError("mandatory SCRAM extensions are not supported")
        self.username = _decode_username(attributes[0][1])
        self._client_nonce = attributes[1][1]
        if not self.username or not self._client_nonce:
            raise ScramError("empty user name or nonce")
        self._gs2_header = f"{flag},{authzid},"
        self._bare_client_first = bare
        return self.username

    def server_first(self, secret: ScramSecret) -> bytes:
        """The server-first-message for the credential's ``secret`` (its salt and count)."""
        if not self._bare_client_first:
            raise ScramError("server-first-message before client-first-message")
        if secret.mechanism != self.mechanism:
            raise ScramError("the secret is for another mechanism")
        self._secret = secret
        salt = base64.b64encode(secret.salt).decode()
        self._server_first = f"r={self._client_nonce}{self._nonce},s={salt},i={secret.iterations}"
        return self._server_first.encode()

    def client_final(self, data: bytes) -> bytes:
        """Check the client-final-message's channel binding, nonce and proof; return the
        server-final-message (``v=<ServerSignature>``). Raises :class:`ScramError` when the
        proof is wrong or the message is malformed or out of order."""
        secret = self._secret
        if secret is None:
            raise ScramError("client-final-message before server-first-message")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ScramError("client-final-message is not UTF-8") from None
        attributes = _attributes(text)
        if len(attributes) < 3 or attributes[0][0] != "c" or attributes[1][0] != "r":
            raise ScramError("client-final-message must start with c= and r=")
        if attributes[-1][0] != "p":
            raise ScramError("client-final-message must end with p=")
        expected_binding = base64.b64encode(self._gs2_header.encode()).decode()
        if attributes[0][1] != expected_binding:
            raise ScramError("channel binding data does not match the GS2 header")
        if attributes[1][1] != f"{self._client_nonce}{self._nonce}":
            raise ScramError("the nonce does not match")
        try:
            proof = base64.b64decode(attributes[-1][1], validate=True)
        except ValueError:
            raise ScramError("the proof is not base64") from None
        without_proof = text[: text.rindex(",p=")]
        auth_message = f"{self._bare_client_first},{self._server_first},{without_proof}".encode()
        signature = _hmac(self._hash, secret.stored_key, auth_message)
        if len(proof) != len(signature):
            raise ScramError("the proof does not verify")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(hashlib.new(self._hash, client_key).digest(), secret.stored_key):
            raise ScramError("the proof does not verify")
        server_signature = _hmac(self._hash, secret.server_key, auth_message)
        return b"v=" + base64.b64encode(server_signature)


def unknown_user_secret(mechanism: str, username: str, key: bytes) -> ScramSecret:
    """A secret for a user name without a SCRAM credential: the exchange goes on as for a
    real one and fails only at the proof, so its answers do not tell whether the user
    exists (RFC 5802 9). The salt is HMAC-SHA-256(``key``, mechanism NUL user name), first
    16 bytes: with the key every node shares (the ``scram_unknown_user_key`` setting) the
    same on every node, every time, as a real user's is; the iteration count is the
    mechanism's default (:data:`ITERATIONS`). Raises :class:`ScramError` for an unknown
    mechanism."""
    size = hashlib.new(_hash_name(mechanism)).digest_size
    salt = _hmac("sha256", key, f"{mechanism}\0{username}".encode())[:16]
    return ScramSecret(mechanism, salt, ITERATIONS[mechanism], os.urandom(size), os.urandom(size))
