"""One MQTT client connection, sans-IO: bytes and store outcomes in, effects out.

:class:`ServerConnection` owns the protocol state of one network connection (MQTT 3.1.1 and
5.0): the stream decoder, the connection phase, Packet Identifiers in flight both ways, topic
aliases, keep alive and the Will Message. It never touches a socket or Kafka; the shell
carries out the :mod:`effects <services.ingest.effects>` it returns. Each concern is handled
in its own module (``handle_connect``, ``handle_publish``, ``handle_subscribe``,
``delivery``, ``will``), as in Mosquitto's ``src/``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from services.common.mqtt.codec import StreamDecoder
from services.common.mqtt.errors import MQTTError
from services.common.mqtt.packets import (
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Subscribe,
    Unsubscribe,
)
from services.common.mqtt.properties import Properties
from services.common.mqtt.reason_codes import ReasonCode
from services.common.records import DisconnectCause, SessionRecord
from services.common.settings import Settings
from services.ingest import (
    delivery,
    events,
    handle_connect,
    handle_publish,
    handle_subscribe,
    will,
)
from services.ingest.effects import Close, Effect, Send
from services.ingest.state import ConnectionState, Phase, PreviousSession

log = logging.getLogger(__name__)


class ServerConnection:
    """The server side of one MQTT connection.

    ``settings`` gives the server's limits; ``previous_session`` is consulted on CONNECT;
    ``now_ms`` returns Unix time in milliseconds. Feed bytes with :meth:`receive_data`, report
    store outcomes with :meth:`stored` / :meth:`store_failed`, deliver downlink messages with
    :meth:`deliver` and :meth:`release`; each returns the effects to carry out, in order. The
    acknowledgements of store-assigned deliveries and the session record of QoS 2 changes
    gathered during one call leave as one record each, at the end of its effects.
    """

    __slots__ = ("_decoder", "_previous_session", "state")

    def __init__(
        self,
        settings: Settings,
        node_id: str,
        connection_id: bytes,
        previous_session: PreviousSession,
        now_ms: Callable[[], int],
    ) -> None:
        self.state = ConnectionState(settings, node_id, connection_id, now_ms)
        self._decoder = StreamDecoder(max_packet_size=settings.max_packet_size)
        self._previous_session = previous_session

    @property
    def client_id(self) -> str:
        """The client identifier (assigned one included); "" before CONNECT."""
        return self.state.client_id

    @property
    def awaiting_connect(self) -> bool:
        """True until a CONNECT has been received."""
        return self.state.phase is Phase.AWAIT_CONNECT

    @property
    def closed(self) -> bool:
        """True once the connection must not be used any more."""
        return self.state.phase is Phase.CLOSED

    @property
    def keep_alive_timeout(self) -> float | None:
        """Seconds of silence after which the client is gone (1.5 times Keep Alive, MQTT 3.1.2.10).

        Before CONNECT, the server's connect timeout; None when keep alive is off (0).
        """
        if self.state.phase is Phase.AWAIT_CONNECT:
            return self.state.settings.connect_timeout_seconds
        return self.state.keep_alive * 1.5 if self.state.keep_alive else None

    def receive_data(self, data: bytes) -> list[Effect]:
        """Handle bytes read from the socket; returns the effects, in order."""
        if self.closed:
            return []
        try:
            packets = self._decoder.feed(data)
        except MQTTError as exc:
            return self.protocol_violation(exc)
        effects: list[Effect] = []
        for packet in packets:
            try:
                effects.extend(self._dispatch(packet))
            except MQTTError as exc:
                effects.extend(self.protocol_violation(exc))
            if self.closed:
                break
        return self._finish(effects)

    def _finish(self, effects: list[Effect]) -> list[Effect]:
        """Append the records gathered during one call: the session record the QoS 2
        exchanges wait for, then the client's acknowledgements for the message store."""
        state = self.state
        effects += handle_publish.flush_session_record(state)
        effects += delivery.flush_acks(state)
        return effects

    def _dispatch(self, packet: Packet) -> list[Effect]:
        state = self.state
        if state.phase is Phase.AWAIT_CONNECT:
            assert isinstance(packet, Connect), "the decoder admits CONNECT first"
            self._decoder.protocol_version = packet.protocol_version
            return handle_connect.handle_connect(state, packet, self._previous_session)
        if state.phase is Phase.CONNECTING:
            # MQTT 3.1.4: a client may send packets before CONNACK; handle them after it.
            state.early_packets.append(packet)
            return []
        return self._dispatch_connected(packet)

    def _dispatch_connected(self, packet: Packet) -> list[Effect]:
        state = self.state
        if isinstance(packet, Publish):
            return handle_publish.handle_publish(state, packet)
        if isinstance(packet, PubAck):
            return delivery.handle_puback(state, packet)
        if isinstance(packet, PubRec):
            return delivery.handle_pubrec(state, packet)
        if isinstance(packet, PubComp):
            return delivery.handle_pubcomp(state, packet)
        if isinstance(packet, PubRel):
            return handle_publish.handle_pubrel(state, packet)
        if isinstance(packet, PingReq):
            return [Send(state.encode(PingResp()))]
        if isinstance(packet, Subscribe):
            return handle_subscribe.handle_subscribe(state, packet)
        if isinstance(packet, Unsubscribe):
            return handle_subscribe.handle_unsubscribe(state, packet)
        if isinstance(packet, Disconnect):
            return handle_connect.handle_disconnect(state, packet)
        raise MQTTError(f"unexpected {type(packet).__name__}", ReasonCode.PROTOCOL_ERROR)

    def stored(self, token: int) -> list[Effect]:
        """Report that the ``Store*`` effect named ``token`` reached Kafka (acks=all), or
        that the :class:`~services.ingest.effects.CreateAppTopic` named ``token`` is done."""
        state = self.state
        if self.closed:
            return []
        if token == state.app_topic_token:
            return handle_connect.app_topic_created(state)
        if token == state.connack_token:
            effects = handle_connect.connect_stored(state)
            for packet in state.early_packets:
                if self.closed:
                    break
                try:
                    effects.extend(self._dispatch_connected(packet))
                except MQTTError as exc:
                    effects.extend(self.protocol_violation(exc))
            state.early_packets.clear()
            return self._finish(effects)
        if token in state.pending_subacks:
            return handle_subscribe.subscribe_outcome(state, token)
        if token in state.record_waiters:
            return self._session_record_outcome(token, ok=True)
        return self._finish(handle_publish.publish_outcome(state, token, ok=True))

    def store_failed(self, token: int) -> list[Effect]:
        """Report that the ``Store*`` effect named ``token`` could not be stored in Kafka.

        Nothing unstored is ever acknowledged: a failed PUBLISH gets a v5 PUBACK/PUBREC with
        Reason Code 0x80, or (v3.1.1, which has no negative acknowledgement) the connection
        is closed so the client resends it. A failed CONNECT (its session record, or an
        APPLICATION client's topic) gets CONNACK 0x88 / 0x03. A failed subscription set,
        retained request or PUBREL record closes the connection (v5: DISCONNECT 0x80):
        their acknowledgements cannot say "failed".
        """
        state = self.state
        if self.closed:
            return []
        if token in (state.connack_token, state.app_topic_token):
            return handle_connect.connect_failed(state)
        if token in state.pending_subacks:
            state.pending_subacks.pop(token)
            return self.protocol_violation(
                MQTTError("subscriptions could not be stored", ReasonCode.UNSPECIFIED_ERROR)
            )
        if token in state.record_waiters:
            return self._session_record_outcome(token, ok=False)
        return self._finish(handle_publish.publish_outcome(state, token, ok=False))

    def _session_record_outcome(self, token: int, ok: bool) -> list[Effect]:
        effects, release_failed = handle_publish.session_record_outcome(self.state, token, ok)
        if release_failed:
            effects += self.protocol_violation(
                MQTTError("a PUBREL could not be recorded", ReasonCode.UNSPECIFIED_ERROR)
            )
        return self._finish(effects)

    def deliver(
        self, packet: Publish, encoded: bytes | None = None, expires_at_ms: int | None = None
    ) -> list[Effect]:
        """Send a routed message to this client: ``packet`` already carries the granted QoS,
        RETAIN and DUP flags, properties, and a store-assigned Packet Identifier or None; the
        node's own Packet Identifiers, the in-flight window and the remaining Message Expiry
        Interval are handled here. ``encoded`` optionally holds a QoS 0 ``packet`` already
        encoded for this client's protocol version (shared by a fan-out); ``expires_at_ms``
        is when the message expires (Unix ms, None: never).
        """
        if self.state.phase is not Phase.CONNECTED:
            return []
        return self._finish(delivery.deliver(self.state, packet, encoded, expires_at_ms))

    def release(self, packet_id: int) -> list[Effect]:
        """Send PUBREL for a store-assigned QoS 2 delivery the client received (PUBREC) on
        an earlier connection of its session (MQTT 4.4); PUBCOMP is then expected."""
        if self.state.phase is not Phase.CONNECTED:
            return []
        return delivery.release(self.state, packet_id)

    def keep_alive_expired(self) -> list[Effect]:
        """The client was silent past :attr:`keep_alive_timeout` (v5: DISCONNECT 0x8D)."""
        if self.state.phase is Phase.AWAIT_CONNECT:
            return self.close("no CONNECT within the connect timeout")
        events.ending(self.state, DisconnectCause.KEEP_ALIVE_TIMEOUT, ReasonCode.KEEP_ALIVE_TIMEOUT)
        return self.protocol_violation(
            MQTTError("keep alive timeout", ReasonCode.KEEP_ALIVE_TIMEOUT)
        )

    def taken_over(self, new_clean_start: bool) -> list[Effect]:
        """Another connection took this client's session (MQTT 3.1.4-3; v5 DISCONNECT 0x8E).

        The session now belongs to the new connection, so this one writes no end records;
        its Will Message is published or discarded as :func:`will.on_taken_over` says, from
        ``new_clean_start``, the new connection's Clean Start.
        """
        self.state.session_ended = True
        events.ending(self.state, DisconnectCause.TAKEOVER, ReasonCode.SESSION_TAKEN_OVER)
        effects = will.on_taken_over(self.state, new_clean_start)
        return effects + self.disconnect_and_close(
            ReasonCode.SESSION_TAKEN_OVER, "session taken over"
        )

    def connection_lost(self) -> list[Effect]:
        """The socket is gone: the Will Message (unless a normal DISCONNECT discarded it) and
        the session's end records (none if already ended); each at most once."""
        self.state.phase = Phase.CLOSED
        return [
            *will.on_close(self.state),
            *handle_connect.end_session(self.state),
            *events.disconnected(self.state),
        ]

    def shutting_down(self) -> list[Effect]:
        """The node stops: v5 DISCONNECT 0x8B Server shutting down, then close."""
        events.ending(self.state, DisconnectCause.SERVER_SHUTDOWN, ReasonCode.SERVER_SHUTTING_DOWN)
        return self.disconnect_and_close(ReasonCode.SERVER_SHUTTING_DOWN, "server shutting down")

    def older_session_record(self, record: SessionRecord | None) -> list[Effect]:
        """A session record of an older connection of this client (or a tombstone) landed
        after this connection's: store this connection's record again (see
        :func:`handle_connect.restate_session`)."""
        if self.closed:
            return []
        return handle_connect.restate_session(self.state, record)

    def protocol_violation(self, exc: MQTTError) -> list[Effect]:
        """The MQTT-mandated reaction to ``exc`` (MQTT 4.13): CONNACK or DISCONNECT, then close."""
        log.info("client %r: %r", self.state.client_id, exc)
        if self.state.phase is Phase.AWAIT_CONNECT:
            return handle_connect.refuse(self.state, exc)
        events.ending(self.state, DisconnectCause.PROTOCOL_ERROR, exc.reason_code)
        return self.disconnect_and_close(exc.reason_code, exc.message)

    def disconnect_and_close(self, reason_code: int, reason: str) -> list[Effect]:
        """Send a v5 DISCONNECT with ``reason_code`` (v3.1.1 has none), then close.

        Before CONNACK the connection is only closed: a server sends no DISCONNECT until
        after a successful CONNACK (MQTT-3.14.0-1).
        """
        effects: list[Effect] = []
        if self.state.protocol_version == 5 and self.state.phase is Phase.CONNECTED:
            props = Properties()
            if self.state.request_problem_information:
                props.reason_string = reason[:200]
            effects.append(Send(self.state.encode(Disconnect(reason_code, props))))
        return effects + self.close(reason)

    def close(self, reason: str) -> list[Effect]:
        """Close the connection."""
        self.state.phase = Phase.CLOSED
        return [Close(reason)]
