"""Delayed publication in the sans-IO ingest core: ``PUBLISH $delayed/<seconds>/<topic>``
(services/ingest/delayed_rules.py, handle_publish.py), with bytes only.

Stored in ``msg.delayed`` (not ``msg.all``) and acknowledged once stored, like any accepted
PUBLISH; refused in its place among the acknowledgements when its delay or target topic is
not valid (v5: 0x90 Topic Name invalid, MQTT 5.0 3.4.2.1; v3.1.1: acknowledged and
dropped, as an unauthorized PUBLISH is, MQTT-3.3.5-2). Authorization of the target topic is
in test_ingest_auth.py.

Bounded (``max_delayed_messages`` in the cluster, ``max_delayed_messages_per_client``): over
a bound, v5 PUBACK / PUBREC 0x97 Quota exceeded in its place, v3.1.1 QoS 1/2 closes the
connection unacknowledged (MQTT-3.3.5-2), QoS 0 is dropped; each refusal is counted.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from test_ingest_support import (
    NOW_MS,
    Client,
    closes,
    make_settings,
    of_type,
    only,
    store_effects,
)

from services.common.kafka.names import TopicNames
from services.common.mqtt.errors import TopicNameInvalid
from services.common.mqtt.packets import PubAck, PubComp, Publish, PubRec, PubRel
from services.common.mqtt.properties import Properties
from services.common.mqtt.reason_codes import ReasonCode
from services.common.records import (
    DELAYED_ID_SIZE,
    PublishMeta,
    decode_meta,
    delayed_record,
    parse_delayed,
)
from services.ingest.delayed_rules import (
    DelayedCounts,
    DelayedTopic,
    parse_delayed_topic,
    waiting_record,
)
from services.ingest.effects import LimitRefused, StoreDelayed, StorePublish, StoreRetained
from services.ingest.limits import Refusal

VERSIONS = [4, 5]


def _connected(version: int, **settings: int) -> Client:
    client = Client(version, make_settings(**settings))
    client.connect()
    return client


@pytest.mark.parametrize("version", VERSIONS)
def test_a_delayed_publish_is_stored_in_msg_delayed_and_acknowledged_once_stored(
    version: int,
) -> None:
    client = _connected(version)
    effects = client.send(Publish("$delayed/15/a/b", b"later", qos=1, retain=True, packet_id=3))
    delayed = only(effects, StoreDelayed)
    assert effects == [delayed]  # nothing to msg.all or msg.retained now
    assert delayed.delay_seconds == 15
    assert delayed.meta == PublishMeta("a/b", 1, True, NOW_MS, version, b"")
    assert client.packets(effects) == []  # PUBACK waits for Kafka
    assert client.packets(client.stored(delayed.token)) == [PubAck(3)]


def test_a_delayed_record_is_due_after_its_delay_and_keeps_the_message() -> None:
    client = _connected(5)
    expiry = Properties(message_expiry_interval=60, content_type="text/plain")
    effects = client.send(Publish("$delayed/15/a/b", b"x", qos=2, packet_id=1, properties=expiry))
    delayed = only(effects, StoreDelayed)
    record = waiting_record("c1", delayed)
    assert record.due_at_ms == NOW_MS + 15_000
    meta = decode_meta(record.meta_raw)
    assert (meta.topic, meta.qos, meta.received_at_ms) == ("a/b", 2, NOW_MS)
    assert meta.properties  # forwarded as any PUBLISH's are, for the publication
    assert client.packets(client.stored(delayed.token)) == [PubRec(1)]
    assert client.packets(client.send(PubRel(1))) == [PubComp(1)]


def test_delayed_ids_name_the_connection_and_never_repeat() -> None:
    client = _connected(5)
    effects = client.send(
        Publish("$delayed/5/t", b"1", qos=1, packet_id=1),
        Publish("$delayed/5/t", b"2", qos=0),
    )
    ids = [d.delayed_id for d in of_type(effects, StoreDelayed)]
    assert len(set(ids)) == 2
    connection_id = client.conn.state.connection_id
    assert all(len(i) == DELAYED_ID_SIZE and i.startswith(connection_id) for i in ids)


def test_a_delay_of_zero_is_published_at_once() -> None:
    client = _connected(5)
    effects = client.send(Publish("$delayed/0/a/b", b"now", qos=1, retain=True, packet_id=1))
    store, retained = only(effects, StorePublish), only(effects, StoreRetained)
    assert store.meta.topic == retained.meta.topic == "a/b"
    assert not of_type(effects, StoreDelayed)


INVALID = [
    "$delayed/abc/t",  # not a number
    "$delayed/-1/t",
    "$delayed/1.5/t",
    "$delayed/\u0661\u0662/t",  # Arabic-Indic digits: str.isdigit, but not ASCII
    "$delayed/15",  # no target topic
    "$delayed/15/",  # an empty target topic
    "$delayed/61/t",  # over max_delay_seconds (60 here)
    "$delayed/99999999999999999999/t",
    "$delayed/15/$SYS/x",  # a $-topic is the server's (MQTT 4.7.2)
    "$delayed/15/$delayed/5/x",  # delayed twice
]


@pytest.mark.parametrize("name", INVALID)
def test_v5_an_invalid_delayed_topic_gets_0x90_in_its_place_and_the_connection_stays(
    name: str,
) -> None:
    client = _connected(5, max_delay_seconds=60)
    effects = client.send(
        Publish("a", b"first", qos=1, packet_id=1),
        Publish(name, b"x", qos=1, packet_id=2),
        Publish(name, b"x", qos=0),
    )
    [stored] = store_effects(effects)  # only the first
    answers = client.packets(client.stored(stored.token))
    assert [(p.packet_id, p.reason_code) for p in answers] == [  # type: ignore[attr-defined]
        (1, 0),
        (2, ReasonCode.TOPIC_NAME_INVALID),
    ]
    assert not client.conn.closed


def test_v311_an_invalid_delayed_topic_is_acknowledged_and_dropped() -> None:
    client = _connected(4, max_delay_seconds=60)
    effects = client.send(
        Publish("$delayed/61/t", b"x", qos=1, packet_id=1),
        Publish("$delayed/x/t", b"x", qos=2, packet_id=2),
    )
    assert store_effects(effects) == []
    assert client.packets(effects) == [PubAck(1), PubRec(2)]
    assert not client.conn.closed


def test_the_delay_may_be_the_maximum() -> None:
    assert parse_delayed_topic("$delayed/60/a/b", 60) == DelayedTopic(60, "a/b")
    assert parse_delayed_topic("$delayed/007/a", 60) == DelayedTopic(7, "a")
    assert parse_delayed_topic("delayed/5/a", 60) is None  # not the prefix: a plain topic
    assert parse_delayed_topic("$Delayed/5/a", 60) is None
    with pytest.raises(TopicNameInvalid):
        parse_delayed_topic("$delayed/61/a", 60)


def test_the_stored_record_parses_back() -> None:
    client = _connected(5)
    delayed = only(client.send(Publish("$delayed/2/a", b"p", qos=1, packet_id=1)), StoreDelayed)
    record = delayed_record(TopicNames("t."), waiting_record("c1", delayed))
    assert record.topic == "t.msg.delayed"
    client_id, delayed_id, waiting = parse_delayed(record.key, record.value)
    assert (client_id, delayed_id) == ("c1", delayed.delayed_id)
    assert waiting is not None and waiting.payload == b"p"


def _counts(client: Client) -> DelayedCounts:
    """The node's count of waiting delayed messages, as the client's connection sees it."""
    return client.conn.state.server.delayed


def _refusals(effects: Iterable[object]) -> list[Refusal]:
    return [e.refusal for e in of_type(effects, LimitRefused)]


def test_v5_a_delayed_publish_over_the_clients_bound_gets_0x97_in_its_place() -> None:
    client = _connected(5, max_delayed_messages_per_client=2)
    effects = client.send(
        *(Publish(f"$delayed/60/t/{n}", b"x", qos=1, packet_id=n) for n in (1, 2, 3)),
        Publish("$delayed/60/t/4", b"x", qos=0),
        Publish("$delayed/0/t/5", b"x", qos=0),  # published at once: it never waits
        Publish("t/6", b"x", qos=1, packet_id=6),  # not delayed: no bound
    )
    # Counted from acceptance, before Kafka answers: all in one read.
    assert [d.meta.topic for d in of_type(effects, StoreDelayed)] == ["t/1", "t/2"]
    assert len(of_type(effects, StorePublish)) == 2
    assert _refusals(effects) == [Refusal.DELAYED_MESSAGES] * 2  # the QoS 1 and the QoS 0
    answers = client.packets(client.store_all(effects))
    assert [(p.packet_id, p.reason_code) for p in answers] == [  # type: ignore[attr-defined]
        (1, 0),
        (2, 0),
        (3, ReasonCode.QUOTA_EXCEEDED),
        (6, 0),
    ]
    assert isinstance(answers[2], PubAck)
    assert answers[2].properties.reason_string == "too many delayed messages wait"
    assert _counts(client).of("c1") == 2
    assert not client.conn.closed


def test_v5_the_cluster_bound_counts_every_publisher_and_frees_with_the_tombstones() -> None:
    client = _connected(5, max_delayed_messages=2)
    counts = _counts(client)
    counts.add("other", b"a" * 24)
    counts.add("other", b"b" * 24)
    counts.add("other", b"b" * 24)  # a record read again counts once
    effects = client.send(Publish("$delayed/5/t", b"x", qos=2, packet_id=7))
    assert store_effects(effects) == []
    assert _refusals(effects) == [Refusal.DELAYED_MESSAGES]
    [refused] = client.packets(effects)
    assert isinstance(refused, PubRec)
    assert (refused.packet_id, refused.reason_code) == (7, ReasonCode.QUOTA_EXCEEDED)
    # A refused PUBREC ends the exchange (MQTT 5.0 4.3.3): the id is free for a new one.
    counts.remove("other", b"a" * 24)  # published (or cancelled): its tombstone was read
    effects = client.send(Publish("$delayed/5/t", b"x", qos=2, packet_id=7))
    assert client.packets(client.store_all(effects)) == [PubRec(7)]
    assert counts.total == 2


@pytest.mark.parametrize("qos", [1, 2])
def test_v311_a_delayed_publish_over_its_bound_closes_the_connection_unacknowledged(
    qos: int,
) -> None:
    client = _connected(4, max_delayed_messages_per_client=1)
    accepted = client.send(Publish("$delayed/9/t", b"x", qos=1, packet_id=1))
    effects = client.send(Publish("$delayed/9/t", b"y", qos=qos, packet_id=2))
    assert store_effects(effects) == []
    assert _refusals(effects) == [Refusal.DELAYED_MESSAGES]
    assert client.packets(effects) == []  # no PUBACK / PUBREC: the client keeps it
    assert closes(effects)
    assert client.conn.closed
    assert len(store_effects(accepted)) == 1


def test_v311_a_qos0_delayed_publish_over_its_bound_is_dropped_and_counted() -> None:
    client = _connected(4, max_delayed_messages=0)
    effects = client.send(Publish("$delayed/9/t", b"x", qos=0))
    assert store_effects(effects) == []
    assert _refusals(effects) == [Refusal.DELAYED_MESSAGES]
    assert not client.conn.closed


def test_a_failed_store_is_no_longer_counted() -> None:
    counts = DelayedCounts()
    counts.add("c", b"1" * 24)
    counts.remove("c", b"1" * 24)
    counts.remove("c", b"1" * 24)  # a tombstone read after the store failure was noted
    assert (counts.total, counts.of("c")) == (0, 0)
    assert counts.refusal("c", 1, 1) is None
    counts.add("c", b"2" * 24)
    assert counts.refusal("c", 5, 1) == "1 delayed messages of this client wait (max 1)"
    assert counts.refusal("d", 1, 5) == "1 delayed messages wait in the cluster (max 1)"
