"""The subscription trie: matching (MQTT 4.7, 4.7.2, 3.3.4, 3.8.3.1, 4.8.2) and bookkeeping."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.mqtt.errors import ProtocolError, TopicFilterInvalid
from services.common.subscription import Subscription
from services.common.topics.trie import ClientMatch, MatchResult, SubscriptionTrie


def _trie(*subs: Subscription) -> SubscriptionTrie:
    trie = SubscriptionTrie()
    for sub in subs:
        trie.add(sub)
    return trie


def _matched(trie: SubscriptionTrie, topic: str, publisher: str | None = None) -> set[str]:
    return set(trie.match(topic, publisher).clients)


# ---------------------------------------------------------------- reference matcher


def _reference_matches(topic_filter: str, topic: str) -> bool:
    """MQTT 4.7 matching written as directly as possible, for comparison with the trie."""
    filter_levels = topic_filter.split("/")
    topic_levels = topic.split("/")
    if topic.startswith("$") and filter_levels[0] in ("+", "#"):
        return False
    for index, level in enumerate(filter_levels):
        if level == "#":
            return True
        if index >= len(topic_levels):
            return False
        if level != "+" and level != topic_levels[index]:
            return False
    return len(filter_levels) == len(topic_levels)


def _reference_match(
    subs: list[Subscription], topic: str, publisher: str | None
) -> tuple[dict[str, ClientMatch], dict[tuple[str, str], list[Subscription]]]:
    clients: dict[str, ClientMatch] = {}
    shared: dict[tuple[str, str], list[Subscription]] = {}
    for sub in subs:
        if sub.topic_filter.startswith("$share/"):
            group, _, inner = sub.topic_filter[len("$share/") :].partition("/")
            if _reference_matches(inner, topic):
                shared.setdefault((group, inner), []).append(sub)
            continue
        if not _reference_matches(sub.topic_filter, topic):
            continue
        if sub.no_local and sub.client_id == publisher:
            continue
        found = clients.setdefault(sub.client_id, ClientMatch(sub.client_id, 0, [], False))
        found.qos = max(found.qos, sub.qos)
        if sub.subscription_identifier is not None:
            found.subscription_identifiers.append(sub.subscription_identifier)
        found.retain_as_published = found.retain_as_published or sub.retain_as_published
    for found in clients.values():
        found.subscription_identifiers.sort()
    return clients, _sorted_members(shared)


def _sorted_members(
    shared: dict[tuple[str, str], list[Subscription]],
) -> dict[tuple[str, str], list[Subscription]]:
    return {key: sorted(members, key=lambda s: s.client_id) for key, members in shared.items()}


@pytest.mark.parametrize(
    ("topic_filter", "topic", "expected"),
    [
        ("a/#", "a", True),
        ("+", "", True),
        ("#", "$x", False),
        ("a/+", "a", False),
        ("a/b", "a/b/c", False),
    ],
)
def test_reference_matcher_itself(topic_filter: str, topic: str, expected: bool) -> None:
    assert _reference_matches(topic_filter, topic) is expected


# ---------------------------------------------------------------- matching rules, MQTT 4.7


@pytest.mark.parametrize(
    ("topic_filter", "matching", "not_matching"),
    [
        # Examples from MQTT 4.7.1.2 and 4.7.1.3.
        (
            "sport/tennis/player1/#",
            ["sport/tennis/player1", "sport/tennis/player1/ranking", "sport/tennis/player1/a/b"],
            ["sport/tennis/player2", "sport/tennis", "sport/tennis/player10"],
        ),
        ("sport/#", ["sport", "sport/", "sport/x/y"], ["sports", "/sport"]),
        ("#", ["a", "/", "", "a/b/c"], ["$SYS", "$SYS/a"]),
        ("sport/tennis/+", ["sport/tennis/player1", "sport/tennis/"], ["sport/tennis/a/b"]),
        ("sport/+", ["sport/", "sport/x"], ["sport", "sport/x/y"]),
        ("+/+", ["/finance", "a/b", "/"], ["a", "a/b/c"]),
        ("/+", ["/finance", "/"], ["finance", "a/b"]),
        ("+", ["finance", ""], ["/finance", "a/b", "$SYS"]),
        ("+/tennis/#", ["sport/tennis", "sport/tennis/x"], ["sport/golf", "$x/tennis"]),
        ("a//b", ["a//b"], ["a/b", "a/x/b"]),
        ("a/+/b", ["a//b", "a/x/b"], ["a/b"]),
        ("/", ["/"], ["", "a/"]),
        # 4.7.2: $-topics match only filters whose first level is literal.
        ("$SYS/#", ["$SYS", "$SYS/monitor/Clients"], ["SYS/x", "$sys/x"]),
        ("$SYS/monitor/+", ["$SYS/monitor/Clients"], ["$SYS/monitor"]),
        ("+/monitor/Clients", ["x/monitor/Clients"], ["$SYS/monitor/Clients"]),
        # The $ rule is about the first level only.
        ("a/+", ["a/$x"], []),
        ("a/#", ["a/$x/y"], []),
        ("Case", ["Case"], ["case", "CASE"]),
    ],
)
def test_filter_semantics(topic_filter: str, matching: list[str], not_matching: list[str]) -> None:
    trie = _trie(Subscription("c", topic_filter, 1))
    for topic in matching:
        assert _matched(trie, topic) == {"c"}, topic
        assert _reference_matches(topic_filter, topic), topic
    for topic in not_matching:
        assert _matched(trie, topic) == set(), topic
        assert not _reference_matches(topic_filter, topic), topic


def test_empty_trie_matches_nothing() -> None:
    result = SubscriptionTrie().match("a/b")
    assert result == MatchResult({}, {})


def test_many_clients_on_one_filter_and_disjoint_filters() -> None:
    trie = _trie(
        *(Subscription(f"c{i}", "devices/+/telemetry", 0) for i in range(50)),
        Subscription("exact", "devices/d1/telemetry", 2),
        Subscription("other", "devices/d2/telemetry", 2),
    )
    assert _matched(trie, "devices/d1/telemetry") == {f"c{i}" for i in range(50)} | {"exact"}
    assert _matched(trie, "devices/d3/status") == set()


# ---------------------------------------------------------------- overlapping subscriptions, 3.3.4


def test_overlapping_subscriptions_collapse_to_max_qos_and_all_identifiers() -> None:
    trie = _trie(
        Subscription("c", "a/b", 0, subscription_identifier=7),
        Subscription("c", "a/+", 2, subscription_identifier=3),
        Subscription("c", "a/#", 1),
        Subscription("c", "#", 1, subscription_identifier=5, retain_as_published=True),
        Subscription("c", "x/#", 2, subscription_identifier=1),  # does not match
    )
    result = trie.match("a/b")
    assert result.clients == {"c": ClientMatch("c", 2, [3, 5, 7], True)}
    assert result.shared == {}


def test_identifiers_sorted_and_one_per_matching_subscription() -> None:
    trie = _trie(
        Subscription("c", "a/b", 1, subscription_identifier=9),
        Subscription("c", "a/+", 1, subscription_identifier=2),
        Subscription("c", "+/b", 1, subscription_identifier=9),
    )
    assert trie.match("a/b").clients["c"].subscription_identifiers == [2, 9, 9]


def test_without_identifiers_or_retain_as_published() -> None:
    trie = _trie(Subscription("c", "a", 1), Subscription("c", "#", 0))
    assert trie.match("a").clients == {"c": ClientMatch("c", 1, [], False)}


def test_overlap_does_not_leak_between_clients() -> None:
    trie = _trie(
        Subscription("c1", "a/#", 2, subscription_identifier=1, retain_as_published=True),
        Subscription("c2", "a/b", 0, subscription_identifier=2),
    )
    assert trie.match("a/b").clients == {
        "c1": ClientMatch("c1", 2, [1], True),
        "c2": ClientMatch("c2", 0, [2], False),
    }


def test_match_results_are_independent() -> None:
    trie = _trie(Subscription("c", "a", 1, subscription_identifier=4), Subscription("c", "#", 0))
    first = trie.match("a")
    first.clients["c"].subscription_identifiers.append(99)
    first.clients["c"].qos = 0
    assert trie.match("a").clients["c"] == ClientMatch("c", 1, [4], False)


# ---------------------------------------------------------------- No Local, 3.8.3.1


def test_no_local_skips_only_the_publishers_own_subscription() -> None:
    trie = _trie(
        Subscription("me", "chat/#", 1, no_local=True),
        Subscription("you", "chat/#", 1, no_local=True),
        Subscription("them", "chat/#", 1),
    )
    assert _matched(trie, "chat/room", publisher="me") == {"you", "them"}
    assert _matched(trie, "chat/room", publisher=None) == {"me", "you", "them"}


def test_no_local_only_drops_that_subscription_not_the_client() -> None:
    trie = _trie(
        Subscription("me", "chat/#", 2, no_local=True, subscription_identifier=1),
        Subscription("me", "chat/+", 0, subscription_identifier=2),
    )
    assert trie.match("chat/room", publisher="me").clients == {
        "me": ClientMatch("me", 0, [2], False)
    }


def test_own_messages_delivered_without_no_local() -> None:
    trie = _trie(Subscription("me", "t", 1))
    assert _matched(trie, "t", publisher="me") == {"me"}


# ---------------------------------------------------------------- shared subscriptions, 4.8.2


def test_shared_members_reported_per_group_and_never_in_clients() -> None:
    a1 = Subscription("a1", "$share/ga/sensors/+", 1)
    a2 = Subscription("a2", "$share/ga/sensors/+", 2)
    b1 = Subscription("b1", "$share/gb/sensors/+", 0)
    hash_sub = Subscription("a1", "$share/ga/sensors/#", 0)
    plain = Subscription("a1", "sensors/temp", 1)
    trie = _trie(a1, a2, b1, hash_sub, plain)
    result = trie.match("sensors/temp")
    assert result.clients == {"a1": ClientMatch("a1", 1, [], False)}
    assert _sorted_members(result.shared) == {
        ("ga", "sensors/+"): [a1, a2],
        ("gb", "sensors/+"): [b1],
        ("ga", "sensors/#"): [hash_sub],
    }
    assert trie.match("sensors").shared == {("ga", "sensors/#"): [hash_sub]}
    assert trie.match("other").shared == {}


def test_shared_subscription_follows_the_dollar_rule() -> None:
    trie = _trie(
        Subscription("c", "$share/g/#", 1),
        Subscription("c", "$share/g/$SYS/#", 1),
    )
    assert list(trie.match("$SYS/x").shared) == [("g", "$SYS/#")]
    assert list(trie.match("x").shared) == [("g", "#")]


def test_shared_and_plain_same_inner_filter_are_distinct_subscriptions() -> None:
    trie = _trie(Subscription("c", "a", 0), Subscription("c", "$share/g/a", 2))
    assert len(trie) == 2
    assert trie.remove("c", "a")
    result = trie.match("a")
    assert result.clients == {}
    assert list(result.shared) == [("g", "a")]


def test_no_local_on_shared_subscription_is_a_protocol_error() -> None:
    trie = SubscriptionTrie()
    with pytest.raises(ProtocolError) as info:
        trie.add(Subscription("c", "$share/g/a", 1, no_local=True))
    assert info.value.reason_code == 0x82
    assert len(trie) == 0
    assert trie.node_count() == 1


# ---------------------------------------------------------------- add / replace / validation


def test_add_replaces_same_client_and_filter() -> None:
    trie = SubscriptionTrie()
    assert trie.add(Subscription("c", "a/+", 0, subscription_identifier=1)) is True
    assert trie.add(Subscription("c", "a/+", 2, subscription_identifier=2)) is False
    assert len(trie) == 1
    assert trie.match("a/b").clients == {"c": ClientMatch("c", 2, [2], False)}
    assert trie.subscriptions_of("c") == [Subscription("c", "a/+", 2, subscription_identifier=2)]


def test_shared_replace_and_membership() -> None:
    trie = SubscriptionTrie()
    assert trie.add(Subscription("c", "$share/g/a", 0)) is True
    assert trie.add(Subscription("c", "$share/g/a", 1)) is False
    assert trie.add(Subscription("c", "$share/h/a", 1)) is True
    assert trie.add(Subscription("d", "$share/g/a", 1)) is True
    assert len(trie) == 3
    members = trie.match("a").shared
    assert sorted(s.client_id for s in members[("g", "a")]) == ["c", "d"]
    assert [s.qos for s in members[("h", "a")]] == [1]


@pytest.mark.parametrize("topic_filter", ["", "a/#/b", "a+", "$share//a", "$share/g", "x\x00"])
def test_add_rejects_invalid_filters(topic_filter: str) -> None:
    trie = SubscriptionTrie()
    with pytest.raises(TopicFilterInvalid):
        trie.add(Subscription("c", topic_filter, 0))
    assert len(trie) == 0
    assert trie.subscriptions_of("c") == []


@pytest.mark.parametrize(
    "sub",
    [
        Subscription("c", "a", 3),
        Subscription("c", "a", -1),
        Subscription("c", "a", 0, retain_handling=3),
        Subscription("c", "a", 0, subscription_identifier=0),
        Subscription("c", "a", 0, subscription_identifier=268_435_456),
    ],
)
def test_add_rejects_invalid_options(sub: Subscription) -> None:
    trie = SubscriptionTrie()
    with pytest.raises(ProtocolError):
        trie.add(sub)
    assert len(trie) == 0


def test_subscription_identifier_limits_accepted() -> None:
    trie = _trie(
        Subscription("c", "a", 0, subscription_identifier=1),
        Subscription("c", "+", 0, subscription_identifier=268_435_455),
    )
    assert trie.match("a").clients["c"].subscription_identifiers == [1, 268_435_455]


# ---------------------------------------------------------------- remove / prune


def test_remove_and_prune_back_to_empty() -> None:
    trie = SubscriptionTrie()
    empty_nodes = trie.node_count()
    assert empty_nodes == 1
    filters = ["a/b/c", "a/b", "a/+/c", "a/#", "#", "+", "/", "$SYS/x", "$share/g/a/b/c"]
    for topic_filter in filters:
        trie.add(Subscription("c", topic_filter, 0))
    assert trie.node_count() > empty_nodes
    for topic_filter in filters:
        assert trie.remove("c", topic_filter) is True
        assert topic_filter not in {s.topic_filter for s in trie.subscriptions_of("c")}
    assert len(trie) == 0
    assert trie.node_count() == empty_nodes
    assert trie.subscriptions_of("c") == []


def test_remove_keeps_nodes_still_in_use() -> None:
    trie = _trie(Subscription("c", "a/b/c", 0), Subscription("d", "a/b", 0))
    nodes = trie.node_count()
    assert trie.remove("d", "a/b")
    assert trie.node_count() == nodes  # a/b is still on the path to a/b/c
    assert _matched(trie, "a/b/c") == {"c"}
    assert _matched(trie, "a/b") == set()
    assert trie.remove("c", "a/b/c")
    assert trie.node_count() == 1


def test_remove_missing_returns_false() -> None:
    trie = _trie(Subscription("c", "a/b", 0), Subscription("c", "$share/g/a/b", 0))
    assert trie.remove("c", "a") is False
    assert trie.remove("d", "a/b") is False
    assert trie.remove("c", "$share/h/a/b") is False
    assert trie.remove("c", "not/#/valid") is False
    assert len(trie) == 2
    assert trie.remove("c", "a/b") is True
    assert trie.remove("c", "a/b") is False
    assert len(trie) == 1


def test_remove_one_shared_member_keeps_the_group() -> None:
    trie = _trie(Subscription("c", "$share/g/a", 0), Subscription("d", "$share/g/a", 1))
    assert trie.remove("c", "$share/g/a")
    assert [s.client_id for s in trie.match("a").shared[("g", "a")]] == ["d"]
    assert trie.remove("d", "$share/g/a")
    assert trie.match("a").shared == {}
    assert trie.node_count() == 1


def test_remove_client() -> None:
    trie = _trie(
        Subscription("c", "a/#", 0),
        Subscription("c", "$share/g/a/b", 1),
        Subscription("c", "x", 1),
        Subscription("d", "a/b", 1),
    )
    assert trie.remove_client("c") == 3
    assert trie.remove_client("c") == 0
    assert trie.remove_client("nobody") == 0
    assert len(trie) == 1
    result = trie.match("a/b")
    assert set(result.clients) == {"d"}
    assert result.shared == {}
    assert trie.subscriptions_of("c") == []
    assert trie.node_count() == 3  # root, "a", "a/b"


def test_subscriptions_of_in_first_added_order() -> None:
    subs = [Subscription("c", f, 1) for f in ("z", "a/#", "$share/g/m")]
    trie = _trie(*subs, Subscription("d", "z", 0))
    assert trie.subscriptions_of("c") == subs
    assert trie.subscriptions_of("nobody") == []


def test_churn_does_not_grow_the_trie() -> None:
    rng = random.Random(7)
    trie = SubscriptionTrie()
    for round_number in range(20):
        filters = {f"dev/{rng.randrange(1000)}/{rng.choice(['+', '#', 't'])}" for _ in range(50)}
        for topic_filter in filters:
            trie.add(Subscription(f"c{round_number}", topic_filter, 1))
        assert trie.remove_client(f"c{round_number}") == len(filters)
        assert trie.node_count() == 1
    assert len(trie) == 0


def test_deepest_filters_do_not_hit_the_recursion_limit() -> None:
    # A 65,535-byte filter can hold 32,768 levels; matching must not recurse per level.
    deep_plus = "/".join(["+"] * 32_768)
    deep_literal = "/".join(["a"] * 32_768)
    trie = _trie(
        Subscription("plus", deep_plus, 1),
        Subscription("literal", deep_literal, 1),
        Subscription("mixed", "a/+/" + "/".join(["a"] * 32_766), 1),
    )
    assert _matched(trie, deep_literal) == {"plus", "literal", "mixed"}
    assert _matched(trie, deep_literal + "/a") == set()
    assert trie.remove_client("plus") == 1
    assert trie.remove_client("literal") == 1
    assert trie.remove_client("mixed") == 1
    assert trie.node_count() == 1


# ---------------------------------------------------------------- property: trie == brute force

_FILTER_LEVELS = ["", "a", "b", "$sys", "+"]
_TOPIC_LEVELS = ["", "a", "b", "$sys"]
_CLIENTS = ["c1", "c2", "c3"]


@st.composite
def _subscriptions(draw: st.DrawFn) -> Subscription:
    levels = draw(st.lists(st.sampled_from(_FILTER_LEVELS), min_size=0, max_size=4))
    if not levels or draw(st.booleans()):
        levels.append("#")
    # A lone empty level would make the empty filter, which is invalid (4.7.3).
    topic_filter = "/".join(levels) or "#"
    group = draw(st.sampled_from([None, "g1", "g2"]))
    if group is not None:
        topic_filter = f"$share/{group}/{topic_filter}"
    return Subscription(
        client_id=draw(st.sampled_from(_CLIENTS)),
        topic_filter=topic_filter,
        qos=draw(st.integers(0, 2)),
        no_local=group is None and draw(st.booleans()),
        retain_as_published=draw(st.booleans()),
        retain_handling=draw(st.integers(0, 2)),
        subscription_identifier=draw(st.one_of(st.none(), st.integers(1, 4))),
    )


_topics = st.lists(st.sampled_from(_TOPIC_LEVELS), min_size=1, max_size=5).map("/".join)


@settings(max_examples=300)
@given(
    st.lists(_subscriptions(), max_size=25),
    st.lists(st.integers(0, 24), max_size=8),
    st.lists(st.tuples(_topics, st.sampled_from([None, *_CLIENTS])), min_size=1, max_size=10),
)
def test_property_match_equals_brute_force(
    subs: list[Subscription],
    removals: list[int],
    queries: list[tuple[str, str | None]],
) -> None:
    trie = SubscriptionTrie()
    live: dict[tuple[str, str], Subscription] = {}
    for sub in subs:
        key = (sub.client_id, sub.topic_filter)
        assert trie.add(sub) is (key not in live)
        live[key] = sub
    for index in removals:
        if index < len(subs):
            key = (subs[index].client_id, subs[index].topic_filter)
            assert trie.remove(*key) is (key in live)
            live.pop(key, None)
    assert len(trie) == len(live)

    for topic, publisher in queries:
        result = trie.match(topic, publisher)
        expected_clients, expected_shared = _reference_match(list(live.values()), topic, publisher)
        assert result.clients == expected_clients, topic
        assert _sorted_members(result.shared) == expected_shared, topic

    for client_id in _CLIENTS:
        trie.remove_client(client_id)
    assert len(trie) == 0
    assert trie.node_count() == 1
