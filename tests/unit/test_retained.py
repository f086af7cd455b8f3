"""The retained message store (services/common/topics/retained.py): MQTT 4.7 matching of
stored Topic Names by a Topic Filter, replacement and deletion (MQTT 3.3.1.3)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common.topics.retained import RetainedStore
from tests.unit.test_trie import _reference_matches

_TOPIC_LEVELS = ["a", "b", "", "$SYS", "c"]
_FILTER_LEVELS = ["a", "b", "", "$SYS", "+"]

_topics = st.lists(st.sampled_from(_TOPIC_LEVELS), min_size=1, max_size=4).map("/".join)


@st.composite
def _filters(draw: st.DrawFn) -> str:
    levels = draw(st.lists(st.sampled_from(_FILTER_LEVELS), min_size=0, max_size=4))
    if not levels or draw(st.booleans()):
        levels.append("#")
    return "/".join(levels)


def _store(*topics: str) -> RetainedStore[str]:
    store: RetainedStore[str] = RetainedStore()
    for topic in topics:
        store.set(topic, f"v:{topic}")
    return store


@pytest.mark.parametrize(
    ("topic_filter", "expected"),
    [
        ("a/b", {"a/b"}),
        ("a/+", {"a/b", "a/c"}),
        ("a/#", {"a", "a/b", "a/c", "a/b/d"}),  # '#' matches its parent level too
        ("+/b", {"a/b"}),
        ("#", {"a", "a/b", "a/c", "a/b/d", "/x"}),  # never $-topics (MQTT 4.7.2)
        ("+/+", {"a/b", "a/c", "/x"}),
        ("$SYS/#", {"$SYS/load", "$SYS"}),
        ("$SYS/+", {"$SYS/load"}),
        ("+/load", set()),
        ("/+", {"/x"}),
        ("nothing/#", set()),
    ],
)
def test_filters_match_stored_topics(topic_filter: str, expected: set[str]) -> None:
    store = _store("a", "a/b", "a/c", "a/b/d", "$SYS/load", "$SYS", "/x")
    assert {topic for topic, _ in store.match(topic_filter)} == expected


def test_set_replaces_and_delete_prunes() -> None:
    store = _store("a/b/c")
    store.set("a/b/c", "new")
    assert len(store) == 1
    assert list(store.match("a/#")) == [("a/b/c", "new")]
    assert store.get("a/b/c") == "new"
    assert store.get("a/b") is None
    assert store.delete("a/b/c") is True
    assert store.delete("a/b/c") is False
    assert len(store) == 0
    assert store._root.children == {}  # nothing left behind


def test_delete_keeps_a_parent_that_still_holds_a_message() -> None:
    store = _store("a", "a/b")
    assert store.delete("a/b")
    assert list(store.match("#")) == [("a", "v:a")]
    assert store.delete("missing/topic") is False


def test_a_very_deep_filter_does_not_recurse() -> None:
    topic = "/".join(["x"] * 20_000)
    store = _store(topic)
    assert [t for t, _ in store.match("/".join(["+"] * 20_000))] == [topic]


@given(st.lists(_topics, max_size=12), st.lists(_topics, max_size=4), _filters())
def test_match_agrees_with_the_reference_matcher(
    kept: list[str], deleted: list[str], topic_filter: str
) -> None:
    store = _store(*kept)
    for topic in deleted:
        store.delete(topic)
    live = set(kept) - set(deleted)
    expected = {t for t in live if _reference_matches(topic_filter, t)}
    found = [t for t, _ in store.match(topic_filter)]
    assert sorted(found) == sorted(expected)  # each topic once
    assert len(store) == len(live)
