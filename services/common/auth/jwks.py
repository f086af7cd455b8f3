"""The signing keys of JWT credentials that name a JSON Web Key Set (RFC 7517 5) URL.

One :class:`jwt.PyJWKClient` per URL fetches the set over HTTPS (certificates verified
against the system's CAs and those of an optional CA file), keeps it for
``refresh_seconds``, and picks the key a token's ``kid`` header names (RFC 7515 4.1.4).
A ``kid`` the set lacks fetches the set again, at most once per ``refresh_seconds``
(PyJWT's cooldown), so tokens with made-up ``kid`` values cannot make the node hammer the
issuer. Fetches are blocking urllib calls: they run on this module's own worker threads,
never on the event loop, and one at a time per URL (the CONNECTs that need one meanwhile
wait for it); a token whose key is in the fresh cached set is served on the loop without
a thread. After a failed fetch, tokens of that URL are refused for ``retry_seconds``
without trying again.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import jwt

from services.common.auth.jwt_auth import JwksUnavailable, NotThisIssuer, TokenError

FETCH_TIMEOUT_SECONDS = 10.0
"""How long one JWKS fetch may take (connect and read) before it counts as failed."""


@dataclass
class _Source:
    """One JWKS URL: its client, the lock that lets one CONNECT at a time go past the cached
    set (the others wait, then find what it fetched), and until when (monotonic seconds)
    a failed fetch is not tried again, with why it failed."""

    client: jwt.PyJWKClient
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    failed_until: float = 0.0
    failure: str = ""


class JwksKeys:
    """The JWKS signing keys of every JWT credential of a node, by URL.

    ``refresh_seconds``: how long a fetched key set is used before it is fetched again,
    and the least time between two fetches caused by an unknown ``kid`` (> 0).
    ``retry_seconds``: after a failed fetch, how long tokens of that URL are refused
    without trying again, so an issuer that is down or slow does not hold every CONNECT
    for the fetch timeout. ``ca_file``: PEM file of CAs a JWKS server's certificate may
    chain to besides the system's (None: the system's only). ``workers``: threads that
    fetch. Raises ``OSError`` / ``ssl.SSLError`` if ``ca_file`` cannot be read,
    ``ValueError`` if ``refresh_seconds`` <= 0.
    """

    def __init__(
        self,
        refresh_seconds: float = 300.0,
        ca_file: str | None = None,
        *,
        retry_seconds: float = 5.0,
        workers: int = 2,
    ) -> None:
        if refresh_seconds <= 0:
            raise ValueError("the JWKS refresh interval is > 0 seconds")
        self.refresh_seconds = refresh_seconds
        self.retry_seconds = retry_seconds
        self._ssl = ssl.create_default_context()
        if ca_file is not None:
            self._ssl.load_verify_locations(cafile=ca_file)
        self._sources: dict[str, _Source] = {}
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="jwks")

    def _source(self, url: str) -> _Source:
        source = self._sources.get(url)
        if source is None:
            client = jwt.PyJWKClient(
                url,
                cache_jwk_set=True,
                lifespan=self.refresh_seconds,
                cooldown_duration=self.refresh_seconds,
                timeout=FETCH_TIMEOUT_SECONDS,
                ssl_context=self._ssl,
            )
            source = self._sources[url] = _Source(client)
        return source

    async def key(self, url: str, token: bytes) -> jwt.PyJWK:
        """The key of ``url``'s set that ``token``'s ``kid`` header names.

        Raises :class:`~.jwt_auth.NotThisIssuer` when the token has no ``kid`` or the set
        has no such key (after at most one refetch per ``refresh_seconds``),
        :class:`~.jwt_auth.TokenError` when its header is malformed, and
        :class:`~.jwt_auth.JwksUnavailable` when the set could not be fetched (then or
        less than ``retry_seconds`` before).
        """
        try:
            kid = jwt.get_unverified_header(token).get("kid")
        except jwt.InvalidTokenError as exc:
            raise TokenError(f"malformed token ({type(exc).__name__})") from None
        if not isinstance(kid, str) or not kid:
            raise NotThisIssuer("token has no 'kid' header to pick a JWKS key by")
        source = self._source(url)
        found = _cached(source.client, kid)
        if found is not None:
            return found
        async with source.lock:
            found = _cached(source.client, kid)  # fetched while this CONNECT waited
            if found is not None:
                return found
            if time.monotonic() < source.failed_until:
                raise JwksUnavailable(f"{source.failure} (not retried yet)")
            loop = asyncio.get_running_loop()
            try:
                return await loop.run_in_executor(self._executor, _lookup, source.client, kid)
            except JwksUnavailable as exc:
                source.failed_until = time.monotonic() + self.retry_seconds
                source.failure = str(exc)
                raise

    def close(self) -> None:
        """Stop the fetching threads (a fetch under way ends by its timeout)."""
        self._executor.shutdown(wait=False, cancel_futures=True)


def _cached(client: jwt.PyJWKClient, kid: str) -> jwt.PyJWK | None:
    """The signing key ``kid`` of ``client``'s set if it is cached and fresh."""
    cache = client.jwk_set_cache
    cached = cache.get() if cache is not None else None
    for candidate in cached.keys if cached is not None else ():
        if candidate.key_id == kid and candidate.public_key_use in ("sig", None):
            return candidate
    return None


def _lookup(client: jwt.PyJWKClient, kid: str) -> jwt.PyJWK:
    """Blocking (a worker thread's): the key ``kid`` of the set, fetched when the cached one
    is stale, or lacks it and the cooldown allows. Raises :class:`NotThisIssuer` or
    :class:`JwksUnavailable`."""
    try:
        return client.get_signing_key(kid)
    except jwt.PyJWKClientConnectionError as exc:
        raise JwksUnavailable(str(exc)) from None
    except jwt.PyJWKSetError as exc:
        raise JwksUnavailable(f"not a usable key set: {exc}") from None
    except jwt.PyJWKClientError as exc:
        # A set fetched fine and holding keys, yet none with this kid: not this issuer's
        # token (or a key it no longer publishes). Otherwise the set itself is unusable.
        cache = client.jwk_set_cache
        current = cache.get() if cache is not None else None
        if current is not None and any(k.key_id for k in current.keys):
            raise NotThisIssuer("no key of the JWKS has the token's 'kid'") from None
        raise JwksUnavailable(str(exc)) from None
    except (ValueError, OSError) as exc:
        # urllib and json errors PyJWT lets through (a body that is not JSON, ...).
        raise JwksUnavailable(f"{type(exc).__name__}: {exc}") from None
