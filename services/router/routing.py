"""The router's state and decisions, without Kafka: who gets a message, on which node.

:class:`RoutingTable` holds the subscription trie (from ``client.subscriptions``) and the
latest session record of every client (from ``client.sessions``). :meth:`RoutingTable.route`
turns one message into one target list per ingest node (DESIGN.md: one downlink record per
message per node, never one per subscriber).
"""

from __future__ import annotations

import logging
from collections import defaultdict

from services.common.mqtt.errors import MQTTError
from services.common.records import (
    PublishMeta,
    RecordError,
    SessionRecord,
    Target,
    decode_session,
    decode_subscriptions,
)
from services.common.topics.trie import Subscription, SubscriptionTrie

log = logging.getLogger(__name__)


def _client_id(key: bytes) -> str:
    """A state record's key as a client id; RecordError if it is not UTF-8."""
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecordError(f"record key is not UTF-8: {exc}") from exc


class RoutingTable:
    """Subscriptions and client locations, as seen in the compacted state topics."""

    def __init__(self) -> None:
        self.trie = SubscriptionTrie()
        self.sessions: dict[str, SessionRecord] = {}
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

    def _node_of(self, client_id: str) -> str | None:
        session = self.sessions.get(client_id)
        if session is None or not session.connected:
            return None
        return session.node_id

    def route(self, publisher: str, meta: PublishMeta) -> dict[str, list[Target]]:
        """Targets of one message, grouped by ingest node id.

        Granted QoS is min(publish QoS, subscription QoS) (MQTT 3.8.4); overlapping
        subscriptions of one client give one delivery at their highest QoS (MQTT 3.3.4); one
        connected member of each shared subscription group gets the message, round robin
        (MQTT 4.8.2). Clients that are not connected are skipped: their sessions are not
        persistent (persistent delivery goes through ``msg.persisted``, a later stage).
        """
        match = self.trie.match(meta.topic, publisher)
        by_node: dict[str, list[Target]] = defaultdict(list)
        for client in match.clients.values():
            node = self._node_of(client.client_id)
            if node is not None:
                by_node[node].append(
                    Target(
                        client.client_id,
                        min(meta.qos, client.qos),
                        client.retain_as_published,
                        tuple(client.subscription_identifiers),
                    )
                )
        for group_key, members in match.shared.items():
            chosen = self._choose_member(group_key, members)
            if chosen is None:
                continue
            sub, node = chosen
            ids = () if sub.subscription_identifier is None else (sub.subscription_identifier,)
            by_node[node].append(
                Target(sub.client_id, min(meta.qos, sub.qos), sub.retain_as_published, ids)
            )
        return by_node

    def _choose_member(
        self, group_key: tuple[str, str], members: list[Subscription]
    ) -> tuple[Subscription, str] | None:
        """Round robin over the group's connected members; None when none is connected."""
        ordered = sorted(members, key=lambda s: s.client_id)
        start = self._next_member[group_key]
        for step in range(len(ordered)):
            sub = ordered[(start + step) % len(ordered)]
            node = self._node_of(sub.client_id)
            if node is not None:
                self._next_member[group_key] = (start + step + 1) % len(ordered)
                return sub, node
        return None
