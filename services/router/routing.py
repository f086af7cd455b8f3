"""The router's state and decisions, without Kafka: who gets a message, and by which path.

:class:`RoutingTable` holds the subscription trie (from ``client.subscriptions``), the
latest session record of every client (from ``client.sessions``) and the retained messages
(from ``msg.retained``). :meth:`RoutingTable.route` turns one message into :class:`Routes`:
one target list per ingest node for connected non-persistent sessions (DESIGN.md: one
downlink record per message per node, never one per subscriber), one target per
persistent DEVICE session, whose messages go through its store (``msg.persisted``) whether
it is connected or not, and one target per persistent APPLICATION session, whose messages go
to its own topic (``msg.app.<client>``, read by app_delivery), connected or not. A Shared
Subscription whose chosen member is a persistent APPLICATION client gets one record in the
group's topic (``msg.app-shared.<group>``) instead: its APPLICATION members read that topic
as one Kafka consumer group (TBMQ's APPLICATION shared subscriptions).
:meth:`RoutingTable.retained_for` answers a retained message request (a new subscription,
MQTT 3.3.1.3) the same way.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field

from services.common.mqtt.errors import MQTTError
from services.common.records import (
    ClientKind,
    PublishMeta,
    RecordError,
    SessionRecord,
    Target,
    decode_meta,
    decode_session,
    decode_subscriptions,
    expires_at_ms,
)
from services.common.topics.retained import RetainedStore
from services.common.topics.trie import Subscription, SubscriptionTrie

log = logging.getLogger(__name__)


def _client_id(key: bytes) -> str:
    """A state record's key as a client id; RecordError if it is not UTF-8."""
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecordError(f"record key is not UTF-8: {exc}") from exc


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

    def add(self, destination: str | None, target: Target, session_id: bytes = bytes(16)) -> None:
        """Add ``target`` for ``destination`` (:meth:`RoutingTable.destination`);
        ``session_id`` is the session an APPLICATION target's message is routed for."""
        if destination == PERSISTED:
            self.persisted.append(target)
        elif destination == APPLICATION:
            self.app.append((target, session_id))
        elif destination is not None:
            self.by_node[destination].append(target)


PERSISTED = "\x00persisted"
"""The destination of a persistent DEVICE session: its store, not a node (never a node id:
node ids are ``[A-Za-z0-9_-]``)."""

APPLICATION = "\x00application"
"""The destination of a persistent APPLICATION session: its own ``msg.app.<client>``
topic."""


@dataclass(frozen=True, slots=True)
class RetainedMessage:
    """A retained message as ``msg.retained`` holds it: decoded and raw metadata, payload."""

    meta: PublishMeta
    meta_raw: bytes
    payload: bytes


class RoutingTable:
    """Subscriptions, client locations and retained messages, from the compacted topics."""

    def __init__(self) -> None:
        self.trie = SubscriptionTrie()
        self.sessions: dict[str, SessionRecord] = {}
        self.retained: RetainedStore[RetainedMessage] = RetainedStore()
        self._next_member: dict[tuple[str, str], int] = defaultdict(int)

    def set_subscriptions(self, client_id: str, subs: list[Subscription]) -> None:
        """Replace ``client_id``'s whole subscription set (an empty list removes it).

        An entry the trie refuses (an invalid filter in a garbage record) is logged and
        skipped; the client's other subscriptions still apply.
        """
        self.trie.remove_client(client_id)
        for sub in subs:
            try:
                self.trie.add(sub)
            except MQTTError as exc:
                log.warning("skipping subscription %r of %r: %r", sub.topic_filter, client_id, exc)

    def set_session(self, client_id: str, record: SessionRecord | None) -> None:
        """Record where ``client_id`` is connected; None (a tombstone) forgets the client."""
        if record is None:
            self.sessions.pop(client_id, None)
        else:
            self.sessions[client_id] = record

    def apply_subscriptions_record(self, key: bytes, value: bytes | None) -> None:
        """Apply one ``client.subscriptions`` record. Raises ``RecordError`` on garbage."""
        client_id = _client_id(key)
        subs = [] if value is None else decode_subscriptions(client_id, value)
        self.set_subscriptions(client_id, subs)

    def apply_session_record(self, key: bytes, value: bytes | None) -> None:
        """Apply one ``client.sessions`` record. Raises ``RecordError`` on garbage."""
        client_id = _client_id(key)
        self.set_session(client_id, None if value is None else decode_session(value))

    def apply_retained_record(
        self, key: bytes, value: bytes | None, meta_raw: bytes | None
    ) -> None:
        """Apply one ``msg.retained`` record (key = Topic Name; a tombstone deletes).

        Raises ``RecordError`` on garbage (a record without metadata included).
        """
        topic = _client_id(key)
        if value is None:
            self.retained.delete(topic)
            return
        if meta_raw is None:
            raise RecordError("retained message without its metadata header")
        self.retained.set(topic, RetainedMessage(decode_meta(meta_raw), meta_raw, value))

    def destination(self, client_id: str) -> str | None:
        """Where ``client_id``'s messages go: :data:`PERSISTED` for a persistent DEVICE
        session and :data:`APPLICATION` for a persistent APPLICATION one (connected or not),
        the node id of a connected non-persistent session (either kind), or None (no
        session, or a non-persistent one that is not connected: dropped)."""
        session = self.sessions.get(client_id)
        if session is None:
            return None
        if session.persistent:
            return PERSISTED if session.kind is ClientKind.DEVICE else APPLICATION
        return session.node_id if session.connected else None

    def session_id(self, client_id: str) -> bytes:
        """The session id of ``client_id``'s latest session record (zeros if none)."""
        session = self.sessions.get(client_id)
        return bytes(16) if session is None else session.session_id

    def route(self, publisher: str, meta: PublishMeta) -> Routes:
        """Where one message goes (:class:`Routes`).

        Granted QoS is min(publish QoS, subscription QoS) (MQTT 3.8.4); overlapping
        subscriptions of one client give one delivery at their highest QoS (MQTT 3.3.4); one
        member of each shared subscription group gets the message, round robin over the
        connected members, or over the persistent ones when none is connected (MQTT 4.8.2).
        When the member chosen is a persistent APPLICATION client, the message goes to the
        group's topic, which all its APPLICATION members share through Kafka: in a group
        of DEVICE and APPLICATION members, a DEVICE member's turn goes to it and an
        APPLICATION member's turn to the group's topic.
        """
        match = self.trie.match(meta.topic, publisher)
        routes = Routes()
        for client in match.clients.values():
            destination = self.destination(client.client_id)
            if destination is not None:
                target = Target(
                    client.client_id,
                    min(meta.qos, client.qos),
                    client.retain_as_published,
                    tuple(client.subscription_identifiers),
                )
                routes.add(destination, target, self.session_id(client.client_id))
        for group_key, members in match.shared.items():
            chosen = self._choose_member(group_key, members)
            if chosen is None:
                continue
            sub, destination = chosen
            if destination == APPLICATION:
                routes.app_shared.append(group_key)
                continue
            ids = () if sub.subscription_identifier is None else (sub.subscription_identifier,)
            routes.add(
                destination,
                Target(sub.client_id, min(meta.qos, sub.qos), sub.retain_as_published, ids),
            )
        return routes

    def retained_for(
        self, client_id: str, subscriptions: list[Subscription], now_ms: int
    ) -> list[tuple[RetainedMessage, Target]]:
        """The retained messages a client's new ``subscriptions`` must receive (3.3.1.3).

        One delivery per matching topic, with RETAIN set (``retain_as_published`` forces
        it: MQTT 3.3.1.3 asks for RETAIN 1 on these), at min(message QoS, subscription QoS)
        over the matching subscriptions, carrying their Subscription Identifiers. Expired
        messages (Message Expiry Interval passed at ``now_ms``, Unix ms) are left out.
        Nothing when the client has no destination.
        """
        if self.destination(client_id) is None:
            return []
        found: dict[str, tuple[RetainedMessage, int, list[int]]] = {}
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
            except MQTTError as exc:
                log.warning("skipping retained message with bad properties: %r", exc)
                continue
            if deadline is None or deadline > now_ms:
                deliveries.append((message, Target(client_id, qos, True, tuple(ids))))
        return deliveries

    def _choose_member(
        self, group_key: tuple[str, str], members: list[Subscription]
    ) -> tuple[Subscription, str] | None:
        """Round robin over the group's connected members, else over its persistent members
        (stored until they return); None when there is neither."""
        ordered = sorted(members, key=lambda s: s.client_id)
        start = self._next_member[group_key]
        fallback: tuple[Subscription, str] | None = None
        for step in range(len(ordered)):
            sub = ordered[(start + step) % len(ordered)]
            destination = self.destination(sub.client_id)
            if destination is None:
                continue
            session = self.sessions[sub.client_id]
            if session.connected:
                self._next_member[group_key] = (start + step + 1) % len(ordered)
                return sub, destination
            if fallback is None:
                fallback = sub, destination
                self._next_member[group_key] = (start + step + 1) % len(ordered)
        return fallback
