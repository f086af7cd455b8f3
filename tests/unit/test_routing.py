"""The router's pure logic (services/router/routing.py): who gets a message, on which node.

MQTT 3.3.4 (overlapping subscriptions), 3.8.4 (granted QoS), 4.8.2 (shared subscriptions).
"""

from __future__ import annotations

from collections import Counter

import pytest

from services.common.records import (
    PublishMeta,
    RecordError,
    SessionRecord,
    Target,
    encode_session,
    encode_subscriptions,
)
from services.common.topics.trie import Subscription
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
    routed = table.route("pub", _meta("t/x"))
    assert {node: sorted(t.client_id for t in ts) for node, ts in routed.items()} == {
        "n1": ["a", "b"],
        "n2": ["c"],
    }


def test_no_match_routes_nowhere() -> None:
    table = _table(a=("n1", [_sub("a", "t")]))
    assert dict(table.route("pub", _meta("u"))) == {}


def test_disconnected_and_unknown_clients_are_skipped() -> None:
    table = _table(a=("n1", [_sub("a", "t")]), b=(None, [_sub("b", "t")]))
    table.set_subscriptions("ghost", [_sub("ghost", "t")])  # no session record at all
    assert dict(table.route("pub", _meta("t"))) == {"n1": [Target("a", 1)]}


def test_session_tombstone_forgets_the_client() -> None:
    table = _table(a=("n1", [_sub("a", "t")]))
    table.set_session("a", None)
    assert dict(table.route("pub", _meta("t"))) == {}
    table.set_session("a", None)  # a second tombstone is harmless
    assert dict(table.route("pub", _meta("t"))) == {}


def test_client_moving_to_another_node_is_routed_there() -> None:
    table = _table(a=("n1", [_sub("a", "t")]))
    table.set_session("a", _session("n2"))
    assert list(table.route("pub", _meta("t"))) == ["n2"]


@pytest.mark.parametrize(
    ("publish_qos", "sub_qos", "granted"), [(0, 1, 0), (1, 0, 0), (1, 1, 1), (2, 1, 1), (1, 2, 1)]
)
def test_granted_qos_is_the_minimum(publish_qos: int, sub_qos: int, granted: int) -> None:
    table = _table(a=("n1", [_sub("a", "t", sub_qos)]))
    [target] = table.route("pub", _meta("t", publish_qos))["n1"]
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
    assert table.route("pub", _meta("t/x", 2))["n1"] == [Target("a", 1, True, (1, 3))]


def test_no_local_skips_the_publisher_only() -> None:
    table = _table(
        a=("n1", [_sub("a", "t", no_local=True)]),
        b=("n1", [_sub("b", "t", no_local=True)]),
    )
    assert [t.client_id for t in table.route("a", _meta("t"))["n1"]] == ["b"]


def test_shared_group_round_robins_over_connected_members() -> None:
    members = {
        c: ("n1" if c != "m2" else "n2", [_sub(c, "$share/g/t/+")]) for c in ("m1", "m2", "m3")
    }
    table = _table(**members)
    chosen = []
    for _ in range(6):
        routed = table.route("pub", _meta("t/x"))
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
    chosen = [table.route("pub", _meta("t"))["n1"][0].client_id for _ in range(4)]
    assert Counter(chosen) == {"m1": 2, "m3": 2}


def test_shared_group_without_connected_members_routes_nowhere() -> None:
    table = _table(m1=(None, [_sub("m1", "$share/g/t")]))
    assert dict(table.route("pub", _meta("t"))) == {}


def test_each_shared_group_gets_one_copy_besides_plain_subscribers() -> None:
    table = _table(
        a=("n1", [_sub("a", "$share/g1/t", 1, subscription_identifier=8), _sub("a", "t", 0)]),
        b=("n1", [_sub("b", "$share/g2/t", 0)]),
    )
    targets = table.route("pub", _meta("t", 1))["n1"]
    assert sorted(targets, key=lambda t: (t.client_id, t.qos)) == [
        Target("a", 0),
        Target("a", 1, False, (8,)),
        Target("b", 0),
    ]


def test_replacing_subscriptions_drops_the_old_ones() -> None:
    table = _table(a=("n1", [_sub("a", "old")]))
    table.set_subscriptions("a", [_sub("a", "new")])
    assert dict(table.route("pub", _meta("old"))) == {}
    assert table.route("pub", _meta("new"))["n1"] == [Target("a", 1)]
    table.set_subscriptions("a", [])
    assert len(table.trie) == 0


def test_invalid_subscription_in_a_record_is_skipped_not_fatal() -> None:
    table = RoutingTable()
    table.set_subscriptions(
        "a", [_sub("a", "bad/#/x"), _sub("a", "$share/g/t", no_local=True), _sub("a", "ok")]
    )
    table.set_session("a", _session("n1"))
    assert table.route("pub", _meta("ok"))["n1"] == [Target("a", 1)]
    assert len(table.trie) == 1


# ---------------------------------------------------------------------- Kafka records


def test_records_are_applied() -> None:
    table = RoutingTable()
    table.apply_subscriptions_record(b"a", encode_subscriptions([_sub("a", "t")]))
    table.apply_session_record(b"a", encode_session(_session("n1")))
    assert table.route("pub", _meta("t"))["n1"] == [Target("a", 1)]
    table.apply_subscriptions_record(b"a", None)
    assert dict(table.route("pub", _meta("t"))) == {}
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
