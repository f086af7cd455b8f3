"""Authentication of one CONNECT (or AUTH exchange): the entry point of an ingest node.

The sans-IO connection asks (an ``Authenticate`` effect with an :class:`AuthRequest`); the
node's shell calls :meth:`Authenticator.authenticate` and reports the :data:`Outcome` back:
:class:`Accepted` (with the client's :class:`Principal`), :class:`Refused` (with the MQTT 5
Reason Code for CONNACK), or :class:`Challenge` (SCRAM: send AUTH 0x18 and wait).

Which credential (MQTT 5.0 3.1.3.5, 3.1.3.6, 4.12), in this order:

0. when an HTTP authentication provider is set (``auth_http_url``), a CONNECT without an
   Authentication Method is first put to it (:mod:`.http_provider`): its allow or deny is
   final; when it cannot answer, its failure policy refuses the CONNECT (0x88 Server
   unavailable) or lets the steps below decide;

1. an Authentication Method (v5 enhanced authentication): ``SCRAM-SHA-256`` or
   ``SCRAM-SHA-512`` with a SCRAM credential of the user name the client-first-message
   names; any other method is refused with 0x8C Bad authentication method;
2. a verified TLS client certificate (``AuthRequest.certificate``, mutual TLS on the TLS
   and WSS listeners) that an X509 credential matches
   (:func:`~.certificates.match_certificate`);
3. an MQTT_BASIC credential of the User Name (with this client id or none), else of the
   Client Identifier alone; its password, if it has one, must match. A generated secret
   (HMAC-SHA-256, :mod:`.passwords`) is verified at once on the event loop (a few µs,
   on whichever node the client reaches); a wrong one then also spends a
   dummy argon2id verification, as an unknown user name does, so that the time of a
   refusal tells neither whether the user name exists nor how its password is hashed.
   A chosen password (argon2id) is verified in a bounded thread pool; a password this
   node verified lately for the credential's current hash is matched from memory instead
   (:mod:`.verified`), and CONNECTs that present the same credential and password while
   it is being verified wait for that one verification;
4. a Password that is a JWT one of the JWT credentials verifies (a credential naming a
   JWKS URL verifies with the key of its set that the token's ``kid`` names, fetched off
   the event loop by :class:`~.jwks.JwksKeys`);
5. a certificate no X509 credential matches, and no User Name or Password: refused, as an
   unknown user name is, even where anonymous access is on (a certificate is an identity
   this server does not know);
6. no User Name, Password or certificate at all: anonymous, when allowed.

The User Name ``${username}`` stands for is the one authentication bound, never one the
client merely claims: an MQTT_BASIC or SCRAM credential's own User Name; a JWT's claim
(``username_claim``, default ``sub``); an X509 certificate's CN, or the SAN its credential's
SAN pattern matches (:func:`certificate_username`). A JWT or certificate client whose
CONNECT carries another User Name is refused with 0x87.

Throttling (:class:`~.throttle.AuthThrottle`): before any of that, a source address or
User Name with recent failures waits a growing delay, then is refused with 0x9F Connection
rate exceeded, and an address with many is banned (0x8A Banned) for a while. Each source
address may hold only a share of the password-check queue (:class:`~.throttle.HashingPool`):
past it, 0x9F Connection rate exceeded, so a storm from one address leaves room for others.

Refusals: 0x86 Bad User Name or Password (unknown user, wrong password, a token or SCRAM
proof that does not verify), 0x87 Not authorized (anonymous access off, a certificate no
credential matches, a token claim that does not match the client, a token no issuer
verifies while a JWKS could not be fetched), 0x8A Banned (a
disabled credential, said only to a client that proved it holds it), 0x8C Bad
authentication method, 0x88 Server unavailable (PostgreSQL unreachable), 0x89 Server busy
(too many password checks waiting).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Protocol

from services.common.auth.authorize import Rule
from services.common.auth.certificates import CertificateIdentity, match_certificate
from services.common.auth.credentials import Credential, CredentialType
from services.common.auth.http_provider import HttpAuthProvider
from services.common.auth.jwks import JwksKeys
from services.common.auth.jwt_auth import (
    DEFAULT_USERNAME_CLAIM,
    JwksUnavailable,
    NotThisIssuer,
    TokenError,
    looks_like_token,
    verify_token,
)
from services.common.auth.passwords import (
    PasswordScheme,
    verify,
    verify_against_dummy,
    verify_password,
)
from services.common.auth.principal import (
    Accepted,
    AuthRequest,
    Challenge,
    Outcome,
    Principal,
    Refused,
    ScramState,
    principal_of,
)
from services.common.auth.scram import (
    MECHANISMS,
    ScramError,
    ScramExchange,
    unknown_user_secret,
)
from services.common.auth.throttle import AuthThrottle, HashingPool, PoolBusy, SourceBusy
from services.common.auth.verified import VerifiedPasswords
from services.common.mqtt.reason_codes import ReasonCode
from services.common.stores.base import StoreUnavailable

log = logging.getLogger(__name__)


class CredentialSource(Protocol):
    """Where credentials are found: the node's :class:`~.cache.CredentialCache` (or a test's
    own). Every method may raise :class:`~services.common.stores.base.StoreUnavailable`."""

    async def by_username(self, username: str) -> Sequence[Credential]:
        """The MQTT_BASIC and SCRAM credentials naming ``username``."""

    async def by_client_id(self, client_id: str) -> Sequence[Credential]:
        """The MQTT_BASIC credentials naming ``client_id`` and no user name."""

    async def by_fingerprint(self, fingerprint: str) -> Sequence[Credential]:
        """The X509 credential of that certificate fingerprint."""

    async def unkeyed(self) -> Sequence[Credential]:
        """The X509 credentials matched by pattern and the JWT issuers."""


class Authenticator:
    """Authenticates CONNECTs and AUTH exchanges against ``source`` (see the module).

    ``allow_anonymous``: whether a client presenting nothing gets in, with
    ``anonymous_rules``. ``hash_workers``: threads that verify passwords (argon2id: about
    20 ms of a core each); ``max_pending_hashes``: verifications allowed to wait for them
    before CONNECTs are refused with 0x89 Server busy, so a storm of wrong passwords
    queues in bounded memory and leaves the event loop to everyone else's traffic;
    ``max_pending_per_address``: of those, the checks one source address may hold (past
    it: 0x9F Connection rate exceeded). ``verified``: the passwords verified lately
    (:mod:`.verified`; default: none are remembered), which the caller tells of credential
    changes. ``throttle``: the failures counted per address and User Name (None: none are;
    for tests of other behaviour), on ``clock`` (monotonic seconds).
    ``scram_unknown_user_key``: the key every node shares that an unknown SCRAM user's salt
    is derived from (:func:`~.scram.unknown_user_secret`; None: a random one of this
    process, logged as a warning). ``jwks``: the key sets of JWT credentials that name a
    JWKS URL (default: fetched with the system's CAs, kept 300 s). ``http_provider``: the
    operator's HTTP authentication endpoint, asked before the stored credentials (None:
    none; :mod:`.http_provider`).
    """

    def __init__(
        self,
        source: CredentialSource,
        *,
        allow_anonymous: bool = False,
        anonymous_rules: Sequence[Rule] = (),
        hash_workers: int = 1,
        max_pending_hashes: int = 1000,
        max_pending_per_address: int | None = None,
        verified: VerifiedPasswords | None = None,
        throttle: AuthThrottle | None = None,
        clock: Callable[[], float] = time.monotonic,
        scram_unknown_user_key: bytes | None = None,
        jwks: JwksKeys | None = None,
        http_provider: HttpAuthProvider | None = None,
    ) -> None:
        self.source = source
        self.allow_anonymous = allow_anonymous
        self.anonymous = Principal(
            None, None, None, tuple(anonymous_rules), None, client_id_bound=True
        )
        self.hashing = HashingPool(
            hash_workers,
            max_pending_hashes,
            max_pending_per_address or max_pending_hashes,
            "password-check",
        )
        self.throttle = throttle
        self.clock = clock
        if scram_unknown_user_key is None:
            log.warning(
                "scram_unknown_user_key is not set: an unknown SCRAM user's salt differs "
                "from node to node and restart to restart, which tells that it is unknown"
            )
        self._scram_key = scram_unknown_user_key or os.urandom(32)
        self.verified = VerifiedPasswords(0, 0) if verified is None else verified
        self.jwks = JwksKeys() if jwks is None else jwks
        self.http_provider = http_provider
        # Verifications running, by (credential id, digest of its hash and the password).
        self._verifying: dict[tuple[uuid.UUID, bytes], asyncio.Future[bool]] = {}

    async def authenticate(self, request: AuthRequest, state: ScramState | None = None) -> Outcome:
        """The outcome of ``request``; ``state`` is the :class:`Challenge`'s exchange when
        ``request`` answers one. Never raises: PostgreSQL trouble is a :class:`Refused`
        with 0x88 Server unavailable (logged)."""
        throttle = self.throttle
        username = request.username if state is None else state.exchange.username
        if throttle is not None and state is None:
            verdict = throttle.verdict(request.address, username, self.clock())
            if verdict.refuse is not None:
                return Refused(verdict.refuse, verdict.reason)
            if verdict.delay:
                await asyncio.sleep(verdict.delay)
        outcome = await self._checked(request, state)
        if throttle is not None:
            if isinstance(outcome, Refused) and outcome.reason_code in FAILURES:
                throttle.failed(request.address, username, self.clock())
            elif isinstance(outcome, Accepted):
                throttle.succeeded(username)
        return outcome

    async def _checked(self, request: AuthRequest, state: ScramState | None) -> Outcome:
        try:
            if request.method is not None:
                return await self._enhanced(request, state)
            return await self._plain(request)
        except StoreUnavailable as exc:
            log.warning("credentials unavailable: %s", exc)
            return Refused(ReasonCode.SERVER_UNAVAILABLE, "credentials unavailable")
        except PoolBusy:
            return Refused(ReasonCode.SERVER_BUSY, "too many password checks waiting")
        except SourceBusy:
            return Refused(
                ReasonCode.CONNECTION_RATE_EXCEEDED,
                "too many password checks of this address waiting",
            )

    async def _plain(self, request: AuthRequest) -> Outcome:
        if self.http_provider is not None:
            verdict = await self.http_provider.check(request)
            if verdict is not None:
                return verdict
        if request.certificate is not None:
            credential = await self._certificate_credential(request.certificate)
            if credential is not None:
                name = certificate_username(credential, request.certificate)
                if request.username is not None and request.username != name:
                    return Refused(
                        ReasonCode.NOT_AUTHORIZED,
                        f"user name is not the certificate's {_certificate_field(credential)}",
                    )
                return self._admitted(credential, name)
        username, password = request.username, request.password
        basic = await self._basic_credential(request)
        if basic is not None:
            checked = basic.password_hash is None or (
                password is not None
                and await self._password_matches(basic, password, request.address)
            )
            if not checked:
                return Refused(ReasonCode.BAD_USER_NAME_OR_PASSWORD, "wrong password")
            # The credential's own User Name: a client matched by its client id alone does
            # not choose the ${username} of its rules with the User Name it sends.
            return self._admitted(basic, basic.username)
        if password is not None and looks_like_token(password):
            issuers = [c for c in await self.source.unkeyed() if c.type is CredentialType.JWT]
            if issuers:
                return await self._token(request, password, issuers)
        if username is not None or password is not None:
            await self._hashed(
                lambda _hash, given: verify_against_dummy(given), None, password, request.address
            )
            return Refused(ReasonCode.BAD_USER_NAME_OR_PASSWORD, "unknown user name")
        if request.certificate is not None:
            identity = request.certificate
            return Refused(
                ReasonCode.NOT_AUTHORIZED,
                f"no X509 credential matches the client certificate {identity.subject!r} "
                f"(SHA-256 {identity.fingerprint})",
            )
        if self.allow_anonymous:
            return Accepted(self.anonymous)
        return Refused(ReasonCode.NOT_AUTHORIZED, "anonymous access is off")

    async def _certificate_credential(self, identity: CertificateIdentity) -> Credential | None:
        candidates = list(await self.source.by_fingerprint(identity.fingerprint))
        candidates += [c for c in await self.source.unkeyed() if c.type is CredentialType.X509]
        by_name = {c.name: c for c in candidates if c.certificate is not None}
        name = match_certificate(
            identity, ((n, c.certificate) for n, c in by_name.items() if c.certificate)
        )
        return None if name is None else by_name[name]

    async def _basic_credential(self, request: AuthRequest) -> Credential | None:
        """The MQTT_BASIC credential of the request: user name and this client id, then
        user name alone, then client id alone."""
        if request.username is not None:
            found = [
                c
                for c in await self.source.by_username(request.username)
                if c.type is CredentialType.MQTT_BASIC and c.client_id in (None, request.client_id)
            ]
            if found:
                return max(found, key=lambda c: c.client_id is not None)
        if request.client_id:
            by_id = await self.source.by_client_id(request.client_id)
            if by_id:
                return by_id[0]
        return None

    async def _password_matches(
        self, credential: Credential, password: bytes, address: str | None
    ) -> bool:
        """Whether ``password`` is ``credential``'s: a generated secret's HMAC-SHA-256 at
        once (a mismatch spends a dummy argon2id in the pool, see the module); a chosen
        password from :attr:`verified` when this node verified it lately for the
        credential's current hash, else by argon2id (shared with the CONNECTs presenting
        the same pair meanwhile). Raises
        :class:`~.throttle.PoolBusy` or :class:`~.throttle.SourceBusy`."""
        encoded = credential.password_hash or ""
        if credential.password_scheme is PasswordScheme.HMAC_SHA256:
            if verify(encoded, password):
                return True
            await self._hashed(
                lambda _hash, given: verify_against_dummy(given), None, password, address
            )
            return False
        digest = self.verified.digest(encoded, password)
        if self.verified.matches(credential.id, digest):
            return True
        key = (credential.id, digest)
        running = self._verifying.get(key)
        if running is None:
            running = asyncio.ensure_future(self._verify(credential, password, digest, address))
            self._verifying[key] = running
            running.add_done_callback(lambda _done: self._verifying.pop(key, None))
        # Shielded: a waiter that goes away (its client closed) does not cancel the others'.
        return await asyncio.shield(running)

    async def _verify(
        self, credential: Credential, password: bytes, digest: bytes, address: str | None
    ) -> bool:
        generation = self.verified.generation
        matched = await self._hashed(verify_password, credential, password, address)
        if matched:
            self.verified.remember(credential.id, digest, generation)
        return matched

    async def _hashed(
        self,
        check: Callable[[str, bytes], bool],
        credential: Credential | None,
        password: bytes | None,
        address: str | None,
    ) -> bool:
        """Run the argon2id ``check`` in the bounded pool, on ``address``'s share. Raises
        :class:`~.throttle.PoolBusy` or :class:`~.throttle.SourceBusy` when too many wait."""
        encoded = "" if credential is None else credential.password_hash or ""
        given = password or b""
        return await self.hashing.run(address, lambda: check(encoded, given))

    @property
    def pending_hashes(self) -> int:
        """Password checks waiting for the pool's threads or running."""
        return self.hashing.pending

    async def _token(
        self, request: AuthRequest, token: bytes, issuers: Sequence[Credential]
    ) -> Outcome:
        unavailable = False
        for issuer in issuers:
            assert issuer.jwt is not None
            try:
                key = None
                if issuer.jwt.jwks_url is not None:
                    key = await self.jwks.key(issuer.jwt.jwks_url, token)
                claims = verify_token(token, issuer.jwt, key)
            except JwksUnavailable as exc:
                # Logged without the URL (it may carry an API key) nor the token.
                log.warning("JWKS of JWT credential %r unavailable: %s", issuer.name, exc)
                unavailable = True
                continue
            except NotThisIssuer:
                continue
            except TokenError as exc:
                return Refused(ReasonCode.BAD_USER_NAME_OR_PASSWORD, str(exc))
            settings = issuer.jwt
            if settings.client_id_claim is not None and (
                str(claims.get(settings.client_id_claim)) != request.client_id
            ):
                return Refused(
                    ReasonCode.NOT_AUTHORIZED,
                    f"client id is not the token's {settings.client_id_claim!r} claim",
                )
            claim = settings.username_claim or DEFAULT_USERNAME_CLAIM
            claimed = claims.get(claim)
            username = None if claimed is None else str(claimed)
            required = settings.username_claim is not None and claimed is None
            if required or (request.username is not None and request.username != username):
                return Refused(
                    ReasonCode.NOT_AUTHORIZED, f"user name is not the token's {claim!r} claim"
                )
            return self._admitted(issuer, username)
        if unavailable:
            # MQTT 5.0 3.2.2.2: 0x87 Not authorized, not 0x86 Bad User Name or Password: the
            # token may be sound, the server could not check it. 0x86 would tell the client
            # its token is bad and count as a failure against its address and User Name.
            return Refused(ReasonCode.NOT_AUTHORIZED, "a JWKS could not be fetched")
        return Refused(ReasonCode.BAD_USER_NAME_OR_PASSWORD, "token signature does not verify")

    def _admitted(self, credential: Credential, username: str | None) -> Outcome:
        if not credential.enabled:
            return Refused(ReasonCode.BANNED, f"credential {credential.name!r} is disabled")
        return Accepted(principal_of(credential, username))

    async def _enhanced(self, request: AuthRequest, state: ScramState | None) -> Outcome:
        method = request.method or ""
        if method not in MECHANISMS:
            return Refused(ReasonCode.BAD_AUTHENTICATION_METHOD, f"unsupported method {method!r}")
        data = request.data or b""
        try:
            if state is None:
                exchange = ScramExchange(method)
                username = exchange.client_first(data)
                found = [
                    c
                    for c in await self.source.by_username(username)
                    if c.type is CredentialType.SCRAM
                ]
                credential = found[0] if found else None
                secret = None if credential is None else credential.scram_secret(method)
                if secret is None:
                    secret = unknown_user_secret(method, username, self._scram_key)
                first = exchange.server_first(secret)
                return Challenge(first, ScramState(exchange, credential))
            final = state.exchange.client_final(data)
        except ScramError as exc:
            reason = ReasonCode.BAD_USER_NAME_OR_PASSWORD if state else ReasonCode.NOT_AUTHORIZED
            return Refused(reason, f"SCRAM: {exc}")
        if state.credential is None:
            return Refused(ReasonCode.BAD_USER_NAME_OR_PASSWORD, "SCRAM: unknown user name")
        outcome = self._admitted(state.credential, state.credential.username)
        if isinstance(outcome, Accepted):
            return Accepted(outcome.principal, final)
        return outcome

    def close(self) -> None:
        """Stop the password-check and JWKS fetching threads (waiting for none)."""
        self.hashing.close()
        self.jwks.close()


def certificate_username(credential: Credential, identity: CertificateIdentity) -> str | None:
    """The User Name ``${username}`` stands for on a connection an X509 ``credential``
    recognised by its client certificate ``identity``: the first Subject Alternative Name
    the credential's SAN pattern matches when it recognises certificates by SAN, else the
    certificate's CN (None: it has none)."""
    match = credential.certificate
    if match is not None and match.san is not None:
        return match.matched_san(identity)
    return identity.common_name


def _certificate_field(credential: Credential) -> str:
    match = credential.certificate
    return "SAN" if match is not None and match.san is not None else "CN"


FAILURES = frozenset({ReasonCode.BAD_USER_NAME_OR_PASSWORD})
"""The refusals :attr:`Authenticator.throttle` counts: a wrong password, an unknown user
name, a token or SCRAM proof that does not verify (not a disabled credential, nor the
server's own trouble)."""


class NoCredentials:
    """A :class:`CredentialSource` without any credential: an authenticator over it lets in
    anonymous clients only (when allowed). For nodes without PostgreSQL: the sans-IO tests
    and benchmarks of the ingest shell."""

    async def by_username(self, username: str) -> Sequence[Credential]:
        """None."""
        return ()

    async def by_client_id(self, client_id: str) -> Sequence[Credential]:
        """None."""
        return ()

    async def by_fingerprint(self, fingerprint: str) -> Sequence[Credential]:
        """None."""
        return ()

    async def unkeyed(self) -> Sequence[Credential]:
        """None."""
        return ()

    async def get(self, credential_id: uuid.UUID) -> Credential | None:
        """None (the node's ``fetch_credential``)."""
        return None
