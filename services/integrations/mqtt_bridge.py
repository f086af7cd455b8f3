"""The MQTT bridge: an integration's messages forwarded to another MQTT broker, and,
optionally, the other broker's messages on some Topic Filters published here
(docs/integrations/mqtt-bridge.md).

Forward (:class:`MqttBridgeDeliverer`): the stage's at-least-once runner hands it each
``msg.all`` partition's matched messages in order; it publishes them, in that order, on one
connection to the remote broker and returns once the remote acknowledged every one
(PUBACK for QoS 1, PUBCOMP for QoS 2; QoS 0 once written to the socket), and only then
does the runner commit the partition's offsets. A lost connection, a refused PUBACK
(MQTT 5 Reason Code 0x80 or more) or an acknowledgement that does not come within
:data:`ACK_TIMEOUT_SECONDS` fails the batch: the connection is dropped, and the whole batch
is published again, in order, on a new connection after an exponential backoff with jitter
(tenacity), until it is acknowledged. So nothing is lost and each publisher's order holds
(MQTT 5.0 4.6: one connection, one QoS stream); what the remote received before a failure
can come twice.

A message goes with the lower of its own QoS and the sink's, its RETAIN flag kept or
cleared (``retain``), on its Topic Name mapped by the sink's prefixes
(:mod:`services.common.integrations.topic_mapping`). To an MQTT 5 broker its properties go
along when the payload is sent raw (Payload Format Indicator, Content Type, Response Topic,
Correlation Data, User Properties, and the Message Expiry Interval lowered by the time it
waited, 3.3.2.3.3: a message that expired meanwhile is not sent); with the JSON format the
properties are in the document and the PUBLISH says ``application/json``.

Reverse (:class:`ReverseBridge`): a persistent session on the remote broker subscribed to
the sink's reverse Topic Filters; each message is published here with the configured
credential (the broker's own authentication and authorization apply), and acknowledged to
the remote only once this broker acknowledged it (paho's manual acknowledgement): a crash
in between has the remote send it again when the session resumes (MQTT 5.0 4.4). Loops are
refused when the integration is stored (:func:`~services.common.integrations.model.
check_mqtt_sink`): no topic the forward direction writes may match a reverse filter.

paho-mqtt drives each connection on its own network thread (``loop_start``);
:class:`Connection` turns its callbacks into asyncio futures.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential_jitter,
)

from services.common.integrations.model import Integration, MqttSink, PayloadFormat
from services.common.integrations.topic_mapping import map_topic
from services.common.mqtt.properties import Properties
from services.common.settings import Settings
from services.integrations.at_least_once import Gathering
from services.integrations.matching import Outgoing

if TYPE_CHECKING:
    from services.integrations.stage import IntegrationCounters

log = logging.getLogger(__name__)

#: Seconds the remote broker may take to answer CONNECT, SUBSCRIBE, and to acknowledge a
#: batch's last message (a batch is at most the stage's batch of one partition).
CONNECT_TIMEOUT_SECONDS = 10.0
ACK_TIMEOUT_SECONDS = 30.0

#: Keep Alive of the bridge's connections (MQTT 5.0 3.1.2.10), seconds.
KEEPALIVE_SECONDS = 30

#: QoS 1 and 2 messages the bridge has unacknowledged on the remote connection at once;
#: the rest of a batch waits in paho's queue, in order.
MAX_INFLIGHT = 100

#: Backoff before publishing a failed batch again, or reconnecting the reverse direction:
#: exponential from the first value, with up to as much jitter, at most the second.
RETRY_MIN_SECONDS = 0.5
RETRY_MAX_SECONDS = 30.0

#: Seconds a round may keep failing before :meth:`MqttBridgeDeliverer.deliver` gives up
#: and the stage starts the integration again (its consumer group member stays meanwhile).
RETRY_BUDGET_SECONDS = 120.0

#: Session Expiry Interval (MQTT 5.0 3.1.2.11.2) of the reverse direction's session on an
#: MQTT 5 remote: how long the remote keeps its messages while the bridge is away. An
#: MQTT 3.1.1 remote keeps a persistent session as long as its own settings say.
REVERSE_SESSION_EXPIRY_SECONDS = 7 * 24 * 3600

_JSON_CONTENT_TYPE = "application/json"

#: Distinct sets of PUBLISH properties whose paho form is kept (:func:`paho_properties`).
PROPERTIES_CACHE_SIZE = 1024


class BridgeError(Exception):
    """A connection to a broker failed, was refused, was lost, or did not acknowledge in
    time; the message says which broker and why (never a password)."""


class PublishRefused(BridgeError):
    """A broker answered a PUBLISH with a Reason Code of 0x80 or more (MQTT 5.0 3.4.2.1:
    Not authorized, Topic Name invalid, Quota exceeded...)."""


def instance_name(settings: Settings) -> str:
    """What tells this stage process's connections apart from another instance's: its
    static group member id, else ``<host name>-<pid>``."""
    return settings.group_instance_id or f"{socket.gethostname()}-{os.getpid()}"


class Connection:
    """One MQTT connection (paho-mqtt on its network thread) whose acknowledgements are
    asyncio futures. ``persistent``: resume the session (Clean Session 0 / Clean Start 0
    with :data:`REVERSE_SESSION_EXPIRY_SECONDS`) and acknowledge received messages only
    through :meth:`ack`. Every method raises :class:`BridgeError` on failure."""

    def __init__(
        self,
        what: str,
        host: str,
        port: int,
        client_id: str,
        *,
        protocol_version: int = 5,
        username: str | None = None,
        password: str | None = None,
        tls: bool = False,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
        persistent: bool = False,
    ) -> None:
        self.what = f"{what} {host}:{port}"
        self.host = host
        self.port = port
        self.v5 = protocol_version == 5
        self.persistent = persistent
        self._loop = asyncio.get_running_loop()
        self._client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            clean_session=None if self.v5 else not persistent,
            protocol=paho.MQTTv5 if self.v5 else paho.MQTTv311,
            reconnect_on_failure=False,
            manual_ack=persistent,
        )
        if username is not None:
            self._client.username_pw_set(username, password)
        if tls:
            # Verifies the broker's certificate chain and host name (paho's defaults).
            self._client.tls_set(ca_certs=ca_file, certfile=cert_file, keyfile=key_file)
        self._client.max_inflight_messages_set(MAX_INFLIGHT)
        self._client.max_queued_messages_set(0)
        self._connected: asyncio.Future[bool] = self._loop.create_future()
        self.lost: asyncio.Future[None] = self._loop.create_future()
        self._pending: dict[int, asyncio.Future[None]] = {}
        self._subscribing: dict[int, asyncio.Future[list[ReasonCode]]] = {}
        self._on_message: Callable[[paho.MQTTMessage], None] | None = None
        self._client.on_connect = self._connect_answered
        self._client.on_disconnect = self._disconnected
        self._client.on_publish = self._published
        self._client.on_subscribe = self._subscribed
        self._client.on_message = self._received

    def _soon(self, callback: Callable[..., None], *args: Any) -> None:
        """Run ``callback(*args)`` on the event loop (paho calls back on its thread)."""
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            self._loop.call_soon_threadsafe(callback, *args)

    async def open(self, on_message: Callable[[paho.MQTTMessage], None] | None = None) -> bool:
        """Connect and wait for the CONNACK; returns its Session Present flag.
        ``on_message`` gets each received PUBLISH, on the event loop."""
        self._on_message = on_message
        properties = None
        if self.v5 and self.persistent:
            properties = PahoProperties(PacketTypes.CONNECT)
            properties.SessionExpiryInterval = REVERSE_SESSION_EXPIRY_SECONDS
        # MQTT 3.1.1 takes the session choice in the constructor (Clean Session).
        clean_start = not self.persistent if self.v5 else paho.MQTT_CLEAN_START_FIRST_ONLY
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_SECONDS):
                await asyncio.to_thread(
                    self._client.connect,
                    self.host,
                    self.port,
                    KEEPALIVE_SECONDS,
                    clean_start=clean_start,
                    properties=properties,
                )
                self._client.loop_start()
                return await self._connected
        except (OSError, ValueError, TimeoutError) as exc:
            await self.close()
            raise BridgeError(f"{self.what}: cannot connect: {exc!r}") from None
        except BridgeError:
            await self.close()
            raise

    def _connect_answered(
        self, _client: Any, _userdata: Any, flags: Any, reason: ReasonCode, _properties: Any
    ) -> None:
        if reason.is_failure:
            error = BridgeError(f"{self.what}: CONNECT refused: {reason}")
            self._soon(_settle, self._connected, error)
        else:
            self._soon(_settle, self._connected, bool(flags.session_present))

    def _disconnected(
        self, _client: Any, _userdata: Any, _flags: Any, reason: ReasonCode, _properties: Any
    ) -> None:
        self._soon(self._lose, BridgeError(f"{self.what}: connection lost: {reason}"))

    def _lose(self, error: BridgeError) -> None:
        """Fail everything waiting on this connection."""
        _settle(self._connected, error)
        _settle(self.lost, error)
        waiting: list[asyncio.Future[Any]] = [*self._pending.values()]
        waiting.extend(self._subscribing.values())
        for future in waiting:
            _settle(future, error)
        self._pending.clear()
        self._subscribing.clear()

    def _published(
        self, _client: Any, _userdata: Any, mid: int, reason: ReasonCode, _properties: Any
    ) -> None:
        self._soon(self._acknowledged, mid, reason)

    def _acknowledged(self, mid: int, reason: ReasonCode) -> None:
        future = self._pending.pop(mid, None)
        if future is None:
            return
        if reason.is_failure:
            _settle(future, PublishRefused(f"{self.what}: PUBLISH refused: {reason}"))
        else:
            _settle(future, None)

    def publish(
        self,
        topic: str,
        payload: bytes,
        qos: int,
        retain: bool,
        properties: PahoProperties | None = None,
    ) -> asyncio.Future[None]:
        """Send a PUBLISH (queued by paho behind :data:`MAX_INFLIGHT` others, in order);
        the future is done once it is acknowledged (QoS 0: written)."""
        if self.lost.done():
            raise BridgeError(f"{self.what}: connection lost")
        info = self._client.publish(topic, payload, qos, retain, properties)
        if info.rc != paho.MQTT_ERR_SUCCESS:
            raise BridgeError(f"{self.what}: PUBLISH not sent: {paho.error_string(info.rc)}")
        # paho's acknowledgement reaches the loop through call_soon_threadsafe, so it runs
        # after this: registering the future now cannot miss it.
        future: asyncio.Future[None] = self._loop.create_future()
        self._pending[info.mid] = future
        return future

    async def subscribe(self, topic_filters: Sequence[str], qos: int) -> None:
        """Subscribe to ``topic_filters`` with maximum QoS ``qos`` (MQTT 5: Retain As
        Published, so the RETAIN flag comes as published, and Retain Handling 1, retained
        messages only for a new subscription, not again for each resumed session,
        3.8.3.1); raises :class:`BridgeError` when a filter is refused (a SUBACK Reason
        Code of 0x80 or more)."""
        options: Any = (
            SubscribeOptions(
                qos=qos,
                retainAsPublished=True,
                retainHandling=SubscribeOptions.RETAIN_SEND_IF_NEW_SUB,
            )
            if self.v5
            else qos
        )
        result, mid = self._client.subscribe([(f, options) for f in topic_filters])
        if result != paho.MQTT_ERR_SUCCESS or mid is None:
            raise BridgeError(f"{self.what}: SUBSCRIBE not sent: {paho.error_string(result)}")
        future: asyncio.Future[list[ReasonCode]] = self._loop.create_future()
        self._subscribing[mid] = future
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_SECONDS):
                reasons = await future
        except TimeoutError:
            raise BridgeError(f"{self.what}: no SUBACK") from None
        refused = [f for f, r in zip(topic_filters, reasons, strict=False) if r.is_failure]
        if refused:
            raise BridgeError(f"{self.what}: subscriptions refused: {refused}")

    def _subscribed(
        self, _client: Any, _userdata: Any, mid: int, reasons: list[ReasonCode], _props: Any
    ) -> None:
        self._soon(self._suback, mid, reasons)

    def _suback(self, mid: int, reasons: list[ReasonCode]) -> None:
        future = self._subscribing.pop(mid, None)
        if future is not None:
            _settle(future, reasons)

    def _received(self, _client: Any, _userdata: Any, message: paho.MQTTMessage) -> None:
        handler = self._on_message
        if handler is not None:
            self._soon(handler, message)

    def ack(self, message: paho.MQTTMessage) -> None:
        """Acknowledge a received QoS 1 or 2 ``message`` (PUBACK / PUBCOMP)."""
        if message.qos > 0:
            self._client.ack(message.mid, message.qos)

    async def close(self) -> None:
        """Disconnect (DISCONNECT, then the socket) and stop paho's thread."""
        with contextlib.suppress(Exception):
            self._client.disconnect()
        await asyncio.to_thread(self._client.loop_stop)
        self._lose(BridgeError(f"{self.what}: closed"))


def _settle(future: asyncio.Future[Any], outcome: Any) -> None:
    """Give ``future`` its result, or its exception when ``outcome`` is one; once."""
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
        # Retrieved here so that a future nobody waits on any more is not reported.
        future.exception()
    else:
        future.set_result(outcome)


@dataclass(frozen=True, slots=True)
class RemoteMessage:
    """A PUBLISH as the bridge sends it to the remote broker (or here, reversed)."""

    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: PahoProperties | None


def paho_properties(
    properties: Properties, now_ms: int, received_at_ms: int
) -> PahoProperties | None:
    """The PUBLISH properties an MQTT 5 remote gets of a message with ``properties``
    accepted at ``received_at_ms``: those a server forwards (MQTT 5.0 3.3.2.3), the Message
    Expiry Interval lowered by the whole seconds since (3.3.2.3.3). None when there are
    none. Raises ``LookupError`` when the message expired. The object is shared by every
    message with the same properties (:func:`_built_properties`): read it, never change
    it."""
    left = None
    if properties.message_expiry_interval is not None:
        left = properties.message_expiry_interval - (now_ms - received_at_ms) // 1000
        if left <= 0:
            raise LookupError("expired")
    return _built_properties(
        left,
        properties.payload_format_indicator,
        properties.content_type,
        properties.response_topic,
        properties.correlation_data,
        tuple(properties.user_properties),
    )


@functools.lru_cache(maxsize=PROPERTIES_CACHE_SIZE)
def _built_properties(
    message_expiry_interval: int | None,
    payload_format_indicator: int | None,
    content_type: str | None,
    response_topic: str | None,
    correlation_data: bytes | None,
    user_properties: tuple[tuple[str, str], ...],
) -> PahoProperties | None:
    """paho's PUBLISH properties of these values (None: left out), or None when all are
    left out. Built once per distinct set: building paho's ``Properties`` (its tables
    and checked attributes) was half of the bridge's own CPU per message
    (bench/NOTES.md, "issue 27: the webhook and the MQTT bridge"), and paho only reads
    it (``pack``) when it sends or sends again a PUBLISH."""
    out = PahoProperties(PacketTypes.PUBLISH)
    present = False
    if message_expiry_interval is not None:
        out.MessageExpiryInterval = message_expiry_interval
        present = True
    if payload_format_indicator is not None:
        out.PayloadFormatIndicator = payload_format_indicator
        present = True
    if content_type is not None:
        out.ContentType = content_type
        present = True
    if response_topic is not None:
        out.ResponseTopic = response_topic
        present = True
    if correlation_data is not None:
        out.CorrelationData = correlation_data
        present = True
    if user_properties:
        out.UserProperty = list(user_properties)
        present = True
    return out if present else None


def remote_message(
    integration: Integration, message: Outgoing, now_ms: int
) -> RemoteMessage | None:
    """What the bridge publishes on the remote broker for ``message`` (see the module), or
    None when it is not sent: its topic maps to nothing (logged), or it expired."""
    sink = integration.sink
    assert isinstance(sink, MqttSink)
    topic = map_topic(message.topic, sink.local_prefix, sink.remote_prefix)
    if topic is None:
        log.warning(
            "integration %s skips a message on %r: it maps to no topic (local prefix %r, "
            "remote prefix %r)",
            integration.name,
            message.topic,
            sink.local_prefix,
            sink.remote_prefix,
        )
        return None
    try:
        forwarded = paho_properties(message.properties, now_ms, message.received_at_ms)
    except LookupError:
        return None  # expired while it waited: not forwarded (MQTT 5.0 3.3.2.3.3)
    properties: PahoProperties | None = None
    if sink.protocol_version == 5:
        if integration.payload_format is PayloadFormat.RAW:
            properties = forwarded
        else:
            properties = _built_properties(None, 1, _JSON_CONTENT_TYPE, None, None, ())
    return RemoteMessage(
        topic,
        message.value,
        min(message.qos, sink.qos),
        message.retain and sink.retain,
        properties,
    )


def remote_connection(integration: Integration, client_id: str, *, persistent: bool) -> Connection:
    """A (not yet open) connection to ``integration``'s remote broker as ``client_id``."""
    sink = integration.sink
    assert isinstance(sink, MqttSink)
    return Connection(
        "remote broker",
        sink.host,
        sink.port,
        client_id,
        protocol_version=sink.protocol_version,
        username=sink.username,
        password=integration.secrets.mqtt_password,
        tls=sink.tls,
        ca_file=sink.ca_file,
        cert_file=sink.cert_file,
        key_file=sink.key_file,
        persistent=persistent,
    )


class MqttBridgeDeliverer:
    """The MQTT bridge's :class:`~.at_least_once.Deliverer` for ``integration`` (an MQTT
    sink), keeping ``counters``: :meth:`deliver` publishes a round's messages on the
    remote broker and returns once all are acknowledged. Its connection's Client
    Identifier is ``<client id>-out-<instance>`` (:func:`instance_name`): each stage
    instance has its own, so they do not take each other's connection over. :meth:`start`
    connects it and, when the sink has reverse Topic Filters and this instance runs them
    (``integrations_mqtt_reverse``), starts the :class:`ReverseBridge`; :meth:`close`
    stops both."""

    gathering = Gathering()

    def __init__(
        self, settings: Settings, integration: Integration, counters: IntegrationCounters
    ) -> None:
        sink = integration.sink
        assert isinstance(sink, MqttSink)
        self.settings = settings
        self.integration = integration
        self.counters = counters
        self.client_id = (
            f"{sink.connection_client_id(integration.name)}-out-{instance_name(settings)}"
        )
        self._connection: Connection | None = None
        self._reverse: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Connect to the remote broker (raises :class:`BridgeError`); start the reverse
        direction."""
        await self._connected()
        sink = self.integration.sink
        assert isinstance(sink, MqttSink)
        if sink.reverse_topic_filters and self.settings.integrations_mqtt_reverse:
            reverse = ReverseBridge(self.settings, self.integration, self.counters)
            self._reverse = asyncio.create_task(
                reverse.run(), name=f"integration-{self.integration.name}-reverse"
            )

    async def _connected(self) -> Connection:
        connection = self._connection
        if connection is None or connection.lost.done():
            connection = remote_connection(self.integration, self.client_id, persistent=False)
            await connection.open()
            self._connection = connection
        return connection

    async def deliver(self, messages: Sequence[Outgoing]) -> None:
        """Publish ``messages`` in order; return once the remote acknowledged each (see the
        module). A failed attempt (logged, counted as failed and then retried) is published
        again whole, on a new connection, after a backoff (:data:`RETRY_MIN_SECONDS` to
        :data:`RETRY_MAX_SECONDS`); after :data:`RETRY_BUDGET_SECONDS` of failures the last
        :class:`BridgeError` is raised (the stage starts the integration again)."""
        now_ms = int(time.time() * 1000)
        outgoing = [
            remote
            for message in messages
            if (remote := remote_message(self.integration, message, now_ms)) is not None
        ]
        if not outgoing:
            return
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(BridgeError),
            wait=wait_exponential_jitter(
                initial=RETRY_MIN_SECONDS, max=RETRY_MAX_SECONDS, jitter=RETRY_MIN_SECONDS
            ),
            stop=stop_after_delay(RETRY_BUDGET_SECONDS),
            before_sleep=lambda state: self._failed(state, len(outgoing)),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                await self._publish(outgoing)
                if attempt.retry_state.attempt_number > 1:
                    self.counters.retried += len(outgoing)
        self.counters.sent += len(outgoing)

    def _failed(self, state: RetryCallState, count: int) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        self.counters.failed += count
        self.counters.error(f"remote broker: {error}")
        log.warning(
            "integration %s: %d messages not acknowledged: %s; again in %.1f s",
            self.integration.name,
            count,
            error,
            wait,
        )

    async def _publish(self, messages: Sequence[RemoteMessage]) -> None:
        connection = await self._connected()
        try:
            acks = [
                connection.publish(m.topic, m.payload, m.qos, m.retain, m.properties)
                for m in messages
            ]
            async with asyncio.timeout(ACK_TIMEOUT_SECONDS):
                await asyncio.gather(*acks)
        except (BridgeError, TimeoutError) as exc:
            self._connection = None
            await connection.close()
            if isinstance(exc, TimeoutError):
                raise BridgeError(f"{connection.what}: no acknowledgement in time") from None
            raise

    async def close(self) -> None:
        """Stop the reverse direction; disconnect from the remote broker."""
        reverse, self._reverse = self._reverse, None
        if reverse is not None:
            reverse.cancel()
            await asyncio.gather(reverse, return_exceptions=True)
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.close()


class ReverseBridge:
    """The reverse direction of ``integration`` (an MQTT sink with reverse Topic
    Filters): :meth:`run` until cancelled. Its remote session's Client Identifier is
    ``<client id>-in``; its connection here ``<client id>-in-<instance>``, logged in as
    the sink's local credential, to ``integrations_mqtt_host``:``integrations_mqtt_port``.
    """

    def __init__(
        self, settings: Settings, integration: Integration, counters: IntegrationCounters
    ) -> None:
        sink = integration.sink
        assert isinstance(sink, MqttSink)
        self.settings = settings
        self.integration = integration
        self.counters = counters
        self.sink = sink
        base = sink.connection_client_id(integration.name)
        self.remote_client_id = f"{base}-in"
        self.local_client_id = f"{base}-in-{instance_name(settings)}"

    async def run(self) -> None:
        """Republish until cancelled; reconnect after a failure (logged) with an
        exponential backoff with jitter (:data:`RETRY_MIN_SECONDS` to
        :data:`RETRY_MAX_SECONDS`)."""
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(BridgeError),
            wait=wait_exponential_jitter(
                initial=RETRY_MIN_SECONDS, max=RETRY_MAX_SECONDS, jitter=RETRY_MIN_SECONDS
            ),
            before_sleep=self._failed,
        )
        async for attempt in retrying:
            with attempt:
                await self._run_once()

    def _failed(self, state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        self.counters.error(f"reverse direction: {error}")
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        log.warning(
            "integration %s reverse direction stopped: %s; again in %.1f s",
            self.integration.name,
            error,
            wait,
        )

    async def _run_once(self) -> None:
        settings = self.settings
        local = Connection(
            "this broker",
            settings.integrations_mqtt_host,
            settings.integrations_mqtt_port,
            self.local_client_id,
            username=self.sink.local_username,
            password=self.integration.secrets.local_password,
        )
        remote = remote_connection(self.integration, self.remote_client_id, persistent=True)
        incoming: asyncio.Queue[paho.MQTTMessage] = asyncio.Queue()
        try:
            await local.open()
            await remote.open(incoming.put_nowait)
            await remote.subscribe(self.sink.reverse_topic_filters, self.sink.qos)
            log.info(
                "integration %s reverse direction subscribed to %s",
                self.integration.name,
                list(self.sink.reverse_topic_filters),
            )
            while True:
                message = await _first(incoming.get(), local.lost, remote.lost)
                await self._republish(local, message)
                remote.ack(message)
        finally:
            await asyncio.gather(local.close(), remote.close())

    async def _republish(self, local: Connection, message: paho.MQTTMessage) -> None:
        """Publish ``message`` here and wait for this broker's acknowledgement."""
        sink = self.sink
        topic = map_topic(message.topic, sink.remote_prefix, sink.local_prefix)
        if topic is None:
            log.warning(
                "integration %s skips %r from the remote broker: it maps to no topic",
                self.integration.name,
                message.topic,
            )
            return
        properties = getattr(message, "properties", None) if sink.protocol_version == 5 else None
        publish = local.publish(
            topic,
            bytes(message.payload),
            min(message.qos, sink.qos),
            bool(message.retain) and sink.retain,
            _forwardable(properties),
        )
        try:
            async with asyncio.timeout(ACK_TIMEOUT_SECONDS):
                await publish
        except TimeoutError:
            raise BridgeError(f"{local.what}: no acknowledgement in time") from None
        except PublishRefused as exc:
            # This broker will not take it (the credential's rules, a quota): waiting would
            # hold up every later message of the session, so it is dropped, loudly.
            self.counters.failed += 1
            self.counters.error(f"reverse direction: {exc}")
            log.warning(
                "integration %s drops %r from the remote broker, published here as %r: %s",
                self.integration.name,
                message.topic,
                topic,
                exc,
            )


def _forwardable(received: PahoProperties | None) -> PahoProperties | None:
    """The properties of a PUBLISH received from the remote broker that go on here: all
    but the Topic Alias and Subscription Identifiers, which belong to that connection
    (MQTT 5.0 3.3.2.3.4, 3.3.2.3.8)."""
    if received is None:
        return None
    out = PahoProperties(PacketTypes.PUBLISH)
    present = False
    for name in (
        "PayloadFormatIndicator",
        "MessageExpiryInterval",
        "ContentType",
        "ResponseTopic",
        "CorrelationData",
        "UserProperty",
    ):
        if hasattr(received, name):
            setattr(out, name, getattr(received, name))
            present = True
    return out if present else None


async def _first(
    get: Coroutine[Any, Any, paho.MQTTMessage], *lost: asyncio.Future[None]
) -> paho.MQTTMessage:
    """The message ``get`` gives, unless a connection in ``lost`` is lost first (its
    :class:`BridgeError` is raised)."""
    task = asyncio.ensure_future(get)
    waited: set[asyncio.Future[Any]] = {task, *lost}
    try:
        await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
    for future in lost:
        if future.done():
            raise future.exception() or BridgeError("connection closed")
    return task.result()
