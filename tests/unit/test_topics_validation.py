"""Topic Name / Topic Filter validation and Shared Subscription parsing (MQTT 4.7, 4.8.2)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common.mqtt.errors import TopicFilterInvalid, TopicNameInvalid
from services.common.topics.validation import (
    MAX_TOPIC_BYTES,
    SharedFilter,
    parse_shared,
    validate_topic_filter,
    validate_topic_name,
)

# ---------------------------------------------------------------- topic names


@pytest.mark.parametrize(
    "name",
    [
        "a",
        "/",
        "//",
        "sport/tennis/player1",
        "/finance",
        "finance/",
        "$SYS/broker/uptime",
        "$share/g/x",  # only filters are special about $share; as a name it is plain text
        "ünïcödé/温度",
        " spaces are fine ",
        "a" * MAX_TOPIC_BYTES,
        "é" * (MAX_TOPIC_BYTES // 2) + "a",  # 2-byte chars, exactly at the limit
    ],
)
def test_valid_topic_names(name: str) -> None:
    assert validate_topic_name(name) is None


@pytest.mark.parametrize(
    "name",
    [
        "",
        "+",
        "#",
        "a/+/b",
        "a/#",
        "a+b",
        "a#",
        "a\x00b",
        "\x00",
        "a" * (MAX_TOPIC_BYTES + 1),
        "é" * (MAX_TOPIC_BYTES // 2 + 1),  # 65,536 bytes although only 32,768 characters
        "a\ud800b",  # lone surrogate: not a UTF-8 string (MQTT 1.5.4)
    ],
)
def test_invalid_topic_names(name: str) -> None:
    with pytest.raises(TopicNameInvalid) as info:
        validate_topic_name(name)
    assert info.value.reason_code == 0x90


def test_topic_name_error_is_not_a_filter_error() -> None:
    with pytest.raises(TopicNameInvalid) as info:
        validate_topic_name("a/+")
    assert not isinstance(info.value, TopicFilterInvalid)
    assert "wildcard" in info.value.message


# ---------------------------------------------------------------- topic filters


@pytest.mark.parametrize(
    "topic_filter",
    [
        "a",
        "/",
        "#",
        "+",
        "+/+",
        "/+",
        "+/",
        "sport/#",
        "sport/tennis/#",
        "sport/+/player1",
        "+/tennis/#",
        "a//b",
        "$SYS/#",
        "$SYS/+/x",
        "$share",  # no slash after it: an ordinary filter, not a Shared Subscription
        "$sharegroup/x",
        "$SHARE/g/x",  # the prefix is case-sensitive; this is an ordinary filter
        "$share/g/x",
        "$share/g/#",
        "$share/g/+/b/#",
        "$share/g//",
        "$share/g/$share/h/x",
        "a" * MAX_TOPIC_BYTES,
    ],
)
def test_valid_topic_filters(topic_filter: str) -> None:
    assert validate_topic_filter(topic_filter) is None


@pytest.mark.parametrize(
    "topic_filter",
    [
        "",
        "sport/tennis#",
        "sport/tennis/#/ranking",
        "#/a",
        "##",
        "sport+",
        "sport/+tennis",
        "++",
        "a/b+/c",
        "a\x00",
        "a" * (MAX_TOPIC_BYTES + 1),
        "x\udfff",
        # Shared Subscriptions, MQTT 4.8.2
        "$share/",
        "$share//x",
        "$share/g",
        "$share/g/",
        "$share/g+/x",
        "$share/+/x",
        "$share/#/x",
        "$share/g#/x",
        "$share/g/a#",
        "$share/g/#/a",
        "$share/g/a+",
        "$share/g/\x00",
        "$share/g/" + "a" * MAX_TOPIC_BYTES,
    ],
)
def test_invalid_topic_filters(topic_filter: str) -> None:
    with pytest.raises(TopicFilterInvalid) as info:
        validate_topic_filter(topic_filter)
    assert info.value.reason_code == 0x8F


def test_glued_hash_error_explains_the_rule() -> None:
    with pytest.raises(TopicFilterInvalid, match="whole level"):
        validate_topic_filter("a/b#")


# ---------------------------------------------------------------- shared subscriptions


@pytest.mark.parametrize(
    ("topic_filter", "expected"),
    [
        ("$share/g/x", SharedFilter("g", "x")),
        ("$share/consumer1/sport/tennis/+", SharedFilter("consumer1", "sport/tennis/+")),
        ("$share/g/#", SharedFilter("g", "#")),
        ("$share/g//", SharedFilter("g", "/")),
        ("$share/$g/$SYS/x", SharedFilter("$g", "$SYS/x")),
        ("$share/g/$share/h/x", SharedFilter("g", "$share/h/x")),
    ],
)
def test_parse_shared(topic_filter: str, expected: SharedFilter) -> None:
    assert parse_shared(topic_filter) == expected


@pytest.mark.parametrize("topic_filter", ["a/b", "#", "$share", "$SHARE/g/x", "$sharex/g/x"])
def test_parse_shared_returns_none_for_plain_filters(topic_filter: str) -> None:
    assert parse_shared(topic_filter) is None


@pytest.mark.parametrize(
    ("topic_filter", "fragment"),
    [
        ("$share/", "empty ShareName"),
        ("$share//x", "empty ShareName"),
        ("$share/a+b/x", "ShareName holds a wildcard"),
        ("$share/#/x", "ShareName holds a wildcard"),
        ("$share/g", "no Topic Filter"),
        ("$share/g/", "no Topic Filter"),
        ("$share/g/a/#/b", "whole level"),
    ],
)
def test_parse_shared_rejects(topic_filter: str, fragment: str) -> None:
    with pytest.raises(TopicFilterInvalid, match=fragment) as info:
        parse_shared(topic_filter)
    assert info.value.reason_code == 0x8F


def test_shared_filter_is_frozen() -> None:
    shared = SharedFilter("g", "a/b")
    with pytest.raises(dataclasses.FrozenInstanceError):
        shared.group = "h"  # type: ignore[misc]
    assert hash(shared) == hash(SharedFilter("g", "a/b"))


# ---------------------------------------------------------------- properties

_plain_level = st.text(
    alphabet=st.characters(blacklist_characters="/+#\x00", blacklist_categories=("Cs",)),
    max_size=5,
)
_filter_level = st.one_of(_plain_level, st.just("+"))


@given(st.lists(_plain_level, min_size=1, max_size=6).filter(lambda ls: "/".join(ls) != ""))
def test_property_any_wildcard_free_name_is_valid(levels: list[str]) -> None:
    name = "/".join(levels)
    assert validate_topic_name(name) is None
    assert validate_topic_filter(name) is None


@given(
    st.lists(_filter_level, min_size=1, max_size=6),
    st.booleans(),
    st.one_of(st.none(), st.text(alphabet="abcxyz$", min_size=1, max_size=4)),
)
def test_property_well_placed_wildcards_are_valid(
    levels: list[str], multi: bool, group: str | None
) -> None:
    topic_filter = "/".join([*levels, "#"] if multi else levels)
    if topic_filter == "":
        topic_filter = "+"
    shared = topic_filter if group is None else f"$share/{group}/{topic_filter}"
    assert validate_topic_filter(shared) is None
    if group is None:
        assert parse_shared(shared) is None
    else:
        assert parse_shared(shared) == SharedFilter(group, topic_filter)
    if "+" in topic_filter or "#" in topic_filter:
        with pytest.raises(TopicNameInvalid):
            validate_topic_name(topic_filter)


@given(
    st.lists(_plain_level, min_size=1, max_size=4),
    st.sampled_from(["+", "#"]),
    st.text(alphabet="ab", min_size=1, max_size=2),
    st.booleans(),
)
def test_property_wildcard_glued_to_text_is_invalid(
    levels: list[str], wildcard: str, text: str, before: bool
) -> None:
    glued = wildcard + text if before else text + wildcard
    topic_filter = "/".join([*levels, glued])
    with pytest.raises(TopicFilterInvalid):
        validate_topic_filter(topic_filter)
