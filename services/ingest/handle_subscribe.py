"""SUBSCRIBE/SUBACK and UNSUBSCRIBE/UNSUBACK (MQTT 3.1.1 3.8-3.11; MQTT 5.0 3.8-3.11).

The client's whole subscription set is rewritten to ``client.subscriptions`` (compacted, keyed
by client id) and SUBACK/UNSUBACK is sent only once Kafka stored it: a subscription that was
acknowledged is seen by every router.

Retained messages (MQTT 3.3.1.3, 5.0 3.8.3.1 Retain Handling) are kept and sent by the
router; a SUBSCRIBE asks for them with one ``msg.all`` record listing the new subscriptions
that want them, and its SUBACK also waits for that record. Each such subscription carries a
:class:`~services.common.subscription.LiveFrom` cut, the ``msg.all`` end offsets the shell
reads before storing it (:mod:`services.ingest.store_pipeline`): a PUBLISH with RETAIN
below the cut reaches it as the retained copy only, never live as well.

A Topic Filter the client's rules do not grant (:mod:`services.common.auth.authorize`: one
lying wholly inside a denied subtree, or reaching no allowed topic) fails its own entry:
0x87 Not authorized (v5), 0x80 Failure (v3.1.1); it asks for no retained messages. A filter
granted over a denied subtree (``#`` with ``deny subscribe admin/#``) is granted: the
messages of the denied topics, retained ones included, are withheld at delivery
(:mod:`services.ingest.delivery`).

A replay subscription, ``$replay/<since>/<filter>`` (:mod:`services.common.topics.replay`,
:mod:`services.ingest.handle_replay`), is a subscription to ``<filter>``: it replaces the
client's subscription to that filter (MQTT 3.8.4), UNSUBSCRIBE of either form removes it,
and it is authorized and limited as ``<filter>`` is. It asks for no retained messages (its
history holds them) and carries a replay cut; the replay starts once the SUBACK is sent.
Its own failures, per entry (v3.1.1: 0x80 for each): a ``<since>`` that is no duration or
RFC 3339 time, lies in the future, or a replay inside a Shared Subscription (either way
round) gets 0x8F Topic Filter invalid; a ``<since>`` older than ``max_replay_age_seconds``
0x97 Quota exceeded. A persistent session's replay (Clean Start 0 or a Session Expiry
Interval) keeps its progress with the subscription (:mod:`services.ingest.handle_replay`)
and is granted QoS 1 at most. A ``<since>`` older than
``msg.all``'s retention is granted and starts at the oldest message kept; a v5 SUBACK says
so in its Reason String (unless the client asked for no problem information, MQTT 5.0
3.1.2.11.7).
"""

from __future__ import annotations

import logging

from services.common.auth.authorize import Grant
from services.common.mqtt.errors import MQTTError, ProtocolError
from services.common.mqtt.packets import SubAck, Subscribe, UnsubAck, Unsubscribe
from services.common.mqtt.reason_codes import ReasonCode
from services.common.records import EventKind
from services.common.subscription import LiveFrom, Subscription
from services.common.topics.replay import REPLAY_PREFIX, parse_replay, since_ms
from services.common.topics.validation import parse_shared, validate_topic_filter
from services.ingest import events, handle_replay
from services.ingest.effects import (
    Effect,
    LimitRefused,
    Send,
    StartReplay,
    StopReplay,
    StoreRetainedRequest,
    StoreSubscriptions,
)
from services.ingest.limits import Refusal
from services.ingest.state import ConnectionState, PendingSubAck

log = logging.getLogger(__name__)

MAX_GRANTED_QOS = 2
"""The highest QoS granted to a subscription (MQTT 3.8.4): every QoS is delivered."""

MAX_PERSISTENT_REPLAY_QOS = 1
"""The highest QoS granted to a persistent session's replay subscription: its progress
is stored, the state of QoS 2 exchanges of replayed messages is not."""


def _failure(state: ConnectionState, exc: MQTTError) -> int:
    """The per-filter failure code: the Reason Code (v5) or 0x80 Failure (v3.1.1)."""
    return exc.reason_code if state.protocol_version == 5 else 0x80


def wants_retained(retain_handling: int, existed: bool, shared: bool) -> bool:
    """Whether a subscription just made gets the matching retained messages.

    Retain Handling (MQTT 5.0 3.8.3.1): 0 at every subscribe, 1 only if the subscription
    did not exist before, 2 never; MQTT 3.1.1 subscriptions behave as 0 (3.3.1.3). A Shared
    Subscription never gets retained messages on subscribe (MQTT 5.0 4.8.2).
    """
    if shared:
        return False
    return retain_handling == 0 or (retain_handling == 1 and not existed)


def handle_subscribe(state: ConnectionState, packet: Subscribe) -> list[Effect]:
    """Add or replace subscriptions; SUBACK carries one return/Reason Code per filter.

    Raises :class:`ProtocolError` for No Local on a Shared Subscription (MQTT 5.0 3.8.3-4).
    An invalid Topic Filter fails only its own entry (0x8F in v5, 0x80 in v3.1.1), and so
    does one the client may not subscribe to (0x87 in v5, 0x80 in v3.1.1; one granted over a
    denied subtree is granted, its denied topics withheld at delivery), and one over the
    server's limits (``max_topic_levels`` levels, a new filter beyond ``max_subscriptions``):
    0x97 Quota exceeded in v5, 0x80 in v3.1.1, with a :class:`LimitRefused` effect per limit for
    the node's counters.
    """
    ids = packet.properties.subscription_identifiers
    identifier = ids[0] if ids else None
    updated = dict(state.subscriptions)
    retained: dict[str, Subscription] = {}
    replays: dict[str, tuple[Subscription, int]] = {}
    notes: list[str] = []
    codes: list[int] = []
    refused: dict[Refusal, LimitRefused] = {}
    limits = state.limits
    for request in packet.subscriptions:
        try:
            validate_topic_filter(request.topic_filter)
            shared = parse_shared(request.topic_filter)
            replay = parse_replay(request.topic_filter)
            if shared is not None and shared.topic_filter.startswith(REPLAY_PREFIX):
                raise MQTTError("a replay cannot be a Shared Subscription",
                                ReasonCode.TOPIC_FILTER_INVALID)  # fmt: skip
            since = None if replay is None else since_ms(replay.since, state.now_ms())
        except MQTTError as exc:
            codes.append(_failure(state, exc))
            continue
        if shared is not None and request.no_local:
            raise ProtocolError("No Local is not allowed on a Shared Subscription")
        # A replay subscribes to its inner Topic Filter: that is what is authorized,
        # limited, stored and routed.
        topic_filter = request.topic_filter if replay is None else replay.topic_filter
        if since is not None:
            refusal = _replay_refused(state, since)
            if refusal is not None:
                if isinstance(refusal, LimitRefused):
                    refused.setdefault(refusal.refusal, refusal)
                    refusal = MQTTError(refusal.detail, ReasonCode.QUOTA_EXCEEDED)
                log.info("client %r: replay %r refused: %s", state.client_id,
                         request.topic_filter, refusal.message)  # fmt: skip
                codes.append(_failure(state, refusal))
                continue
        grant = state.authorizer.subscribe_grant(topic_filter)
        if grant is Grant.REFUSED:
            log.info("client %r may not subscribe to %r: refused", state.client_id,
                     request.topic_filter)  # fmt: skip
            codes.append(_failure(state, MQTTError("not authorized", ReasonCode.NOT_AUTHORIZED)))
            continue
        if grant is Grant.FILTERED:
            log.debug("client %r subscribes to %r: its denied topics will be withheld",
                      state.client_id, request.topic_filter)  # fmt: skip
        inner = topic_filter if shared is None else shared.topic_filter
        over = None
        if inner.count("/") >= limits.max_topic_levels:
            over = LimitRefused(Refusal.TOPIC_LEVELS, f"more than {limits.max_topic_levels} levels")
        elif topic_filter not in updated and len(updated) >= limits.max_subscriptions:
            over = LimitRefused(Refusal.SUBSCRIPTIONS, f"more than {limits.max_subscriptions}")
        if over is not None:
            refused.setdefault(over.refusal, over)
            codes.append(_failure(state, MQTTError(over.detail, ReasonCode.QUOTA_EXCEEDED)))
            continue
        granted = min(request.qos, MAX_GRANTED_QOS)
        if since is not None and state.persistent:
            # A persistent replay keeps its progress, not its QoS 2 exchanges (PUBREL).
            granted = min(granted, MAX_PERSISTENT_REPLAY_QOS)
        before = state.subscriptions.get(topic_filter)
        wanted = since is None and wants_retained(
            request.retain_handling, before is not None, shared is not None
        )
        if since is not None:
            # Every message below a replay's cut is replayed, not sent live.
            live_from: LiveFrom | None = LiveFrom(every_message=True)
        elif wanted:
            # A new cut where retained copies are asked for (the shell reads its offsets
            # before the subscription is stored).
            live_from = LiveFrom()
        else:
            live_from = None if before is None else before.live_from  # a repeat keeps its cut
        subscription = Subscription(
            client_id=state.client_id,
            topic_filter=topic_filter,
            qos=granted,
            no_local=request.no_local,
            retain_as_published=request.retain_as_published,
            retain_handling=request.retain_handling,
            subscription_identifier=identifier,
            live_from=live_from,
        )
        if wanted:
            retained[topic_filter] = subscription
        else:
            retained.pop(topic_filter, None)
        if since is not None:
            replays[topic_filter] = (subscription, since)
            if since < state.now_ms() - limits.msg_retention_seconds * 1000:
                notes.append(f"replay of {topic_filter} starts at the oldest message kept "
                             f"({limits.msg_retention_seconds} s)")  # fmt: skip
        else:
            replays.pop(topic_filter, None)
        updated[topic_filter] = subscription
        codes.append(granted)
    accepted = [(r.topic_filter, c) for r, c in zip(packet.subscriptions, codes, strict=True)
                if c < 0x80]  # fmt: skip
    suback = SubAck(packet.packet_id, codes)
    if notes and state.protocol_version == 5 and state.request_problem_information:
        suback.properties.reason_string = "; ".join(notes)
    for topic_filter in replays:
        handle_replay.started(state, topic_filter)
    return [
        *refused.values(),
        *_store(state, updated, suback, list(retained.values()), list(replays.values())),
        *events.subscriptions_changed(state, EventKind.SUBSCRIBED, accepted),
    ]


def _replay_refused(state: ConnectionState, since: int) -> MQTTError | LimitRefused | None:
    """Why a replay from ``since`` (Unix ms) cannot be granted on this connection, if it
    cannot: ``since`` beyond ``max_replay_age_seconds`` (a :class:`LimitRefused`; 0x97)."""
    max_age = state.limits.max_replay_age_seconds
    if state.now_ms() - since > max_age * 1000:
        return LimitRefused(Refusal.REPLAY_AGE, f"a replay reaching back more than {max_age} s")
    return None


def handle_unsubscribe(state: ConnectionState, packet: Unsubscribe) -> list[Effect]:
    """Remove subscriptions; v5 UNSUBACK says per filter whether one existed (0x11)."""
    updated = dict(state.subscriptions)
    codes: list[int] = []
    stopped: list[Effect] = []
    for topic_filter in packet.topic_filters:
        try:
            validate_topic_filter(topic_filter)
            replay = parse_replay(topic_filter)
        except MQTTError as exc:
            codes.append(exc.reason_code)
            continue
        inner = topic_filter if replay is None else replay.topic_filter
        if updated.pop(inner, None) is None:
            codes.append(ReasonCode.NO_SUBSCRIPTION_EXISTED)
            continue
        codes.append(ReasonCode.SUCCESS)
        if state.replaying and inner in state.replaying:
            stopped += [StopReplay(inner), *handle_replay.finished(state, inner)]
    ack = UnsubAck(packet.packet_id, codes if state.protocol_version == 5 else [])
    removed = [(f, 0) for f, c in zip(packet.topic_filters, codes, strict=True) if c == 0]
    return (
        _store(state, updated, ack, [])
        + stopped
        + events.subscriptions_changed(state, EventKind.UNSUBSCRIBED, removed)
    )


def _store(
    state: ConnectionState,
    updated: dict[str, Subscription],
    ack: SubAck | UnsubAck,
    retained: list[Subscription],
    replays: list[tuple[Subscription, int]] | None = None,
) -> list[Effect]:
    """Store the new set if it changed and the retained request if any, and send ``ack``
    once both are stored, followed by the ``replays`` (subscription, since in Unix ms) to
    start.

    An unchanged set is not written again, unless an earlier change is still being stored
    or a replay's new cut must be: then it is, so ``ack`` too waits until Kafka has it.
    """
    waiter = PendingSubAck(ack, 0, replays or [])
    effects: list[Effect] = []
    if updated != state.subscriptions or state.waiters(PendingSubAck) or replays:
        state.subscriptions = updated
        effects.append(StoreSubscriptions(state.new_token(waiter), list(updated.values())))
    if retained:
        effects.append(StoreRetainedRequest(state.new_token(waiter), retained))
    if not effects:
        return [Send(state.encode(ack))]
    waiter.outstanding = len(effects)
    return effects


def subscribe_outcome(state: ConnectionState, waiter: PendingSubAck) -> list[Effect]:
    """One store the SUBACK/UNSUBACK ``waiter`` holds is in Kafka; send it once all of
    them are."""
    waiter.outstanding -= 1
    if waiter.outstanding:
        return []
    return [
        Send(state.encode(waiter.packet)),
        *(StartReplay(subscription, since) for subscription, since in waiter.replays),
    ]
