"""SUBSCRIBE/SUBACK and UNSUBSCRIBE/UNSUBACK (MQTT 3.1.1 3.8-3.11; MQTT 5.0 3.8-3.11).

The client's whole subscription set is rewritten to ``client.subscriptions`` (compacted, keyed
by client id) and SUBACK/UNSUBACK is sent only once Kafka stored it: a subscription that was
acknowledged is seen by every router.
"""

from __future__ import annotations

from services.common.mqtt.errors import MQTTError, ProtocolError
from services.common.mqtt.packets import SubAck, Subscribe, UnsubAck, Unsubscribe
from services.common.mqtt.reason_codes import ReasonCode
from services.common.topics.trie import Subscription
from services.common.topics.validation import parse_shared, validate_topic_filter
from services.ingest.effects import Effect, Send, StoreSubscriptions
from services.ingest.state import ConnectionState

# QoS 2 delivery to subscribers is not offered yet: a QoS 2 request is granted QoS 1, which
# MQTT allows (3.8.4: the granted QoS may be lower than requested).
MAX_GRANTED_QOS = 1


def _failure(state: ConnectionState, exc: MQTTError) -> int:
    """The per-filter failure code: the Reason Code (v5) or 0x80 Failure (v3.1.1)."""
    return exc.reason_code if state.protocol_version == 5 else 0x80


def handle_subscribe(state: ConnectionState, packet: Subscribe) -> list[Effect]:
    """Add or replace subscriptions; SUBACK carries one return/Reason Code per filter.

    Raises :class:`ProtocolError` for No Local on a Shared Subscription (MQTT 5.0 3.8.3-4).
    An invalid Topic Filter fails only its own entry (0x8F in v5, 0x80 in v3.1.1).
    """
    ids = packet.properties.subscription_identifiers
    identifier = ids[0] if ids else None
    updated = dict(state.subscriptions)
    codes: list[int] = []
    for request in packet.subscriptions:
        try:
            validate_topic_filter(request.topic_filter)
            shared = parse_shared(request.topic_filter)
        except MQTTError as exc:
            codes.append(_failure(state, exc))
            continue
        if shared is not None and request.no_local:
            raise ProtocolError("No Local is not allowed on a Shared Subscription")
        granted = min(request.qos, MAX_GRANTED_QOS)
        updated[request.topic_filter] = Subscription(
            client_id=state.client_id,
            topic_filter=request.topic_filter,
            qos=granted,
            no_local=request.no_local,
            retain_as_published=request.retain_as_published,
            retain_handling=request.retain_handling,
            subscription_identifier=identifier,
        )
        codes.append(granted)
    return _store(state, updated, SubAck(packet.packet_id, codes))


def handle_unsubscribe(state: ConnectionState, packet: Unsubscribe) -> list[Effect]:
    """Remove subscriptions; v5 UNSUBACK says per filter whether one existed (0x11)."""
    updated = dict(state.subscriptions)
    codes: list[int] = []
    for topic_filter in packet.topic_filters:
        try:
            validate_topic_filter(topic_filter)
        except MQTTError as exc:
            codes.append(exc.reason_code)
            continue
        if updated.pop(topic_filter, None) is None:
            codes.append(ReasonCode.NO_SUBSCRIPTION_EXISTED)
        else:
            codes.append(ReasonCode.SUCCESS)
    ack = UnsubAck(packet.packet_id, codes if state.protocol_version == 5 else [])
    return _store(state, updated, ack)


def _store(
    state: ConnectionState, updated: dict[str, Subscription], ack: SubAck | UnsubAck
) -> list[Effect]:
    """Store the new set if it changed, and send ``ack`` once it is stored.

    An unchanged set is acknowledged at once, unless an earlier change is still being
    stored: then the set is written again, so ``ack`` too waits until Kafka has it.
    """
    if updated == state.subscriptions and not state.pending_subacks:
        return [Send(state.encode(ack))]
    state.subscriptions = updated
    token = state.new_token()
    state.pending_subacks[token] = ack
    return [StoreSubscriptions(token, list(updated.values()))]
