"""The HTTP publish API: ``POST /api/v1/publish`` (one message) and
``POST /api/v1/publish:batch`` (up to ``http_publish_max_batch``), answered once Kafka stored
the messages (``acks=all``): the guarantee a PUBACK gives an MQTT client.

Why it runs in the admin service and not on the ingest nodes: the admin service is the
FastAPI application already, with its OpenAPI document, a Kafka producer of the services'
options (``acks=all``, Cormorant's partitioner) and PostgreSQL at hand; an ingest node is
a sans-IO MQTT core under a thin asyncio shell whose event loop belongs to MQTT sockets,
and an HTTP stack and JSON parsing there would take from every MQTT client's latency. HTTP
publishing is a back-office path (a service telling devices something), not the fleet's
hot path; ``bench/`` has no figure for it yet, so no throughput is claimed.

A message becomes exactly the records an ingest node writes for a PUBLISH of an MQTT 5
client (:func:`~services.ingest.handle_publish.accepted_meta`,
:func:`~services.ingest.will_rules.publication`,
:func:`~services.ingest.store_pipeline.record_of`): ``msg.all`` keyed by the publisher's
Client Identifier and, with ``retain``, ``msg.retained`` keyed by the Topic Name (an empty
retained payload deletes the topic's retained message, MQTT 3.3.1.3). Routing, retained
messages, persistence and the analytics see no difference. A message to
``$delayed/<seconds>/<topic>`` is a delayed publication as over MQTT
(:mod:`services.ingest.delayed_rules`; docs/concepts/delayed-publish.md): authorized for
its target topic, bounded by ``max_delay_seconds`` and the waiting messages' bounds
(``max_delayed_messages``, ``max_delayed_messages_per_client``, counted as this process
follows ``msg.delayed``), stored in ``msg.delayed``; its answer gives its id, which
``DELETE /api/delayed/{id}`` cancels.

Who may publish (checked before anything is written, all messages of a batch first):

- an API key (``Authorization: Bearer cmk_...``, :mod:`services.common.auth.api_keys`),
  publishing as its Client Identifier under its rules;
- an MQTT_BASIC credential (``Authorization: Basic``, user name and password, UTF-8),
  checked as a CONNECT's would be (:class:`~services.common.auth.authenticate.
  Authenticator`: argon2id in a bounded pool, failures throttled per address and User
  Name), publishing as the ``client_id`` query parameter (which a credential naming a
  Client Identifier requires) or ``http-<credential name>``, under the credential's rules
  (:func:`~services.ingest.handle_connect.authorizer_of`).

Every refusal is an RFC 9457 problem (``application/problem+json``: ``type``, ``title``,
``status``, ``detail``, and ``index``, the refused message of a batch) and writes nothing:
400 a Topic Name MQTT 4.7 refuses or a payload that is not what it claims (UTF-8 text, or
base64); 401 no or a wrong key or password; 403 a topic the rules deny (MQTT's 0x87 Not
authorized); 413 a message whose PUBLISH would exceed ``max_packet_size``, or a batch or
body over its bound; 422 a body that is not the schema; 429 over
``http_publish_rate_per_key`` (``Retry-After``), or delayed messages over their bounds
(``quota-exceeded``, MQTT's 0x97 Quota exceeded: no ``Retry-After``, the bound frees as
waiting messages are published or cancelled); 503 Kafka or PostgreSQL did not answer (a
message may then have been stored: publish it again, at least once as with QoS 1).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import json
import logging
import math
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from enum import StrEnum
from typing import Annotated, Any, Literal

from aiokafka.errors import KafkaError
from aiokafka.structs import RecordMetadata
from fastapi import APIRouter, HTTPException, Query, Request, Response, Security
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from fastapi.security import HTTPBasic, HTTPBearer
from prometheus_client.core import CounterMetricFamily, Metric
from pydantic import BaseModel, ConfigDict, Field

from services.admin.commands import CommandWriter
from services.common import metrics
from services.common.auth.api_keys import ApiKeyStore, parse_token
from services.common.auth.authenticate import Authenticator
from services.common.auth.authorize import Authorizer, authorizer_for
from services.common.auth.credentials import Credential
from services.common.auth.principal import Accepted, AuthRequest, Refused
from services.common.auth.store import CredentialStore
from services.common.auth.throttle import AuthThrottle
from services.common.auth.verified import VerifiedPasswords
from services.common.clock import now_ms
from services.common.kafka.names import TopicNames
from services.common.mqtt.codec import encode
from services.common.mqtt.errors import MQTTError
from services.common.mqtt.packets import Publish
from services.common.mqtt.properties import Properties
from services.common.mqtt.reason_codes import ReasonCode
from services.common.records import DELAYED_ID_SIZE, KafkaRecord, parse_delayed
from services.common.settings import Settings
from services.common.stores.base import StoreUnavailable
from services.common.topics.validation import validate_topic_name
from services.ingest.delayed_rules import DelayedCounts, parse_delayed_topic
from services.ingest.effects import StoreDelayed, StoreEffect, publication
from services.ingest.handle_connect import authorizer_of
from services.ingest.handle_publish import accepted_meta
from services.ingest.rate_limits import TokenBucket
from services.ingest.store_pipeline import record_of

log = logging.getLogger(__name__)

PROBLEM_TYPE = "application/problem+json"
"""The media type of every refusal (RFC 9457)."""

MAX_USER_PROPERTIES = 100
"""Most User Properties one message may carry."""

MAX_STRING_BYTES = 65_535
"""Longest UTF-8 string MQTT can carry (MQTT 5.0 1.5.4), in bytes."""

PRUNE_AT = 10_000
"""Rate buckets kept before the full (idle) ones are dropped."""

QUOTA_EXCEEDED = "quota-exceeded"
"""The problem kind of delayed messages over their bounds (429, MQTT's 0x97)."""


class Outcome(StrEnum):
    """What became of one request: the ``outcome`` label of
    ``cormorant_http_publish_requests_total`` (a bounded set)."""

    ACCEPTED = "accepted"
    INVALID = "invalid"
    UNAUTHENTICATED = "unauthenticated"
    FORBIDDEN = "forbidden"
    TOO_LARGE = "too_large"
    RATE_LIMITED = "rate_limited"
    QUOTA_EXCEEDED = "quota_exceeded"
    UNAVAILABLE = "unavailable"


REQUESTS: dict[Outcome, int] = dict.fromkeys(Outcome, 0)
"""Requests of this process by outcome (every outcome served, 0 included)."""

MESSAGES: list[int] = [0, 0]
"""Messages this process handed to Kafka, by QoS (0, 1)."""

_OUTCOMES = {
    400: Outcome.INVALID,
    401: Outcome.UNAUTHENTICATED,
    403: Outcome.FORBIDDEN,
    413: Outcome.TOO_LARGE,
    422: Outcome.INVALID,
    429: Outcome.RATE_LIMITED,
    503: Outcome.UNAVAILABLE,
}


def collect() -> Iterable[Metric]:
    """``cormorant_http_publish_requests_total{outcome}`` and
    ``cormorant_http_publish_messages_total{qos}`` (registered by the admin service)."""
    requests = CounterMetricFamily(
        "cormorant_http_publish_requests",
        "HTTP publish API requests (one message or a batch), by outcome: accepted, or the "
        "refusal's reason (invalid, unauthenticated, forbidden, too_large, rate_limited, "
        "quota_exceeded: delayed messages over their bounds, unavailable).",
        labels=["outcome"],
    )
    for outcome, count in REQUESTS.items():
        requests.add_metric([outcome.value], count)
    yield requests
    messages = CounterMetricFamily(
        "cormorant_http_publish_messages",
        "Messages the HTTP publish API wrote to msg.all, by QoS.",
        labels=["qos"],
    )
    for qos, count in enumerate(MESSAGES):
        messages.add_metric([str(qos)], count)
    yield messages


# ------------------------------------------------------------------------------- problems


class Problem(Exception):
    """A refusal, answered as an RFC 9457 problem: ``status``, a short ``kind`` (the end of
    its ``type`` URI), ``detail`` in words, ``index`` the batch's refused message (None: the
    request as a whole), and extra response ``headers``."""

    def __init__(
        self,
        status: int,
        kind: str,
        detail: str,
        index: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.kind = kind
        self.detail = detail
        self.index = index
        self.headers = headers or {}

    def at(self, index: int) -> Problem:
        """This problem, as message ``index`` of a batch's."""
        return Problem(self.status, self.kind, self.detail, index, self.headers)

    def response(self) -> Response:
        """The ``application/problem+json`` answer (non-ASCII escaped: a detail may echo a
        topic holding a lone surrogate, which UTF-8 cannot encode)."""
        body: dict[str, Any] = {
            "type": f"urn:cormorant:problem:{self.kind}",
            "title": self.kind.replace("-", " "),
            "status": self.status,
            "detail": self.detail,
        }
        if self.index is not None:
            body["index"] = self.index
        return Response(
            json.dumps(body, ensure_ascii=True),
            self.status,
            headers=self.headers,
            media_type=PROBLEM_TYPE,
        )


class ProblemView(BaseModel):
    """An RFC 9457 problem: what was refused and why; nothing was written."""

    type: str = Field(description="urn:cormorant:problem:<kind>, e.g. ...:topic-invalid.")
    title: str
    status: int
    detail: str
    index: int | None = Field(None, description="The refused message of a batch (from 0).")


def _problems(*codes: int) -> dict[int | str, dict[str, Any]]:
    words = {
        400: "A Topic Name MQTT refuses, or a payload that is not what it claims.",
        401: "No API key or credential, or a wrong one.",
        403: "The key's or credential's rules deny the topic.",
        413: "A message larger than max_packet_size, or a batch or body over its bound.",
        422: "A body that is not the schema.",
        429: "Over http_publish_rate_per_key: wait Retry-After seconds.",
        503: "Kafka or PostgreSQL did not answer: publish again.",
    }
    return {
        code: {"model": ProblemView, "description": words[code], "content": {PROBLEM_TYPE: {}}}
        for code in codes
    }


class ProblemRoute(APIRoute):
    """A route whose every refusal is an RFC 9457 problem (a schema error and a FastAPI
    :class:`HTTPException` too), whose body is read only up to
    ``http_publish_max_body_bytes`` and must be UTF-8 JSON (RFC 8259 8.1), and whose
    outcome is counted (:data:`REQUESTS`)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """The route's handler, wrapped (see the class)."""
        handle = super().get_route_handler()

        async def handler(request: Request) -> Response:
            kind = None
            try:
                await _read_body(request)
                response = await handle(request)
            except Problem as problem:
                response = problem.response()
                kind = problem.kind
            except RequestValidationError as exc:
                where = "; ".join(
                    f"{'.'.join(str(p) for p in error.get('loc', ()))}: {error.get('msg')}"
                    for error in exc.errors()
                )
                response = Problem(422, "invalid-body", where).response()
            except HTTPException as exc:
                response = Problem(
                    exc.status_code, "refused", str(exc.detail), headers=dict(exc.headers or {})
                ).response()
            outcome = _OUTCOMES.get(response.status_code)
            if kind == QUOTA_EXCEEDED:
                outcome = Outcome.QUOTA_EXCEEDED
            REQUESTS[outcome or Outcome.ACCEPTED] += 1
            return response

        return handler


async def _read_body(request: Request) -> None:
    """Read the body, refusing it past the bound (413) or when it is not UTF-8 (400)."""
    limit = publisher_of(request).settings.http_publish_max_body_bytes
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise Problem(413, "body-too-large", f"the request body is over {limit} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise Problem(413, "body-too-large", f"the request body is over {limit} bytes")
    try:
        bytes(body).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Problem(
            400, "body-not-utf8", f"the request body is not UTF-8 (RFC 8259 8.1): {exc.reason}"
        ) from None
    # Starlette's Request keeps the body it read here; FastAPI parses it from there.
    request._body = bytes(body)


# --------------------------------------------------------------------------------- models


class UserProperty(BaseModel):
    """One MQTT 5 User Property (MQTT 5.0 3.3.2.3.7): a UTF-8 string pair."""

    model_config = ConfigDict(extra="forbid")

    name: str
    value: str


class PublishMessage(BaseModel):
    """One message to publish, as an MQTT 5 client would (MQTT 5.0 3.3)."""

    model_config = ConfigDict(extra="forbid")

    topic: str = Field(description="The Topic Name (no wildcards, MQTT 4.7).")
    payload: str = Field("", description="The payload: UTF-8 text, or base64 (payload_encoding).")
    payload_encoding: Literal["utf8", "base64"] = Field(
        "utf8", description="How payload is written: utf8 text (sent as its UTF-8 bytes) or base64."
    )
    qos: Literal[0, 1] = Field(
        1,
        description="1: answered once Kafka stored the message (acks=all), as a PUBACK; "
        "0: answered once handed to the producer (202), as QoS 0 is fire and forget.",
    )
    retain: bool = Field(False, description="Keep it as the topic's retained message.")
    content_type: str | None = Field(None, description="Content Type (MQTT 5.0 3.3.2.3.9).")
    payload_format_indicator: bool | None = Field(
        None, description="true: the payload is UTF-8 text (MQTT 5.0 3.3.2.3.2; checked)."
    )
    message_expiry_interval: int | None = Field(
        None, ge=0, le=4_294_967_295, description="Seconds (MQTT 5.0 3.3.2.3.3)."
    )
    response_topic: str | None = Field(None, description="Response Topic (3.3.2.3.5).")
    correlation_data: str | None = Field(None, description="Correlation Data, base64 (3.3.2.3.6).")
    user_properties: list[UserProperty] = Field(
        default_factory=list, max_length=MAX_USER_PROPERTIES, description="In this order."
    )


class PublishBatch(BaseModel):
    """Messages to publish in this order (at most ``http_publish_max_batch``)."""

    model_config = ConfigDict(extra="forbid")

    messages: list[PublishMessage] = Field(min_length=1)


class PublishedView(BaseModel):
    """A message written to ``msg.all`` (``msg.delayed`` for a delayed one): ``stored``
    when Kafka acknowledged it (QoS 1), false when it was only handed to the producer
    (QoS 0)."""

    topic: str
    qos: int
    retain: bool
    stored: bool
    delayed_id: str | None = Field(
        None,
        description="A delayed publication's id ($delayed/<seconds>/<topic>): "
        "DELETE /api/delayed/{id} cancels it; null: published now.",
    )


class BatchView(BaseModel):
    """The batch's messages, in order."""

    published: list[PublishedView]


# ------------------------------------------------------------------------- the publisher


class _StoredBasicCredentials:
    """The :class:`~services.common.auth.authenticate.CredentialSource` of HTTP Basic: the
    MQTT_BASIC credentials in PostgreSQL, looked up at every request (a change or a
    deletion counts at once); no certificates or JWT issuers."""

    def __init__(self, store: CredentialStore) -> None:
        self.store = store

    async def by_username(self, username: str) -> Sequence[Credential]:
        """The credentials naming ``username``."""
        return await self.store.by_username(username)

    async def by_client_id(self, client_id: str) -> Sequence[Credential]:
        """The MQTT_BASIC credentials naming ``client_id`` and no user name."""
        return await self.store.by_client_id(client_id)

    async def by_fingerprint(self, fingerprint: str) -> Sequence[Credential]:
        """None: HTTP Basic presents no certificate."""
        return ()

    async def unkeyed(self) -> Sequence[Credential]:
        """None: HTTP Basic is for MQTT_BASIC credentials."""
        return ()


@dataclasses.dataclass(frozen=True, slots=True)
class Publisher:
    """Who publishes: ``name`` (the key's or credential's, for the log), ``rate_key``
    (whose bucket counts its messages), the ``client_id`` its messages are published as,
    and its compiled rules."""

    name: str
    rate_key: str
    client_id: str
    authorizer: Authorizer


_REFUSED_STATUS = {
    ReasonCode.BANNED: 403,
    ReasonCode.SERVER_UNAVAILABLE: 503,
    ReasonCode.SERVER_BUSY: 503,
    ReasonCode.CONNECTION_RATE_EXCEEDED: 429,
}
"""HTTP status of an authentication refusal by its CONNACK Reason Code (others: 401)."""


class HttpPublisher:
    """What the publish API's handlers use: ``writer`` (the admin service's producer),
    the API keys and MQTT credentials in ``credentials``' PostgreSQL, the authenticator
    of HTTP Basic, one token bucket per key or credential, and ``delayed``, the waiting
    delayed messages as the admin service counts them (:class:`~services.admin.state.
    ClientState`; none given: only this publisher's). :meth:`close` at shutdown."""

    def __init__(
        self,
        settings: Settings,
        writer: CommandWriter,
        credentials: CredentialStore,
        delayed: DelayedCounts | None = None,
    ):
        self.settings = settings
        self.delayed = DelayedCounts() if delayed is None else delayed
        self.names = TopicNames.from_settings(settings)
        self.writer = writer
        self.keys = ApiKeyStore(credentials.pool)
        self.authenticator = Authenticator(
            _StoredBasicCredentials(credentials),
            hash_workers=settings.auth_hash_workers,
            max_pending_hashes=settings.auth_max_pending,
            max_pending_per_address=settings.auth_max_pending_per_address,
            verified=VerifiedPasswords(
                settings.auth_verified_cache_entries, settings.auth_verified_cache_seconds
            ),
            throttle=AuthThrottle.from_settings(settings),
            # No SCRAM over HTTP: the key would only salt unknown SCRAM users' answers.
            scram_unknown_user_key=secrets.token_bytes(32),
        )
        self.rate = settings.http_publish_rate_per_key
        self._buckets: dict[str, TokenBucket] = {}
        self._clock: Callable[[], float] = time.monotonic

    def close(self) -> None:
        """Stop the password-check threads."""
        self.authenticator.close()

    # ---------------------------------------------------------------- authentication

    async def publisher(
        self, authorization: str | None, client_id: str | None, address: str | None
    ) -> Publisher:
        """Who the ``Authorization`` header names. Raises :class:`Problem` 401 (none, or
        not valid), 403 (a disabled credential), 429/503 (see :data:`_REFUSED_STATUS`)."""
        scheme, _, value = (authorization or "").partition(" ")
        value = value.strip()
        if scheme.lower() == "bearer" and value:
            return await self._api_key(value, client_id, address)
        if scheme.lower() == "basic" and value:
            return await self._basic(value, client_id, address)
        raise Problem(
            401,
            "unauthenticated",
            "send an API key (Authorization: Bearer cmk_...) or an MQTT credential "
            "(Authorization: Basic)",
            headers={"WWW-Authenticate": 'Bearer, Basic realm="cormorant"'},
        )

    def _unauthenticated(self, detail: str) -> Problem:
        return Problem(
            401, "unauthenticated", detail, headers={"WWW-Authenticate": "Bearer, Basic"}
        )

    async def _api_key(self, token: str, client_id: str | None, address: str | None) -> Publisher:
        throttle = self.authenticator.throttle
        assert throttle is not None
        verdict = throttle.verdict(address, None, self._clock())
        if verdict.refuse is not None:
            raise Problem(429, "too-many-failures", verdict.reason)
        if verdict.delay:
            await asyncio.sleep(verdict.delay)
        parsed = parse_token(token)
        key = None if parsed is None else await self.keys.get(parsed[0])
        if parsed is None or key is None or not key.matches(parsed[1]):
            throttle.failed(address, None, self._clock())
            raise self._unauthenticated("the API key is not valid")
        if client_id is not None and client_id != key.client_id:
            raise Problem(403, "client-id", f"an API key publishes as {key.client_id!r} only")
        return Publisher(
            f"api key {key.name}",
            f"k:{key.id}",
            key.client_id,
            authorizer_for(key.rules, key.client_id, None),
        )

    async def _basic(self, encoded: str, client_id: str | None, address: str | None) -> Publisher:
        try:
            decoded = base64.b64decode(encoded, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise self._unauthenticated("Basic credentials are not base64 of UTF-8") from None
        username, colon, password = decoded.partition(":")
        if not colon or not username:
            raise self._unauthenticated("Basic credentials are not user-name:password")
        request = AuthRequest(client_id or "", username, password.encode(), address=address)
        outcome = await self.authenticator.authenticate(request)
        if isinstance(outcome, Refused):
            status = _REFUSED_STATUS.get(ReasonCode(outcome.reason_code), 401)
            if status == 401:
                raise self._unauthenticated(f"user name or password not valid: {outcome.reason}")
            raise Problem(status, "refused", outcome.reason)
        assert isinstance(outcome, Accepted)
        principal = outcome.principal
        name = principal.credential_name or username
        publishing_as = client_id or f"http-{name}"
        return Publisher(
            f"credential {name}",
            f"c:{principal.credential_id}",
            publishing_as,
            authorizer_of(principal, publishing_as),
        )

    # ---------------------------------------------------------------------- messages

    def records(self, publisher: Publisher, message: PublishMessage) -> list[KafkaRecord]:
        """The records of one message, checked: its publication's, or for
        ``$delayed/<seconds>/<topic>`` its ``msg.delayed`` record (a fresh random id).
        Raises :class:`Problem` 400 (Topic Name, a delay or target topic MQTT's 0x90
        would refuse, payload, properties), 403 (denied topic: the target's for a delayed
        one), 413 (over ``max_packet_size``)."""
        topic = message.topic
        try:
            validate_topic_name(topic)
            delayed = parse_delayed_topic(topic, self.settings.max_delay_seconds)
        except MQTTError as exc:
            raise Problem(400, "topic-invalid", str(exc)) from None
        target = topic if delayed is None else delayed.topic
        payload = _payload(message)
        properties = _properties(message, payload)
        if not publisher.authorizer.may_publish(target):
            log.info("%s may not publish to %r over HTTP: refused", publisher.name, target)
            raise Problem(
                403, "not-authorized", f"not authorized to publish to {target!r} (MQTT 0x87)"
            )
        packet = Publish(
            topic, payload, message.qos, message.retain, False, 1 if message.qos else None,
            properties,
        )  # fmt: skip
        size = len(encode(packet, 5))
        limit = self.settings.max_packet_size
        if size > limit:
            raise Problem(
                413,
                "message-too-large",
                f"as an MQTT PUBLISH the message is {size} bytes, over max_packet_size {limit}",
            )
        meta = accepted_meta(target, message.qos, message.retain, properties, 5, now_ms())
        effects: Sequence[StoreEffect] = publication(meta, payload)
        if delayed is not None and delayed.delay_seconds:
            ident = secrets.token_bytes(DELAYED_ID_SIZE)
            effects = [StoreDelayed(0, ident, delayed.delay_seconds, meta, payload)]
        return [record_of(self.names, publisher.client_id, e) for e in effects]

    def _delayed_ids(self, batch: list[list[KafkaRecord]]) -> list[bytes | None]:
        """Each message's delayed publication id (None: published now)."""
        topic = self.names.msg_delayed
        return [
            next((parse_delayed(r.key, None)[1] for r in records if r.topic == topic), None)
            for records in batch
        ]

    def _within_delayed_bounds(self, publisher: Publisher, count: int) -> None:
        """Raise :class:`Problem` 429 ``quota-exceeded`` unless ``count`` more delayed
        messages of the publisher stay within ``max_delayed_messages`` and
        ``max_delayed_messages_per_client``."""
        settings = self.settings
        why = self.delayed.refusal(
            publisher.client_id,
            settings.max_delayed_messages,
            settings.max_delayed_messages_per_client,
            count,
        )
        if why is None:
            return
        log.info("%s: %d delayed messages refused: %s", publisher.name, count, why)
        raise Problem(
            429, QUOTA_EXCEEDED, f"too many delayed messages: {why} (MQTT 0x97 Quota exceeded)"
        )

    def take(self, publisher: Publisher, count: int) -> None:
        """Count ``count`` messages against the publisher's rate. Raises :class:`Problem`
        429 with ``Retry-After`` (whole seconds) past it."""
        if self.rate <= 0:
            return
        now = self._clock()
        bucket = self._buckets.get(publisher.rate_key)
        if bucket is None:
            if len(self._buckets) >= PRUNE_AT:
                for key in [k for k, b in self._buckets.items() if b.full(now)]:
                    del self._buckets[key]
            capacity = max(self.rate, float(self.settings.http_publish_max_batch))
            bucket = self._buckets[publisher.rate_key] = TokenBucket(self.rate, capacity, now)
        if not bucket.try_take(count, now):
            wait = max(1, math.ceil((count - bucket.tokens) / self.rate))
            raise Problem(
                429,
                "rate-limited",
                f"over {self.rate:g} messages per second: try again in {wait} s",
                headers={"Retry-After": str(wait)},
            )

    async def publish(
        self, publisher: Publisher, messages: Sequence[PublishMessage]
    ) -> list[PublishedView]:
        """Check every message, then write them in order; returns once Kafka stored every
        QoS 1 message. Raises :class:`Problem` (nothing written when a message is refused;
        503 when Kafka did not answer: some may be stored)."""
        batch: list[list[KafkaRecord]] = []
        for index, message in enumerate(messages):
            try:
                batch.append(self.records(publisher, message))
            except Problem as problem:
                raise problem if len(messages) == 1 else problem.at(index) from None
        ids = self._delayed_ids(batch)
        waiting = [i for i in ids if i is not None]
        if waiting:
            self._within_delayed_bounds(publisher, len(waiting))
        self.take(publisher, len(messages))
        for ident in waiting:  # counted from now, as an ingest node does
            self.delayed.add(publisher.client_id, ident)
        try:
            sent = await self.writer.enqueue([r for records in batch for r in records])
        except KafkaError as exc:
            for ident in waiting:  # read and counted again if Kafka wrote it after all
                self.delayed.remove(publisher.client_id, ident)
            raise _kafka_down(exc) from None
        waits: list[Awaitable[RecordMetadata]] = []
        position = 0
        for message, records in zip(messages, batch, strict=True):
            futures = sent[position : position + len(records)]
            position += len(records)
            MESSAGES[message.qos] += 1
            if message.qos:
                waits.extend(futures)
            else:
                for future in futures:
                    future.add_done_callback(_log_qos0_failure)
        try:
            await asyncio.gather(*waits)
        except KafkaError as exc:
            raise _kafka_down(exc) from None
        return [
            PublishedView(
                topic=m.topic,
                qos=m.qos,
                retain=m.retain,
                stored=bool(m.qos),
                delayed_id=None if i is None else i.hex(),
            )
            for m, i in zip(messages, ids, strict=True)
        ]


def _kafka_down(exc: KafkaError) -> Problem:
    log.warning("HTTP publish not stored in Kafka: %r", exc)
    return Problem(
        503,
        "kafka-unavailable",
        f"Kafka did not store the message(s) ({type(exc).__name__}); some may be stored: "
        "publish again (at least once, as MQTT QoS 1)",
    )


def _log_qos0_failure(future: asyncio.Future[RecordMetadata]) -> None:
    """Log a QoS 0 message Kafka did not store (nobody waits for it: fire and forget)."""
    if not future.cancelled() and future.exception() is not None:
        log.warning("an HTTP QoS 0 message was not stored: %r", future.exception())


def _utf8(value: str, what: str) -> None:
    """Raise :class:`Problem` 400 unless ``value`` is an MQTT UTF-8 Encoded String (MQTT
    5.0 1.5.4: well-formed, no U+0000, at most 65,535 bytes)."""
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise Problem(400, "not-utf8", f"{what} is not valid UTF-8 (MQTT 1.5.4)") from None
    if "\x00" in value or size > MAX_STRING_BYTES:
        raise Problem(
            400, "not-utf8", f"{what} holds U+0000 or is over {MAX_STRING_BYTES} bytes (MQTT 1.5.4)"
        )


def _payload(message: PublishMessage) -> bytes:
    """The payload's bytes. Raises :class:`Problem` 400: text that is not UTF-8 (a lone
    surrogate), base64 that is not, or a payload the Payload Format Indicator says is UTF-8
    and is not (MQTT 5.0 3.3.2.3.2)."""
    if message.payload_encoding == "base64":
        try:
            payload = base64.b64decode(message.payload, validate=True)
        except binascii.Error:
            raise Problem(400, "payload-invalid", "payload is not valid base64") from None
        if message.payload_format_indicator:
            try:
                payload.decode("utf-8")
            except UnicodeDecodeError:
                raise Problem(
                    400,
                    "payload-invalid",
                    "payload_format_indicator says UTF-8, the payload is not (MQTT 5.0 3.3.2.3.2)",
                ) from None
        return payload
    try:
        return message.payload.encode("utf-8")
    except UnicodeEncodeError:
        raise Problem(400, "payload-invalid", "payload is not valid UTF-8 text") from None


def _properties(message: PublishMessage, payload: bytes) -> Properties:
    """The message's MQTT 5 PUBLISH properties. Raises :class:`Problem` 400 for a string
    MQTT cannot carry, a Response Topic that is not a Topic Name, Correlation Data that is
    not base64."""
    props = Properties(
        message_expiry_interval=message.message_expiry_interval,
        content_type=message.content_type,
        response_topic=message.response_topic,
    )
    if message.payload_format_indicator is not None:
        props.payload_format_indicator = int(message.payload_format_indicator)
    if message.content_type is not None:
        _utf8(message.content_type, "content_type")
    if message.response_topic is not None:
        try:
            validate_topic_name(message.response_topic)
        except MQTTError as exc:
            raise Problem(400, "topic-invalid", f"response_topic: {exc}") from None
    if message.correlation_data is not None:
        try:
            props.correlation_data = base64.b64decode(message.correlation_data, validate=True)
        except binascii.Error:
            raise Problem(400, "payload-invalid", "correlation_data is not base64") from None
    for pair in message.user_properties:
        _utf8(pair.name, "a user property name")
        _utf8(pair.value, "a user property value")
        props.user_properties.append((pair.name, pair.value))
    return props


# --------------------------------------------------------------------------------- routes


class _DocumentedOnly(HTTPBearer):
    """Names the API key scheme in the OpenAPI document; :class:`HttpPublisher` reads the
    header itself (Basic passwords are UTF-8, which FastAPI's HTTPBasic refuses)."""

    async def __call__(self, request: Request) -> None:  # type: ignore[override]
        return None


class _DocumentedBasic(HTTPBasic):
    """Names the HTTP Basic scheme in the OpenAPI document (see :class:`_DocumentedOnly`)."""

    async def __call__(self, request: Request) -> None:  # type: ignore[override]
        return None


_SECURITY = [
    Security(
        _DocumentedOnly(
            scheme_name="ApiKey",
            bearerFormat="cmk_<id>.<secret>",
            description="An API key (cormorant api-keys add).",
        )
    ),
    Security(
        _DocumentedBasic(
            scheme_name="MqttCredential",
            description="The User Name and Password of an MQTT_BASIC credential.",
        )
    ),
]

router = APIRouter(prefix="/api/v1", tags=["HTTP publish"], route_class=ProblemRoute)
"""Included by :func:`services.admin.api.create_app`."""

ClientIdParameter = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=1024,
        description="HTTP Basic: the Client Identifier to publish as (a credential naming "
        "one requires it; default http-<credential name>). An API key publishes as its own.",
    ),
]


def publisher_of(request: Request) -> HttpPublisher:
    """The :class:`HttpPublisher` of the application serving ``request``."""
    publisher: HttpPublisher = request.app.state.context.publisher
    return publisher


async def _authenticated(request: Request, client_id: str | None) -> Publisher:
    address = request.client.host if request.client is not None else None
    try:
        return await publisher_of(request).publisher(
            request.headers.get("authorization"), client_id, address
        )
    except StoreUnavailable as exc:
        raise Problem(503, "store-unavailable", str(exc)) from None


def _answer(published: list[PublishedView], response: Response) -> None:
    if not all(p.stored for p in published):
        response.status_code = 202


@router.post(
    "/publish",
    response_model=PublishedView,
    responses={202: {"description": "QoS 0: handed to the producer."},
               **_problems(400, 401, 403, 413, 422, 429, 503)},
    dependencies=_SECURITY,
)  # fmt: skip
async def publish(
    request: Request, body: PublishMessage, response: Response, client_id: ClientIdParameter = None
) -> PublishedView:
    """Publish one message as an MQTT 5 client would; 200 once Kafka stored it (QoS 1,
    acks=all: a PUBACK's guarantee), 202 once handed to the producer (QoS 0)."""
    publisher = await _authenticated(request, client_id)
    published = await publisher_of(request).publish(publisher, [body])
    _answer(published, response)
    return published[0]


@router.post(
    "/publish:batch",
    response_model=BatchView,
    responses={202: {"description": "A QoS 0 message was handed to the producer only."},
               **_problems(400, 401, 403, 413, 422, 429, 503)},
    dependencies=_SECURITY,
)  # fmt: skip
async def publish_batch(
    request: Request, body: PublishBatch, response: Response, client_id: ClientIdParameter = None
) -> BatchView:
    """Publish messages in order, all or none refused: every message is checked before
    any is written (a refusal names the message's ``index``). 200 once Kafka stored every
    QoS 1 message (202 if some are QoS 0)."""
    publisher = await _authenticated(request, client_id)
    limit = publisher_of(request).settings.http_publish_max_batch
    if len(body.messages) > limit:
        raise Problem(413, "batch-too-large", f"a batch holds at most {limit} messages")
    published = await publisher_of(request).publish(publisher, body.messages)
    _answer(published, response)
    return BatchView(published=published)


def register_metrics() -> None:
    """Serve :func:`collect`'s families at ``/metrics`` (the admin service, once)."""
    metrics.register(collect)
