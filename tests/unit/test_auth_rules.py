"""Authorization rules (services/common/auth/authorize.py): their syntax, placeholders, and the
matcher checked against a naive reference with hypothesis.

The reference works on whole strings (a regular expression per filter) and on a small
universe of topics enumerated in full, so it shares nothing with the level-walking code it
checks.
"""

from __future__ import annotations

import itertools
import re
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.auth.authorize import (
    ALLOW_ALL,
    ALLOW_ALL_RULE,
    Action,
    Authorizer,
    Grant,
    Permission,
    Rule,
    RuleError,
    authorizer_for,
    covers,
    intersection,
    matches,
    overlaps,
    parse_rule,
    parse_rules,
)

# ---------------------------------------------------------------------- the naive reference

LEVELS = ("a", "b", "", "$s")
UNIVERSE = tuple(
    "/".join(levels) for depth in range(1, 5) for levels in itertools.product(LEVELS, repeat=depth)
)
"""Every topic of 1 to 4 levels over LEVELS: deep enough to tell any two filters of up to 3
levels apart. It holds "" (one empty level: not a valid Topic Name, but ``/#`` matches it as
the parent of ``/``, and the algebra counts it)."""


@cache
def _regex(topic_filter: str) -> re.Pattern[str]:
    levels = topic_filter.split("/")
    parts = ["[^/]*" if level == "+" else re.escape(level) for level in levels]
    if levels[-1] == "#":
        head = "/".join(parts[:-1])
        pattern = f"{head}(/.*)?" if len(levels) > 1 else ".*"
    else:
        pattern = "/".join(parts)
    return re.compile(f"^{pattern}$", re.DOTALL)


def naive_matches(topic_filter: str, topic: str) -> bool:
    """MQTT 4.7 matching by regular expression; wildcards first never match ``$`` topics."""
    if topic_filter[:1] in ("+", "#") and topic.startswith("$"):
        return False
    return _regex(topic_filter).match(topic) is not None


def naive_decision(rules: list[tuple[bool, str]], topic: str) -> bool:
    """The first rule whose filter matches ``topic`` decides; none: denied."""
    for allow, topic_filter in rules:
        if naive_matches(topic_filter, topic):
            return allow
    return False


level = st.sampled_from(("a", "b", "", "$s", "+"))


@st.composite
def filters(draw: st.DrawFn) -> str:
    """A valid Topic Filter of 1 to 3 levels over LEVELS, ``+`` and a trailing ``#``."""
    levels = draw(st.lists(level, min_size=1, max_size=3))
    if draw(st.booleans()):
        levels = [*levels[:2], "#"]
    return "/".join(levels) or "a"


topics = st.sampled_from(UNIVERSE)
rule_lists = st.lists(
    st.tuples(st.booleans(), st.sampled_from(tuple(Action)), filters()), max_size=6
)


def _rules(drawn: list[tuple[bool, Action, str]]) -> list[Rule]:
    return [Rule(Permission.ALLOW if a else Permission.DENY, act, f) for a, act, f in drawn]


def _of(rules: list[Rule], action: Action) -> list[tuple[bool, str]]:
    return [
        (r.permission is Permission.ALLOW, r.topic_filter)
        for r in rules
        if r.action in (action, Action.ALL)
    ]


# ---------------------------------------------------------------------- properties


@settings(max_examples=400)
@given(filters(), topics)
def test_matching_agrees_with_the_reference(topic_filter: str, topic: str) -> None:
    assert matches(topic_filter.split("/"), topic.split("/")) == naive_matches(topic_filter, topic)


@settings(max_examples=300)
@given(filters(), filters())
def test_covers_and_overlaps_agree_with_the_universe(outer: str, inner: str) -> None:
    inner_topics = [t for t in UNIVERSE if naive_matches(inner, t)]
    both = [t for t in inner_topics if naive_matches(outer, t)]
    assert covers(outer.split("/"), inner.split("/")) == (len(both) == len(inner_topics))
    assert overlaps(outer.split("/"), inner.split("/")) == bool(both)


@settings(max_examples=400)
@given(rule_lists, topics)
def test_a_publish_is_decided_by_the_first_matching_rule(
    drawn: list[tuple[bool, Action, str]], topic: str
) -> None:
    rules = _rules(drawn)
    authorizer = Authorizer(rules, "c1", "u1")
    expected = naive_decision(_of(rules, Action.PUBLISH), topic)
    assert authorizer.may_publish(topic) == expected
    assert authorizer.may_publish(topic) == expected  # the cached decision


@settings(max_examples=300)
@given(filters(), filters())
def test_the_intersection_matches_what_both_filters_match(a: str, b: str) -> None:
    both = {t for t in UNIVERSE if naive_matches(a, t) and naive_matches(b, t)}
    common = intersection(a.split("/"), b.split("/"))
    if common is None:
        assert not both
    else:
        assert {t for t in UNIVERSE if naive_matches("/".join(common), t)} == both


@settings(max_examples=400)
@given(rule_lists, topics)
def test_a_delivery_is_decided_by_the_first_matching_read_rule(
    drawn: list[tuple[bool, Action, str]], topic: str
) -> None:
    rules = _rules(drawn)
    authorizer = Authorizer(rules, "c1", "u1")
    expected = naive_decision(_of(rules, Action.SUBSCRIBE), topic)
    assert authorizer.may_receive(topic) == expected
    assert authorizer.may_receive(topic) == expected  # the cached decision


@settings(max_examples=600)
@given(rule_lists, filters())
def test_a_subscription_is_granted_when_some_topic_of_it_may_be_read(
    drawn: list[tuple[bool, Action, str]], topic_filter: str
) -> None:
    """FULL ⇒ every topic of the filter may be read; REFUSED ⇒ none may be (nothing readable
    is ever refused); a filter without wildcards is granted exactly when its one topic may
    be read; a filter inside one deny rule's filter that no earlier allow rule reaches is
    refused; strict grants FULL filters only."""
    rules = _rules(drawn)
    authorizer = Authorizer(rules, "c1", "u1")
    read_rules = _of(rules, Action.SUBSCRIBE)
    grant = authorizer.subscribe_grant(topic_filter)
    strict = Authorizer(rules, "c1", "u1", strict=True).subscribe_grant(topic_filter)
    assert authorizer.subscribe_grant(f"$share/g/{topic_filter}") is grant
    if not rules:
        assert grant is Grant.REFUSED and strict is Grant.REFUSED
        return
    readable = [naive_decision(read_rules, t) for t in UNIVERSE if naive_matches(topic_filter, t)]
    if grant is Grant.FULL:
        assert all(readable)
    if grant is Grant.REFUSED:
        assert not any(readable)
    if "+" not in topic_filter and "#" not in topic_filter:
        assert (grant is not Grant.REFUSED) == naive_decision(read_rules, topic_filter)
    levels = topic_filter.split("/")
    for allow, rule_filter in read_rules:
        if allow and overlaps(rule_filter.split("/"), levels):
            break
        if not allow and covers(rule_filter.split("/"), levels):
            assert grant is Grant.REFUSED
            break
    assert strict is (Grant.FULL if grant is Grant.FULL else Grant.REFUSED)
    assert authorizer.may_subscribe(topic_filter) == (grant is not Grant.REFUSED)


# ---------------------------------------------------------------------- examples


def test_rules_are_written_as_text_and_as_json() -> None:
    rule = parse_rule("ALLOW publish  devices/${client_id}/data stream/#")
    assert rule == Rule(Permission.ALLOW, Action.PUBLISH, "devices/${client_id}/data stream/#")
    assert str(rule) == "allow publish devices/${client_id}/data stream/#"
    assert Rule.from_json(rule.to_json()) == rule
    assert parse_rules(["deny subscribe admin/#", rule.to_json()])[1] == rule


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("allow publish", "is not '<allow|deny>"),
        ("permit publish a", "permission must be allow or deny"),
        ("allow read a", "action must be publish, subscribe or all"),
        ("allow all a/#/b", "'#'"),
        ("allow all a+/b", "'+'"),
        ("allow all $share/g/a", "without $share"),
        ("allow all dev-${client_id}/x", "whole topic level"),
        ("allow all ${clientid}/x", "whole topic level"),
    ],
)
def test_a_bad_rule_says_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(RuleError, match=re.escape(message)):
        parse_rule(text)
    with pytest.raises(RuleError):
        Rule.from_json(42)


def test_placeholders_stand_for_the_connection() -> None:
    rules = parse_rules(
        [
            "allow publish devices/${client_id}/#",
            "allow subscribe users/${username}/inbox",
            "deny publish private/${username}/#",
            "allow publish private/#",
        ]
    )
    dev = Authorizer(rules, "dev-1", "alice")
    assert dev.may_publish("devices/dev-1/temp")
    assert not dev.may_publish("devices/dev-2/temp")
    assert dev.may_subscribe("users/alice/inbox") and not dev.may_subscribe("users/bob/inbox")
    assert not dev.may_publish("private/alice/x") and dev.may_publish("private/bob/x")


@pytest.mark.parametrize("client_id", ["a/b", "a+", "#", ""])
def test_an_identifier_that_cannot_fill_a_level_never_widens_access(client_id: str) -> None:
    rules = parse_rules(
        ["deny publish jail/${client_id}", "allow publish jail/#", "allow publish d/${client_id}"]
    )
    authorizer = Authorizer(rules, client_id, None)
    assert not authorizer.may_publish("jail/anyone")  # the deny rule covers every value
    assert not authorizer.may_publish("d/a/b") and not authorizer.may_publish("d/x")
    without_user = Authorizer(parse_rules(["allow all u/${username}/#"]), "c", None)
    assert not without_user.may_publish("u/c/x") and not without_user.may_subscribe("u/+/x")


def test_a_wildcard_over_a_denied_subtree_is_granted_and_filtered() -> None:
    rules = parse_rules(["deny subscribe admin/#", "allow all #"])
    authorizer = Authorizer(rules, "c", None)
    assert authorizer.subscribe_grant("#") is Grant.FILTERED
    assert authorizer.subscribe_grant("+/users") is Grant.FILTERED
    assert authorizer.subscribe_grant("$share/g/+/users") is Grant.FILTERED
    assert authorizer.subscribe_grant("sensors/#") is Grant.FULL
    assert authorizer.subscribe_grant("admin/users/#") is Grant.REFUSED  # wholly denied
    assert authorizer.subscribe_grant("admin/#") is Grant.REFUSED
    assert not authorizer.may_receive("admin/users") and authorizer.may_receive("sensors/t")
    assert authorizer.may_publish("admin/x")  # the deny rule is about subscribing only
    strict = Authorizer(rules, "c", None, strict=True)
    assert not strict.may_subscribe("#") and not strict.may_subscribe("+/users")
    assert strict.may_subscribe("sensors/#") and strict.may_subscribe("$share/g/x/+")


def test_an_allow_rule_shadowed_by_an_earlier_deny_grants_nothing() -> None:
    rules = parse_rules(["deny subscribe a/b/#", "allow subscribe a/b/c", "allow subscribe x"])
    authorizer = Authorizer(rules, "c", None)
    assert authorizer.subscribe_grant("a/+/c") is Grant.REFUSED  # only a/b/c, denied
    assert authorizer.subscribe_grant("+/+/c") is Grant.REFUSED
    assert authorizer.subscribe_grant("#") is Grant.FILTERED  # x may be read


def test_no_rules_allow_nothing_and_allow_all_is_an_explicit_rule() -> None:
    nothing = Authorizer((), "c", "u")
    assert not nothing.may_publish("a/b") and not nothing.may_subscribe("#")
    assert not nothing.may_subscribe("c/#") and not nothing.may_publish("c")
    assert not nothing.may_receive("a/b") and nothing.subscribe_grant("#") is Grant.REFUSED
    assert parse_rules(["allow all #"]) == (ALLOW_ALL_RULE,) == ALLOW_ALL.rules
    assert ALLOW_ALL.may_publish("any/topic") and ALLOW_ALL.may_subscribe("#")
    assert ALLOW_ALL.may_subscribe("$share/g/#") and ALLOW_ALL.subscribe_grant("#") is Grant.FULL
    assert not ALLOW_ALL.may_publish("$SYS/x")  # "#" matches no $ topic (MQTT 4.7.2)


def test_connections_share_the_authorizer_of_rules_without_placeholders() -> None:
    rules = parse_rules(["deny subscribe admin/#", "allow all #"])
    first = authorizer_for(rules, "c1", "u1")
    assert authorizer_for(list(rules), "c2", None) is first  # one decision cache for all
    assert authorizer_for(rules, "c1", "u1", strict=True) is not first
    own = parse_rules(["allow all d/${client_id}/#"])
    mine, theirs = authorizer_for(own, "c1", None), authorizer_for(own, "c2", None)
    assert mine.may_receive("d/c1/x") and not theirs.may_receive("d/c1/x")
