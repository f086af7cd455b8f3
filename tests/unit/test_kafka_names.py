"""Topic names of APPLICATION clients (services/common/kafka/names.py): Kafka's charset and
length, injective in the client id or Shared Subscription, collision-free under Kafka's
rule that ``.`` and ``_`` are the same character in topic names."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from services.common.kafka.names import KAFKA_TOPIC_MAX, TopicNames, escape, fitted

KAFKA_CHARSET = re.compile(r"^[A-Za-z0-9._-]+$")

# Client ids as MQTT allows them (any UTF-8 but U+0000 and lone surrogates), biased
# towards the characters escaping must not confuse.
client_ids = st.text(
    alphabet=st.one_of(
        st.sampled_from("._-_5f2e/aZ09é€"),
        st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    ),
    max_size=300,
)


def _kafka_key(name: str) -> str:
    """What Kafka compares when it looks for colliding topic names."""
    return name.replace(".", "_")


def test_escape_keeps_safe_bytes_and_escapes_the_rest() -> None:
    assert escape("sensor-01") == "sensor-01"
    assert escape("a.b_c/d") == "a_2eb_5fc_2fd"
    assert escape("é") == "_c3_a9"
    assert escape("") == ""


@given(client_ids, client_ids)
def test_escape_is_injective_and_in_kafkas_charset_without_dots(a: str, b: str) -> None:
    ea, eb = escape(a), escape(b)
    assert (ea == eb) == (a == b)
    for escaped in (ea, eb):
        assert "." not in escaped
        assert escaped == "" or KAFKA_CHARSET.match(escaped)


@given(client_ids, client_ids)
def test_app_topic_names_are_valid_and_distinct_under_kafkas_collision_rule(a: str, b: str) -> None:
    names = TopicNames("test-1234.")
    ta, tb = names.app(a), names.app(b)
    for topic in (ta, tb):
        assert len(topic) <= KAFKA_TOPIC_MAX
        assert KAFKA_CHARSET.match(topic)
    assert (_kafka_key(ta) == _kafka_key(tb)) == (a == b)
    assert (names.app_group(a) == names.app_group(b)) == (a == b)


def test_long_ids_are_shortened_with_a_digest_and_stay_distinct() -> None:
    names = TopicNames("p.")
    long_a, long_b = "x" * 400, "x" * 399 + "y"
    ta, tb = names.app(long_a), names.app(long_b)
    assert len(ta) == len(tb) == KAFKA_TOPIC_MAX
    assert ta != tb and "__" in ta
    # A name just at the limit is kept whole; one character more is shortened.
    head = "p.msg.app."
    fits = "a" * (KAFKA_TOPIC_MAX - len(head))
    assert names.app(fits) == head + fits
    assert "__" in names.app(fits + "a")


def test_a_shortened_name_never_ends_inside_an_escape() -> None:
    for pad in range(3):
        name = fitted("h.", "a" * pad + "_c3_a9" * 100)
        kept = name[len("h.") : name.index("__")]
        assert re.fullmatch(r"a*(_c3_a9|_c3)*", kept), kept


@given(st.text(min_size=1, max_size=20).filter(lambda s: "/" not in s), client_ids, client_ids)
def test_shared_topics_never_collide_with_client_topics(
    share: str, topic_filter: str, client_id: str
) -> None:
    names = TopicNames()
    shared = names.app_shared(share, topic_filter)
    assert KAFKA_CHARSET.match(shared) and len(shared) <= KAFKA_TOPIC_MAX
    assert _kafka_key(shared) != _kafka_key(names.app(client_id))
    assert names.app_shared_group(share, topic_filter) != names.app_group(client_id)


def test_shared_topic_names_one_subscription_each() -> None:
    names = TopicNames()
    # The ShareName has no "/" (MQTT 4.8.2), so "<share>/<filter>" is unambiguous.
    assert names.app_shared("g", "a/b") != names.app_shared("h", "a/b")
    assert names.app_shared("g", "a/b") != names.app_shared("g", "a/+")
