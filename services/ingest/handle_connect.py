"""CONNECT, CONNACK and DISCONNECT (MQTT 3.1.1 section 3.1-3.2, 3.14; MQTT 5.0 3.1-3.2, 3.14).

A CONNECT is accepted in two steps: :func:`handle_connect` validates it and asks the shell to
store the session record in ``client.sessions``; :func:`connect_stored` sends CONNACK once
Kafka has it, so every node sees the session (and takes over an older connection) before the
client is told it is connected.

Between the two, the client's credentials are checked: :func:`handle_connect` asks the
shell to authenticate (:class:`~services.ingest.effects.Authenticate`), and :func:`admit`
takes the accepted client in (its kind and rules from its credential, the Will Topic
authorized, a resumed session's subscriptions checked against its rules).

A persistent APPLICATION client (its kind comes from its credential; an anonymous client's
from ``application_client_ids``) has its ``msg.app.<client>`` topic made sure of first
(:class:`CreateAppTopic`), and only then its session record stored: a CONNACK implies that
the topic the router writes its messages to exists.

The session record also carries the Packet Identifiers of inbound QoS 2 messages not yet
released (MQTT 4.3.3), so a session resumed on any node knows them; :func:`session_record`
says which ones each record lists.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable

from services.common.auth.authorize import (
    ALLOW_ALL,
    ALLOW_ALL_RULE,
    DENY_ALL,
    Authorizer,
    authorizer_for,
)
from services.common.auth.blocked import Verdict
from services.common.auth.principal import AuthRequest, Principal, host_of
from services.common.metrics import MQTT
from services.common.mqtt.errors import MQTTError, ProtocolError, UnsupportedProtocolVersion
from services.common.mqtt.packets import ConnAck, Connect, Disconnect
from services.common.mqtt.properties import Properties
from services.common.mqtt.reason_codes import CONNACK_REASON_CODES, ReasonCode, v3_connack_code
from services.common.records import ClientKind, DisconnectCause, EventKind, SessionRecord
from services.common.sessions import (
    client_kind,
    is_persistent,
    owned_by_another,
    session_expired,
)
from services.common.topics.validation import validate_topic_name
from services.ingest import events, handle_replay, will_rules
from services.ingest.effects import (
    Authenticate,
    Close,
    Connected,
    CreateAppTopic,
    Effect,
    LimitRefused,
    Send,
    StartReplay,
    StoreSession,
    StoreSubscriptions,
    WatchSession,
)
from services.ingest.limits import Refusal
from services.ingest.state import (
    AwaitingAppTopic,
    AwaitingConnAck,
    AwaitingStateSync,
    ConnectionState,
    Phase,
    RecordWaiters,
)

log = logging.getLogger(__name__)


def handle_connect(state: ConnectionState, connect: Connect) -> list[Effect]:
    """Validate ``connect``, set up the connection state and ask the shell to check the
    credentials (:class:`Authenticate`); :func:`admit` goes on once they are accepted.

    A v5 client that sent no Client Identifier gets one from the server's generator
    (``ServerContext.new_client_id``; MQTT 5.0 3.1.3.1, Assigned Client Identifier).
    Raises :class:`MQTTError` with the CONNACK Reason Code for a refused CONNECT: the
    shell's refusal (``state.refusal``: a connection limit, 0x97 or 0x9F), 0x85 Client
    Identifier not valid (empty id with Clean Session 0 in v3.1.1, MQTT 3.1.3-8), 0x90 for
    an invalid Will Topic. A blocked client (``ServerContext.blocked``) is refused with
    0x8A Banned before its credentials are checked (:func:`blocked`).
    """
    state.protocol_version = connect.protocol_version
    if state.refusal is not None:
        raise state.refusal
    props = connect.properties
    client_id = connect.client_id
    assigned = False
    if not client_id:
        if connect.protocol_version < 5 and not connect.clean_start:
            raise MQTTError(
                "empty Client Identifier needs Clean Session 1",
                ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
            )
        if connect.protocol_version == 3:
            raise MQTTError(
                "MQTT 3.1 requires a Client Identifier", ReasonCode.CLIENT_IDENTIFIER_NOT_VALID
            )
        client_id = state.server.new_client_id()
        assigned = True
    if connect.will is not None:
        validate_topic_name(connect.will.topic)
    verdict = state.server.blocked(client_id, connect.username, state.client_address)
    if verdict is not None:
        return blocked(state, client_id, verdict)

    limits = state.limits
    state.will = connect.will
    state.client_id = client_id
    state.clean_start = connect.clean_start
    state.session_expiry_interval = props.session_expiry_interval or 0
    state.persistent = is_persistent(
        connect.protocol_version, connect.clean_start, state.session_expiry_interval
    )
    if props.receive_maximum is not None:
        state.client_receive_maximum = props.receive_maximum
    if props.maximum_packet_size is not None:
        state.client_maximum_packet_size = props.maximum_packet_size
    if props.topic_alias_maximum is not None:
        state.client_topic_alias_maximum = props.topic_alias_maximum
    if props.request_problem_information is not None:
        state.request_problem_information = bool(props.request_problem_information)

    connack_props = Properties()
    keep_alive = connect.keep_alive
    if connect.protocol_version == 5:
        wanted = keep_alive
        if limits.server_keep_alive is not None:
            keep_alive = limits.server_keep_alive
        elif keep_alive > limits.max_keep_alive or (keep_alive == 0 and limits.max_keep_alive):
            keep_alive = min(keep_alive or limits.max_keep_alive, limits.max_keep_alive)
        if keep_alive != wanted:
            connack_props.server_keep_alive = keep_alive
        if assigned:
            connack_props.assigned_client_identifier = client_id
        connack_props.receive_maximum = limits.receive_maximum
        connack_props.maximum_packet_size = limits.max_packet_size
        if limits.topic_alias_maximum:
            connack_props.topic_alias_maximum = limits.topic_alias_maximum
    state.keep_alive = keep_alive
    state.connack_properties = connack_props
    state.auth_method = props.authentication_method
    state.phase = Phase.AUTHENTICATING
    request = AuthRequest(
        client_id,
        connect.username,
        connect.password,
        state.certificate,
        props.authentication_method,
        props.authentication_data,
        host_of(state.client_address),
    )
    return [Authenticate(request)]


def blocked(state: ConnectionState, client_id: str, verdict: Verdict) -> list[Effect]:
    """Refuse a blocked client before its credentials are checked: CONNACK 0x8A Banned
    (v3.1.1: 0x05 Not authorized; MQTT 5.0 3.2.2.2), counted and logged by the shell
    (:class:`LimitRefused`). The client is not told which block refused it."""
    state.client_id = client_id
    refused = LimitRefused(Refusal.BLOCKED, verdict.block.describe())
    return [refused, *refuse(state, MQTTError("banned", ReasonCode.BANNED))]


def authorizer_of(principal: Principal, client_id: str) -> Authorizer:
    """The compiled rules of ``principal`` on the connection of ``client_id`` (no rules:
    nothing allowed). ``${client_id}`` stands for ``client_id`` only when the principal is
    bound to it (``Principal.client_id_bound``); otherwise an allow rule naming it matches
    nothing, and a deny rule any client id."""
    if not principal.rules:
        return DENY_ALL
    if principal.rules == (ALLOW_ALL_RULE,) and not principal.strict_subscribe:
        return ALLOW_ALL
    bound = client_id if principal.client_id_bound else ""
    return authorizer_for(
        principal.rules, bound, principal.username, strict=principal.strict_subscribe
    )


def admit(state: ConnectionState, principal: Principal, auth_data: bytes | None) -> list[Effect]:
    """The client is authenticated as ``principal``: take its kind and rules, authorize
    its Will Topic, and store the session record CONNACK waits for (a resumed session keeps
    only the subscriptions its rules still grant). ``auth_data`` is the Authentication
    Data CONNACK carries (enhanced authentication, MQTT 5.0 4.12).

    A Client Identifier whose session (connected, or kept while disconnected) belongs to
    another principal is refused with 0x87 Not authorized (v3.1.1: 0x05), and the session is
    left as it is: :func:`refuse_foreign_session`.

    Raises :class:`MQTTError` 0x87 Not authorized when the Will Topic is not allowed.
    """
    client_id = state.client_id
    limits = state.limits
    previous, previous_subs = state.server.previous_session(client_id)
    if owned_by_another(
        previous, principal.owner, state.now_ms(), limits.session_expiry_max_seconds
    ):
        assert previous is not None
        return refuse_foreign_session(state, principal, previous)
    state.principal = principal
    state.authorizer = authorizer_of(principal, client_id)
    if principal.kind is None:
        state.kind = client_kind(client_id, limits.application_client_ids)
    else:
        state.kind = principal.kind
    if state.will is not None and not state.authorizer.may_publish(state.will.topic):
        raise MQTTError("Will Topic not authorized", ReasonCode.NOT_AUTHORIZED)
    connack_props = state.connack_properties or Properties()
    state.connack_properties = None
    if state.auth_method is not None:
        # MQTT-4.12.0-5: a successful CONNACK names the method the CONNECT used.
        connack_props.authentication_method = state.auth_method
        connack_props.authentication_data = auth_data

    if previous is not None:
        state.previous_connection_id = previous.connection_id
    session_present = (
        not state.clean_start
        and previous is not None
        and previous.persistent
        and not session_expired(previous, state.now_ms(), limits.session_expiry_max_seconds)
    )
    effects: list[Effect] = []
    if session_present:
        assert previous is not None
        state.subscriptions = {s.topic_filter: s for s in previous_subs}
        effects += keep_authorized_subscriptions(state)
        state.session_id = previous.session_id
        # QoS 2 messages stored but not released: a resend is acknowledged, not published
        # again, whichever node stored it (MQTT 4.3.3).
        state.unreleased_qos2 = set(previous.unreleased)
    else:
        # A new session (MQTT 3.1.2.4): it is named after the connection that starts it.
        state.session_id = state.connection_id
        if previous_subs:
            # Clean start, or the old session was not persistent or has expired: its
            # subscriptions end here.
            effects.append(StoreSubscriptions(state.new_token(), []))

    state.connected_at_ms = state.now_ms()
    state.session_requested = True
    connack = ConnAck(session_present, ReasonCode.SUCCESS, connack_props)
    state.phase = Phase.CONNECTING
    if session_present and previous is not None and previous.connected:
        # Another connection still holds the session, and may be ending it right now (a
        # v5 DISCONNECT with Session Expiry Interval 0 ends it at once, 3.14.2.2.2):
        # confirmed once the records written before this connection's are read.
        state.confirm_previous = True
        effects.append(WatchSession(client_id))
    if state.persistent and state.kind is ClientKind.APPLICATION:
        effects.append(CreateAppTopic(state.new_token(AwaitingAppTopic(connack)), client_id))
    else:
        token = state.new_token(AwaitingConnAck(connack))
        effects.append(StoreSession(token, session_record(state, connected=True)))
    return effects


def refuse_foreign_session(
    state: ConnectionState, principal: Principal, session: SessionRecord
) -> list[Effect]:
    """Refuse a CONNECT of ``principal`` for a Client Identifier whose ``session`` belongs
    to another principal: CONNACK 0x87 Not authorized (v3.1.1: 0x05 Not authorized, MQTT
    3.2.2.3), then close; an AUTH_FAILED event with 0x87 in ``client.events``, one more
    ``cormorant_mqtt_session_owner_refusals_total``, and a warning logged at most once per
    Client Identifier and minute. Nothing is stored: the owner's session, its connection,
    subscriptions and stored messages stay as they are (no takeover, MQTT 3.1.4-3 applies
    only between connections of the same principal)."""
    MQTT.session_owner_refusals += 1
    if state.server.owner_refusals_logged.allow(state.client_id, state.now_ms()):
        log.warning(
            "CONNECT refused: client %r from %s as %s: its session belongs to %s "
            "(logged once a minute per client id)",
            state.client_id,
            state.client_address,
            principal.owner,
            session.owner,
        )
    return refuse(
        state, MQTTError("the session belongs to another principal", ReasonCode.NOT_AUTHORIZED)
    )


def keep_authorized_subscriptions(state: ConnectionState) -> list[Effect]:
    """Drop the subscriptions the connection's rules no longer grant (a session resumed
    by another credential, or rules changed since): the new set is stored, and an
    UNSUBSCRIBED event records the dropped filters. [] when all are granted."""
    authorizer = state.authorizer
    dropped = [f for f in state.subscriptions if not authorizer.may_subscribe(f)]
    if not dropped:
        return []
    log.info("client %r: subscriptions no longer authorized, dropped: %s", state.client_id, dropped)
    state.subscriptions = {f: s for f, s in state.subscriptions.items() if f not in dropped}
    store = StoreSubscriptions(state.new_token(), list(state.subscriptions.values()))
    return [
        store,
        *events.subscriptions_changed(state, EventKind.UNSUBSCRIBED, [(f, 0) for f in dropped]),
    ]


def record_seen_while_connecting(
    state: ConnectionState, record: SessionRecord | None, offset: int
) -> None:
    """While a resumed session is being confirmed (:func:`confirm_session`), a record of
    the client at ``offset`` (None: a tombstone), read from Kafka; this connection's own
    are left out."""
    if not state.confirm_previous:
        return
    if record is not None and record.connection_id == state.connection_id:
        return
    if state.seen_while_connecting is None:
        state.seen_while_connecting = []
    state.seen_while_connecting.append((offset, record))


def confirm_session(state: ConnectionState, waiter: AwaitingStateSync) -> list[Effect] | None:
    """The state topics have been read past this connection's own session record: None if
    the resumed session stands (CONNACK may go), or the effects that start a new session
    instead, because the connection that held it ended it before this one's record (a
    tombstone, or a record that is not persistent): Session Present 0 and no old
    subscriptions, as if that end had been read at CONNECT (MQTT 3.1.2.4, 3.14.2.2.2).

    Records seen after this connection's own stay in ``seen_while_connecting``: they are
    newer, and are handled once connected (``ServerConnection.session_record_seen``).
    """
    state.confirm_previous = False
    seen, own = state.seen_while_connecting or [], state.session_offset
    state.seen_while_connecting = [s for s in seen if own is not None and s[0] > own] or None
    before = [
        record
        for offset, record in seen
        if own is not None
        and offset < own
        and (record is None or record.connection_id == state.previous_connection_id)
    ]
    if not before or (before[-1] is not None and before[-1].persistent):
        return None  # not ended before this connection's record: the session goes on
    state.session_id = state.connection_id
    state.subscriptions = {}
    state.unreleased_qos2 = set()
    state.early_deliveries = None  # routed for the session that ended
    connack = dataclasses.replace(waiter.connack, session_present=False)
    token = state.new_token(AwaitingConnAck(connack))
    return [StoreSession(token, session_record(state, connected=True))]


def app_topic_created(state: ConnectionState, waiter: AwaitingAppTopic) -> list[Effect]:
    """The client's ``msg.app.<client>`` topic exists: store the session record CONNACK
    waits for."""
    token = state.new_token(AwaitingConnAck(waiter.connack))
    return [StoreSession(token, session_record(state, connected=True))]


def session_record(state: ConnectionState, connected: bool) -> SessionRecord:
    """This connection's ``client.sessions`` record.

    ``unreleased`` lists the inbound QoS 2 Packet Identifiers of the session (MQTT 4.3.3).
    While connected, a record also lists the ids whose PUBLISH is still being stored (their
    PUBREC waits for a record that includes them) and leaves out those whose PUBREL is being
    recorded (their PUBCOMP waits for a record without them). An end record lists only the
    ids that were acknowledged with PUBREC: a PUBLISH whose storing did not finish is not
    acknowledged, so the client resends it, and it must then be stored again.
    """
    return SessionRecord(
        node_id=state.server.node_id,
        connection_id=state.connection_id,
        connected=connected,
        protocol_version=state.protocol_version,
        clean_start=state.clean_start,
        persistent=state.persistent,
        kind=state.kind,
        session_expiry_interval=state.session_expiry_interval,
        connected_at_ms=state.connected_at_ms,
        updated_at_ms=state.now_ms(),
        session_id=state.session_id,
        receive_maximum=state.client_receive_maximum,
        unreleased=(
            _recorded_unreleased(state) if connected else tuple(sorted(state.unreleased_qos2))
        ),
        owner=None if state.principal is None else state.principal.owner,
    )


def _recorded_unreleased(state: ConnectionState) -> tuple[int, ...]:
    ids = set(state.unreleased_qos2)
    ids.update(p.packet_id for p in state.pending_acks if p.unreleased_qos2)
    ids.difference_update(_releasing(state))
    return tuple(sorted(ids))


def _releasing(state: ConnectionState) -> Iterable[int]:
    yield from state.unsaved.releases
    for waiters in state.waiters(RecordWaiters):
        yield from waiters.releases


def connect_stored(state: ConnectionState, waiter: AwaitingConnAck) -> list[Effect]:
    """The session record is in Kafka: send CONNACK; the shell registers the client.

    Keep Alive counts from this CONNACK (MQTT 3.1.2.10): the client could not have been
    expected to speak while its CONNECT was being authenticated and stored.
    """
    state.phase = Phase.CONNECTED
    state.heard_at = state.server.monotonic()
    state.accepted = True
    MQTT.connect_outcome(state.listener, ReasonCode.SUCCESS)
    effects: list[Effect] = [
        Send(state.encode(waiter.connack)),
        Connected(state.client_id),
        events.connected(state),
    ]
    if waiter.connack.session_present:
        effects += resume_replays(state)
    return effects


def resume_replays(state: ConnectionState) -> list[Effect]:
    """A resumed session's replay subscriptions with a stored progress go on from it
    (:mod:`services.ingest.handle_replay`, "Persistent sessions"): live messages are held
    from now on, before anything routed to the client is sent."""
    effects: list[Effect] = []
    for subscription in state.subscriptions.values():
        if subscription.replay is not None:
            handle_replay.started(state, subscription.topic_filter)
            effects.append(StartReplay(subscription, 0))
    return effects


def connect_failed(state: ConnectionState) -> list[Effect]:
    """The session record (or an APPLICATION client's topic) could not be stored: CONNACK
    Server unavailable (v3.1.1: 0x03), then close."""
    state.session_ended = True
    return refuse(state, MQTTError("Kafka unavailable", ReasonCode.SERVER_UNAVAILABLE))


def refuse(state: ConnectionState, exc: MQTTError) -> list[Effect]:
    """Refuse a CONNECT: CONNACK with the reason where the spec asks for one, then close.

    MQTT 3.1.1 answers an unacceptable protocol level with return code 0x01 (3.1.2-2), a
    refused identifier with 0x02 and an unavailable server with 0x03, but any other invalid
    CONNECT (malformed, an invalid Will Topic, over the size limit) only with a close (3.1.4,
    4.8): its return codes cannot name those reasons. MQTT 5 answers with the Reason Code
    (3.2.2.2); an error whose Reason Code a CONNACK may not carry (a PUBLISH with Topic Alias
    0 sent before CONNACK: 0x94) is answered 0x82 Protocol Error, which it is (4.13.1).
    """
    state.phase = Phase.CLOSED
    reason = exc.reason_code
    if reason not in CONNACK_REASON_CODES:
        reason = ReasonCode.PROTOCOL_ERROR
    MQTT.connect_outcome(state.listener, reason)
    effects: list[Effect] = []
    if isinstance(exc, UnsupportedProtocolVersion):
        effects.append(Send(ConnAckBytes.unsupported_version))
    elif state.protocol_version == 5:
        props = Properties()
        if state.request_problem_information:
            props.reason_string = exc.message[:200]
        effects.append(Send(state.encode(ConnAck(False, reason, props))))
    elif reason in _V3_REFUSALS:
        effects.append(Send(state.encode(ConnAck(False, v3_connack_code(reason)))))
    effects.append(Close(exc.message))
    return effects + events.refused(state, reason)


_V3_REFUSALS = frozenset(
    (
        ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
        ReasonCode.BAD_USER_NAME_OR_PASSWORD,
        ReasonCode.NOT_AUTHORIZED,
        ReasonCode.BANNED,
        ReasonCode.SERVER_UNAVAILABLE,
        ReasonCode.SERVER_BUSY,
        ReasonCode.QUOTA_EXCEEDED,
        ReasonCode.CONNECTION_RATE_EXCEEDED,
    )
)
"""Refusals an MQTT 3.1.1 CONNACK return code can express (3.2.2.3); the connection limits
become 0x03 Server unavailable, the nearest (the client retries later)."""


class ConnAckBytes:
    """Fixed CONNACK encodings needed before a protocol version is known."""

    # MQTT 3.1.1 CONNACK, return code 0x01 Unacceptable protocol version (3.1.2-2): the
    # format every client version can read.
    unsupported_version = bytes([0x20, 0x02, 0x00, 0x01])


def handle_disconnect(state: ConnectionState, packet: Disconnect) -> list[Effect]:
    """A client's DISCONNECT: end the session as it asks, then close (MQTT 3.14.4).

    The socket is closed once Kafka has the end records (or refused them). A v5
    DISCONNECT may change the Session Expiry Interval, but not from 0 to non-zero
    (3.14.2.2.2: Protocol Error). One that says 0 ends the session with the connection,
    whatever made it persistent at CONNECT (TBMQ's Clean Start 0 rule included): a new
    connection finds no session (3.1.2.11.2). A v3.1.1 DISCONNECT and a v5 one with Reason
    Code 0x00 discard the Will Message; any other Reason Code (0x04 Disconnect with Will
    Message included) leaves it to be published when the connection closes (3.14.4,
    3.1.2.5).
    """
    expiry = packet.properties.session_expiry_interval
    if expiry is not None:
        if state.session_expiry_interval == 0 and expiry != 0:
            raise ProtocolError("Session Expiry Interval cannot change from 0 on DISCONNECT")
        state.session_expiry_interval = expiry
        state.persistent = expiry > 0
    if state.protocol_version < 5 or packet.reason_code == ReasonCode.SUCCESS:
        will_rules.discard(state)
    state.phase = Phase.CLOSED
    events.ending(state, DisconnectCause.CLIENT_DISCONNECT, packet.reason_code)
    ends = end_session(state)
    if not ends:
        return [Close("client sent DISCONNECT")]
    # The socket closes once the session's end is stored (:func:`closed_after`): a client
    # that reconnects after the close finds what its DISCONNECT left.
    state.close_after = ends[-1].token
    return list(ends)


def closed_after(state: ConnectionState, token: int) -> list[Effect]:
    """The outcome of a store of a connection already closed for the protocol: the close
    of the socket if it waited for that one (:func:`handle_disconnect`), else nothing."""
    if token != state.close_after:
        return []
    state.close_after = None
    return [Close("client sent DISCONNECT")]


def end_session(state: ConnectionState) -> list[StoreSubscriptions | StoreSession]:
    """Records that end this connection's hold on the session (once; none after takeover).

    A persistent session is marked disconnected and keeps its subscriptions; a non-persistent
    one is deleted: tombstones for its subscriptions and its session record, each naming the
    session it deletes, so that landing late, after a newer session's records (another
    node), it deletes nothing (:func:`~services.common.records.stale_delete`).
    """
    if state.session_ended or not state.session_requested:
        return []
    state.session_ended = True
    if state.persistent:
        return [StoreSession(state.new_token(), session_record(state, connected=False))]
    effects: list[StoreSubscriptions | StoreSession] = []
    if state.subscriptions:
        effects.append(StoreSubscriptions(state.new_token(), [], state.session_id))
    effects.append(StoreSession(state.new_token(), None, state.session_id))
    return effects


def restate_session(state: ConnectionState, record: SessionRecord | None) -> list[Effect]:
    """A ``client.sessions`` record of an older connection of this client (or a tombstone)
    landed after this connection's own records: store this connection's record again, so
    the latest record names the connection that holds the session.

    An older connection of the same session may have stored QoS 2 messages after this one
    read the session at CONNECT; their Packet Identifiers are kept, so that their resends
    are acknowledged without being published twice (MQTT 4.3.3). Only while this connection
    has had no QoS 2 PUBLISH or PUBREL of its own: after that, the older connection's view
    may list an id the client has since released here, and keeping it would swallow the
    next message that reuses the id.

    A tombstone came with a tombstone of the subscriptions (the older connection ended the
    session it held, later than this one took it over): this connection's subscription
    set is stored again too, so the routers keep what the client was told it has.
    """
    if (
        record is not None
        and record.session_id == state.session_id
        and state.persistent
        and not state.inbound_qos2_seen
    ):
        state.unreleased_qos2.update(record.unreleased)
    effects: list[Effect] = []
    if record is None and state.subscriptions:
        effects.append(StoreSubscriptions(state.new_token(), list(state.subscriptions.values())))
    effects.append(StoreSession(state.new_token(), session_record(state, connected=True)))
    return effects


def orphaned_session_end(record: SessionRecord, now_ms: int) -> SessionRecord | None:
    """The record that ends a session whose connection died with its ingest node's process.

    As :func:`end_session` does for a closed connection: a persistent session is marked
    disconnected as of ``now_ms`` (Unix ms; its Session Expiry Interval runs from then) and
    keeps everything else, unreleased QoS 2 Packet Identifiers included; a non-persistent
    one is deleted (None: a tombstone; its subscriptions must be deleted too).
    """
    if not record.persistent:
        return None
    return dataclasses.replace(record, connected=False, updated_at_ms=now_ms)
