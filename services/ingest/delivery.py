"""Outbound PUBLISH to a subscriber and its PUBACK (MQTT 4.3.2, 4.4, 4.9; 5.0 3.1.2.11.3-4).

QoS 1 deliveries take a free Packet Identifier and count against the client's Receive
Maximum (v5; 65,535 when unset); further messages wait in order in a per-connection queue.
A packet larger than the client's Maximum Packet Size is discarded for that client, as if it
had been delivered (MQTT 5.0 3.1.2.11.4).
"""

from __future__ import annotations

import logging

from services.common.mqtt.packets import PubAck, Publish
from services.ingest.effects import Effect, Send
from services.ingest.state import ConnectionState, Outbound

log = logging.getLogger(__name__)

MAX_QUEUED = 10_000
"""Messages a non-persistent connection may have waiting for its in-flight window; beyond
that the oldest are dropped (a slow consumer must not exhaust the node's memory)."""


def deliver(state: ConnectionState, packet: Publish, encoded: bytes | None = None) -> list[Effect]:
    """Send ``packet`` (QoS 0 or 1) to the client, or queue it behind the in-flight window.

    ``encoded`` may carry the packet already encoded for this protocol version (QoS 0 only:
    one encoding shared by every subscriber of a fan-out).
    """
    if packet.qos == 0:
        return _send(state, encoded if encoded is not None else state.encode(packet))
    if len(state.outbound) >= state.client_receive_maximum or state.outbound_queue:
        if len(state.outbound_queue) >= MAX_QUEUED:
            state.outbound_queue.popleft()
            log.warning(
                "client %r: outbound queue full, dropped its oldest message", state.client_id
            )
        state.outbound_queue.append(packet)
        return []
    return _send_with_packet_id(state, packet)


def _send(state: ConnectionState, data: bytes) -> list[Effect]:
    if len(data) > state.client_maximum_packet_size:
        log.info(
            "client %r: dropped a %d-byte PUBLISH over its Maximum Packet Size",
            state.client_id,
            len(data),
        )
        return []
    return [Send(data)]


def _next_packet_id(state: ConnectionState) -> int:
    packet_id = state.last_packet_id
    while True:
        packet_id = packet_id % 65535 + 1
        if packet_id not in state.outbound:
            state.last_packet_id = packet_id
            return packet_id


def _send_with_packet_id(state: ConnectionState, packet: Publish) -> list[Effect]:
    packet.packet_id = _next_packet_id(state)
    effects = _send(state, state.encode(packet))
    if effects:
        state.outbound[packet.packet_id] = Outbound(packet)
    return effects


def handle_puback(state: ConnectionState, packet: PubAck) -> list[Effect]:
    """The client acknowledged a QoS 1 delivery: free its Packet Identifier, send queued ones."""
    if state.outbound.pop(packet.packet_id, None) is None:
        log.info(
            "client %r: PUBACK for unknown Packet Identifier %d", state.client_id, packet.packet_id
        )
    effects: list[Effect] = []
    while state.outbound_queue and len(state.outbound) < state.client_receive_maximum:
        effects.extend(_send_with_packet_id(state, state.outbound_queue.popleft()))
    return effects
