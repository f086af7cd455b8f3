"""Replay subscriptions in the connection core: history first, then live, nothing twice.

A SUBSCRIBE to ``$replay/<since>/<filter>`` (:mod:`services.common.topics.replay`; the
checks in :mod:`services.ingest.handle_subscribe`) subscribes to ``<filter>`` with a replay
cut (``LiveFrom(every_message=True)``): the ``msg.all`` end offsets, one per partition,
read by the shell before the subscription is stored. The router sends the subscription
only the messages at or after the cut; the shell's replay reader
(:mod:`services.ingest.replay`) reads those before it, from ``<since>`` on, and hands each
matching one to :func:`replayed`. So every message reaches the subscription exactly once,
either replayed or live, and the switch between the two is fixed before either starts.

Order: one publisher's messages are in one ``msg.all`` partition (keyed by its client id)
and the reader reads each partition in order, so the history keeps per-publisher order
(MQTT 4.6). Live messages routed to the client while a replay runs, for any of its
subscriptions, are held (:func:`hold`) and sent after the last replay ends
(:func:`finished`): none of a publisher's live messages overtakes its history. Like the
in-flight queue (:data:`services.ingest.delivery.MAX_QUEUED`), what is held is bounded;
beyond it the oldest held message is dropped and counted (``queue_full``).

Flow control: the reader hands over a message only while :func:`room` says the client's
in-flight window (its Receive Maximum, MQTT 5.0 3.3.4) has a free slot and nothing queues
behind it; it waits otherwise, so a replay never fills the node's memory.

A replayed message is sent as a live one would be (QoS min(message, subscription), RETAIN
as published only with Retain As Published, the subscription's identifier, the original
properties with the Message Expiry Interval left), checked against the client's rules as of
now (:func:`services.ingest.delivery.deliver`), and to a v5 client with the User Property
``replayed=true`` (MQTT 5.0 3.3.2.3.7), which tells it from a live one.
"""

from __future__ import annotations

from collections import deque

from services.common.metrics import Drop, dropped
from services.common.records import Target
from services.ingest import delivery
from services.ingest.effects import Effect
from services.ingest.fan_out import FanOut
from services.ingest.state import ConnectionState, Phase

REPLAYED = ("replayed", "true")
"""The User Property on every replayed PUBLISH to a v5 client."""


def started(state: ConnectionState, topic_filter: str) -> None:
    """A replay of ``topic_filter`` is asked for: live messages are held from now on (the
    router may route live ones before the SUBACK is sent)."""
    if state.replaying is None:
        state.replaying = set()
    state.replaying.add(topic_filter)


def hold(state: ConnectionState, message: FanOut, target: Target) -> bool:
    """Keep a live ``message`` for ``target`` until the replays end; False (not held)
    when no replay runs."""
    if not state.replaying:
        return False
    if state.held is None:
        state.held = deque()
    elif len(state.held) >= delivery.MAX_QUEUED:
        state.held.popleft()
        dropped(Drop.QUEUE_FULL)
    state.held.append((message, target))
    return True


def room(state: ConnectionState) -> bool:
    """Whether the client can take one more replayed message now: connected, a free slot
    in its in-flight window (Receive Maximum) and nothing queued for one."""
    return (
        state.phase is Phase.CONNECTED
        and len(state.outbound) < state.client_receive_maximum
        and not state.outbound_queue
    )


def replayed(state: ConnectionState, message: FanOut, target: Target) -> list[Effect]:
    """Send one replayed ``message`` to the client as ``target`` says (QoS, Retain As
    Published, Subscription Identifiers); v5 clients see ``replayed=true``."""
    if state.phase is not Phase.CONNECTED:
        return []
    packet = message.publish(target, state.protocol_version)
    if state.protocol_version == 5:
        packet.properties.user_properties = [*packet.properties.user_properties, REPLAYED]
    return delivery.deliver(state, packet, message.expires_at_ms)


def finished(state: ConnectionState, topic_filter: str) -> list[Effect]:
    """The replay of ``topic_filter`` ended (all history sent, stopped by UNSUBSCRIBE, or
    replaced by a new one): once no replay runs, the held live messages go, in order."""
    if state.replaying is None:
        return []
    state.replaying.discard(topic_filter)
    if state.replaying:
        return []
    state.replaying = None
    held, state.held = state.held, None
    effects: list[Effect] = []
    for message, target in held or ():
        if state.phase is not Phase.CONNECTED:
            break
        effects.extend(delivery.deliver_routed(state, message, target))
    return effects
