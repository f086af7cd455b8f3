"""Inbound PUBLISH, PUBREL and the acknowledgements the server owes (MQTT 3.3-3.7, 4.3, 4.6).

A QoS 1/2 PUBLISH is acknowledged (PUBACK / PUBREC) only after Kafka stored it with
``acks=all``, and acknowledgements leave in the order the PUBLISHes arrived (MQTT 4.6), even
when Kafka answers out of order.
A PUBLISH whose store failed, or that Kafka did not answer in time, is neither acknowledged
nor refused: the producer may still write it, so the connection is closed (v5: DISCONNECT
0x80) and the client resends it after reconnecting, instead of publishing it anew after a
negative acknowledgement (docs/guarantees/edges.md).

A PUBLISH the client's rules do not allow (:mod:`services.common.auth.authorize`) is not
stored: a v5 client gets PUBACK/PUBREC 0x87 Not authorized, in its place among the
acknowledgements; a v3.1.1 client, which has no negative acknowledgement, gets the normal
positive one (MQTT-3.3.5-2 allows it or a close; Mosquitto's and EMQX's default); QoS 0 is
dropped. Either way the refusal is logged.

A PUBLISH to ``$delayed/<seconds>/<topic>`` (:mod:`services.ingest.delayed_rules`) is
authorized for its target topic and stored in ``msg.delayed`` instead of ``msg.all``; its
acknowledgement waits for that record like any other's, and the node owning its partition
publishes it when due (:mod:`services.ingest.delayed_publish`). One whose delay or target
topic is not valid is refused as an unauthorized one is, with 0x90 Topic Name invalid (MQTT
5.0 3.4.2.1, 3.5.2.1) for a v5 client: the Topic Name itself is valid MQTT, only the
extension refuses it, so the connection stays open. ``$delayed/0/<topic>`` is published at
once. One over the delayed messages' bounds (``max_delayed_messages`` in the cluster,
``max_delayed_messages_per_client``) gets 0x97 Quota exceeded (v5), closes a v3.1.1
connection unacknowledged, and is dropped at QoS 0 (:func:`_refuse_delayed` says why).

QoS 2 is exactly once across reconnects (MQTT 4.3.3): the Packet Identifier of a stored
PUBLISH stays "unreleased" until PUBREL, and a resend of it is acknowledged without being
published again. For a persistent session the unreleased ids live in the session record, so
that any node resuming the session knows them: PUBREC waits until both the ``msg.all``
record and a session record listing the id are stored, and PUBCOMP until a session record
without it is. One session record serves all the QoS 2 PUBLISHes and PUBRELs of one read
(:func:`flush_session_record`). A non-persistent session keeps them in memory only: it ends
with its connection.
"""

from __future__ import annotations

import dataclasses
import logging

from services.common.metrics import MQTT
from services.common.mqtt.errors import MQTTError, ProtocolError
from services.common.mqtt.packets import (
    Disconnect,
    PacketType,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
)
from services.common.mqtt.properties import Properties, encode_properties
from services.common.mqtt.reason_codes import ReasonCode
from services.common.records import DisconnectCause, PublishMeta
from services.common.topics.validation import validate_topic_name
from services.ingest import events
from services.ingest.delayed_rules import DelayedTopic, parse_delayed_topic
from services.ingest.effects import (
    Close,
    Effect,
    LimitRefused,
    Send,
    StoreDelayed,
    StorePublish,
    StoreRetained,
    StoreSession,
)
from services.ingest.handle_connect import session_record
from services.ingest.limits import Refusal
from services.ingest.state import ConnectionState, PendingAck, Phase, RecordWaiters
from services.ingest.topic_alias import resolve_inbound

log = logging.getLogger(__name__)


def encode_forwarded_properties(props: Properties) -> bytes:
    """The PUBLISH properties passed on to subscribers (MQTT 5.0 3.3.2.3), wire-encoded.

    The Topic Alias is per connection and is not forwarded; b"" when nothing is left.
    """
    kept = dataclasses.replace(props, topic_alias=None, subscription_identifiers=[])
    if kept == Properties():
        return b""
    return encode_properties(kept, PacketType.PUBLISH)


def accepted_meta(
    topic: str,
    qos: int,
    retain: bool,
    properties: Properties,
    protocol_version: int,
    received_at_ms: int,
) -> PublishMeta:
    """The ``msg.all`` metadata of an accepted PUBLISH to Topic Name ``topic`` (validated and
    authorized already): QoS 0..2, RETAIN, the publisher's ``protocol_version`` (4 or 5;
    only a v5 PUBLISH forwards ``properties``, MQTT 5.0 3.3.2.3) and when it was accepted
    (Unix ms, where its Message Expiry Interval starts). What every publisher of
    ``msg.all`` stamps: this node's PUBLISHes and the HTTP publish API's
    (:mod:`services.admin.publish_api`)."""
    return PublishMeta(
        topic=topic,
        qos=qos,
        retain=retain,
        received_at_ms=received_at_ms,
        protocol_version=protocol_version,
        properties=encode_forwarded_properties(properties) if protocol_version == 5 else b"",
    )


def handle_publish(state: ConnectionState, packet: Publish) -> list[Effect]:
    """Validate an inbound PUBLISH and ask the shell to store it in ``msg.all``.

    A PUBLISH with RETAIN is also written to ``msg.retained`` (an empty payload deletes the
    topic's retained message, MQTT 3.3.1.3), and its PUBACK/PUBREC waits for both records:
    a retained message acknowledged is seen by every later SUBSCRIBE.
    A PUBLISH the client may not make is refused (see the module).
    Raises :class:`MQTTError`: 0x90 Topic Name invalid, 0x94 Topic Alias invalid, 0x93
    Receive Maximum exceeded (v5), 0x82 Protocol Error for a Subscription Identifier sent by
    a client (3.3.4-6), 0x97 for a v3.1.1 QoS 2 PUBLISH over ``max_inflight_qos2`` (a v5
    one gets PUBREC 0x97 instead).

    A PUBLISH to ``$delayed/<seconds>/<topic>`` is stored in ``msg.delayed``
    (:class:`StoreDelayed`: its RETAIN flag applies when it is published, and it counts in
    the node's :class:`~services.ingest.delayed_rules.DelayedCounts` from now), or refused
    (see the module).
    """
    topic = resolve_inbound(
        state.topic_aliases,
        state.limits.topic_alias_maximum,
        packet.topic,
        packet.properties.topic_alias,
    )
    validate_topic_name(topic)
    delayed: DelayedTopic | None = None
    invalid: str | None = None
    try:
        delayed = parse_delayed_topic(topic, state.limits.max_delay_seconds)
    except MQTTError as exc:
        invalid = exc.message
    if state.protocol_version == 5 and packet.properties.subscription_identifiers:
        raise ProtocolError("a client must not send a Subscription Identifier")
    if packet.qos:
        assert packet.packet_id is not None, "the decoder requires a Packet Identifier"
        if packet.qos == 2:
            state.inbound_qos2_seen = True
            if any(p.packet_id == packet.packet_id for p in state.pending_acks):
                # A resend of a PUBLISH still being stored: its PUBREC (with the store's
                # outcome) answers both; a second PUBREC must not claim success early.
                return []
            if packet.packet_id in state.unreleased_qos2:
                # A resent QoS 2 PUBLISH: stored once already, so only acknowledge (4.3.3).
                state.pending_acks.append(PendingAck(packet.packet_id, 2, outstanding=0))
                return _release_acks(state)
        if state.protocol_version == 5 and (
            len(state.pending_acks) + len(state.unreleased_qos2) >= state.limits.receive_maximum
        ):
            raise MQTTError("Receive Maximum exceeded", ReasonCode.RECEIVE_MAXIMUM_EXCEEDED)
    if invalid is not None:
        return _refuse(state, packet, topic, ReasonCode.TOPIC_NAME_INVALID, invalid)
    target = topic if delayed is None else delayed.topic
    if not state.authorizer.may_publish(target):
        return _refuse(state, packet, target, ReasonCode.NOT_AUTHORIZED, "not authorized")
    if packet.qos == 2 and _inflight_qos2(state) >= state.limits.max_inflight_qos2:
        return _refuse_qos2(state, packet)
    waits = delayed is not None and delayed.delay_seconds > 0
    if waits:
        limits = state.limits
        over = state.server.delayed.refusal(
            state.client_id, limits.max_delayed_messages, limits.max_delayed_messages_per_client
        )
        if over is not None:
            return _refuse_delayed(state, packet, over)
    meta = accepted_meta(
        target, packet.qos, packet.retain, packet.properties, state.protocol_version, state.now_ms()
    )
    # A QoS 0 PUBLISH is stored all the same, but nothing waits for the outcome.
    pending = None
    if packet.qos:
        assert packet.packet_id is not None
        pending = PendingAck(packet.packet_id, packet.qos)
    MQTT.publish_received[packet.qos] += 1
    effects: list[Effect]
    if waits:
        assert delayed is not None
        token = state.new_token(pending)
        # The connection id and a number no other of its effects has: unique for ever.
        delayed_id = state.connection_id + token.to_bytes(8, "big")
        # Counted from now: the next PUBLISH of this read must see it.
        state.server.delayed.add(state.client_id, delayed_id)
        effects = [StoreDelayed(token, delayed_id, delayed.delay_seconds, meta, packet.payload)]
    else:
        effects = [StorePublish(state.new_token(pending), meta, packet.payload)]
    if packet.retain and isinstance(effects[0], StorePublish):
        effects.append(StoreRetained(state.new_token(pending), meta, packet.payload))
    if pending is not None:
        pending.outstanding = len(effects)
        state.pending_acks.append(pending)
        if packet.qos == 2 and state.persistent:
            pending.outstanding += 1
            state.unsaved.acks.append(pending)
    return effects


def _refuse(
    state: ConnectionState, packet: Publish, topic: str, reason: ReasonCode, why: str
) -> list[Effect]:
    """A PUBLISH to ``topic`` refused for ``reason`` (0x87 Not authorized: the client's
    rules do not allow it; 0x90 Topic Name invalid: a ``$delayed/`` Topic Name whose delay
    or target topic is not valid; ``why`` says which, for the log): answered in order (v5
    with ``reason``, v3.1.1 positively, MQTT-3.3.5-2), not stored."""
    log.info("client %r may not publish to %r (%s): refused", state.client_id, topic, why)
    if not packet.qos:
        return []
    assert packet.packet_id is not None
    refused = reason if state.protocol_version == 5 else 0
    state.pending_acks.append(PendingAck(packet.packet_id, packet.qos, 0, refused=refused))
    return _release_acks(state)


def _inflight_qos2(state: ConnectionState) -> int:
    """Inbound QoS 2 messages of the session not yet released: stored ones and those being
    stored."""
    return len(state.unreleased_qos2) + sum(1 for p in state.pending_acks if p.unreleased_qos2)


def _refuse_qos2(state: ConnectionState, packet: Publish) -> list[Effect]:
    """A QoS 2 PUBLISH over ``max_inflight_qos2``: v5 PUBREC 0x97 Quota exceeded in its
    turn (nothing stored, the Packet Identifier free again); v3.1.1 has no negative
    acknowledgement, so :class:`MQTTError` closes the connection."""
    assert packet.packet_id is not None
    limit = state.limits.max_inflight_qos2
    refused = LimitRefused(Refusal.INFLIGHT_QOS2, f"more than {limit} QoS 2 messages unreleased")
    if state.protocol_version < 5:
        raise MQTTError(refused.detail, ReasonCode.QUOTA_EXCEEDED)
    state.pending_acks.append(
        PendingAck(packet.packet_id, 2, outstanding=0, refused=ReasonCode.QUOTA_EXCEEDED)
    )
    return [refused, *_release_acks(state)]


def _refuse_delayed(state: ConnectionState, packet: Publish, why: str) -> list[Effect]:
    """A delayed PUBLISH over ``max_delayed_messages`` or ``max_delayed_messages_per_client``
    (``why`` says which, for the log), nothing stored: v5 PUBACK / PUBREC 0x97 Quota
    exceeded in its turn (MQTT 5.0 3.4.2.1, 3.5.2.1); QoS 0 dropped. v3.1.1 has no negative
    acknowledgement and MQTT-3.3.5-2 leaves a positive one or closing the Network Connection:
    the connection is closed, the PUBLISH unacknowledged, so the client still holds it and
    publishes it again after reconnecting, rather than losing it to an acknowledgement that
    lies (the choice made for ``max_inflight_qos2``)."""
    refused = LimitRefused(Refusal.DELAYED_MESSAGES, why)
    if not packet.qos:
        return [refused]
    assert packet.packet_id is not None
    if state.protocol_version < 5:
        # As for any refusal that closes the connection (the analysts' DISCONNECTED event).
        events.ending(state, DisconnectCause.PROTOCOL_ERROR, ReasonCode.QUOTA_EXCEEDED)
        state.phase = Phase.CLOSED
        return [refused, Close(f"a delayed PUBLISH over the quota: {why}")]
    state.pending_acks.append(
        PendingAck(
            packet.packet_id,
            packet.qos,
            outstanding=0,
            refused=ReasonCode.QUOTA_EXCEEDED,
            reason_string="too many delayed messages wait",
        )
    )
    return [refused, *_release_acks(state)]


def publish_outcome(state: ConnectionState, pending: PendingAck, ok: bool) -> list[Effect]:
    """Kafka's answer for one of the records ``pending`` waits for; releases acks in order."""
    _answered(state, pending, ok)
    return _release_acks(state)


def _answered(state: ConnectionState, pending: PendingAck, ok: bool) -> None:
    pending.outstanding -= 1
    if not ok and not pending.failed:
        pending.failed = True
        if pending.qos == 2 and state.persistent:
            # A session record may already list this id: the next one must not, or a later
            # PUBLISH reusing the id would be taken for a resend and lost (MQTT 4.3.3).
            state.session_dirty = True


_REASON_STRINGS: dict[int, str] = {
    ReasonCode.NOT_AUTHORIZED: "not authorized to publish to this topic",
    ReasonCode.TOPIC_NAME_INVALID: "not $delayed/<seconds>/<topic> with a valid delay and topic",
    ReasonCode.QUOTA_EXCEEDED: "too many QoS 2 messages in flight",
}
"""The Reason String of a refused PUBLISH's acknowledgement, by its Reason Code."""


def _release_acks(state: ConnectionState) -> list[Effect]:
    out: list[bytes] = []
    acks = state.pending_acks
    released = 0
    while released < len(acks) and acks[released].done:
        pending = acks[released]
        released += 1
        if pending.failed:
            # The store failed or Kafka did not answer in time: its outcome is unknown, as
            # the idempotent producer may still write the record once Kafka is back. A
            # negative acknowledgement (v5 0x80) would tell the client the message was not
            # taken, and it would publish it again as a new message: twice in Kafka. So the
            # connection is closed without acknowledging it (MQTT 5.0 4.13: DISCONNECT, then
            # close), as v3.1.1, which has no negative acknowledgement, always did: the
            # client resends the same PUBLISH (DUP) after reconnecting, which QoS 1 allows
            # to arrive twice. Nothing behind it is acknowledged any more either.
            del acks[:released]
            effects: list[Effect] = [Send(b"".join(out))] if out else []
            if state.protocol_version == 5:
                props = Properties()
                if state.request_problem_information:
                    props.reason_string = "a PUBLISH could not be stored: publish it again"
                disconnect = Disconnect(ReasonCode.UNSPECIFIED_ERROR, props)
                effects.append(Send(state.encode(disconnect)))
            state.phase = Phase.CLOSED
            return [*effects, Close("a PUBLISH could not be stored in Kafka")]
        reason = pending.refused or (
            ReasonCode.UNSPECIFIED_ERROR if pending.failed else ReasonCode.SUCCESS
        )
        props = Properties()
        if reason != ReasonCode.SUCCESS and state.request_problem_information:
            props.reason_string = pending.reason_string or _REASON_STRINGS.get(
                reason, "the message could not be stored"
            )
        if pending.qos == 1:
            out.append(state.encode(PubAck(pending.packet_id, reason, props)))
        else:
            if reason == ReasonCode.SUCCESS:
                # (a v3.1.1 refusal too: its PUBREL then gets PUBCOMP as usual)
                state.unreleased_qos2.add(pending.packet_id)
            out.append(state.encode(PubRec(pending.packet_id, reason, props)))
    del acks[:released]
    return [Send(b"".join(out))] if out else []


def handle_pubrel(state: ConnectionState, packet: PubRel) -> list[Effect]:
    """PUBREL → PUBCOMP; the Packet Identifier may be reused afterwards (MQTT 4.3.3).

    For a persistent session PUBCOMP waits until a session record without the id is stored.
    An id that is not unreleased gets PUBCOMP 0x92 Packet Identifier not found (v5).
    """
    state.inbound_qos2_seen = True
    if packet.packet_id not in state.unreleased_qos2:
        unknown = PubComp(packet.packet_id, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND)
        return [Send(state.encode(unknown))]
    if state.persistent:
        state.unsaved.releases.append(packet.packet_id)
        return []
    state.unreleased_qos2.discard(packet.packet_id)
    return [Send(state.encode(PubComp(packet.packet_id)))]


def flush_session_record(state: ConnectionState) -> list[Effect]:
    """The one session record that the QoS 2 PUBLISHes and PUBRELs handled since the last
    flush wait for (or that corrects an earlier one after a failed store); [] if none is
    needed or the connection is closed (its end record follows)."""
    if not (state.unsaved or state.session_dirty) or state.phase is not Phase.CONNECTED:
        return []
    record = session_record(state, connected=True)
    token = state.new_token(state.unsaved)
    state.unsaved = RecordWaiters()
    state.session_dirty = False
    return [StoreSession(token, record)]


def session_record_outcome(
    state: ConnectionState, waiters: RecordWaiters, ok: bool
) -> tuple[list[Effect], bool]:
    """Kafka's answer for the session record ``waiters`` wait for.

    Stored: the waiting PUBRECs may leave (in order) and the PUBCOMPs are sent. Not stored:
    the waiting PUBLISHes are refused as if their own store had failed. Returns the effects
    and whether a PUBREL went unrecorded: PUBCOMP has no Reason Code to refuse it with, so
    the caller closes the connection and the client resends the PUBREL after reconnecting
    (MQTT 4.4).
    """
    for pending in waiters.acks:
        _answered(state, pending, ok)
    effects = _release_acks(state)
    if not waiters.releases or state.phase is Phase.CLOSED:
        return effects, False
    if not ok:
        return effects, True
    for packet_id in waiters.releases:
        state.unreleased_qos2.discard(packet_id)
    comps = b"".join(state.encode(PubComp(packet_id)) for packet_id in waiters.releases)
    return [*effects, Send(comps)], False
