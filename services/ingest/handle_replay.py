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

Persistent sessions (docs/concepts/replay.md, "Persistent sessions"): a replay keeps a
:class:`~services.common.subscription.ReplayProgress` with its subscription
(``client.subscriptions``): the second cut (:func:`switch`), and per partition ``next``
(acknowledged below) and ``sent`` (nothing sent at or past), stored by :func:`mark` before
the reader sends past ``sent``; a QoS 1 replayed message in flight holds ``next`` back until
its PUBACK. A resumed session's replay starts at CONNACK
(:func:`services.ingest.handle_connect.resume_replays`) from ``next``, reads the window
again only to :func:`remember` what it delivered there, and sends ``[next, sent)`` with
DUP=1. The message stores' live copies (device_persist's, app_delivery's) carry their
``msg.all`` origin (header ``a``), so :func:`replayed_already` drops them as it drops the
router's, and reports them complete to their store; held ones go only once the node's own
Packet Identifiers in flight are acknowledged (:func:`drained`), since the stores pick
theirs from the same space.

Packet Identifiers of a persistent session's replay (MQTT 4.4 [MQTT-4.4.0-1]: a resend
after a reconnect carries the original one). Each replay reserves a block of
:data:`PACKET_ID_BLOCK` identifiers (one of :data:`PACKET_ID_BLOCKS`, not used by the
session's other replays), kept with its progress; a message's identifier derives from its
``msg.all`` partition and offset within the block (:func:`packet_id`), so a resumed replay
sends ``[next, sent)`` again with the same identifiers, on any node, with nothing stored
per message. An identifier still in flight (an earlier offset of the same residue, a
message store's delivery) makes the reader wait for its acknowledgement (:func:`room`).

A replayed message is sent as a live one would be (QoS min(message, subscription), RETAIN
as published only with Retain As Published, the subscription's identifier, the original
properties with the Message Expiry Interval left), checked against the client's rules as of
now (:func:`services.ingest.delivery.deliver`), and to a v5 client with the User Property
``replayed=true`` (MQTT 5.0 3.3.2.3.7), which tells it from a live one.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Sequence

from services.common.metrics import Drop, dropped
from services.common.records import Target
from services.common.subscription import ReplayProgress, Subscription
from services.ingest import delivery
from services.ingest.effects import Effect, StoreSubscriptions
from services.ingest.fan_out import FanOut
from services.ingest.state import ConnectionState, PendingReplayMark, Phase

REPLAYED = ("replayed", "true")
"""The User Property on every replayed PUBLISH to a v5 client."""

PACKET_ID_BLOCK = 4095
"""Packet Identifiers one persistent replay reserves; its ``msg.all`` partitions share them
equally (12 partitions: 341 consecutive offsets each before an identifier comes again)."""

PACKET_ID_BLOCKS = 16
"""Blocks of :data:`PACKET_ID_BLOCK` identifiers in 1..65,520 (MQTT 2.2.1: 1..65,535)."""


def started(state: ConnectionState, topic_filter: str) -> None:
    """A replay of ``topic_filter`` is asked for: live messages are held from now on (the
    router may route live ones before the SUBACK is sent)."""
    if state.replaying is None:
        state.replaying = set()
    state.replaying.add(topic_filter)


def hold(state: ConnectionState, message: FanOut, target: Target) -> bool:
    """Keep a live ``message`` for ``target`` until the replays end (and, in a persistent
    session, their deliveries in flight are acknowledged); False (not held) when no
    replay runs."""
    if not state.replaying and not state.replay_draining:
        return False
    if state.held is None:
        state.held = deque()
    elif len(state.held) >= delivery.MAX_QUEUED:
        state.held.popleft()
        dropped(Drop.QUEUE_FULL)
    state.held.append((message, target))
    return True


def room(state: ConnectionState, packet_id: int = 0) -> bool:
    """Whether the client can take one more replayed message now: connected, a free slot
    in its in-flight window (Receive Maximum), nothing queued for one, and its Packet
    Identifier ``packet_id`` (:func:`packet_id`; 0: any) not in flight."""
    return (
        state.phase is Phase.CONNECTED
        and len(state.outbound) < state.client_receive_maximum
        and not state.outbound_queue
        and packet_id not in state.outbound
    )


def packet_id(state: ConnectionState, topic_filter: str, message: FanOut, target: Target) -> int:
    """The Packet Identifier (1..65,520) of ``message`` replayed by the persistent
    session's replay of ``topic_filter`` as ``target`` (QoS 1): the same whenever it is
    sent, on the first connection or after a reconnect (MQTT 4.4 [MQTT-4.4.0-1]). Within
    the replay's block (:attr:`ReplayProgress.packet_ids`), partition ``p`` of ``msg.all``
    owns the span ``p * S .. p * S + S - 1`` (``S`` the block shared by the partitions)
    and offset ``o`` its ``o mod S``-th identifier. 0 (the node picks one) for a QoS 0
    delivery, a replay of a session that is not persistent, or a message without origin."""
    subscription = state.subscriptions.get(topic_filter)
    origin = message.origin
    if not target.qos or subscription is None or subscription.replay is None or origin is None:
        return 0
    span = max(1, PACKET_ID_BLOCK // len(subscription.replay.cut))
    within = (origin.partition * span + origin.offset % span) % PACKET_ID_BLOCK
    return subscription.replay.packet_ids * PACKET_ID_BLOCK + within + 1


def _free_block(state: ConnectionState, topic_filter: str) -> int:
    """A block of Packet Identifiers no other replay of the session holds (the first; with
    every block held, block 0 is shared, and its replays wait on each other's)."""
    held = {
        s.replay.packet_ids
        for s in state.subscriptions.values()
        if s.replay is not None and s.topic_filter != topic_filter
    }
    return next((block for block in range(PACKET_ID_BLOCKS) if block not in held), 0)


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
    current = state.subscriptions.get(subscription.topic_filter)
    if state.persistent and current is not None and current.replay is None:
        # A persistent session's replay keeps its second cut with its subscription; its
        # progress is stored by the reader's first mark, before anything is sent.
        progress = ReplayProgress(
            second, second, second, _free_block(state, subscription.topic_filter)
        )
        updated = dataclasses.replace(current, replay=progress)
        state.subscriptions = {**state.subscriptions, subscription.topic_filter: updated}
    return second


def _in_window(state: ConnectionState, partition: int, offset: int) -> bool:
    """Whether ``msg.all``'s ``offset`` in ``partition`` lies between the two cuts of one of
    the client's replays."""
    for first, second in (state.replay_windows or {}).values():
        if partition < len(first) and first[partition] <= offset < second[partition]:
            return True
    return False


def replayed_already(state: ConnectionState, message: FanOut, target: Target) -> bool:
    """Whether a live ``message`` for ``target`` was delivered by a replay already (its
    origin is one the replay handed over from between its cuts): then it is dropped, and
    its origin forgotten (a message comes live to a client once). A message store's
    delivery (a Packet Identifier of its own) is reported to it as complete, as one
    withheld is (:mod:`services.ingest.delivery`): it must not come again. A message
    without an origin (a record of an older router or store) passes."""
    origins = state.replayed_origins
    origin = message.origin
    if not origins or origin is None:
        return False
    key = (origin.partition, origin.offset)
    if key not in origins:
        return False
    origins.discard(key)
    if target.qos and target.packet_id:
        delivery.completed_unsent(state, target.qos, target.packet_id)
    return True


def remember(state: ConnectionState, message: FanOut) -> None:
    """A replay read ``message`` (its ``msg.all`` origin): remembered when it lies between
    a replay's two cuts, so that its live copy is dropped (:func:`replayed_already`).
    A resumed replay calls it alone for what the client acknowledged before."""
    origin = message.origin
    if origin is not None and _in_window(state, origin.partition, origin.offset):
        if state.replayed_origins is None:
            state.replayed_origins = set()
        state.replayed_origins.add((origin.partition, origin.offset))


def replayed(
    state: ConnectionState, message: FanOut, target: Target, topic_filter: str = ""
) -> list[Effect]:
    """Send one replayed ``message`` of the replay of ``topic_filter`` to the client as
    ``target`` says (QoS, Retain As Published, Subscription Identifiers, DUP: a resumed
    replay's resend); v5 clients see ``replayed=true``. Its origin is remembered
    (:func:`remember`); in a persistent session, a QoS 1 one goes with its own Packet
    Identifier (:func:`packet_id`) and its origin is kept until its PUBACK (:func:`mark`)."""
    remember(state, message)
    if state.phase is not Phase.CONNECTED:
        return []
    packet = message.publish(target, state.protocol_version)
    if state.protocol_version == 5:
        packet.properties.user_properties = [*packet.properties.user_properties, REPLAYED]
    own_id = packet_id(state, topic_filter, message, target)
    effects = delivery.deliver(state, packet, message.expires_at_ms, own_id)
    origin = message.origin
    if state.persistent and packet.packet_id in state.outbound and origin is not None:
        if state.replay_inflight is None:
            state.replay_inflight = {}
        state.replay_inflight[packet.packet_id] = (topic_filter, origin.partition, origin.offset)
    return effects


def mark(
    state: ConnectionState, topic_filter: str, positions: Sequence[int], sent: Sequence[int]
) -> list[Effect]:
    """Store how far the persistent session's replay of ``topic_filter`` got, before its
    reader sends anything past its stored ``sent`` marks: ``positions[p]`` is the offset
    of ``msg.all`` partition ``p`` the reader has handed over everything below,
    ``sent[p]`` what it may send up to once this is stored (both one per partition).

    The subscription's :class:`~services.common.subscription.ReplayProgress` gets ``next``,
    the lower of the position and the oldest QoS 1 message in flight of each partition,
    and ``sent``; the whole subscription set is written (``client.subscriptions``, in
    order with the connection's other changes). :func:`marked` says when it is stored.
    Nothing is written for a subscription that is gone (UNSUBSCRIBE), or on a connection
    no longer connected."""
    subscription = state.subscriptions.get(topic_filter)
    if state.phase is not Phase.CONNECTED or subscription is None or subscription.replay is None:
        return []
    inflight = state.replay_inflight or {}
    for packet_id in [p for p, _ in inflight.items() if p not in state.outbound]:
        del inflight[packet_id]  # acknowledged
    following = list(positions)
    for packet_id, (owner, partition, offset) in inflight.items():
        if owner == topic_filter and state.outbound[packet_id].store_assigned is False:
            following[partition] = min(following[partition], offset)
    progress = dataclasses.replace(subscription.replay, next=tuple(following), sent=tuple(sent))
    updated = dataclasses.replace(subscription, replay=progress)
    state.subscriptions = {**state.subscriptions, topic_filter: updated}
    if state.replay_marks is None:
        state.replay_marks = {}
    state.replay_marks[topic_filter] = state.replay_marks.get(topic_filter, 0) + 1
    token = state.new_token(PendingReplayMark(topic_filter))
    return [StoreSubscriptions(token, list(state.subscriptions.values()))]


def marked(state: ConnectionState, topic_filter: str) -> bool:
    """Whether every progress of the replay of ``topic_filter`` asked for by :func:`mark`
    is stored (or none is being stored)."""
    return not state.replay_marks or topic_filter not in state.replay_marks


def mark_stored(state: ConnectionState, waiter: PendingReplayMark) -> None:
    """Kafka acknowledged one progress :func:`mark` wrote: once all are, its reader may
    go on."""
    marks = state.replay_marks
    if marks is not None and waiter.topic_filter in marks:
        marks[waiter.topic_filter] -= 1
        if not marks[waiter.topic_filter]:
            del marks[waiter.topic_filter]


def finished(state: ConnectionState, topic_filter: str) -> list[Effect]:
    """The replay of ``topic_filter`` ended (all history sent, stopped by UNSUBSCRIBE, or
    replaced by a new one): once no replay runs, the held live messages go, in order,
    but for those a replay delivered (:func:`replayed_already`). In a persistent session
    they wait until the replays' own deliveries in flight are acknowledged
    (:func:`drained`): a message store's Packet Identifiers may be any."""
    if state.replaying is None:
        return []
    state.replaying.discard(topic_filter)
    if state.replaying:
        return []
    state.replaying = None
    if state.persistent:
        state.replay_draining = True
        return drained(state)
    return _release(state)


def drained(state: ConnectionState) -> list[Effect]:
    """A delivery was acknowledged: in a persistent session whose replays ended, the held
    live messages go once none of the node's own Packet Identifiers is in flight."""
    if not state.replay_draining:
        return []
    if any(not entry.store_assigned for entry in state.outbound.values()):
        return []
    state.replay_draining = False
    return _release(state)


def _release(state: ConnectionState) -> list[Effect]:
    """Send the held live messages, in order, but for those a replay delivered."""
    held, state.held = state.held, None
    effects: list[Effect] = []
    for message, target in held or ():
        if state.phase is not Phase.CONNECTED:
            break
        if replayed_already(state, message, target):
            continue
        effects.extend(delivery.deliver_routed(state, message, target))
    return effects
