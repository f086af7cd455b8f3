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
from collections.abc import Sequence

from services.common.auth.certificates import CertificateIdentity
from services.common.auth.principal import Outcome, Principal
from services.common.mqtt.codec import StreamDecoder
from services.common.mqtt.errors import MQTTError, ProtocolError
from services.common.mqtt.keep_alive import silence_allowed
from services.common.mqtt.packets import (
    Auth,
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
from services.common.records import DisconnectCause, SessionRecord, Target
from services.common.subscription import Subscription
from services.ingest import (
    delivery,
    events,
    handle_auth,
    handle_connect,
    handle_publish,
    handle_replay,
    handle_subscribe,
    will_rules,
)
from services.ingest.effects import Close, Effect, Send, SyncState
from services.ingest.fan_out import FanOut
from services.ingest.state import (
    AwaitingAppTopic,
    AwaitingConnAck,
    AwaitingStateSync,
    ConnectionState,
    EarlyDelivery,
    PendingAck,
    PendingReplayMark,
    PendingSubAck,
    Phase,
    RecordWaiters,
    ServerContext,
)

log = logging.getLogger(__name__)


class ServerConnection:
    """The server side of one MQTT connection.

    ``server`` is what the node's connections share (limits, node id, session lookup,
    clock, client id generator); ``connection_id`` (16 bytes) names this network
    connection; ``certificate`` is the client's verified TLS certificate, given by a TLS
    transport (X509 credentials). Feed bytes with :meth:`receive_data`, report store outcomes with
    :meth:`stored` / :meth:`store_failed`, deliver downlink messages with
    :meth:`deliver_routed`, :meth:`deliver` and :meth:`release`, and the client's session
    records read from Kafka with :meth:`session_record_seen`, the outcome of an
    ``Authenticate`` effect with :meth:`authenticated`, and changes of the client's
    credential with :meth:`revoked` / :meth:`principal_changed`; each returns the effects to
    carry out, in order. The acknowledgements of store-assigned deliveries and the session
    record of QoS 2 changes gathered during one call leave as one record each, at the end
    of its effects.
    """

    __slots__ = ("_decoder", "state")

    def __init__(
        self,
        server: ServerContext,
        connection_id: bytes,
        certificate: CertificateIdentity | None = None,
    ) -> None:
        self.state = ConnectionState(
            server, connection_id, certificate=certificate, heard_at=server.monotonic()
        )
        self._decoder = StreamDecoder(max_packet_size=server.limits.max_packet_size)

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

        Before CONNECT and while its credentials are checked, the server's connect
        timeout; None when keep alive is off (0).
        """
        if self.state.phase is Phase.CONNECTED or self.state.phase is Phase.CLOSED:
            return silence_allowed(self.state.keep_alive) if self.state.keep_alive else None
        return self.state.limits.connect_timeout_seconds

    @property
    def keep_alive_deadline(self) -> float | None:
        """When (``ServerContext.monotonic`` seconds) the client is gone unless heard from.

        Before CONNACK: the connect timeout after the last bytes read. From the successful
        CONNACK on: 1.5 times the granted Keep Alive (MQTT 3.1.2.10; v5: Server Keep Alive,
        3.2.2.3.14) after the CONNACK or the last bytes read, whichever is later, however
        long authentication or the state sync took. None once closed or with Keep Alive 0.
        The deadline moves earlier only when the CONNACK is sent (the shell re-arms its
        timer on the ``Connected`` effect).
        """
        timeout = self.keep_alive_timeout
        if timeout is None or self.closed:
            return None
        return self.state.heard_at + timeout

    def heard(self) -> None:
        """Count the client as heard from now: the shell paused reading (backpressure or a
        rate limit), so the silence until now is the node's, not the client's."""
        self.state.heard_at = self.state.server.monotonic()

    def check_keep_alive(self) -> list[Effect]:
        """The shell's keep-alive timer fired: :meth:`keep_alive_expired` if
        :attr:`keep_alive_deadline` has passed, else [] (the client was heard from since
        the timer was set; the shell sets it again at the new deadline)."""
        deadline = self.keep_alive_deadline
        if deadline is None or self.state.server.monotonic() < deadline:
            return []
        return self.keep_alive_expired()

    def receive_data(self, data: bytes) -> list[Effect]:
        """Handle bytes read from the socket; returns the effects, in order."""
        if self.closed:
            return []
        self.state.heard_at = self.state.server.monotonic()
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
            return handle_connect.handle_connect(state, packet)
        if state.phase is Phase.AUTHENTICATING:
            if isinstance(packet, Auth):
                return handle_auth.handle_auth(state, packet)
            if state.auth_method is not None and not isinstance(packet, Disconnect):
                raise ProtocolError(
                    "only AUTH or DISCONNECT before CONNACK in enhanced authentication"
                )
        if state.phase is not Phase.CONNECTED:
            # MQTT 3.1.4: a client may send packets before CONNACK; handle them after it.
            state.early_packets.append(packet)
            return []
        return self._dispatch_connected(packet)

    def _dispatch_connected(self, packet: Packet) -> list[Effect]:
        state = self.state
        if isinstance(packet, Publish):
            return handle_publish.handle_publish(state, packet)
        if isinstance(packet, PubAck):
            return delivery.handle_puback(state, packet) + handle_replay.drained(state)
        if isinstance(packet, PubRec):
            return delivery.handle_pubrec(state, packet) + handle_replay.drained(state)
        if isinstance(packet, PubComp):
            return delivery.handle_pubcomp(state, packet) + handle_replay.drained(state)
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
        if isinstance(packet, Auth):
            return handle_auth.handle_auth(state, packet)
        raise MQTTError(f"unexpected {type(packet).__name__}", ReasonCode.PROTOCOL_ERROR)

    def authenticated(self, outcome: Outcome) -> list[Effect]:
        """Report the outcome of this connection's ``Authenticate`` effect: before CONNACK,
        CONNACK (refused: with the outcome's Reason Code) or the next AUTH challenge; on a
        re-authentication, AUTH (Success or Continue), or DISCONNECT 0x87 and close."""
        state = self.state
        if self.closed:
            return []
        try:
            if state.phase is Phase.AUTHENTICATING:
                return self._finish(handle_auth.connect_outcome(state, outcome))
            if state.reauthenticating:
                return self._finish(handle_auth.reauth_outcome(state, outcome))
        except handle_auth.ReauthenticationFailed as exc:
            events.ending(state, DisconnectCause.NOT_AUTHORIZED, exc.reason_code)
            return [
                events.auth_failed(state, exc.reason_code),
                *self.disconnect_and_close(exc.reason_code, exc.message),
            ]
        except MQTTError as exc:
            return self.protocol_violation(exc)
        return []

    def revoked(self, reason: str) -> list[Effect]:
        """The client's credential was disabled or deleted: v5 DISCONNECT 0x98
        Administrative action, then close (before CONNACK: close only)."""
        log.info("client %r: %s", self.state.client_id, reason)
        events.ending(self.state, DisconnectCause.ADMINISTRATIVE_ACTION,
                      ReasonCode.ADMINISTRATIVE_ACTION)  # fmt: skip
        return self.disconnect_and_close(ReasonCode.ADMINISTRATIVE_ACTION, reason)

    def principal_changed(self, principal: Principal) -> list[Effect]:
        """The client's credential changed (rules, kind): the new rules apply to the next
        PUBLISH and SUBSCRIBE, and subscriptions they no longer grant are dropped
        (:func:`handle_auth.apply_principal`)."""
        if self.state.phase is not Phase.CONNECTED:
            return []
        return handle_auth.apply_principal(self.state, principal)

    def stored(self, token: int) -> list[Effect]:
        """Report that the ``Store*`` effect named ``token`` reached Kafka (acks=all), or
        that the :class:`~services.ingest.effects.CreateAppTopic` named ``token`` is done."""
        state = self.state
        if self.closed:
            return handle_connect.closed_after(state, token)
        waiter = state.waiting.pop(token, None)
        if isinstance(waiter, PendingAck):
            return self._finish(handle_publish.publish_outcome(state, waiter, ok=True))
        if isinstance(waiter, PendingSubAck):
            return handle_subscribe.subscribe_outcome(state, waiter)
        if isinstance(waiter, PendingReplayMark):
            handle_replay.mark_stored(state, waiter)
            return []
        if isinstance(waiter, RecordWaiters):
            return self._session_record_outcome(waiter, ok=True)
        if isinstance(waiter, AwaitingAppTopic):
            return handle_connect.app_topic_created(state, waiter)
        if isinstance(waiter, AwaitingConnAck):
            if state.confirm_previous:
                return [SyncState(state.new_token(AwaitingStateSync(waiter.connack)))]
            return self._accepted(waiter)
        if isinstance(waiter, AwaitingStateSync):
            restarted = handle_connect.confirm_session(state, waiter)
            if restarted is not None:
                return restarted
            return self._accepted(AwaitingConnAck(waiter.connack))
        return self._finish([])  # nothing waits for it (QoS 0, end of session, acks)

    def _accepted(self, waiter: AwaitingConnAck) -> list[Effect]:
        """CONNACK, then the packets the client sent before it (MQTT 3.1.4), what was
        routed to it before it, and the session records newer than its own read meanwhile."""
        state = self.state
        effects = handle_connect.connect_stored(state, waiter)
        for packet in state.early_packets:
            if self.closed:
                break
            try:
                effects.extend(self._dispatch_connected(packet))
            except MQTTError as exc:
                effects.extend(self.protocol_violation(exc))
        state.early_packets.clear()
        early, state.early_deliveries = state.early_deliveries or [], None
        for item in early:
            if isinstance(item, int):
                effects.extend(self.release(item))
            else:
                effects.extend(self._deliver_live(*item))
        late, state.seen_while_connecting = state.seen_while_connecting or [], None
        for offset, record in late:
            effects.extend(self.session_record_seen(record, offset))
        return self._finish(effects)

    def _hold(self, item: EarlyDelivery) -> bool:
        """Keep ``item`` for after CONNACK if this connection waits for it with its session
        record already stored (a resumed session being confirmed); False otherwise."""
        state = self.state
        if state.phase is not Phase.CONNECTING or not state.confirm_previous:
            return False
        if state.early_deliveries is None:
            state.early_deliveries = []
        if len(state.early_deliveries) < delivery.MAX_QUEUED:
            state.early_deliveries.append(item)
        return True

    def store_failed(self, token: int) -> list[Effect]:
        """Report that the ``Store*`` effect named ``token`` could not be stored in Kafka.

        Nothing unstored is ever acknowledged, and nothing whose store may still succeed is
        refused: a failed PUBLISH closes the connection (v5: DISCONNECT 0x80 first), so the
        client resends it after reconnecting (``handle_publish._release_acks`` says why). A
        failed CONNECT (its session record, or an APPLICATION client's topic) gets CONNACK
        0x88 / 0x03. A failed subscription set,
        retained request or PUBREL record closes the connection (v5: DISCONNECT 0x80):
        their acknowledgements cannot say "failed".
        """
        state = self.state
        if self.closed:
            return handle_connect.closed_after(state, token)
        waiter = state.waiting.pop(token, None)
        if isinstance(waiter, PendingAck):
            return self._finish(handle_publish.publish_outcome(state, waiter, ok=False))
        if isinstance(waiter, PendingSubAck | PendingReplayMark):
            return self.protocol_violation(
                MQTTError("subscriptions could not be stored", ReasonCode.UNSPECIFIED_ERROR)
            )
        if isinstance(waiter, RecordWaiters):
            return self._session_record_outcome(waiter, ok=False)
        if isinstance(waiter, AwaitingConnAck | AwaitingAppTopic | AwaitingStateSync):
            return handle_connect.connect_failed(state)
        return self._finish([])

    def session_stored_at(self, offset: int) -> None:
        """One of this connection's connected session records is in Kafka at ``offset``:
        a record of the client at a higher offset is newer than this connection's
        (:meth:`session_record_seen`)."""
        state = self.state
        if state.session_offset is None or offset > state.session_offset:
            state.session_offset = offset

    def _session_record_outcome(self, waiters: RecordWaiters, ok: bool) -> list[Effect]:
        effects, release_failed = handle_publish.session_record_outcome(self.state, waiters, ok)
        if release_failed:
            effects += self.protocol_violation(
                MQTTError("a PUBREL could not be recorded", ReasonCode.UNSPECIFIED_ERROR)
            )
        return self._finish(effects)

    def deliver_routed(self, message: FanOut, target: Target) -> list[Effect]:
        """Send a routed message to this client as its downlink ``target`` says (QoS,
        Retain As Published, Subscription Identifiers, a store-assigned Packet Identifier
        and DUP), sharing ``message``'s QoS 0 encodings (:mod:`services.ingest.fan_out`)."""
        if self.state.phase is not Phase.CONNECTED:
            self._hold((message, target))
            return []
        return self._finish(self._deliver_live(message, target))

    def _deliver_live(self, message: FanOut, target: Target) -> list[Effect]:
        if handle_replay.hold(self.state, message, target):
            return []  # after the history of the replays running (per-publisher order)
        if handle_replay.replayed_already(self.state, message, target):
            return []  # its replay delivered it (the switch's window)
        return delivery.deliver_routed(self.state, message, target)

    def replay_room(self, packet_id: int = 0) -> bool:
        """Whether the client can take one more replayed message now (its in-flight
        window has a free slot, and ``packet_id`` (0: any) is not in flight): the replay
        reader waits while it cannot."""
        return handle_replay.room(self.state, packet_id)

    def replay_packet_id(self, topic_filter: str, message: FanOut, target: Target) -> int:
        """The Packet Identifier ``message`` of the replay of ``topic_filter`` goes with as
        ``target`` (a persistent session's: the same after a reconnect; 0 otherwise, any),
        :func:`services.ingest.handle_replay.packet_id`."""
        return handle_replay.packet_id(self.state, topic_filter, message, target)

    def replay_switch(self, subscription: Subscription, ends: Sequence[int]) -> tuple[int, ...]:
        """The replay of ``subscription`` read ``msg.all``'s end offsets ``ends`` after its
        subscription was stored: returns the second cut it reads up to
        (:func:`services.ingest.handle_replay.switch`)."""
        return handle_replay.switch(self.state, subscription, ends)

    def replayed(self, message: FanOut, target: Target, topic_filter: str = "") -> list[Effect]:
        """Send one message of the history of the replay of ``topic_filter``
        (:mod:`services.ingest.handle_replay`) as ``target`` says (DUP: a resumed
        replay's resend); v5 clients see the User Property ``replayed=true``."""
        return self._finish(handle_replay.replayed(self.state, message, target, topic_filter))

    def replay_seen(self, message: FanOut) -> None:
        """A resumed replay read ``message`` again, which the client acknowledged on an
        earlier connection: not sent, only known (its live copy is dropped)."""
        handle_replay.remember(self.state, message)

    def replay_mark(
        self, topic_filter: str, positions: Sequence[int], sent: Sequence[int]
    ) -> list[Effect]:
        """A persistent session's replay of ``topic_filter`` is about to send up to
        ``sent`` (one ``msg.all`` offset per partition), having handed over everything
        below ``positions``: its progress is stored first
        (:func:`services.ingest.handle_replay.mark`; :meth:`replay_marked` says when)."""
        return self._finish(handle_replay.mark(self.state, topic_filter, positions, sent))

    def replay_marked(self, topic_filter: str) -> bool:
        """Whether the progress :meth:`replay_mark` stores for ``topic_filter`` is in Kafka."""
        return handle_replay.marked(self.state, topic_filter)

    def replay_finished(self, topic_filter: str) -> list[Effect]:
        """The replay of ``topic_filter`` sent its whole history: once no replay runs, the
        live messages held meanwhile are sent."""
        return self._finish(handle_replay.finished(self.state, topic_filter))

    def replay_failed(self, topic_filter: str, reason: str) -> list[Effect]:
        """The replay of ``topic_filter`` could not read its history (Kafka): the client is
        disconnected (v5: DISCONNECT 0x80 Unspecified error) rather than left with a gap
        it cannot see."""
        if self.closed:
            return []
        log.warning("client %r: replay of %r failed: %s", self.state.client_id, topic_filter,
                    reason)  # fmt: skip
        return self.protocol_violation(
            MQTTError(f"replay of {topic_filter} failed", ReasonCode.UNSPECIFIED_ERROR)
        )

    def deliver(self, packet: Publish, expires_at_ms: int | None = None) -> list[Effect]:
        """Send one PUBLISH to this client: ``packet`` already carries the granted QoS,
        RETAIN and DUP flags, properties, and a store-assigned Packet Identifier or None; the
        node's own Packet Identifiers, the in-flight window, Topic Aliases and the remaining
        Message Expiry Interval are handled here. ``expires_at_ms`` is when the message
        expires (Unix ms, None: never).
        """
        if self.state.phase is not Phase.CONNECTED:
            return []
        return self._finish(delivery.deliver(self.state, packet, expires_at_ms))

    def release(self, packet_id: int) -> list[Effect]:
        """Send PUBREL for a store-assigned QoS 2 delivery the client received (PUBREC) on
        an earlier connection of its session (MQTT 4.4); PUBCOMP is then expected."""
        if self.state.phase is not Phase.CONNECTED:
            self._hold(packet_id)
            return []
        return delivery.release(self.state, packet_id)

    def keep_alive_expired(self) -> list[Effect]:
        """The client was silent past :attr:`keep_alive_timeout` (v5: DISCONNECT 0x8D).

        Before CONNACK the connect timeout: no CONNECT (or no answer to an AUTH challenge)
        closes the connection; a CONNECT whose credentials the node did not check in time
        (password checks queued behind a storm) gets CONNACK 0x89 Server busy (v3.1.1:
        0x03 Server unavailable), so the client learns to come back later; a session record
        not stored in time closes the connection (no CONNACK was sent, so no DISCONNECT).
        """
        state = self.state
        if state.phase is Phase.AWAIT_CONNECT:
            return self.close("no CONNECT within the connect timeout")
        if state.phase is Phase.AUTHENTICATING:
            if state.auth_state is not None:
                return self.close("no answer to the AUTH challenge within the connect timeout")
            busy = MQTTError("credentials not checked within the connect timeout",
                             ReasonCode.SERVER_BUSY)  # fmt: skip
            return self.protocol_violation(busy)
        events.ending(self.state, DisconnectCause.KEEP_ALIVE_TIMEOUT, ReasonCode.KEEP_ALIVE_TIMEOUT)
        return self.protocol_violation(
            MQTTError("keep alive timeout", ReasonCode.KEEP_ALIVE_TIMEOUT)
        )

    def taken_over(self, new_clean_start: bool) -> list[Effect]:
        """Another connection took this client's session (MQTT 3.1.4-3; v5 DISCONNECT 0x8E).

        The session now belongs to the new connection, so this one writes no end records;
        its Will Message is published or discarded as :func:`will_rules.on_taken_over` says, from
        ``new_clean_start``, the new connection's Clean Start.
        """
        self.state.session_ended = True
        events.ending(self.state, DisconnectCause.TAKEOVER, ReasonCode.SESSION_TAKEN_OVER)
        effects = will_rules.on_taken_over(self.state, new_clean_start)
        return effects + self.disconnect_and_close(
            ReasonCode.SESSION_TAKEN_OVER, "session taken over"
        )

    def connection_lost(self) -> list[Effect]:
        """The socket is gone: the Will Message (unless a normal DISCONNECT discarded it) and
        the session's end records (none if already ended); each at most once."""
        self.state.phase = Phase.CLOSED
        return [
            *will_rules.on_close(self.state),
            *handle_connect.end_session(self.state),
            *events.disconnected(self.state),
        ]

    def disconnected_by_administrator(self, end_session: bool) -> list[Effect]:
        """An administrator disconnects this connection (the admin API): v5 DISCONNECT
        0x98 Administrative action, then close; the Will Message is published, as after
        any disconnect the client did not ask for (MQTT 3.1.2.5). With ``end_session``
        the session ends with the connection, as after a v5 DISCONNECT with Session
        Expiry Interval 0 (its subscriptions and stored messages are deleted)."""
        if self.closed:
            return []
        if end_session:
            self.state.session_expiry_interval = 0
            self.state.persistent = False
        events.ending(
            self.state, DisconnectCause.ADMINISTRATIVE_ACTION, ReasonCode.ADMINISTRATIVE_ACTION
        )
        return self.disconnect_and_close(
            ReasonCode.ADMINISTRATIVE_ACTION, "disconnected by an administrator"
        )

    def shutting_down(self, reason_code: int = ReasonCode.SERVER_SHUTTING_DOWN) -> list[Effect]:
        """The node stops or drains: v5 DISCONNECT ``reason_code`` (0x8B Server shutting
        down; 0x9C Use another server when an operator drains a node that stays up, MQTT
        5.0 3.14.2.1, without a Server Reference: the client comes back through the load
        balancer), then close."""
        events.ending(self.state, DisconnectCause.SERVER_SHUTDOWN, reason_code)
        reason = (
            "use another server"
            if reason_code == ReasonCode.USE_ANOTHER_SERVER
            else "server shutting down"
        )
        return self.disconnect_and_close(reason_code, reason)

    def session_record_seen(self, record: SessionRecord | None, offset: int) -> list[Effect]:
        """A ``client.sessions`` record of this client (None: a tombstone) at ``offset``,
        read from Kafka (session takeover, MQTT 3.1.4-3).

        While CONNECT waits for its confirmation (a session resumed from a connection that
        still held it), records are noted (:func:`handle_connect.record_seen_while_connecting`)
        and the newer ones handled after CONNACK.
        Once connected, records no newer than this connection's own
        (:meth:`session_stored_at`) and its own are ignored. A newer
        connected record of another connection (not the one this connection took the
        session from) means that connection took the session over (:meth:`taken_over`).
        Anything else newer is an older connection's record (or a tombstone) that landed
        late: this connection's record is stored again
        (:func:`handle_connect.restate_session`), so the latest one names it.
        """
        state = self.state
        if state.phase is Phase.CONNECTING:
            handle_connect.record_seen_while_connecting(state, record, offset)
            return []
        if self.closed or state.session_offset is None or offset <= state.session_offset:
            return []
        if record is not None and record.connection_id == state.connection_id:
            return []
        if (
            record is not None
            and record.connected
            and record.connection_id != state.previous_connection_id
        ):
            log.info("client %r connected elsewhere (node %s)", state.client_id, record.node_id)
            return self.taken_over(record.clean_start)
        return handle_connect.restate_session(state, record)

    def protocol_violation(self, exc: MQTTError) -> list[Effect]:
        """The MQTT-mandated reaction to ``exc`` (MQTT 4.13): CONNACK or DISCONNECT, then close."""
        log.info("client %r: %r", self.state.client_id, exc)
        if self.state.phase is Phase.AWAIT_CONNECT or self.state.phase is Phase.AUTHENTICATING:
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
