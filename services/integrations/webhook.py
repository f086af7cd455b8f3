"""The HTTP webhook: an integration's messages POSTed to an HTTP endpoint, at least once
(docs/integrations/webhook.md).

:class:`WebhookDeliverer` is the webhook's :class:`~.at_least_once.Deliverer`. Each round's
messages are split into lanes by their publisher's Client Identifier (:func:`lanes`: one
lane per request in flight, ``max_in_flight`` of them, a Client Identifier always in the
same one) and each lane's messages into requests of ``batch_size`` (:func:`encode`). The
lanes run at once; within a lane one request at a time, in order. So a Client Identifier's
messages reach the endpoint in the order the broker accepted them, with at most
``max_in_flight`` requests on the way.

Each request is signed as the HTTP authentication provider's are
(:func:`~services.common.auth.http_provider.signature`: ``X-Cormorant-Timestamp`` and
``X-Cormorant-Signature: sha256=<hex HMAC-SHA-256 of "<timestamp>.<body>">`` under the
integration's signing secret). An attempt fails on a transport error, no complete answer
within ``timeout_seconds``, or a status other than 2xx (redirects are not followed); it is
tried again after an exponential backoff with jitter (:func:`backoff`, tenacity) until
``max_attempts`` attempts failed. Then its messages are written to the dead-letter topic
(:mod:`services.common.integrations.dead_letter`) and the lane goes on with its next
request. Only when that write fails does :meth:`WebhookDeliverer.deliver` raise (the round
is delivered again).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
import urllib.parse
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

import httpx
from aiokafka import AIOKafkaProducer
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)
from tenacity.wait import wait_base

from services.common.auth.http_provider import signature
from services.common.faust_app import producer_options
from services.common.integrations.dead_letter import DeadLetter, dead_letter_record
from services.common.integrations.model import Integration, PayloadFormat, WebhookSink
from services.common.kafka.names import TopicNames
from services.common.settings import Settings
from services.integrations.at_least_once import Gathering
from services.integrations.matching import Outgoing

if TYPE_CHECKING:
    from services.integrations.stage import IntegrationCounters

log = logging.getLogger(__name__)

ERROR_TEXT_MAX = 300
"""Characters of an attempt's failure kept (the last error, a dead letter's header)."""


class AttemptFailed(Exception):
    """One attempt of a request failed; the message says how (one line, no secret)."""


def webhook_sink(integration: Integration) -> WebhookSink:
    """``integration``'s sink. Raises ``TypeError`` when it is not a webhook."""
    sink = integration.sink
    if not isinstance(sink, WebhookSink):
        raise TypeError(f"integration {integration.name} is not a webhook")
    return sink


def lanes(messages: Sequence[Outgoing], count: int) -> list[list[Outgoing]]:
    """``messages`` in up to ``count`` lanes (the empty ones left out), each in the order
    given: a Client Identifier's messages all in the lane of the CRC-32 of its UTF-8
    bytes, modulo ``count`` (the same lane in every round)."""
    found: dict[int, list[Outgoing]] = {}
    for message in messages:
        lane = zlib.crc32(message.client_id.encode("utf-8")) % count
        found.setdefault(lane, []).append(message)
    return [found[lane] for lane in sorted(found)]


def requests_of(lane: Sequence[Outgoing], batch_size: int) -> list[Sequence[Outgoing]]:
    """``lane`` cut into requests of ``batch_size`` messages (the last one may hold
    fewer), in order."""
    return [lane[start : start + batch_size] for start in range(0, len(lane), batch_size)]


def encode(
    batch: Sequence[Outgoing], sink: WebhookSink, payload_format: PayloadFormat
) -> tuple[bytes, dict[str, str]]:
    """The body and the content headers of a request of ``batch``. With a ``batch_size``
    of 1: the message as formatted (``application/json``, or the raw payload as
    ``application/octet-stream``), its Topic Name and Client Identifier in
    ``X-Cormorant-Topic`` and ``X-Cormorant-Client-Id`` (UTF-8, percent-encoded, RFC 3986
    section 2.1); over 1: a JSON array of the messages' documents, in order."""
    if sink.batch_size > 1:
        return b"[" + b",".join(message.value for message in batch) + b"]", {
            "Content-Type": "application/json"
        }
    (message,) = batch
    json = payload_format is PayloadFormat.JSON
    return message.value, {
        "Content-Type": "application/json" if json else "application/octet-stream",
        "X-Cormorant-Topic": urllib.parse.quote(message.topic, safe="/"),
        "X-Cormorant-Client-Id": urllib.parse.quote(message.client_id, safe=""),
    }


def backoff(sink: WebhookSink) -> wait_base:
    """The pause before each next attempt: ``backoff_seconds`` doubled at each attempt (at
    most ``backoff_max_seconds`` less the jitter), plus a random jitter of up to
    ``backoff_seconds`` (endpoints recovering are not hit by every stage at once): never
    over ``backoff_max_seconds``."""
    jitter = sink.backoff_seconds
    return wait_exponential(
        multiplier=sink.backoff_seconds, max=sink.backoff_max_seconds - jitter
    ) + wait_random(0, jitter)


def _tls(sink: WebhookSink) -> ssl.SSLContext | bool:
    """What httpx verifies the endpoint's certificate with: the sink's CA file, else the
    system's CAs. Raises ``OSError``/``ssl.SSLError`` when the CA file cannot be read."""
    if not sink.ssl_cafile:
        return True
    context = ssl.create_default_context()
    context.load_verify_locations(cafile=sink.ssl_cafile)
    return context


class WebhookDeliverer:
    """POSTs ``integration``'s messages to its webhook (see the module), keeping
    ``counters``: sent (answered 2xx), failed and retried (messages of failed and repeated
    attempts), dead-lettered, the last error."""

    def __init__(
        self, settings: Settings, integration: Integration, counters: IntegrationCounters
    ) -> None:
        self.settings = settings
        self.integration = integration
        self.sink = webhook_sink(integration)
        secret = integration.secrets.signing_secret
        if secret is None:
            raise TypeError(f"integration {integration.name} has no signing secret")
        self.secret = secret.encode("utf-8")
        self.counters = counters
        self.names = TopicNames.from_settings(settings)
        self.gathering = Gathering(
            max_messages=self.sink.batch_size * self.sink.max_in_flight,
            linger_seconds=self.sink.linger_seconds,
        )
        self.client: httpx.AsyncClient | None = None
        self.dead_letters = AIOKafkaProducer(**producer_options(settings), enable_idempotence=True)

    async def start(self) -> None:
        """Connect the dead-letter producer and make the HTTP client. Raises
        ``KafkaError``, or ``OSError``/``ssl.SSLError`` when the CA file cannot be
        read."""
        sink = self.sink
        await self.dead_letters.start()
        self.client = httpx.AsyncClient(
            verify=_tls(sink),
            timeout=httpx.Timeout(sink.timeout_seconds),
            follow_redirects=False,
            limits=httpx.Limits(max_connections=sink.max_in_flight),
            headers=list(sink.headers),
        )

    async def deliver(self, messages: Sequence[Outgoing]) -> None:
        """POST ``messages`` (see the module); returns once each was answered with a 2xx
        or dead-lettered. Raises ``KafkaError`` (in an ``ExceptionGroup``) when a dead
        letter could not be written."""
        async with asyncio.TaskGroup() as group:
            for lane in lanes(messages, self.sink.max_in_flight):
                group.create_task(self._lane(lane))

    async def _lane(self, lane: Sequence[Outgoing]) -> None:
        for batch in requests_of(lane, self.sink.batch_size):
            await self._send(batch)

    async def _send(self, batch: Sequence[Outgoing]) -> None:
        """POST ``batch`` until an attempt succeeds, else dead-letter it."""
        body, headers = encode(batch, self.sink, self.integration.payload_format)
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.sink.max_attempts),
            wait=backoff(self.sink),
            retry=retry_if_exception_type(AttemptFailed),
            before_sleep=lambda state: self._again(len(batch)),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    await self._attempt(body, headers, len(batch))
        except AttemptFailed as exc:
            await self._dead_letter(batch, str(exc), retrying.statistics["attempt_number"])
            return
        self.counters.sent += len(batch)

    def _again(self, messages: int) -> None:
        """A failed attempt of ``messages`` is tried again (after the backoff)."""
        self.counters.retried += messages

    async def _attempt(self, body: bytes, headers: dict[str, str], messages: int) -> None:
        """One POST of ``body``. Raises :class:`AttemptFailed` (counted as failed)."""
        assert self.client is not None
        timestamp = str(int(time.time()))
        signed = {
            **headers,
            "X-Cormorant-Integration": self.integration.name,
            "X-Cormorant-Timestamp": timestamp,
            "X-Cormorant-Signature": signature(self.secret, timestamp, body),
        }
        try:
            # httpx's timeout is per read; the whole answer must come within it too.
            async with asyncio.timeout(self.sink.timeout_seconds):
                response = await self.client.post(self.sink.url, content=body, headers=signed)
            failure = None if response.is_success else f"answered HTTP {response.status_code}"
        except (TimeoutError, httpx.TimeoutException):
            failure = f"no answer within {self.sink.timeout_seconds:g} s"
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            failure = f"unreachable: {type(exc).__name__}: {exc}"
        if failure is not None:
            text = " ".join(failure.split())[:ERROR_TEXT_MAX]
            self.counters.failed += messages
            self.counters.error(text)
            raise AttemptFailed(text)

    async def _dead_letter(self, batch: Sequence[Outgoing], error: str, attempts: int) -> None:
        """Write ``batch`` to the dead-letter topic (each message a record) and wait for
        Kafka's acknowledgement. Raises ``KafkaError``."""
        failed_at_ms = int(time.time() * 1000)
        acks = []
        for message in batch:
            letter = DeadLetter(
                message.client_id,
                message.topic,
                message.value,
                self.integration.name,
                self.integration.id,
                attempts,
                error,
                failed_at_ms,
            )
            record = dead_letter_record(self.names, letter)
            acks.append(
                await self.dead_letters.send(
                    record.topic, record.value, key=record.key, headers=list(record.headers)
                )
            )
        await asyncio.gather(*acks)
        self.counters.dead_lettered += len(batch)
        log.warning(
            "integration %s: %d message(s) to the dead-letter topic after %d attempts: %s",
            self.integration.name,
            len(batch),
            attempts,
            error,
        )

    async def close(self) -> None:
        """Close the HTTP client and the dead-letter producer."""
        if self.client is not None:
            await self.client.aclose()
        await self.dead_letters.stop()
