"""The router's state and decisions, without Kafka: who gets a message, and by which path.

:class:`RoutingTable` holds the subscription trie (from ``client.subscriptions``), the
latest session record of every client (from ``client.sessions``) and the retained messages
(from ``msg.retained``). :meth:`RoutingTable.route` turns one message into :class:`Routes`:
one target list per ingest node for connected non-persistent sessions (docs/design.md: one
downlink record per message per node, never one per subscriber), one target per
persistent DEVICE session, whose messages go through its store (``msg.persisted``) whether
it is connected or not, and one target per persistent APPLICATION session, whose messages go
to its own topic (``msg.app.<client>``, read by app_delivery), connected or not. A Shared
Subscription whose chosen member is a persistent APPLICATION client gets one record in the
group's topic (``msg.app-shared.<group>``) instead: its APPLICATION members read that topic
as one Kafka consumer group (TBMQ's APPLICATION shared subscriptions).
:meth:`RoutingTable.retained_for` answers a retained message request (a new subscription,
MQTT 3.3.1.3) the same way.

The table counts the state records it applies (:attr:`RoutingTable.version`) and remembers
what the latest ones changed, so :meth:`RoutingTable.outdated` can tell whether messages
routed at an earlier version would be routed differently now: the router routes before it
knows it has read every state record it must honour, and checks before its routing counts
(router/main.py).
"""

from __future__ import annotations

import logging
from collections import defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import islice

from services.common.mqtt.errors import MQTTError
from services.common.records import (
    Headers,
    Message,
    PublishMeta,
    RecordError,
    RetainedRequest,
    SessionRecord,
    Target,
    expires_at_ms,
    parse_client_session,
    parse_client_subscriptions,
    parse_retained,
    stale_delete,
)
from services.common.sessions import DeliveryPath, delivery_path
from services.common.subscription import Subscription
from services.common.topics.retained import RetainedStore
from services.common.topics.trie import SubscriptionTrie

log = logging.getLogger(__name__)

#: State changes :meth:`RoutingTable.outdated` can look back over (one per state record
#: applied); a check reaching further back answers "outdated".
JOURNAL_LENGTH = 10_000

#: Subscriptions of changed clients :meth:`RoutingTable.outdated` matches messages against
#: at most; past that (a client replacing thousands at once) it answers "outdated" rather
#: than index them all.
OUTDATED_MAX_SUBSCRIPTIONS = 1_000


@dataclass(frozen=True, slots=True)
class StateChange:
    """What one applied state record changed: a client's subscriptions or session
    (``client_id``, with ``subscriptions``: the client's subscriptions before and after, the
    ones whose messages the change may reroute), or a retained message (``retained_topic``)."""

    client_id: str | None = None
    subscriptions: tuple[Subscription, ...] = ()
    retained_topic: str | None = None


@dataclass(slots=True)
class Routes:
    """Where one message goes.

    ``by_node``: ingest node id → its targets (connected non-persistent sessions), one
    downlink record each; ``persisted``: one target per persistent DEVICE session, one
    ``msg.persisted`` record each (keyed by the target's client id); ``app``: one
    (target, session id) per persistent APPLICATION session, one ``msg.app.<client>``
    record each; ``app_shared``: the Shared Subscriptions, as (ShareName, Topic Filter), that
    get one ``msg.app-shared.<group>`` record each.
    """

    by_node: dict[str, list[Target]] = field(default_factory=lambda: defaultdict(list))
    persisted: list[Target] = field(default_factory=list)
    app: list[tuple[Target, bytes]] = field(default_factory=list)
    app_shared: list[tuple[str, str]] = field(default_factory=list)

    def add(self, session: SessionRecord | None, target: Target) -> None:
        """Add ``target``, whose client's latest session record is ``session``, by its
        :func:`~services.common.sessions.delivery_path` (none: not added)."""
        path = delivery_path(session)
        if path is DeliveryPath.NONE:
            return
        assert session is not None
        if path is DeliveryPath.PERSISTED:
            self.persisted.append(target)
        elif path is DeliveryPath.APPLICATION:
            self.app.append((target, session.session_id))
        else:
            self.by_node[session.node_id].append(target)


def _routed_alike(before: list[Subscription], after: list[Subscription]) -> bool:
    """Whether two subscription sets of one client route every message alike: the same
    subscriptions (options included) with the same cuts; they may differ in a replay's
    :class:`~services.common.subscription.ReplayProgress`, which the router never reads."""

    def routing(subs: list[Subscription]) -> dict[str, tuple[object, ...]]:
        return {
            s.topic_filter: (
                s,
                None if s.live_from is None else (s.live_from.offsets, s.live_from.every_message),
            )
            for s in subs
        }

    return len(before) == len(after) and routing(before) == routing(after)


class RoutingTable:
    """Subscriptions, client locations and retained messages, from the compacted topics."""

    def __init__(self) -> None:
        self.trie = SubscriptionTrie()
        self.sessions: dict[str, SessionRecord] = {}
        self.retained: RetainedStore[Message] = RetainedStore()
        self._next_member: dict[tuple[str, str], int] = defaultdict(int)
        #: State records applied so far: a routing decision made now is made at this version.
        self.version = 0
        self._journal: deque[StateChange] = deque(maxlen=JOURNAL_LENGTH)

    def _changed(self, change: StateChange) -> None:
        self.version += 1
        self._journal.append(change)

    def set_subscriptions(self, client_id: str, subs: list[Subscription]) -> None:
        """Replace ``client_id``'s whole subscription set (an empty list removes it).

        An entry the trie refuses (an invalid filter in a garbage record) is logged and
        skipped; the client's other subscriptions still apply.
        """
        before = self.trie.subscriptions_of(client_id)
        if not _routed_alike(before, subs):
            # A replay's progress alone (a persistent session's, stored every few dozen
            # messages) routes nothing otherwise: it does not outdate a transaction.
            self._changed(StateChange(client_id, (*before, *subs)))
        self.trie.remove_client(client_id)
        for sub in subs:
            try:
                self.trie.add(sub)
            except MQTTError as exc:
                log.warning("skipping subscription %r of %r: %r", sub.topic_filter, client_id, exc)

    def set_session(self, client_id: str, record: SessionRecord | None) -> None:
        """Record where ``client_id`` is connected; None (a tombstone) forgets the client."""
        self._changed(StateChange(client_id, tuple(self.trie.subscriptions_of(client_id))))
        if record is None:
            self.sessions.pop(client_id, None)
        else:
            self.sessions[client_id] = record

    def apply_subscriptions_record(
        self, key: bytes, value: bytes | None, headers: Headers = ()
    ) -> None:
        """Apply one ``client.subscriptions`` record; a late delete of an older session
        (:func:`~services.common.records.stale_delete`) is not. Raises ``RecordError`` on
        garbage."""
        client_id, subscriptions = parse_client_subscriptions(key, value)
        if not stale_delete(self.sessions.get(client_id), value, headers):
            self.set_subscriptions(client_id, subscriptions)

    def apply_session_record(self, key: bytes, value: bytes | None, headers: Headers = ()) -> None:
        """Apply one ``client.sessions`` record; a late delete of an older session is not.
        Raises ``RecordError`` on garbage."""
        client_id, record = parse_client_session(key, value)
        if not stale_delete(self.sessions.get(client_id), value, headers):
            self.set_session(client_id, record)

    def apply_retained_record(self, key: bytes, value: bytes | None, headers: Headers) -> None:
        """Apply one ``msg.retained`` record (key = Topic Name; a tombstone deletes).

        Raises ``RecordError`` on garbage (a record without metadata included).
        """
        topic, message = parse_retained(key, value, headers)
        self._changed(StateChange(retained_topic=topic))
        if message is None:
            self.retained.delete(topic)
        else:
            self.retained.set(topic, message)

    def outdated(
        self, version: int, topics: Iterable[str], requests: Iterable[RetainedRequest] = ()
    ) -> bool:
        """Whether messages to ``topics`` and answers to retained message ``requests``
        decided at :attr:`version` ``version`` could be decided otherwise now.

        False when no state record was applied since. Otherwise True if a client whose
        subscriptions or session changed has (had, before the change) a subscription
        matching one of ``topics`` (a shared one included: its group's member choice may
        differ), or made one of ``requests``; if a retained message changed on a topic one
        of ``requests`` matches; and, without looking, when the changes reach back beyond
        :data:`JOURNAL_LENGTH` records or the changed clients hold more than
        :data:`OUTDATED_MAX_SUBSCRIPTIONS` subscriptions. Conservative: True does not mean
        the decisions differ.
        """
        gap = self.version - version
        if gap <= 0:
            return False
        if gap > len(self._journal):
            return True
        changes = list(islice(self._journal, len(self._journal) - gap, None))
        changed = SubscriptionTrie()
        clients: set[str] = set()
        retained_topics: list[str] = []
        for change in changes:
            if change.client_id is None:
                retained_topics.append(change.retained_topic or "")
                continue
            clients.add(change.client_id)
            for sub in change.subscriptions:
                if len(changed) >= OUTDATED_MAX_SUBSCRIPTIONS:
                    return True
                try:
                    changed.add(sub)
                except MQTTError:
                    continue  # never in the trie, so it routes nothing
        for topic in topics:
            match = changed.match(topic)
            if match.clients or match.shared:
                return True
        for request in requests:
            if request.client_id in clients:
                return True
            if retained_topics and _any_match(request.subscriptions, retained_topics):
                return True
        return False

    def path(self, client_id: str) -> DeliveryPath:
        """The :class:`~services.common.sessions.DeliveryPath` of ``client_id``'s messages."""
        return delivery_path(self.sessions.get(client_id))

    def route(
        self, publisher: str, meta: PublishMeta, position: tuple[int, int] | None = None
    ) -> Routes:
        """Where one message goes (:class:`Routes`).

        ``position`` is the message's ``msg.all`` (partition, offset). A PUBLISH with RETAIN
        is not sent live to a subscription whose
        :class:`~services.common.subscription.LiveFrom` cut lies after it: it was
        acknowledged before that SUBSCRIBE, which gets it as the retained copy
        (:meth:`retained_for`), so each message reaches the subscription once (MQTT
        3.3.1.3). Under a replay subscription's cut (``LiveFrom.every_message``) no
        PUBLISH is sent live: the subscriber's ingest node replays it
        (:mod:`services.ingest.replay`).

        Granted QoS is min(publish QoS, subscription QoS) (MQTT 3.8.4); overlapping
        subscriptions of one client give one delivery at their highest QoS (MQTT 3.3.4); one
        member of each shared subscription group gets the message, round robin over the
        connected members, or over the persistent ones when none is connected (MQTT 4.8.2).
        When the member chosen is a persistent APPLICATION client, the message goes to the
        group's topic, which all its APPLICATION members share through Kafka: in a group
        of DEVICE and APPLICATION members, a DEVICE member's turn goes to it and an
        APPLICATION member's turn to the group's topic.
        """
        where = None if position is None else (*position, meta.retain)
        match = self.trie.match(meta.topic, publisher, where)
        routes = Routes()
        sessions = self.sessions
        for client in match.clients.values():
            session = sessions.get(client.client_id)
            if session is not None:
                target = Target(
                    client.client_id,
                    min(meta.qos, client.qos),
                    client.retain_as_published,
                    tuple(client.subscription_identifiers),
                )
                routes.add(session, target)
        for group_key, members in match.shared.items():
            chosen = self._choose_member(group_key, members)
            if chosen is None:
                continue
            sub, session = chosen
            if delivery_path(session) is DeliveryPath.APPLICATION:
                routes.app_shared.append(group_key)
                continue
            ids = () if sub.subscription_identifier is None else (sub.subscription_identifier,)
            routes.add(
                session,
                Target(sub.client_id, min(meta.qos, sub.qos), sub.retain_as_published, ids),
            )
        return routes

    def retained_for(
        self, client_id: str, subscriptions: list[Subscription], now_ms: int
    ) -> list[tuple[Message, Target]]:
        """The retained messages a client's new ``subscriptions`` must receive (3.3.1.3).

        One delivery per matching topic, with RETAIN set (``retain_as_published`` forces
        it: MQTT 3.3.1.3 asks for RETAIN 1 on these), at min(message QoS, subscription QoS)
        over the matching subscriptions, carrying their Subscription Identifiers. Expired
        messages (Message Expiry Interval passed at ``now_ms``, Unix ms) are left out.
        Nothing when the client has no destination.
        """
        if self.path(client_id) is DeliveryPath.NONE:
            return []
        found: dict[str, tuple[Message, int, list[int]]] = {}
        for sub in subscriptions:
            for topic, message in self.retained.match(sub.topic_filter):
                qos = min(message.meta.qos, sub.qos)
                _, best, ids = found.get(topic, (message, -1, []))
                if sub.subscription_identifier is not None:
                    ids = sorted([*ids, sub.subscription_identifier])
                found[topic] = (message, max(best, qos), ids)
        deliveries = []
        for message, qos, ids in found.values():
            try:
                deadline = expires_at_ms(message.meta)
            except RecordError as exc:
                log.warning("skipping retained message with bad properties: %r", exc)
                continue
            if deadline is None or deadline > now_ms:
                deliveries.append((message, Target(client_id, qos, True, tuple(ids))))
        return deliveries

    def _choose_member(
        self, group_key: tuple[str, str], members: list[Subscription]
    ) -> tuple[Subscription, SessionRecord] | None:
        """Round robin over the group's connected members, else over its persistent members
        (stored until they return); None when there is neither. Returns the member's
        subscription and latest session record."""
        ordered = sorted(members, key=lambda s: s.client_id)
        start = self._next_member[group_key]
        fallback: tuple[Subscription, SessionRecord] | None = None
        for step in range(len(ordered)):
            sub = ordered[(start + step) % len(ordered)]
            session = self.sessions.get(sub.client_id)
            if session is None or delivery_path(session) is DeliveryPath.NONE:
                continue
            if session.connected:
                self._next_member[group_key] = (start + step + 1) % len(ordered)
                return sub, session
            if fallback is None:
                fallback = sub, session
                self._next_member[group_key] = (start + step + 1) % len(ordered)
        return fallback


def _any_match(subscriptions: list[Subscription], topics: list[str]) -> bool:
    """Whether one of ``subscriptions`` matches one of ``topics`` (valid Topic Names)."""
    trie = SubscriptionTrie()
    for sub in subscriptions:
        try:
            trie.add(sub)
        except MQTTError:
            continue
    for topic in topics:
        match = trie.match(topic)
        if match.clients or match.shared:
            return True
    return False
