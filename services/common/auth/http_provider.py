"""The HTTP authentication provider: an operator's own HTTP service decides who connects.

When ``auth_http_url`` is set, the :class:`~.authenticate.Authenticator` of every ingest
node asks it first about each CONNECT without an Authentication Method (enhanced
authentication, SCRAM, stays with the stored credentials). It POSTs JSON:

``{"client_id", "username", "password", "password_base64", "certificate_fingerprint",
"address"}``: the Client Identifier, the User Name (null: none), the Password as UTF-8 text
(null: none, or not UTF-8) and as base64 (null: none), the SHA-256 fingerprint of the
verified TLS client certificate (64 lowercase hex digits; null: none) and the client's IP
address (its PROXY header's when there is one).

The request is signed so that the endpoint can trust the broker: headers
``X-Cormorant-Timestamp`` (Unix seconds) and ``X-Cormorant-Signature: sha256=<hex>``, the
HMAC-SHA-256 under ``auth_http_secret`` of ``<timestamp>.<body>`` (the endpoint should
refuse old timestamps: a replayed request is then useless). TLS certificates are verified
(the system's CAs, or ``auth_http_ca_file``).

A 200 answer is validated with pydantic (:class:`ProviderAnswer`): ``{"result": "allow" |
"deny", "kind": "DEVICE" | "APPLICATION", "rules": ["allow publish ..."], "username":
...}``. ``allow`` admits the client with that kind and those rules (the credentials' rule
syntax, :mod:`.authorize`; none: it may do nothing); ``${client_id}`` stands for the
Client Identifier the endpoint saw, ``${username}`` for ``username`` if the answer gives
one, else the CONNECT's User Name. ``deny`` refuses it with 0x86 Bad User Name or Password
(counted by the failure throttle, :mod:`.throttle`). An answer that does not validate is a
deny, logged (never with the password).

When the endpoint cannot answer (no answer within ``auth_http_timeout_seconds``, refused
connection, TLS failure, a status other than 200), ``auth_http_failure_policy`` decides:
``deny`` (0x88 Server unavailable, the default) or ``fall_through``: the stored credentials
decide, as if there were no provider.

Answers are cached per node: an allow for ``auth_http_allow_cache_seconds``, a deny for
``auth_http_deny_cache_seconds`` (0: not cached), at most :data:`MAX_ENTRIES`. The cache is
keyed by an HMAC-SHA-256, under a random key of the process, of everything sent: never the
password in clear, and a different password is a different entry.

A client let in so has no stored credential: its sessions belong to ``http:<user name>``
(``http-client:<client id>`` without a User Name), so neither another user nor an
anonymous client can take them over (:attr:`~.principal.Principal.external_owner`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import secrets
import ssl
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Literal

import httpx
from prometheus_client.core import CounterMetricFamily, Metric
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from services.common.auth.authorize import parse_rules
from services.common.auth.principal import Accepted, AuthRequest, Principal, Refused
from services.common.metrics import PRODUCE_BUCKETS, Histogram, histogram_family
from services.common.mqtt.reason_codes import ReasonCode
from services.common.records import ClientKind
from services.common.settings import Settings

log = logging.getLogger(__name__)

MAX_ENTRIES = 100_000
"""Answers one node keeps (the least recently used go first)."""

MAX_ANSWER_BYTES = 256 * 1024
"""Largest answer read from the endpoint; a longer one is malformed."""


class FailurePolicy(StrEnum):
    """What a CONNECT gets when the endpoint cannot answer."""

    DENY = "deny"
    FALL_THROUGH = "fall_through"


class Result(StrEnum):
    """The ``outcome`` label of ``cormorant_auth_http_requests_total``."""

    ALLOW = "allow"
    DENY = "deny"
    MALFORMED = "malformed"
    TIMEOUT = "timeout"
    ERROR = "error"


REQUESTS: dict[Result, int] = dict.fromkeys(Result, 0)
"""Requests to the endpoint by outcome (this process)."""

LATENCY: dict[str, Histogram] = {r.value: Histogram(PRODUCE_BUCKETS) for r in Result}
"""Seconds from sending a request to its outcome, by outcome."""

CACHE_HITS: dict[Result, int] = {Result.ALLOW: 0, Result.DENY: 0}
"""CONNECTs answered from the cache, by the cached result."""


def collect() -> Iterable[Metric]:
    """The provider's families (registered by the ingest node when a provider is set)."""
    requests = CounterMetricFamily(
        "cormorant_auth_http_requests",
        "Requests to the HTTP authentication provider, by outcome (allow, deny, malformed, "
        "timeout, error).",
        labels=["outcome"],
    )
    for result, count in REQUESTS.items():
        requests.add_metric([result.value], count)
    yield requests
    yield histogram_family(
        "cormorant_auth_http_latency_seconds",
        "Time the HTTP authentication provider took to answer (or to fail), by outcome.",
        LATENCY,
        "outcome",
    )
    hits = CounterMetricFamily(
        "cormorant_auth_http_cache_hits",
        "CONNECTs answered from the HTTP authentication provider's cache, by cached result.",
        labels=["result"],
    )
    for result, count in CACHE_HITS.items():
        hits.add_metric([result.value], count)
    yield hits


class ProviderAnswer(BaseModel):
    """The endpoint's answer (see the module). Extra fields are ignored."""

    model_config = ConfigDict(extra="ignore")

    result: Literal["allow", "deny"]
    kind: Literal["DEVICE", "APPLICATION"] = "DEVICE"
    rules: list[str] = Field(default_factory=list, max_length=1000)
    username: str | None = Field(None, min_length=1, max_length=1024)

    @field_validator("rules")
    @classmethod
    def _valid_rules(cls, rules: list[str]) -> list[str]:
        parse_rules(rules)  # RuleError is a ValueError: pydantic reports it
        return rules


@dataclass(frozen=True, slots=True)
class ProviderSettings:
    """Where and how to ask: ``url`` (http or https), the HMAC ``secret`` (bytes),
    ``timeout`` (seconds), the ``failure_policy``, the cache's lifetimes of an allow and a
    deny (seconds; 0: not cached), TLS verification (``verify``; ``ca_file``: CAs
    besides the system's)."""

    url: str
    secret: bytes
    timeout: float = 2.0
    failure_policy: FailurePolicy = FailurePolicy.DENY
    allow_seconds: float = 60.0
    deny_seconds: float = 5.0
    verify: bool = True
    ca_file: Path | None = None


def provider_settings(settings: Settings) -> ProviderSettings | None:
    """The provider ``settings`` describe (``auth_http_*``), or None without a URL."""
    if settings.auth_http_url is None or settings.auth_http_secret is None:
        return None
    return ProviderSettings(
        settings.auth_http_url,
        settings.auth_http_secret.get_secret_value().encode(),
        settings.auth_http_timeout_seconds,
        FailurePolicy(settings.auth_http_failure_policy),
        settings.auth_http_allow_cache_seconds,
        settings.auth_http_deny_cache_seconds,
        settings.auth_http_tls_verify,
        settings.auth_http_ca_file,
    )


def signature(secret: bytes, timestamp: str, body: bytes) -> str:
    """The ``X-Cormorant-Signature`` header of ``body`` sent at ``timestamp`` (Unix seconds,
    as text): ``sha256=`` and the hex HMAC-SHA-256 under ``secret`` of
    ``<timestamp>.<body>``."""
    digest = hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def request_body(request: AuthRequest) -> bytes:
    """The JSON the endpoint gets for ``request`` (see the module)."""
    password = request.password
    text = None
    if password is not None:
        try:
            text = password.decode("utf-8")
        except UnicodeDecodeError:
            text = None
    certificate = request.certificate
    return json.dumps(
        {
            "client_id": request.client_id,
            "username": request.username,
            "password": text,
            "password_base64": None if password is None else base64.b64encode(password).decode(),
            "certificate_fingerprint": None if certificate is None else certificate.fingerprint,
            "address": request.address,
        },
        ensure_ascii=True,
        separators=(",", ":"),
    ).encode()


def principal_of_answer(answer: ProviderAnswer, request: AuthRequest) -> Principal:
    """The principal an ``allow`` admits (see the module)."""
    username = answer.username if answer.username is not None else request.username
    owner = f"http:{username}" if username is not None else f"http-client:{request.client_id}"
    return Principal(
        None,
        "http-auth",
        ClientKind[answer.kind],
        parse_rules(answer.rules),
        username,
        client_id_bound=True,
        external_owner=owner,
    )


class HttpAuthProvider:
    """Asks ``settings.url`` about CONNECTs (see the module); ``client``: the httpx
    client to use (default: one of its own, with the settings' TLS verification);
    ``clock``: monotonic seconds (the cache's). :meth:`close` at shutdown."""

    def __init__(
        self,
        settings: ProviderSettings,
        client: httpx.AsyncClient | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        verify: bool | ssl.SSLContext = settings.verify
        if settings.verify and settings.ca_file is not None:
            verify = ssl.create_default_context()
            verify.load_verify_locations(cafile=str(settings.ca_file))
        if not settings.verify:
            log.warning("the HTTP authentication provider's TLS certificate is not verified")
        self.client = client or httpx.AsyncClient(verify=verify, follow_redirects=False)
        self.clock = clock
        self._key = secrets.token_bytes(32)
        self._cache: OrderedDict[bytes, tuple[float, Accepted | Refused]] = OrderedDict()

    async def close(self) -> None:
        """Close the HTTP client's connections."""
        await self.client.aclose()

    async def check(self, request: AuthRequest) -> Accepted | Refused | None:
        """The provider's verdict on ``request``: :class:`Accepted`, :class:`Refused`, or
        None when the endpoint could not answer and the policy falls through to the stored
        credentials. Never raises."""
        body = request_body(request)
        key = hmac.new(self._key, body, hashlib.sha256).digest()
        now = self.clock()
        cached = self._cache.get(key)
        if cached is not None:
            until, remembered = cached
            if until > now:
                self._cache.move_to_end(key)
                hit = Result.ALLOW if isinstance(remembered, Accepted) else Result.DENY
                CACHE_HITS[hit] += 1
                return remembered
            del self._cache[key]
        started = time.perf_counter()
        result, outcome = await self._ask(body, request)
        REQUESTS[result] += 1
        LATENCY[result.value].observe(time.perf_counter() - started)
        if outcome is None:
            return None
        ttl = self.settings.allow_seconds if result is Result.ALLOW else self.settings.deny_seconds
        if result in (Result.ALLOW, Result.DENY) and ttl > 0:
            if len(self._cache) >= MAX_ENTRIES:
                self._cache.popitem(last=False)
            self._cache[key] = (self.clock() + ttl, outcome)
        return outcome

    async def _ask(
        self, body: bytes, request: AuthRequest
    ) -> tuple[Result, Accepted | Refused | None]:
        settings = self.settings
        timestamp = str(int(time.time()))
        headers = {
            "Content-Type": "application/json",
            "X-Cormorant-Timestamp": timestamp,
            "X-Cormorant-Signature": signature(settings.secret, timestamp, body),
        }
        try:
            response = await self.client.post(
                settings.url, content=body, headers=headers, timeout=settings.timeout
            )
        except httpx.TimeoutException:
            log.warning("HTTP authentication provider: no answer within %s s", settings.timeout)
            return Result.TIMEOUT, self._failed()
        except httpx.HTTPError as exc:
            log.warning("HTTP authentication provider unreachable: %s", type(exc).__name__)
            return Result.ERROR, self._failed()
        if response.status_code != 200:
            log.warning("HTTP authentication provider answered %d", response.status_code)
            return Result.ERROR, self._failed()
        try:
            if len(response.content) > MAX_ANSWER_BYTES:
                raise ValueError(f"an answer over {MAX_ANSWER_BYTES} bytes")
            answer = ProviderAnswer.model_validate_json(response.content)
        except (ValidationError, ValueError) as exc:
            # The request's fields are not logged (the password is among them).
            log.warning(
                "HTTP authentication provider's answer for client %r is malformed: %s",
                request.client_id,
                _errors(exc),
            )
            return Result.MALFORMED, Refused(
                ReasonCode.NOT_AUTHORIZED, "the authentication provider's answer is malformed"
            )
        if answer.result == "deny":
            return Result.DENY, Refused(
                ReasonCode.BAD_USER_NAME_OR_PASSWORD, "denied by the authentication provider"
            )
        return Result.ALLOW, Accepted(principal_of_answer(answer, request))

    def _failed(self) -> Refused | None:
        if self.settings.failure_policy is FailurePolicy.FALL_THROUGH:
            return None
        return Refused(ReasonCode.SERVER_UNAVAILABLE, "the authentication provider did not answer")


def _errors(exc: Exception) -> str:
    """What is wrong with an answer, without echoing its values."""
    if isinstance(exc, ValidationError):
        return "; ".join(
            f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}" for error in exc.errors()
        )
    return str(exc)
