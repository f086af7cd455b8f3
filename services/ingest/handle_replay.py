"""Replay subscriptions in the connection core: history first, then live, nothing twice.

A SUBSCRIBE to ``$replay/<since>/<filter>`` (:mod:`services.common.topics.replay`; the
checks in :mod:`services.ingest.handle_subscribe`) subscribes to ``<filter>`` with a replay
cut (``LiveFrom(every_message=True)``): the ``msg.all`` end offsets, one per partition,
read by the shell before the subscription is stored, the *first cut*. The router sends the
subscription live only the messages at or after it.

The switch (exactly once where history meets live). The first cut alone leaves a gap: a
PUBLISH stored after the first cut was read but before the subscription record was may be
routed by a router that has not seen the subscription yet; it is not sent live, and it is
not below the first cut either. So once the subscription is stored (its SUBACK sent), the
shell's replay reader (:mod:`services.ingest.replay`) reads the end offsets again, the
*second cut* (:func:`switch`; at least the first in every partition), and replays every
matching message from ``<since>`` up to it. A message at or after the second cut was
stored after the subscription record: before the router routes it, it has applied every
state record stored before the message was fetched (the router's state barrier,
docs/architecture.md "Ordering"), so it is sent live, and the replay does not read it.
A message below the first cut is replayed only (the router's cut). A message in the
window between the cuts is replayed, and may also come live; the reader hands each
message with its ``msg.all`` origin, the window's are remembered (:func:`replayed`), and a
live copy whose origin (every routed downlink record has one,
:func:`services.common.records.with_origins`) is one of them is dropped
(:func:`replayed_already`): the message was delivered by the replay. A live copy of a
message the replay did not hand over (another topic, a retained message answering a
SUBSCRIBE, whose origin is that request's) passes. The origins remembered are those of
one Kafka round trip's messages on the filter's topics, each forgotten when its live copy
comes; what never comes goes with the connection.

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
from collections.abc import Sequence

from services.common.metrics import Drop, dropped
from services.common.records import Target
from services.common.subscription import Subscription
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


def switch(
    state: ConnectionState, subscription: Subscription, ends: Sequence[int]
) -> tuple[int, ...]:
    """The replay of ``subscription`` (its first cut filled in and stored) read
    ``msg.all``'s end offsets ``ends`` (one per partition) after its subscription record
    was stored: returns its second cut, ``ends`` but never below the first cut, which the
    replay reads up to; the messages between the two cuts it replays are remembered
    (:func:`replayed`). A new replay of the same Topic Filter replaces the window."""
    live_from = subscription.live_from
    assert live_from is not None and live_from.offsets is not None, "stored with its cut"
    first = live_from.offsets
    second = tuple(max(a, b) for a, b in zip(first, ends, strict=True))
    if state.replay_windows is None:
        state.replay_windows = {}
    state.replay_windows[subscription.topic_filter] = (first, second)
    return second


def _in_window(state: ConnectionState, partition: int, offset: int) -> bool:
    """Whether ``msg.all``'s ``offset`` in ``partition`` lies between the two cuts of one of
    the client's replays."""
    for first, second in (state.replay_windows or {}).values():
        if partition < len(first) and first[partition] <= offset < second[partition]:
            return True
    return False


def replayed_already(state: ConnectionState, message: FanOut) -> bool:
    """Whether a live ``message`` was delivered by a replay already (its origin is one the
    replay handed over from between its cuts): then it is dropped, and its origin
    forgotten (a message comes live to a client once). A message without an origin (a
    message store's delivery) passes."""
    origins = state.replayed_origins
    origin = message.origin
    if not origins or origin is None:
        return False
    key = (origin.partition, origin.offset)
    if key not in origins:
        return False
    origins.discard(key)
    return True


def replayed(state: ConnectionState, message: FanOut, target: Target) -> list[Effect]:
    """Send one replayed ``message`` to the client as ``target`` says (QoS, Retain As
    Published, Subscription Identifiers); v5 clients see ``replayed=true``. Its origin is
    remembered when it lies between a replay's two cuts (:func:`replayed_already`)."""
    origin = message.origin
    if origin is not None and _in_window(state, origin.partition, origin.offset):
        if state.replayed_origins is None:
            state.replayed_origins = set()
        state.replayed_origins.add((origin.partition, origin.offset))
    if state.phase is not Phase.CONNECTED:
        return []
    packet = message.publish(target, state.protocol_version)
    if state.protocol_version == 5:
        packet.properties.user_properties = [*packet.properties.user_properties, REPLAYED]
    return delivery.deliver(state, packet, message.expires_at_ms)


def finished(state: ConnectionState, topic_filter: str) -> list[Effect]:
    """The replay of ``topic_filter`` ended (all history sent, stopped by UNSUBSCRIBE, or
    replaced by a new one): once no replay runs, the held live messages go, in order,
    but for those a replay delivered (:func:`replayed_already`)."""
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
        if replayed_already(state, message):
            continue
        effects.extend(delivery.deliver_routed(state, message, target))
    return effects
