"""The signing keys of JWT credentials that name a JSON Web Key Set (RFC 7517 5) URL.

One :class:`jwt.PyJWKClient` per URL fetches the set over HTTPS (certificates verified
against the system's CAs and those of an optional CA file), keeps it for
``refresh_seconds``, and picks the key a token's ``kid`` header names (RFC 7515 4.1.4).
A ``kid`` the set lacks fetches the set again, at most once per ``refresh_seconds``
(PyJWT's cooldown), so tokens with made-up ``kid`` values cannot make the node hammer the
issuer. Fetches are blocking urllib calls: they run on this module's own worker threads,
never on the event loop, and one at a time per URL (the client's lock); a token whose key
is in the fresh cached set is served on the loop without a thread.
"""

from __future__ import annotations

import asyncio
import ssl
from concurrent.futures import ThreadPoolExecutor

import jwt

from services.common.auth.jwt_auth import JwksUnavailable, NotThisIssuer, TokenError

FETCH_TIMEOUT_SECONDS = 10.0
"""How long one JWKS fetch may take (connect and read) before it counts as failed."""


class JwksKeys:
    """The JWKS signing keys of every JWT credential of a node, by URL.

    ``refresh_seconds``: how long a fetched key set is used before it is fetched again,
    and the least time between two fetches caused by an unknown ``kid`` (> 0).
    ``ca_file``: PEM file of CAs a JWKS server's certificate may chain to besides the
    system's (None: the system's only). ``workers``: threads that fetch. Raises
    ``OSError`` / ``ssl.SSLError`` if ``ca_file`` cannot be read, ``ValueError`` if
    ``refresh_seconds`` <= 0.
    """

    def __init__(
        self, refresh_seconds: float = 300.0, ca_file: str | None = None, workers: int = 2
    ) -> None:
        if refresh_seconds <= 0:
            raise ValueError("the JWKS refresh interval is > 0 seconds")
        self.refresh_seconds = refresh_seconds
        self._ssl = ssl.create_default_context()
        if ca_file is not None:
            self._ssl.load_verify_locations(cafile=ca_file)
        self._clients: dict[str, jwt.PyJWKClient] = {}
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="jwks")

    def _client(self, url: str) -> jwt.PyJWKClient:
        client = self._clients.get(url)
        if client is None:
            client = jwt.PyJWKClient(
                url,
                cache_jwk_set=True,
                lifespan=self.refresh_seconds,
                cooldown_duration=self.refresh_seconds,
                timeout=FETCH_TIMEOUT_SECONDS,
                ssl_context=self._ssl,
            )
            self._clients[url] = client
        return client

    async def key(self, url: str, token: bytes) -> jwt.PyJWK:
        """The key of ``url``'s set that ``token``'s ``kid`` header names.

        Raises :class:`~.jwt_auth.NotThisIssuer` when the token has no ``kid`` or the set
        has no such key (after at most one refetch per ``refresh_seconds``),
        :class:`~.jwt_auth.TokenError` when its header is malformed, and
        :class:`~.jwt_auth.JwksUnavailable` when the set could not be fetched.
        """
        try:
            kid = jwt.get_unverified_header(token).get("kid")
        except jwt.InvalidTokenError as exc:
            raise TokenError(f"malformed token ({type(exc).__name__})") from None
        if not isinstance(kid, str) or not kid:
            raise NotThisIssuer("token has no 'kid' header to pick a JWKS key by")
        client = self._client(url)
        cache = client.jwk_set_cache
        cached = cache.get() if cache is not None else None
        if cached is not None:
            for candidate in cached.keys:
                if candidate.key_id == kid and candidate.public_key_use in ("sig", None):
                    return candidate
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, client.get_signing_key, kid)
        except jwt.PyJWKClientConnectionError as exc:
            raise JwksUnavailable(str(exc)) from None
        except jwt.PyJWKSetError as exc:
            raise JwksUnavailable(f"not a usable key set: {exc}") from None
        except jwt.PyJWKClientError as exc:
            # A set fetched fine and holding keys, yet none with this kid: not this issuer's
            # token (or a key it no longer publishes). Otherwise the set itself is unusable.
            current = cache.get() if cache is not None else None
            if current is not None and any(k.key_id for k in current.keys):
                raise NotThisIssuer("no key of the JWKS has the token's 'kid'") from None
            raise JwksUnavailable(str(exc)) from None
        except (ValueError, OSError) as exc:
            # urllib and json errors PyJWT lets through (a body that is not JSON, ...).
            raise JwksUnavailable(f"{type(exc).__name__}: {exc}") from None

    def close(self) -> None:
        """Stop the fetching threads (a fetch under way ends by its timeout)."""
        self._executor.shutdown(wait=False, cancel_futures=True)
