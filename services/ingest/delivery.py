"""Outbound PUBLISH to a subscriber and its acknowledgements (MQTT 4.3.2, 4.3.3, 4.4, 4.9;
5.0 3.1.2.11.3-4, 3.3.2.3.3).

QoS 1 and 2 deliveries take a Packet Identifier and count against the client's Receive
Maximum (v5; 65,535 when unset) until PUBACK, or PUBCOMP for QoS 2 (PUBREC → PUBREL →
PUBCOMP), or a PUBREC with a failure Reason Code (MQTT 5.0 4.9). Further messages wait in
order in a per-connection queue. A packet larger than the client's Maximum Packet Size is
discarded for that client, as if it had been delivered (MQTT 5.0 3.1.2.11.4).

Two kinds of deliveries share a connection:

- the node's own: the router's messages for non-persistent sessions; this module picks the
  Packet Identifier and keeps the in-flight window;
- store-assigned: a message store (``device_persist``) picked the Packet Identifier
  (``Target.packet_id``), sets DUP on resends after a reconnect and keeps at most the
  client's Receive Maximum of them in flight itself, so they are sent at once. Every
  acknowledgement of one is reported to the store (``client.acks``, one record per read):
  PUBACK; PUBREC then PUBCOMP. A delivery that ends without them (a PUBREC with a failure
  Reason Code, or a message discarded as too large or expired) is reported as complete:
  PUBACK for QoS 1, PUBREC followed by PUBCOMP for QoS 2. The store also asks for PUBREL
  of QoS 2 messages the client acknowledged with PUBREC before a reconnect
  (:func:`release`).

Message Expiry (MQTT 5.0 3.3.2.3.3): a message is sent with the time it has left, rounded up
to whole seconds; one whose interval has passed before onward delivery started is not sent
[MQTT-3.3.2-5]. A store's resend (DUP) was started before, so it is always sent.

Authorization: every PUBLISH to a client is first checked against its rules
(:meth:`~services.common.auth.authorize.Authorizer.may_receive`, a dict lookup per topic
seen): a Topic Filter granted over a denied subtree (``#`` with ``deny subscribe admin/#``)
gets the messages of the topics it may read only. This one check covers every path a
message takes to a client: live fan-out, retained messages sent on SUBSCRIBE, Shared
Subscriptions, a persistent session's stored messages and an APPLICATION client's feed. A
withheld store-assigned delivery is reported to the store as complete, like one too large.

A routed message (:func:`deliver_routed`) comes as a :class:`~services.ingest.fan_out.FanOut`
shared by the node's targets: a QoS 0 copy is one of its shared encodings. Every PUBLISH
to a v5 client that allows Topic Aliases carries a server-assigned one
(:mod:`services.ingest.topic_alias`) unless ``assign_topic_aliases`` is off.
"""

from __future__ import annotations

import logging
from collections import deque

from services.common.metrics import MQTT, Drop, dropped
from services.common.mqtt.errors import ProtocolError
from services.common.mqtt.packets import PubAck, PubComp, Publish, PubRec, PubRel
from services.common.mqtt.reason_codes import ReasonCode
from services.common.records import AckKind, AckRecord, Target
from services.ingest.effects import Effect, Send, StoreAcks
from services.ingest.fan_out import FanOut, remaining_interval
from services.ingest.state import ConnectionState, Outbound, Queued
from services.ingest.topic_alias import OutboundAliases

log = logging.getLogger(__name__)

MAX_QUEUED = 10_000
"""Messages a connection may have waiting for its in-flight window; beyond that the oldest
are dropped (a slow consumer must not exhaust the node's memory)."""


# ------------------------------------------------------------------------------ expiry


def _set_remaining(state: ConnectionState, packet: Publish, expires_at_ms: int | None) -> bool:
    """Put the time left into ``packet`` (v5); False if the message has expired."""
    if expires_at_ms is None:
        return True
    remaining = remaining_interval(expires_at_ms, state.now_ms())
    if remaining is None:
        return False
    if state.protocol_version == 5:
        packet.properties.message_expiry_interval = remaining
    return True


# ------------------------------------------------------------------------------ sending


def deliver_routed(state: ConnectionState, message: FanOut, target: Target) -> list[Effect]:
    """Send a routed message to this client as ``target`` (this client's entry of the
    downlink record) says: QoS, RETAIN, Subscription Identifiers, and a store-assigned
    Packet Identifier and DUP flag if any. A QoS 0 copy is the message's shared encoding
    of this connection's variant (its time left as of the fan-out); QoS 1/2 go through
    :func:`deliver`."""
    version = state.protocol_version
    if target.qos:  # deliver() checks the rules
        return deliver(state, message.publish(target, version), message.expires_at_ms)
    if not state.authorizer.may_receive(message.meta.topic):
        return _withheld(state, message.meta.topic)
    expires_at_ms = message.expires_at_ms
    if expires_at_ms is not None and expires_at_ms <= state.now_ms():
        dropped(Drop.EXPIRED)
        return []
    aliases = _aliases(state)
    if aliases is None:
        return _send(state, message.qos0_bytes(target, version, 0, False), 0)
    topic = message.meta.topic
    alias, known = aliases.choose(topic)
    effects = _send(state, message.qos0_bytes(target, version, alias, known), 0)
    if not effects and not known:
        aliases.forget(topic)
    return effects


def deliver(
    state: ConnectionState,
    packet: Publish,
    expires_at_ms: int | None = None,
    packet_id: int = 0,
) -> list[Effect]:
    """Send ``packet`` to the client, or queue it behind the in-flight window.

    ``packet.packet_id`` is set for a store-assigned delivery (QoS 1/2) and None otherwise.
    ``expires_at_ms`` is when the message expires (Unix ms; None: never). ``packet_id``
    (1..65535; 0: the node picks one) is the Packet Identifier a delivery of the node's own
    asks for: a persistent session's replayed message, whose resend after a reconnect
    must carry its original one (MQTT 4.4 [MQTT-4.4.0-1]); the node picks another only if
    that one is in flight (the replay reader waits for it to be free first). A message on
    a topic the client's rules do not let it read is withheld (a store-assigned one
    reported complete).
    """
    if not state.authorizer.may_receive(packet.topic):
        if packet.qos and packet.packet_id and packet.packet_id not in state.outbound:
            completed_unsent(state, packet.qos, packet.packet_id)
        return _withheld(state, packet.topic)
    if packet.qos and packet.packet_id:
        return _deliver_store_assigned(state, packet, expires_at_ms)
    if packet.qos == 0:
        if not _set_remaining(state, packet, expires_at_ms):
            dropped(Drop.EXPIRED)
            return []
        return _send_publish(state, packet)
    if len(state.outbound) >= state.client_receive_maximum or state.outbound_queue:
        if state.outbound_queue is None:
            state.outbound_queue = deque()
        elif len(state.outbound_queue) >= MAX_QUEUED:
            state.outbound_queue.popleft()
            dropped(Drop.QUEUE_FULL)
            log.warning(
                "client %r: outbound queue full, dropped its oldest message", state.client_id
            )
        state.outbound_queue.append(Queued(packet, expires_at_ms, packet_id))
        return []
    return _send_with_packet_id(state, packet, expires_at_ms, packet_id)


def _withheld(state: ConnectionState, topic: str) -> list[Effect]:
    """Nothing is sent: the client's rules deny it ``topic``; counted and logged."""
    MQTT.publish_withheld += 1
    dropped(Drop.NOT_AUTHORIZED)
    log.debug("client %r: a message on %r withheld by its rules", state.client_id, topic)
    return []


def _aliases(state: ConnectionState) -> OutboundAliases | None:
    """The connection's server-assigned Topic Aliases, or None when it uses none (v3.1.1,
    a client whose Topic Alias Maximum is 0, or ``assign_topic_aliases`` off)."""
    aliases = state.outbound_aliases
    if aliases is None:
        if (
            state.protocol_version < 5
            or not state.client_topic_alias_maximum
            or not state.limits.assign_topic_aliases
        ):
            return None
        aliases = state.outbound_aliases = OutboundAliases(state.client_topic_alias_maximum)
    return aliases


def _send_publish(state: ConnectionState, packet: Publish) -> list[Effect]:
    """Encode and send ``packet`` with the connection's Topic Alias for its topic, if it
    uses them (the Topic Name left out when the client knows the alias); a new alias of a
    packet that is not sent is given back."""
    aliases = _aliases(state)
    if aliases is None:
        return _send(state, state.encode(packet), packet.qos)
    topic = packet.topic
    alias, known = aliases.choose(topic)
    packet.properties.topic_alias = alias
    if known:
        packet.topic = ""
    effects = _send(state, state.encode(packet), packet.qos)
    if not effects and not known:
        aliases.forget(topic)
    return effects


def _send(state: ConnectionState, data: bytes, qos: int) -> list[Effect]:
    """Send the encoded PUBLISH ``data`` of QoS ``qos`` unless it exceeds the client's
    Maximum Packet Size (counted in ``cormorant_mqtt_publish_sent_total``)."""
    if len(data) > state.client_maximum_packet_size:
        dropped(Drop.TOO_LARGE)
        log.info(
            "client %r: dropped a %d-byte PUBLISH over its Maximum Packet Size",
            state.client_id,
            len(data),
        )
        return []
    MQTT.publish_sent[qos] += 1
    return [Send(data)]


def _next_packet_id(state: ConnectionState) -> int:
    packet_id = state.last_packet_id
    while True:
        packet_id = packet_id % 65535 + 1
        if packet_id not in state.outbound:
            state.last_packet_id = packet_id
            return packet_id


def _send_with_packet_id(
    state: ConnectionState, packet: Publish, expires_at_ms: int | None, packet_id: int = 0
) -> list[Effect]:
    if not _set_remaining(state, packet, expires_at_ms):
        dropped(Drop.EXPIRED)
        return []  # expired while it waited for the window [MQTT-3.3.2-5]
    if not packet_id or packet_id in state.outbound:
        packet_id = _next_packet_id(state)
    packet.packet_id = packet_id
    effects = _send_publish(state, packet)
    if effects:
        state.outbound[packet.packet_id] = Outbound(packet.qos)
    return effects


def _deliver_store_assigned(
    state: ConnectionState, packet: Publish, expires_at_ms: int | None
) -> list[Effect]:
    packet_id = packet.packet_id
    assert packet_id is not None
    if packet_id in state.outbound:
        # Already in flight here: a repeated downlink record. The store resends what stays
        # unacknowledged after the next reconnect (MQTT 4.4).
        log.info("client %r: Packet Identifier %d already in flight", state.client_id, packet_id)
        return []
    if not _set_remaining(state, packet, expires_at_ms):
        if not packet.dup:
            dropped(Drop.EXPIRED)
            completed_unsent(state, packet.qos, packet_id)
            return []
        # A resend: onward delivery had started, so it goes out with the least interval.
        if state.protocol_version == 5:
            packet.properties.message_expiry_interval = 1
    effects = _send_publish(state, packet)
    if effects:
        state.outbound[packet_id] = Outbound(packet.qos, store_assigned=True)
    else:
        completed_unsent(state, packet.qos, packet_id)
    return effects


def completed_unsent(state: ConnectionState, qos: int, packet_id: int) -> None:
    """Report a store-assigned delivery of QoS ``qos`` and ``packet_id`` discarded without
    sending as complete (to ``client.acks``, with the next :func:`flush_acks`)."""
    if qos == 1:
        state.acks_out.append((AckKind.PUBACK, packet_id))
    else:
        state.acks_out += [(AckKind.PUBREC, packet_id), (AckKind.PUBCOMP, packet_id)]


def release(state: ConnectionState, packet_id: int) -> list[Effect]:
    """Send PUBREL for a store-assigned QoS 2 delivery the client acknowledged with PUBREC
    on an earlier connection (MQTT 4.4: PUBREL is resent on a resumed session); it stays in
    flight until PUBCOMP."""
    entry = state.outbound.get(packet_id)
    if entry is not None and not entry.store_assigned:
        log.info(
            "client %r: PUBREL asked for Packet Identifier %d, in use by another delivery",
            state.client_id,
            packet_id,
        )
        return []
    state.outbound[packet_id] = Outbound(2, store_assigned=True, released=True)
    return [Send(state.encode(PubRel(packet_id)))]


# ------------------------------------------------------------------------------ acknowledgements


def handle_puback(state: ConnectionState, packet: PubAck) -> list[Effect]:
    """The client acknowledged a QoS 1 delivery, with any Reason Code: it is complete.

    Raises :class:`ProtocolError` if the Packet Identifier is in flight with QoS 2. A PUBACK
    for an unknown one is ignored (logged).
    """
    entry = state.outbound.get(packet.packet_id)
    if entry is None:
        log.info(
            "client %r: PUBACK for unknown Packet Identifier %d", state.client_id, packet.packet_id
        )
        return []
    if entry.qos != 1:
        raise ProtocolError(f"PUBACK for QoS 2 delivery {packet.packet_id}")
    return _complete(state, packet.packet_id, entry, AckKind.PUBACK)


def handle_pubrec(state: ConnectionState, packet: PubRec) -> list[Effect]:
    """The client received a QoS 2 delivery: answer PUBREL; with a failure Reason Code
    (>= 0x80) the delivery is over instead (MQTT 4.3.3, 4.9).

    An unknown Packet Identifier gets PUBREL 0x92 Packet Identifier not found (v5) so the
    client can complete its side. Raises :class:`ProtocolError` if it is in flight with QoS 1.
    """
    packet_id = packet.packet_id
    entry = state.outbound.get(packet_id)
    if entry is None:
        log.info("client %r: PUBREC for unknown Packet Identifier %d", state.client_id, packet_id)
        return [Send(state.encode(PubRel(packet_id, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND)))]
    if entry.qos != 2:
        raise ProtocolError(f"PUBREC for QoS 1 delivery {packet_id}")
    if entry.released:
        return [Send(state.encode(PubRel(packet_id)))]  # PUBREL already sent: again
    if packet.reason_code >= 0x80:
        if entry.store_assigned:
            state.acks_out.append((AckKind.PUBREC, packet_id))
        return _complete(state, packet_id, entry, AckKind.PUBCOMP)
    entry.released = True
    if entry.store_assigned:
        state.acks_out.append((AckKind.PUBREC, packet_id))
    return [Send(state.encode(PubRel(packet_id)))]


def handle_pubcomp(state: ConnectionState, packet: PubComp) -> list[Effect]:
    """The client completed a QoS 2 delivery (with any Reason Code): free its identifier.

    Raises :class:`ProtocolError` if no PUBREL was sent for it. A PUBCOMP for an unknown
    Packet Identifier is ignored (logged).
    """
    entry = state.outbound.get(packet.packet_id)
    if entry is None:
        log.info(
            "client %r: PUBCOMP for unknown Packet Identifier %d", state.client_id, packet.packet_id
        )
        return []
    if not entry.released:
        raise ProtocolError(f"PUBCOMP before PUBREL for {packet.packet_id}")
    return _complete(state, packet.packet_id, entry, AckKind.PUBCOMP)


def _complete(
    state: ConnectionState, packet_id: int, entry: Outbound, kind: AckKind
) -> list[Effect]:
    """End the delivery of ``packet_id`` and send what waited for its window slot."""
    del state.outbound[packet_id]
    if entry.store_assigned:
        state.acks_out.append((kind, packet_id))
    effects: list[Effect] = []
    while state.outbound_queue and len(state.outbound) < state.client_receive_maximum:
        queued = state.outbound_queue.popleft()
        effects.extend(
            _send_with_packet_id(state, queued.packet, queued.expires_at_ms, queued.packet_id)
        )
    return effects


def flush_acks(state: ConnectionState) -> list[Effect]:
    """The ``client.acks`` record of the acknowledgements gathered since the last flush
    (one record per read of the socket), or [] if there are none."""
    if not state.acks_out:
        return []
    record = AckRecord(state.session_id, state.acks_out)
    state.acks_out = []
    return [StoreAcks(state.new_token(), record)]
