"""The subscription trie: which subscriptions match a Topic Name (MQTT 5.0 4.7, 4.8.2, 3.3.4).

One node per Topic Filter level. Literal levels live in a per-node dict; the ``+`` and ``#``
children live in their own slots so a match looks them up by attribute instead of hashing.
A node holds the non-shared subscriptions whose filter ends at it (keyed by client id: a
client has at most one subscription per filter, MQTT 3.8.4) and the Shared Subscriptions
whose inner filter ends at it (keyed by ``(group, inner filter)``, then client id).

The router is the only user of :class:`SubscriptionTrie` on its hot path and calls it from a
single event loop; the class is not thread-safe.
"""

from __future__ import annotations

from bisect import insort
from dataclasses import dataclass

from services.common.mqtt.errors import ProtocolError
from services.common.subscription import MAX_SUBSCRIPTION_IDENTIFIER, Subscription
from services.common.topics.validation import SHARE_PREFIX, validate_topic_filter


@dataclass(slots=True)
class ClientMatch:
    """All of one client's matching non-shared subscriptions, collapsed (MQTT 3.3.4).

    Attributes:
        client_id: the subscriber.
        qos: the maximum granted QoS over the client's matching subscriptions; the delivery
            QoS is ``min(qos, publish QoS)``, which the caller computes.
        subscription_identifiers: the identifier of every matching subscription that has one,
            ascending; an identifier shared by two matching subscriptions appears twice.
        retain_as_published: True if any matching subscription has Retain As Published.
    """

    client_id: str
    qos: int
    subscription_identifiers: list[int]
    retain_as_published: bool


@dataclass(slots=True)
class MatchResult:
    """What one Topic Name matched.

    Attributes:
        clients: client id -> :class:`ClientMatch` for the non-shared subscriptions.
        shared: ``(group, inner topic filter)`` -> the members of that Shared Subscription
            (MQTT 4.8.2); the caller picks one member per key. A key is present only if it
            has at least one member.
    """

    clients: dict[str, ClientMatch]
    shared: dict[tuple[str, str], list[Subscription]]


class _Node:
    """One Topic Filter level. Dicts are created on first use: most nodes need only one."""

    __slots__ = ("children", "hash", "plus", "shared", "subs")

    def __init__(self) -> None:
        self.children: dict[str, _Node] | None = None
        self.plus: _Node | None = None
        self.hash: _Node | None = None
        self.subs: dict[str, Subscription] | None = None
        self.shared: dict[tuple[str, str], dict[str, Subscription]] | None = None

    def is_empty(self) -> bool:
        """True when the node holds no subscription and has no child (it can be pruned)."""
        return not (self.subs or self.shared or self.children or self.plus or self.hash)


def _split(topic_filter: str) -> tuple[tuple[str, str] | None, list[str]]:
    """Split an already validated filter into its share key (or None) and its levels."""
    if topic_filter.startswith(SHARE_PREFIX):
        group, _, inner = topic_filter[len(SHARE_PREFIX) :].partition("/")
        return (group, inner), inner.split("/")
    return None, topic_filter.split("/")


def _check_options(sub: Subscription, shared: bool) -> None:
    """Raise ProtocolError for option values MQTT 3.8.3.1 / 3.8.2.1.2 call a Protocol Error."""
    if not 0 <= sub.qos <= 2:
        raise ProtocolError(f"QoS {sub.qos} is not 0, 1 or 2 (MQTT 3.8.3.1)")
    if not 0 <= sub.retain_handling <= 2:
        raise ProtocolError(f"Retain Handling {sub.retain_handling} is not 0..2 (MQTT 3.8.3.1)")
    sid = sub.subscription_identifier
    if sid is not None and not 1 <= sid <= MAX_SUBSCRIPTION_IDENTIFIER:
        raise ProtocolError(f"Subscription Identifier {sid} is out of range (MQTT 3.8.2.1.2)")
    if shared and sub.no_local:
        raise ProtocolError("No Local on a Shared Subscription (MQTT 3.8.3.1)")


def _collect(
    node: _Node,
    clients: dict[str, ClientMatch],
    shared: dict[tuple[str, str], list[Subscription]],
    publisher: str | None,
    position: tuple[int, int, bool] | None,
) -> None:
    """Add the subscriptions ending at ``node`` to a match result being built."""
    subs = node.subs
    if subs:
        for client_id, sub in subs.items():
            if sub.no_local and client_id == publisher:
                continue
            live_from = sub.live_from
            if (
                live_from is not None
                and position is not None
                # most cuts are retained messages' and most messages lack RETAIN: no call
                and (position[2] or live_from.every_message)
                and not live_from.includes(*position)
            ):
                continue
            sid = sub.subscription_identifier
            found = clients.get(client_id)
            if found is None:
                clients[client_id] = ClientMatch(
                    client_id, sub.qos, [] if sid is None else [sid], sub.retain_as_published
                )
                continue
            # Overlapping subscriptions of one client (MQTT 3.3.4): one delivery at the
            # maximum QoS, carrying every matching subscription's identifier.
            if sub.qos > found.qos:
                found.qos = sub.qos
            if sid is not None:
                insort(found.subscription_identifiers, sid)
            if sub.retain_as_published:
                found.retain_as_published = True
    groups = node.shared
    if groups:
        # One node is one inner filter, so a (group, filter) key is never seen twice.
        for key, members in groups.items():
            shared[key] = list(members.values())


def _walk(
    node: _Node,
    levels: list[str],
    index: int,
    clients: dict[str, ClientMatch],
    shared: dict[tuple[str, str], list[Subscription]],
    publisher: str | None,
    position: tuple[int, int, bool] | None,
) -> None:
    """Collect matches below ``node`` for ``levels[index:]``.

    The literal path is followed in a loop; ``+`` branches wait on an explicit stack
    (created only when one is met) rather than recursing, because a filter may have up to
    32,768 ``+`` levels and recursion that deep would raise RecursionError in the router.
    """
    end = len(levels)
    pending: list[tuple[_Node, int]] | None = None
    while True:
        if node.hash is not None:
            # '#' matches the rest of the topic, zero levels included (4.7.1.2). A node
            # only exists while it holds a subscription or a child, and '#' is a leaf.
            _collect(node.hash, clients, shared, publisher, position)
        child: _Node | None = None
        if index == end:
            _collect(node, clients, shared, publisher, position)
        else:
            if node.plus is not None:
                if pending is None:
                    pending = []
                pending.append((node.plus, index + 1))
            if node.children is not None:
                child = node.children.get(levels[index])
        if child is not None:
            node = child
            index += 1
        elif pending:
            node, index = pending.pop()
        else:
            return


class SubscriptionTrie:
    """Every subscription known to a router, indexed for matching Topic Names.

    ``add``/``remove`` cost O(filter levels); ``match`` costs O(topic levels) per trie path
    the topic can take (one path per ``+`` branch) plus the matched subscriptions.
    """

    __slots__ = ("_by_client", "_count", "_root")

    def __init__(self) -> None:
        self._root = _Node()
        # client id -> topic filter as sent -> subscription; for replace, remove_client and
        # subscriptions_of without walking the trie.
        self._by_client: dict[str, dict[str, Subscription]] = {}
        self._count = 0

    def __len__(self) -> int:
        """The number of subscriptions (shared and non-shared)."""
        return self._count

    def add(self, sub: Subscription) -> bool:
        """Store ``sub``, replacing the subscription with the same client and filter.

        A ``$share/<group>/<filter>`` subscription is stored under ``<filter>`` as a member
        of ``group`` (MQTT 4.8.2).

        Returns:
            True if the subscription is new, False if it replaced an existing one with the
            same ``(client_id, topic_filter)`` (MQTT 3.8.4).

        Raises:
            TopicFilterInvalid (0x8F): ``sub.topic_filter`` is not a valid filter (4.7, 4.8.2).
            ProtocolError (0x82): QoS or Retain Handling not in 0..2, a Subscription
                Identifier outside 1..268,435,455, or No Local on a Shared Subscription
                (3.8.3.1, 3.8.2.1.2).
        """
        validate_topic_filter(sub.topic_filter)
        key, levels = _split(sub.topic_filter)
        _check_options(sub, key is not None)

        node = self._root
        for level in levels:
            if level == "+":
                child = node.plus
                if child is None:
                    child = node.plus = _Node()
            elif level == "#":
                child = node.hash
                if child is None:
                    child = node.hash = _Node()
            else:
                children = node.children
                if children is None:
                    children = node.children = {}
                child = children.get(level)
                if child is None:
                    child = children[level] = _Node()
            node = child

        if key is None:
            if node.subs is None:
                node.subs = {}
            node.subs[sub.client_id] = sub
        else:
            if node.shared is None:
                node.shared = {}
            node.shared.setdefault(key, {})[sub.client_id] = sub

        filters = self._by_client.setdefault(sub.client_id, {})
        is_new = sub.topic_filter not in filters
        filters[sub.topic_filter] = sub
        if is_new:
            self._count += 1
        return is_new

    def remove(self, client_id: str, topic_filter: str) -> bool:
        """Remove the subscription of ``client_id`` to ``topic_filter`` (as it was sent).

        Nodes left without subscriptions or children are pruned, so the trie's size follows
        the live subscriptions, not their history.

        Returns:
            True if the subscription existed, False otherwise (including an invalid filter).
        """
        filters = self._by_client.get(client_id)
        if filters is None or filters.pop(topic_filter, None) is None:
            return False
        if not filters:
            del self._by_client[client_id]
        self._count -= 1

        key, levels = _split(topic_filter)
        # The walk cannot miss: the index above says the subscription is stored.
        path: list[tuple[_Node, str]] = []
        node = self._root
        for level in levels:
            path.append((node, level))
            if level == "+":
                child = node.plus
            elif level == "#":
                child = node.hash
            else:
                assert node.children is not None
                child = node.children.get(level)
            assert child is not None
            node = child

        if key is None:
            assert node.subs is not None
            del node.subs[client_id]
        else:
            assert node.shared is not None
            members = node.shared[key]
            del members[client_id]
            if not members:
                del node.shared[key]

        for parent, level in reversed(path):
            if not node.is_empty():
                break
            if level == "+":
                parent.plus = None
            elif level == "#":
                parent.hash = None
            else:
                assert parent.children is not None
                del parent.children[level]
            node = parent
        return True

    def remove_client(self, client_id: str) -> int:
        """Remove every subscription of ``client_id`` (session end); returns how many."""
        filters = self._by_client.get(client_id)
        if filters is None:
            return 0
        removed = len(filters)
        for topic_filter in list(filters):
            self.remove(client_id, topic_filter)
        return removed

    def subscriptions_of(self, client_id: str) -> list[Subscription]:
        """The subscriptions of ``client_id``, in the order they were first added."""
        filters = self._by_client.get(client_id)
        return [] if filters is None else list(filters.values())

    def node_count(self) -> int:
        """The number of trie nodes including the root (1 when empty); O(nodes).

        For tests and memory monitoring: it shows that removals prune what adds built.
        """
        count = 0
        stack = [self._root]
        while stack:
            node = stack.pop()
            count += 1
            if node.children:
                stack.extend(node.children.values())
            if node.plus is not None:
                stack.append(node.plus)
            if node.hash is not None:
                stack.append(node.hash)
        return count

    def match(
        self,
        topic_name: str,
        publisher: str | None = None,
        position: tuple[int, int, bool] | None = None,
    ) -> MatchResult:
        """Find the subscriptions whose filter matches ``topic_name`` (MQTT 4.7).

        ``+`` matches exactly one level, an empty one included; ``#`` matches its parent
        level and any number of child levels; a filter whose first level is ``+`` or ``#``
        does not match a Topic Name starting with ``$`` (4.7.2). A subscription with No
        Local is skipped when ``publisher`` is its client (3.8.3.1). Overlapping non-shared
        subscriptions of one client collapse into one :class:`ClientMatch` (3.3.4); shared
        ones are listed per ``(group, inner filter)`` and never merged into ``clients``.

        Args:
            topic_name: a valid Topic Name; it is not validated here (the ingest node did).
            publisher: the publishing client's id, or None (e.g. a message not from a
                client), for No Local.
            position: the message's ``msg.all`` (partition, offset, RETAIN): a
                subscription whose :class:`~services.common.subscription.LiveFrom` cut
                lies after it is skipped when the cut covers it (a PUBLISH with RETAIN:
                its SUBSCRIBE got the retained copy instead; any PUBLISH under a replay's
                cut: its replay delivers it). None: no cut applies.

        Returns:
            A new :class:`MatchResult`; empty dicts when nothing matches.
        """
        clients: dict[str, ClientMatch] = {}
        shared: dict[tuple[str, str], list[Subscription]] = {}
        levels = topic_name.split("/")
        root = self._root
        if topic_name[:1] == "$":
            # 4.7.2: only literal first levels may match a $-topic, so start below the root
            # and never look at the root's wildcard children.
            first = root.children.get(levels[0]) if root.children else None
            if first is not None:
                _walk(first, levels, 1, clients, shared, publisher, position)
        else:
            _walk(root, levels, 0, clients, shared, publisher, position)
        return MatchResult(clients, shared)
