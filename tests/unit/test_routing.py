"""The router's pure logic (services/router/routing.py): who gets a message, on which node.

MQTT 3.3.4 (overlapping subscriptions), 3.8.4 (granted QoS), 4.8.2 (shared subscriptions).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable

import pytest
from aiokafka.structs import ConsumerRecord

from services.common.kafka.consumer import Record
from services.common.kafka.names import TopicNames
from services.common.metrics import DROPPED, Drop
from services.common.mqtt.packets import PacketType
from services.common.mqtt.properties import Properties, encode_properties
from services.common.records import (
    ClientKind,
    KafkaRecord,
    Origin,
    PublishMeta,
    RecordError,
    RetainedRequest,
    SessionRecord,
    Target,
    client_session_record,
    client_subscriptions_record,
    decode_meta,
    decode_subscriptions,
    decode_targets,
    encode_meta,
    encode_origin,
    encode_session,
    encode_subscriptions,
    publish_record,
    retained_record,
    retained_request_record,
)
from services.common.sessions import DeliveryPath
from services.common.subscription import LiveFrom, ReplayProgress, Subscription
from services.router import routing
from services.router.main import RouterCounters, outputs, state_families
from services.router.routing import RoutingTable


def _session(node: str, connected: bool = True) -> SessionRecord:
    return SessionRecord(node, bytes(16), connected, 5, True, False)


def _meta(topic: str, qos: int = 1, retain: bool = False) -> PublishMeta:
    return PublishMeta(topic, qos, retain, 0, 5)


def _table(**clients: tuple[str | None, list[Subscription]]) -> RoutingTable:
    """A table where each client is connected on the given node (None: disconnected)."""
    table = RoutingTable()
    for client_id, (node, subs) in clients.items():
        table.set_subscriptions(client_id, subs)
        table.set_session(client_id, _session(node or "gone", connected=node is not None))
    return table


def _sub(
    client: str,
    topic_filter: str,
    qos: int = 1,
    *,
    no_local: bool = False,
    retain_as_published: bool = False,
    subscription_identifier: int | None = None,
) -> Subscription:
    return Subscription(
        client,
        topic_filter,
        qos,
        no_local=no_local,
        retain_as_published=retain_as_published,
        subscription_identifier=subscription_identifier,
    )


def test_route_groups_targets_per_node() -> None:
    table = _table(
        a=("n1", [_sub("a", "t/#")]),
        b=("n1", [_sub("b", "t/+")]),
        c=("n2", [_sub("c", "t/x")]),
        d=("n2", [_sub("d", "other")]),
    )
    routed = table.route("pub", _meta("t/x")).by_node
    assert {node: sorted(t.client_id for t in ts) for node, ts in routed.items()} == {
        "n1": ["a", "b"],
        "n2": ["c"],
    }


def test_no_match_routes_nowhere() -> None:
    table = _table(a=("n1", [_sub("a", "t")]))
    assert dict(table.route("pub", _meta("u")).by_node) == {}


def test_disconnected_and_unknown_clients_are_skipped() -> None:
    table = _table(a=("n1", [_sub("a", "t")]), b=(None, [_sub("b", "t")]))
    table.set_subscriptions("ghost", [_sub("ghost", "t")])  # no session record at all
    assert dict(table.route("pub", _meta("t")).by_node) == {"n1": [Target("a", 1)]}


def test_session_tombstone_forgets_the_client() -> None:
    table = _table(a=("n1", [_sub("a", "t")]))
    table.set_session("a", None)
    assert dict(table.route("pub", _meta("t")).by_node) == {}
    table.set_session("a", None)  # a second tombstone is harmless
    assert dict(table.route("pub", _meta("t")).by_node) == {}


def test_client_moving_to_another_node_is_routed_there() -> None:
    table = _table(a=("n1", [_sub("a", "t")]))
    table.set_session("a", _session("n2"))
    assert list(table.route("pub", _meta("t")).by_node) == ["n2"]


@pytest.mark.parametrize(
    ("publish_qos", "sub_qos", "granted"), [(0, 1, 0), (1, 0, 0), (1, 1, 1), (2, 1, 1), (1, 2, 1)]
)
def test_granted_qos_is_the_minimum(publish_qos: int, sub_qos: int, granted: int) -> None:
    table = _table(a=("n1", [_sub("a", "t", sub_qos)]))
    [target] = table.route("pub", _meta("t", publish_qos)).by_node["n1"]
    assert target.qos == granted


def test_overlapping_subscriptions_collapse_into_one_target() -> None:
    table = _table(
        a=(
            "n1",
            [
                _sub("a", "t/#", 0, subscription_identifier=3),
                _sub("a", "t/+", 1, subscription_identifier=1, retain_as_published=True),
                _sub("a", "t/x", 0),
            ],
        )
    )
    assert table.route("pub", _meta("t/x", 2)).by_node["n1"] == [Target("a", 1, True, (1, 3))]


def test_no_local_skips_the_publisher_only() -> None:
    table = _table(
        a=("n1", [_sub("a", "t", no_local=True)]),
        b=("n1", [_sub("b", "t", no_local=True)]),
    )
    assert [t.client_id for t in table.route("a", _meta("t")).by_node["n1"]] == ["b"]


def test_shared_group_round_robins_over_connected_members() -> None:
    members = {
        c: ("n1" if c != "m2" else "n2", [_sub(c, "$share/g/t/+")]) for c in ("m1", "m2", "m3")
    }
    table = _table(**members)
    chosen = []
    for _ in range(6):
        routed = table.route("pub", _meta("t/x")).by_node
        [(node, [target])] = routed.items()
        assert node == ("n2" if target.client_id == "m2" else "n1")
        chosen.append(target.client_id)
    assert chosen == ["m1", "m2", "m3", "m1", "m2", "m3"]


def test_shared_group_skips_disconnected_members() -> None:
    table = _table(
        m1=("n1", [_sub("m1", "$share/g/t")]),
        m2=(None, [_sub("m2", "$share/g/t")]),
        m3=("n1", [_sub("m3", "$share/g/t")]),
    )
    chosen = [table.route("pub", _meta("t")).by_node["n1"][0].client_id for _ in range(4)]
    assert Counter(chosen) == {"m1": 2, "m3": 2}


def test_shared_group_without_connected_members_routes_nowhere() -> None:
    table = _table(m1=(None, [_sub("m1", "$share/g/t")]))
    assert dict(table.route("pub", _meta("t")).by_node) == {}


def test_each_shared_group_gets_one_copy_besides_plain_subscribers() -> None:
    table = _table(
        a=("n1", [_sub("a", "$share/g1/t", 1, subscription_identifier=8), _sub("a", "t", 0)]),
        b=("n1", [_sub("b", "$share/g2/t", 0)]),
    )
    targets = table.route("pub", _meta("t", 1)).by_node["n1"]
    assert sorted(targets, key=lambda t: (t.client_id, t.qos)) == [
        Target("a", 0),
        Target("a", 1, False, (8,)),
        Target("b", 0),
    ]


def test_replacing_subscriptions_drops_the_old_ones() -> None:
    table = _table(a=("n1", [_sub("a", "old")]))
    table.set_subscriptions("a", [_sub("a", "new")])
    assert dict(table.route("pub", _meta("old")).by_node) == {}
    assert table.route("pub", _meta("new")).by_node["n1"] == [Target("a", 1)]
    table.set_subscriptions("a", [])
    assert len(table.trie) == 0


def test_invalid_subscription_in_a_record_is_skipped_not_fatal() -> None:
    table = RoutingTable()
    table.set_subscriptions(
        "a", [_sub("a", "bad/#/x"), _sub("a", "$share/g/t", no_local=True), _sub("a", "ok")]
    )
    table.set_session("a", _session("n1"))
    assert table.route("pub", _meta("ok")).by_node["n1"] == [Target("a", 1)]
    assert len(table.trie) == 1


# ---------------------------------------------------------------------- Kafka records


def test_a_late_delete_of_an_older_session_is_not_applied() -> None:
    """Issue 22.1: the delete of a clean session that ended on another node lands after a
    newer session's records; the newer session keeps its subscriptions. Its own delete
    (same ``session_id``) still deletes it."""
    names = TopicNames("t.")
    newer = SessionRecord("n2", b"n" * 16, False, 5, False, True, session_id=b"n" * 16)
    table = RoutingTable()
    table.apply_session_record(b"a", encode_session(newer))
    table.apply_subscriptions_record(b"a", encode_subscriptions([_sub("a", "t")]))
    stale = client_subscriptions_record(names, "a", [], deletes=b"o" * 16)
    table.apply_subscriptions_record(stale.key, stale.value, stale.headers)
    stale = client_session_record(names, "a", None, deletes=b"o" * 16)
    table.apply_session_record(stale.key, stale.value, stale.headers)
    assert table.sessions["a"] == newer
    assert [s.topic_filter for s in table.trie.subscriptions_of("a")] == ["t"]
    own = client_subscriptions_record(names, "a", [], deletes=newer.session_id)
    table.apply_subscriptions_record(own.key, own.value, own.headers)
    assert list(table.trie.subscriptions_of("a")) == []
    own = client_session_record(names, "a", None, deletes=newer.session_id)
    table.apply_session_record(own.key, own.value, own.headers)
    assert "a" not in table.sessions


def test_records_are_applied() -> None:
    table = RoutingTable()
    table.apply_subscriptions_record(b"a", encode_subscriptions([_sub("a", "t")]))
    table.apply_session_record(b"a", encode_session(_session("n1")))
    assert table.route("pub", _meta("t")).by_node["n1"] == [Target("a", 1)]
    table.apply_subscriptions_record(b"a", None)
    assert dict(table.route("pub", _meta("t")).by_node) == {}
    table.apply_session_record(b"a", None)
    assert "a" not in table.sessions


@pytest.mark.parametrize("value", [b"", b"\x02", b"\x01\x00", b"\x01\x00\x00\x00\x01\x00"])
def test_garbage_subscription_record_raises_record_error(value: bytes) -> None:
    table = RoutingTable()
    with pytest.raises(RecordError):
        table.apply_subscriptions_record(b"a", value)


@pytest.mark.parametrize("value", [b"", b"\x02", b"\x01" * 10])
def test_garbage_session_record_raises_record_error(value: bytes) -> None:
    table = RoutingTable()
    with pytest.raises(RecordError):
        table.apply_session_record(b"a", value)


def test_non_utf8_key_raises_record_error() -> None:
    table = RoutingTable()
    with pytest.raises(RecordError):
        table.apply_subscriptions_record(b"\xff", encode_subscriptions([]))
    with pytest.raises(RecordError):
        table.apply_session_record(b"\xff", None)
    assert table.sessions == {}


# ---------------------------------------------------------------------- persistent sessions


def _persistent(node: str, connected: bool) -> SessionRecord:
    return SessionRecord(node, bytes(16), connected, 5, False, True, session_expiry_interval=60)


@pytest.mark.parametrize("connected", [True, False], ids=["connected", "offline"])
def test_a_persistent_device_session_is_routed_to_its_store(connected: bool) -> None:
    table = _table(plain=("n1", [_sub("plain", "t/#")]))
    table.set_subscriptions("dev", [_sub("dev", "t/+", 2, subscription_identifier=4)])
    table.set_session("dev", _persistent("n2", connected))
    routes = table.route("pub", _meta("t/x", 1))
    assert routes.persisted == [Target("dev", 1, False, (4,))]
    assert dict(routes.by_node) == {"n1": [Target("plain", 1)]}


# ---------------------------------------------------------------------- APPLICATION clients

APP_SESSION = b"app-session-0001"


def _app(node: str, connected: bool, persistent: bool = True) -> SessionRecord:
    return SessionRecord(
        node,
        bytes(16),
        connected,
        5,
        not persistent,
        persistent,
        ClientKind.APPLICATION,
        session_expiry_interval=60 if persistent else 0,
        session_id=APP_SESSION,
    )


@pytest.mark.parametrize("connected", [True, False], ids=["connected", "offline"])
def test_a_persistent_application_session_is_routed_to_its_own_topic(connected: bool) -> None:
    table = _table(plain=("n1", [_sub("plain", "t/#")]))
    table.set_subscriptions("app", [_sub("app", "t/+", 2, subscription_identifier=9)])
    table.set_session("app", _app("n2", connected))
    routes = table.route("pub", _meta("t/x", 1))
    # One target with the session it was routed for; never the DEVICE store, never a node.
    assert routes.app == [(Target("app", 1, False, (9,)), APP_SESSION)]
    assert routes.persisted == []
    assert dict(routes.by_node) == {"n1": [Target("plain", 1)]}


def test_a_non_persistent_application_client_is_routed_like_a_device() -> None:
    table = RoutingTable()
    table.set_subscriptions("app", [_sub("app", "t")])
    table.set_session("app", _app("n1", connected=True, persistent=False))
    routes = table.route("pub", _meta("t"))
    assert (dict(routes.by_node), routes.app) == ({"n1": [Target("app", 1)]}, [])
    table.set_session("app", _app("n1", connected=False, persistent=False))
    routes = table.route("pub", _meta("t"))
    assert (dict(routes.by_node), routes.app) == ({}, [])


def test_a_shared_group_of_application_members_writes_one_record_to_its_topic() -> None:
    table = RoutingTable()
    for member, connected in (("a1", True), ("a2", False), ("a3", True)):
        table.set_subscriptions(member, [_sub(member, "$share/g/t/#")])
        table.set_session(member, _app("n1", connected))
    table.set_subscriptions("other", [_sub("other", "$share/h/t/+")])
    table.set_session("other", _app("n2", connected=False))
    for _ in range(4):
        routes = table.route("pub", _meta("t/x"))
        assert sorted(routes.app_shared) == [("g", "t/#"), ("h", "t/+")]
        assert (routes.app, dict(routes.by_node), routes.persisted) == ([], {}, [])


def test_a_mixed_shared_group_gives_devices_their_turns_and_applications_theirs() -> None:
    table = _table(d1=("n1", [_sub("d1", "$share/g/t")]), d2=("n2", [_sub("d2", "$share/g/t")]))
    table.set_subscriptions("app", [_sub("app", "$share/g/t")])
    table.set_session("app", _app("n1", connected=True))
    turns: Counter[str] = Counter()
    for _ in range(30):
        routes = table.route("pub", _meta("t"))
        chosen = [t.client_id for ts in routes.by_node.values() for t in ts]
        chosen += ["app-topic" for _ in routes.app_shared]
        assert len(chosen) == 1
        turns[chosen[0]] += 1
    assert turns == {"d1": 10, "d2": 10, "app-topic": 10}


def test_an_offline_application_member_keeps_the_groups_messages_in_its_topic() -> None:
    table = _table(d=(None, [_sub("d", "$share/g/t")]))
    table.set_subscriptions("app", [_sub("app", "$share/g/t")])
    table.set_session("app", _app("n1", connected=False))
    routes = table.route("pub", _meta("t"))
    assert (routes.app_shared, dict(routes.by_node)) == ([("g", "t")], {})


def test_retained_messages_for_an_application_client_go_to_its_topic() -> None:
    table = RoutingTable()
    table.set_session("app", _app("n1", connected=True))
    table.apply_retained_record(b"r", b"kept", [("m", encode_meta(PublishMeta("r", 1, True, 0)))])
    assert table.path("app") is DeliveryPath.APPLICATION
    assert table.sessions["app"].session_id == APP_SESSION
    [(message, target)] = table.retained_for("app", [_sub("app", "r")], 0)
    assert (message.payload, target) == (b"kept", Target("app", 1, True))


def test_a_shared_group_prefers_connected_members_then_stores_for_persistent_ones() -> None:
    table = _table(m1=(None, [_sub("m1", "$share/g/t")]), m2=("n1", [_sub("m2", "$share/g/t")]))
    table.set_subscriptions("p", [_sub("p", "$share/g/t")])
    table.set_session("p", _persistent("n2", connected=False))
    for _ in range(3):
        routes = table.route("pub", _meta("t"))
        assert (dict(routes.by_node), routes.persisted) == ({"n1": [Target("m2", 1)]}, [])
    table.set_session("m2", _session("n1", connected=False))
    routes = table.route("pub", _meta("t"))
    assert (dict(routes.by_node), routes.persisted) == ({}, [Target("p", 1)])


# ---------------------------------------------------------------------- retained messages


def _retain(table: RoutingTable, topic: str, payload: bytes, qos: int, **meta: object) -> None:
    raw = encode_meta(PublishMeta(topic, qos, True, **meta))  # type: ignore[arg-type]
    table.apply_retained_record(topic.encode(), payload, [("m", raw)])


def test_retained_messages_for_new_subscriptions() -> None:
    table = _table(a=("n1", []))
    _retain(table, "s/1", b"one", 2, received_at_ms=0)
    _retain(table, "s/2", b"two", 0, received_at_ms=0)
    _retain(table, "other", b"x", 1, received_at_ms=0)
    subs = [_sub("a", "s/+", 1, subscription_identifier=7), _sub("a", "s/1", 2)]
    found = {m.meta.topic: (m.payload, t) for m, t in table.retained_for("a", subs, 1)}
    # One delivery per topic, RETAIN forced on, QoS = min(message, best subscription).
    assert found == {
        "s/1": (b"one", Target("a", 2, True, (7,))),
        "s/2": (b"two", Target("a", 0, True, (7,))),
    }


def test_retained_expired_deleted_and_undeliverable_cases() -> None:
    table = _table(a=("n1", []), gone=(None, []))
    expiring = encode_properties(Properties(message_expiry_interval=10), PacketType.PUBLISH)
    _retain(table, "e", b"old", 1, received_at_ms=1_000, protocol_version=5, properties=expiring)
    subs = [_sub("a", "#")]
    assert [m.payload for m, _ in table.retained_for("a", subs, 10_999)] == [b"old"]
    assert table.retained_for("a", subs, 11_000) == []  # the 10 s interval has passed
    assert table.retained_for("gone", [_sub("gone", "#")], 0) == []  # nowhere to deliver
    table.apply_retained_record(b"e", None, [])  # tombstone: retained message deleted
    assert len(table.retained) == 0


def test_retained_record_without_metadata_is_a_record_error() -> None:
    with pytest.raises(RecordError):
        RoutingTable().apply_retained_record(b"t", b"payload", [])


def test_application_records_carry_payload_meta_target_and_session() -> None:
    names = TopicNames("p.")
    table = RoutingTable()
    table.set_subscriptions("app", [_sub("app", "t/#")])
    table.set_session("app", _app("n1", connected=False))
    table.set_subscriptions("m", [_sub("m", "$share/grp/t/+", 1)])
    table.set_session("m", _app("n2", connected=True))
    meta = encode_meta(_meta("t/x", 1))
    record = ConsumerRecord(
        names.msg_all, 0, 7, 0, 0, b"pub-1", b"payload", None, 0, 0, [("m", meta)]
    )
    out = {topic: (key, value, dict(headers)) for topic, key, value, headers in
           outputs(table, names, record, 0)}  # fmt: skip
    assert set(out) == {names.app("app"), names.app_shared("grp", "t/+")}
    key, value, headers = out[names.app("app")]
    # Keyed by the publisher: its messages keep their order in the client's topic.
    assert (key, value, headers["m"], headers["s"]) == (b"pub-1", b"payload", meta, APP_SESSION)
    assert decode_targets(headers["t"]) == [Target("app", 1)]
    # Each record names its origin, the msg.all partition and offset it was routed from.
    origin = encode_origin(Origin(0, 7, 0))
    assert out[names.app_shared("grp", "t/+")] == (b"pub-1", b"payload", {"m": meta, "o": origin})
    assert headers["o"] == origin


# RoutingTable.outdated: would messages routed at an earlier version be routed otherwise now?


def _progressed(client: str, topic_filter: str) -> Subscription:
    """``_sub(client, topic_filter)`` with a persistent replay's progress."""
    return dataclasses.replace(_sub(client, topic_filter), replay=ReplayProgress((5,), (3,), (4,)))


def test_nothing_applied_since_means_not_outdated() -> None:
    table = _table(a=("n1", [_sub("a", "t/#")]))
    version = table.version
    assert not table.outdated(version, ["t/1"], [RetainedRequest("a", [_sub("a", "t/#")])])


@pytest.mark.parametrize(
    ("change", "topic", "outdated"),
    [
        # A new subscription matching the message: it would get it now.
        (lambda t: t.set_subscriptions("b", [_sub("b", "t/+")]), "t/1", True),
        (lambda t: t.set_subscriptions("b", [_sub("b", "other/#")]), "t/1", False),
        # A removed one (UNSUBSCRIBE) that matched: it would not get it now.
        (lambda t: t.set_subscriptions("a", []), "t/1", True),
        (lambda t: t.set_subscriptions("a", []), "u/1", False),
        # A subscriber that moved node or went away; a client without subscriptions.
        (lambda t: t.set_session("a", _session("n2")), "t/1", True),
        (lambda t: t.set_session("a", None), "t/1", True),
        (lambda t: t.set_session("c", _session("n2")), "t/1", False),
        # A shared group member's session: the group's member choice may differ.
        (lambda t: t.set_session("s1", _session("n2")), "g/1", True),
        # A retained message changes no live routing.
        (lambda t: _retain(t, "t/1", b"r", 1, received_at_ms=0), "t/1", False),
        # Nor does a persistent replay's progress (its cut is the same).
        (lambda t: t.set_subscriptions("a", [_progressed("a", "t/#")]), "t/1", False),
        (lambda t: t.set_subscriptions("a", [_sub("a", "t/#", 2)]), "t/1", True),
    ],
    ids=[
        "new-match",
        "new-no-match",
        "removed-match",
        "removed-no-match",
        "moved",
        "gone",
        "no-subscriptions",
        "shared-member",
        "retained",
        "replay-progress",
        "qos",
    ],
)
def test_a_change_outdates_the_messages_it_concerns(
    change: Callable[[RoutingTable], object], topic: str, outdated: bool
) -> None:
    table = _table(a=("n1", [_sub("a", "t/#")]), s1=("n1", [_sub("s1", "$share/g/g/#")]))
    version = table.version
    change(table)
    assert table.outdated(version, [topic]) is outdated
    assert table.outdated(table.version, [topic]) is False


def test_retained_requests_are_outdated_by_their_client_and_matching_retained_messages() -> None:
    table = _table(a=("n1", []))
    request = RetainedRequest("a", [_sub("a", "r/+")])
    version = table.version
    _retain(table, "elsewhere", b"x", 1, received_at_ms=0)
    assert not table.outdated(version, [], [request])
    _retain(table, "r/1", b"x", 1, received_at_ms=0)
    assert table.outdated(version, [], [request])
    version = table.version
    table.set_session("a", _session("n2"))
    assert table.outdated(version, [], [request])


def test_changes_beyond_what_is_remembered_count_as_outdating() -> None:
    table = _table(a=("n1", [_sub("a", "t/#")]))
    version = table.version
    for i in range(routing.JOURNAL_LENGTH + 1):
        table.set_session(f"x{i}", _session("n1"))  # none of them matters to t/1...
    assert table.outdated(version, ["t/1"])  # ...but the journal no longer reaches back
    version = table.version
    many = [_sub("big", f"big/{i}") for i in range(routing.OUTDATED_MAX_SUBSCRIPTIONS + 1)]
    table.set_subscriptions("big", many)
    assert table.outdated(version, ["t/1"])  # too many to index: outdated without looking


# The cut between a SUBSCRIBE's retained copies and its live messages (issue 22.2)


def _consumer_record(record: KafkaRecord, partition: int, offset: int) -> Record:
    """``record`` as the router reads it back from ``partition`` at ``offset``."""
    return ConsumerRecord(
        record.topic, partition, offset, 0, 0, record.key, record.value, None, 0, 0,
        list(record.headers),
    )  # fmt: skip


def _copies(table: RoutingTable, names: TopicNames, record: Record) -> list[tuple[str, bool]]:
    """Each copy ``record`` routes: its subscriber and whether it carries RETAIN 1."""
    copies = []
    for _, _, _, headers in outputs(table, names, record, 0):
        retain = decode_meta(dict(headers)["m"]).retain
        for target in decode_targets(dict(headers)["t"]):
            copies.append((target.client_id, retain and target.retain_as_published))
    return sorted(copies)


def test_a_retained_publish_acknowledged_before_a_subscribe_arrives_once_as_the_retained_copy() -> (
    None
):
    """The interleaving of issue 22.2, replayed in the order that made two copies: the
    router reads the SUBSCRIBE's subscription record before it routes a retained PUBLISH
    that was acknowledged before that SUBSCRIBE. The PUBLISH lies below the subscription's
    cut, so it is not sent live; the retained request sends it once, with RETAIN 1.
    Messages at or after the cut, and other subscribers, are routed live as before."""
    names = TopicNames("p.")
    table = RoutingTable()
    meta = PublishMeta("t/r", 1, True, 0, 4)
    # 1. The PUBLISH is stored at msg.all partition 3, offset 41, and its retained record.
    published = _consumer_record(publish_record(names, "pub", meta, b"kept"), 3, 41)
    retained = retained_record(names, meta, b"kept")
    table.apply_retained_record(retained.key, retained.value, retained.headers)
    # 2. SUBSCRIBE after the PUBACK: msg.all's end offsets (partition 3 at 42) cut it.
    new = Subscription("sub", "t/#", 1, live_from=LiveFrom((0, 0, 0, 42)))
    stored = client_subscriptions_record(names, "sub", [new])
    table.apply_subscriptions_record(stored.key, stored.value, stored.headers)
    table.set_session("sub", _session("n2"))
    table.set_subscriptions("old", [_sub("old", "t/#")])  # subscribed long before
    table.set_session("old", _session("n1"))
    # 3. The router routes the PUBLISH only now: not to "sub", still to "old".
    assert _copies(table, names, published) == [("old", False)]
    # 4. The retained request (the SUBSCRIBE's msg.all record) sends the retained copy.
    request = _consumer_record(retained_request_record(names, "sub", [new]), 5, 9)
    assert _copies(table, names, request) == [("sub", True)]
    # At the cut and after it, and for a message without RETAIN below it: live.
    both = [("old", False), ("sub", False)]
    later = _consumer_record(publish_record(names, "pub", meta, b"new"), 3, 42)
    assert _copies(table, names, later) == both
    plain = PublishMeta("t/r", 1, False, 0, 4)
    below = _consumer_record(publish_record(names, "pub", plain, b"live"), 3, 40)
    assert _copies(table, names, below) == both
    # A partition the cut does not cover (msg.all grew) is live too.
    elsewhere = _consumer_record(publish_record(names, "pub", meta, b"x"), 7, 0)
    assert _copies(table, names, elsewhere) == both


def test_a_subscriptions_cut_survives_its_record() -> None:
    """The cut travels in ``client.subscriptions`` (options bit 0x40): every router reads
    it; a subscription without one is encoded as before."""
    cut = Subscription("c", "a/+", 2, retain_handling=1, live_from=LiveFrom((5, 0, 7)))
    plain = _sub("c", "b")
    [back_cut, back_plain] = decode_subscriptions("c", encode_subscriptions([cut, plain]))
    assert back_cut == cut and back_cut.live_from is not None
    assert back_cut.live_from.offsets == (5, 0, 7)
    assert back_plain == plain and back_plain.live_from is None
    assert encode_subscriptions([plain]) == encode_subscriptions([_sub("c", "b")])


def test_state_gauges_and_unrouted_messages_are_served() -> None:
    """cormorant_sessions{connected, persistent}, cormorant_subscriptions,
    cormorant_retained_messages; a message routed nowhere counts as dropped, no subscriber."""
    table = _table(a=("n1", [_sub("a", "t/#"), _sub("a", "u")]), b=(None, [_sub("b", "t/x")]))
    table.set_session("p", SessionRecord("n1", bytes(16), True, 5, False, True))
    families = {family.name: family for family in state_families(table)}
    sessions = {
        (s.labels["connected"], s.labels["persistent"]): s.value
        for s in families["cormorant_sessions"].samples
    }
    assert sessions == {
        ("true", "true"): 1,
        ("true", "false"): 1,
        ("false", "true"): 0,
        ("false", "false"): 1,
    }
    assert families["cormorant_subscriptions"].samples[0].value == 3
    assert families["cormorant_retained_messages"].samples[0].value == 0
    counters = RouterCounters()
    before = DROPPED[Drop.NO_SUBSCRIBER]
    counters.count(table.route("pub", _meta("t/x")))
    assert DROPPED[Drop.NO_SUBSCRIBER] == before
    counters.count(table.route("pub", _meta("nobody/listens")))
    assert DROPPED[Drop.NO_SUBSCRIBER] == before + 1
