"""Replay subscriptions (``$replay/<since>/<filter>``) in the sans-IO ingest core, with bytes
alone: SUBSCRIBE checks and SUBACK Reason Codes (MQTT 5.0 3.9.3; 3.1.1 3.9.3), the replay
cut in the subscription record and the router's trie, the history's delivery (flow
control, ``replayed=true``), live messages held until the history is sent, the switch's
second cut and the live copies it drops (their ``msg.all`` origins), and the bound on
records read (docs/concepts/replay.md)."""

from __future__ import annotations

import uuid

import pytest
from test_ingest_support import NOW_MS, Client, fan_out, make_settings, of_type, only

from services.common.auth.authorize import parse_rules
from services.common.auth.principal import Accepted, Principal
from services.common.mqtt.packets import (
    PubAck,
    Publish,
    SubAck,
    Subscribe,
    SubscriptionRequest,
    UnsubAck,
    Unsubscribe,
)
from services.common.mqtt.properties import Properties
from services.common.records import (
    ClientKind,
    Origin,
    Target,
    decode_subscriptions,
    encode_subscriptions,
)
from services.common.subscription import LiveFrom, Subscription
from services.common.topics.trie import SubscriptionTrie
from services.ingest.effects import (
    LimitRefused,
    StartReplay,
    StopReplay,
    StoreRetainedRequest,
    StoreSubscriptions,
)
from services.ingest.fan_out import FanOut
from services.ingest.limits import Refusal
from services.ingest.replay import truncated_starts

VERSIONS = [4, 5]
HOUR_MS = 3_600_000


def _at(partition: int, offset: int, payload: bytes, topic: str = "t/a") -> FanOut:
    """A QoS 0 message on ``topic`` stored at ``offset`` of ``msg.all`` partition
    ``partition`` (its origin, as a routed downlink record or a replay's read carries it)."""
    message = fan_out(topic, payload, qos=0)
    message.origin = Origin(partition, offset, 0)
    return message


def _connected(version: int, properties: Properties | None = None, **settings: int) -> Client:
    client = Client(version, make_settings(**settings))
    client.connect("c1", properties=properties)
    return client


def _replay(client: Client, topic_filter: str, qos: int = 1) -> tuple[list[object], StartReplay]:
    """SUBSCRIBE to ``topic_filter``, store everything: the packets sent and the replay."""
    effects = client.send(Subscribe(1, [SubscriptionRequest(topic_filter, qos)]))
    after = client.store_all(effects)
    return list(client.packets(after)), only(after, StartReplay)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    ("since", "start_ms"),
    [
        ("15m", NOW_MS - 15 * 60_000),
        ("6h", NOW_MS - 6 * HOUR_MS),
        ("2d", NOW_MS - 48 * HOUR_MS),
        ("30s", NOW_MS - 30_000),
        ("2023-11-14T22:00:00Z", NOW_MS - 800_000),  # NOW_MS is 2023-11-14T22:13:20Z
        ("2023-11-14T21:00:00.5-01:00", NOW_MS - 799_500),
    ],
)
def test_a_replay_subscribes_to_its_inner_filter_and_starts_after_the_suback(
    version: int, since: str, start_ms: int
) -> None:
    client = _connected(version)
    effects = client.send(Subscribe(1, [SubscriptionRequest(f"$replay/{since}/t/#", 1)]))
    store = only(effects, StoreSubscriptions)
    assert of_type(effects, StoreRetainedRequest) == []  # its history holds the retained ones
    [subscription] = store.subscriptions
    assert subscription == Subscription("c1", "t/#", 1)
    assert subscription.live_from is not None and subscription.live_from.every_message
    assert of_type(effects, StartReplay) == []  # not before the SUBACK
    after = client.stored(store.token)
    assert client.packets(after) == [SubAck(1, [1])]
    assert only(after, StartReplay) == StartReplay(subscription, start_ms)


@pytest.mark.parametrize(("version", "failure"), [(5, 0x8F), (4, 0x80)])
@pytest.mark.parametrize(
    "bad",
    [
        "$replay/15x/t",
        "$replay/0m/t",
        "$replay/-1h/t",
        "$replay/1.5h/t",
        "$replay//t",
        "$replay/2023-11-14/t",  # a date without a time
        "$replay/2023-11-14T22:00:00/t",  # no offset (RFC 3339 asks for one)
        "$replay/2023-11-14T23:00:00+01:00/t",  # '+' is a wildcard in a Topic Filter
        "$replay/2023-13-40T22:00:00Z/t",
        "$replay/2023-11-14T23:00:00Z/t",  # in the future
        "$replay/1h",
        "$replay/1h/",
        "$replay/1h/a/#/b",
        "$replay/1h/$share/g/t",
        "$share/g/$replay/1h/t",
    ],
)
def test_a_malformed_replay_fails_its_own_entry(version: int, failure: int, bad: str) -> None:
    client = _connected(version)
    effects = client.send(Subscribe(1, [SubscriptionRequest(bad, 1), SubscriptionRequest("ok", 1)]))
    assert [s.topic_filter for s in only(effects, StoreSubscriptions).subscriptions] == ["ok"]
    after = client.store_all(effects)
    assert client.packets(after) == [SubAck(1, [failure, 1])]
    assert of_type(after, StartReplay) == []
    assert client.conn.state.replaying is None


@pytest.mark.parametrize(("version", "failure"), [(5, 0x97), (4, 0x80)])
def test_a_replay_older_than_max_replay_age_is_over_quota(version: int, failure: int) -> None:
    client = _connected(version, max_replay_age_seconds=3600)
    effects = client.send(Subscribe(1, [SubscriptionRequest("$replay/61m/t", 1)]))
    assert only(effects, LimitRefused).refusal is Refusal.REPLAY_AGE
    assert client.packets(effects) == [SubAck(1, [failure])]
    assert _replay(client, "$replay/60m/t")[0] == [SubAck(1, [1])]


@pytest.mark.parametrize(("version", "failure"), [(5, 0x87), (4, 0x80)])
def test_the_inner_filter_is_authorized_as_of_now(version: int, failure: int) -> None:
    rules = parse_rules(["deny subscribe public/secret/#", "allow subscribe public/#"])
    who = Principal(uuid.UUID(int=7), "dev", ClientKind.DEVICE, rules, "alice", 1, True)
    client = Client(version, authenticate=lambda _request: Accepted(who))
    client.connect("c1")
    requests = [
        SubscriptionRequest("$replay/1h/private/#", 1),
        SubscriptionRequest("$replay/1h/public/secret/#", 1),
        SubscriptionRequest("$replay/1h/public/#", 1),
    ]
    effects = client.send(Subscribe(1, requests))
    assert client.packets(client.store_all(effects)) == [SubAck(1, [failure, failure, 1])]
    # granted over a denied subtree: the history of its topics is withheld at delivery
    assert client.conn.replayed(fan_out("public/secret/x", b"no"), Target("c1", 1)) == []
    sent = client.packets(client.conn.replayed(fan_out("public/x", b"yes"), Target("c1", 1)))
    assert [p.payload for p in of_type(sent, Publish)] == [b"yes"]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_persistent_device_session_replays_at_qos_1_at_most(version: int) -> None:
    client = Client(version)
    # v5: a session that outlives its connection needs a Session Expiry Interval too
    client.connect("c1", clean_start=False, properties=Properties(session_expiry_interval=60))
    effects = client.send(Subscribe(1, [SubscriptionRequest("$replay/1h/t", 2)]))
    assert client.packets(client.store_all(effects)) == [SubAck(1, [1])]


def test_v5_suback_says_when_the_replay_starts_at_the_oldest_message_kept() -> None:
    client = _connected(5, msg_retention_seconds=3600)
    packets, replay = _replay(client, "$replay/2h/t")
    assert replay.since_ms == NOW_MS - 2 * HOUR_MS
    suback = only(packets, SubAck)
    assert suback.properties.reason_string == (
        "replay of t starts at the oldest message kept (3600 s)"
    )
    quiet = _connected(5, Properties(request_problem_information=False), msg_retention_seconds=60)
    assert only(_replay(quiet, "$replay/2h/t")[0], SubAck).properties.reason_string is None


@pytest.mark.parametrize("version", VERSIONS)
def test_history_then_the_live_messages_held_meanwhile(version: int) -> None:
    client = _connected(version)
    subscribe = client.send(Subscribe(1, [SubscriptionRequest("$replay/1h/t/#", 1)]))
    # Live messages routed before the SUBACK, and during the replay, wait for the history.
    assert client.conn.deliver_routed(fan_out("t/live", b"live-1", qos=0), Target("c1", 0)) == []
    assert client.packets(client.store_all(subscribe)) == [SubAck(1, [1])]
    assert client.conn.deliver_routed(fan_out("t/live", b"live-2", qos=0), Target("c1", 0)) == []
    history = [
        client.conn.replayed(fan_out("t/a", f"old-{i}".encode(), qos=0), Target("c1", 0))
        for i in range(3)
    ]
    sent = [only(client.packets(effects), Publish) for effects in history]
    assert [p.payload for p in sent] == [b"old-0", b"old-1", b"old-2"]
    replayed = [("replayed", "true")] if version == 5 else []
    assert all(p.properties.user_properties == replayed for p in sent)
    live = of_type(client.packets(client.conn.replay_finished("t/#")), Publish)
    assert [(p.payload, p.properties.user_properties) for p in live] == [
        (b"live-1", []),
        (b"live-2", []),
    ]
    assert client.packets(
        client.conn.deliver_routed(fan_out("t/live", b"live-3", qos=0), Target("c1", 0))
    )


def test_a_replayed_message_keeps_its_properties() -> None:
    client = _connected(5)
    _replay(client, "$replay/1h/t")
    original = Properties(content_type="text/plain", user_properties=[("k", "v")])
    effects = client.conn.replayed(fan_out("t", b"x", original), Target("c1", 1, False, (7,)))
    publish = only(client.packets(effects), Publish)
    assert (publish.qos, publish.properties.content_type) == (1, "text/plain")
    assert publish.properties.user_properties == [("k", "v"), ("replayed", "true")]
    assert publish.properties.subscription_identifiers == [7]


def test_the_replay_waits_for_a_free_slot_of_receive_maximum() -> None:
    client = _connected(5, Properties(receive_maximum=2))
    _replay(client, "$replay/1h/t")
    ids = []
    for i in range(2):
        assert client.conn.replay_room()
        effects = client.conn.replayed(fan_out("t", bytes([i]), qos=1), Target("c1", 1))
        ids.append(only(client.packets(effects), Publish).packet_id)
    assert not client.conn.replay_room()  # the reader waits: nothing is queued in the node
    assert client.conn.state.outbound_queue is None
    client.send(PubAck(ids[0]))
    assert client.conn.replay_room()


@pytest.mark.parametrize("form", ["$replay/1h/t/#", "t/#"])
def test_unsubscribe_stops_the_replay_and_releases_the_held_messages(form: str) -> None:
    client = _connected(5)
    _replay(client, "$replay/1h/t/#")
    client.conn.deliver_routed(fan_out("other", b"held", qos=0), Target("c1", 0))
    effects = client.send(Unsubscribe(2, [form]))
    assert StopReplay("t/#") in effects
    assert [p.payload for p in of_type(client.packets(effects), Publish)] == [b"held"]
    assert only(effects, StoreSubscriptions).subscriptions == []
    assert client.packets(client.store_all(effects)) == [UnsubAck(2, [0])]


def test_a_replay_replaces_the_subscription_to_its_filter() -> None:
    client = _connected(5)
    client.store_all(client.send(Subscribe(1, [SubscriptionRequest("t", 0)])))
    effects = client.send(Subscribe(2, [SubscriptionRequest("$replay/1h/t", 0)]))
    [subscription] = only(effects, StoreSubscriptions).subscriptions  # stored for its new cut
    assert subscription.topic_filter == "t"
    assert subscription.live_from is not None and subscription.live_from.every_message


def test_the_replay_cut_survives_the_subscription_record() -> None:
    replay = Subscription("c", "t/#", 1, live_from=LiveFrom((3, 0, 9), every_message=True))
    retained = Subscription("c", "r", 1, live_from=LiveFrom((3, 0, 9)))
    back_replay, back_retained = decode_subscriptions("c", encode_subscriptions([replay, retained]))
    assert back_replay.live_from is not None and back_replay.live_from.every_message
    assert back_replay.live_from.offsets == (3, 0, 9)
    assert back_retained.live_from is not None and not back_retained.live_from.every_message


def test_the_router_sends_live_only_what_lies_at_or_after_a_replay_cut() -> None:
    trie = SubscriptionTrie()
    trie.add(Subscription("replay", "t", 1, live_from=LiveFrom((5, 5), every_message=True)))
    trie.add(Subscription("retain", "t", 1, live_from=LiveFrom((5, 5))))
    assert set(trie.match("t", None, (1, 4, False)).clients) == {"retain"}
    assert set(trie.match("t", None, (1, 4, True)).clients) == set()
    assert set(trie.match("t", None, (1, 5, False)).clients) == {"replay", "retain"}


def test_the_switch_drops_the_live_copies_of_what_was_replayed_between_the_cuts() -> None:
    client = _connected(5)
    _, start = _replay(client, "$replay/1h/t/#")
    assert start.subscription.live_from is not None
    start.subscription.live_from.offsets = (10, 20)  # the first cut, as the shell fills it
    live = Target("c1", 0)
    # Routed while the subscription was being stored: held.
    for message in (
        _at(0, 12, b"switch-a"),  # between the cuts: replayed too
        _at(0, 13, b"retained", "t/r"),  # a retained copy answering a SUBSCRIBE: never replayed
        _at(1, 22, b"after"),  # at or after the second cut: live only
    ):
        assert client.conn.deliver_routed(message, live) == []
    # The replay reads the end offsets again: never below the first cut.
    assert client.conn.replay_switch(start.subscription, (15, 18)) == (15, 20)
    history = [_at(0, 5, b"old"), _at(0, 12, b"switch-a"), _at(0, 14, b"switch-b")]
    for message in history:
        client.conn.replayed(message, live)
    released = of_type(client.packets(client.conn.replay_finished("t/#")), Publish)
    assert [p.payload for p in released] == [b"retained", b"after"]
    # A live copy between the cuts may come after the history: dropped, once replayed.
    assert client.conn.deliver_routed(_at(0, 14, b"switch-b"), live) == []
    assert client.conn.deliver_routed(_at(0, 15, b"next"), live) != []
    assert client.conn.deliver_routed(_at(1, 19, b"other sub"), live) != []  # below the cut


@pytest.mark.parametrize(
    ("starts", "cut", "bound", "expected"),
    [
        ([0, 10], [50, 20], 100, [0, 10]),  # 60 records: within the bound
        ([0, 10], [100, 20], 55, [50, 15]),  # 110: each keeps half of its newest
        ([7, 20], [7, 60], 10, [7, 50]),  # an empty partition stays empty
    ],
)
def test_a_long_history_is_truncated_at_its_old_end(
    starts: list[int], cut: list[int], bound: int, expected: list[int]
) -> None:
    truncated = truncated_starts(starts, cut, bound)
    assert truncated == expected
    assert sum(end - start for start, end in zip(truncated, cut, strict=True)) <= bound


def test_the_window_between_the_cuts_is_read_past_the_bound() -> None:
    # 40 records between the cuts of partition 0, the bound 10: all 40 are read.
    assert truncated_starts([0, 5], [100, 5], 10, first=[60, 5]) == [60, 5]
    assert truncated_starts([0, 5], [100, 5], 10, first=[95, 5]) == [90, 5]
