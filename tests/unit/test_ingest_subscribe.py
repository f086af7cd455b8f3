"""SUBSCRIBE / SUBACK and UNSUBSCRIBE / UNSUBACK of the sans-IO ingest core, and the
retained message requests a SUBSCRIBE makes.

MQTT 3.1.1 sections 3.3.1.3, 3.8-3.11; MQTT 5.0 sections 3.8-3.11 (3.8.3.1 Retain
Handling), 4.8.2.
"""

from __future__ import annotations

import pytest
from test_ingest_support import Client, closes, of_type, only, store_effects

from services.common.mqtt.packets import (
    Disconnect,
    SubAck,
    Subscribe,
    SubscriptionRequest,
    UnsubAck,
    Unsubscribe,
)
from services.common.mqtt.properties import Properties
from services.common.mqtt.reason_codes import ReasonCode
from services.common.subscription import Subscription
from services.ingest.effects import StoreRetainedRequest, StoreSubscriptions

VERSIONS = [4, 5]


def _connected(version: int) -> Client:
    client = Client(version)
    client.connect("c1")
    return client


def _subscribed(client: Client, *requests: SubscriptionRequest, packet_id: int = 1) -> None:
    effects = client.send(Subscribe(packet_id, list(requests)))
    only(client.packets(client.store_all(effects)), SubAck)


def _no_retained(topic_filter: str, qos: int, **options: bool) -> SubscriptionRequest:
    """A v5 subscription that asks for no retained messages (Retain Handling 2)."""
    return SubscriptionRequest(topic_filter, qos, retain_handling=2, **options)


@pytest.mark.parametrize("version", VERSIONS)
def test_suback_only_after_the_subscriptions_and_the_retained_request_are_stored(
    version: int,
) -> None:
    client = _connected(version)
    effects = client.send(Subscribe(3, [SubscriptionRequest("a/+", 1)]))
    store, request = effects
    assert isinstance(store, StoreSubscriptions) and isinstance(request, StoreRetainedRequest)
    assert store.subscriptions == [Subscription("c1", "a/+", 1)]
    assert request.subscriptions == [Subscription("c1", "a/+", 1)]
    assert client.stored(store.token) == []
    assert client.packets(client.stored(request.token)) == [SubAck(3, [1])]


def test_suback_waits_for_the_retained_request_stored_last() -> None:
    client = _connected(5)
    store, request = client.send(Subscribe(3, [SubscriptionRequest("a", 2)]))
    assert client.stored(request.token) == []
    assert client.packets(client.stored(store.token)) == [SubAck(3, [2])]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_qos_is_granted(version: int) -> None:
    client = _connected(version)
    requests = [SubscriptionRequest(f"t/{q}", q) for q in (0, 1, 2)]
    effects = client.send(Subscribe(1, requests))
    assert [s.qos for s in only(effects, StoreSubscriptions).subscriptions] == [0, 1, 2]
    assert client.packets(client.store_all(effects)) == [SubAck(1, [0, 1, 2])]


@pytest.mark.parametrize(("version", "failure"), [(5, 0x8F), (4, 0x80)])
def test_invalid_filter_fails_only_its_entry(version: int, failure: int) -> None:
    client = _connected(version)
    requests = [SubscriptionRequest("a/#/b", 1), SubscriptionRequest("ok", 1)]
    effects = client.send(Subscribe(1, requests))
    assert [s.topic_filter for s in only(effects, StoreSubscriptions).subscriptions] == ["ok"]
    assert [s.topic_filter for s in only(effects, StoreRetainedRequest).subscriptions] == ["ok"]
    assert client.packets(client.store_all(effects)) == [SubAck(1, [failure, 1])]
    assert not client.conn.closed


@pytest.mark.parametrize("bad", ["a+", "$share/g", "$share//t", "$share/g+/t", "#/a"])
def test_only_invalid_filters_get_an_immediate_suback(bad: str) -> None:
    client = _connected(5)
    effects = client.send(Subscribe(2, [SubscriptionRequest(bad, 0)]))
    assert store_effects(effects) == []
    assert client.packets(effects) == [SubAck(2, [ReasonCode.TOPIC_FILTER_INVALID])]


def test_shared_subscription_with_no_local_is_a_protocol_error() -> None:
    client = _connected(5)
    effects = client.send(Subscribe(1, [SubscriptionRequest("$share/g/t", 1, no_local=True)]))
    assert store_effects(effects) == []
    assert only(client.packets(effects), Disconnect).reason_code == ReasonCode.PROTOCOL_ERROR
    assert closes(effects)


def test_shared_subscription_and_v5_options_are_stored() -> None:
    client = _connected(5)
    requests = [
        SubscriptionRequest("$share/g/t/#", 1),
        SubscriptionRequest("own/+", 0, no_local=True, retain_as_published=True, retain_handling=2),
    ]
    packet = Subscribe(1, requests, Properties(subscription_identifiers=[42]))
    effects = client.send(packet)
    assert of_type(effects, StoreRetainedRequest) == []  # shared, and Retain Handling 2
    store = only(effects, StoreSubscriptions)
    assert store.subscriptions == [
        Subscription("c1", "$share/g/t/#", 1, subscription_identifier=42),
        Subscription("c1", "own/+", 0, True, True, 2, 42),
    ]


def test_resubscribing_replaces_the_subscription() -> None:
    client = _connected(5)
    _subscribed(client, SubscriptionRequest("t", 0))
    store = only(
        client.send(Subscribe(2, [_no_retained("t", 1)], Properties(subscription_identifiers=[5]))),
        StoreSubscriptions,
    )
    assert store.subscriptions == [
        Subscription("c1", "t", 1, retain_handling=2, subscription_identifier=5)
    ]


def test_unchanged_set_gets_an_immediate_suback() -> None:
    client = _connected(5)
    _subscribed(client, _no_retained("t", 1))
    effects = client.send(Subscribe(9, [_no_retained("t", 1)]))
    assert store_effects(effects) == []
    assert client.packets(effects) == [SubAck(9, [1])]


@pytest.mark.parametrize("version", VERSIONS)
def test_unchanged_set_still_asks_for_retained_messages(version: int) -> None:
    # Retain Handling 0 (and every v3.1.1 subscription): retained messages at every
    # SUBSCRIBE, also one that only repeats a subscription (MQTT 3.8.4).
    client = _connected(version)
    _subscribed(client, SubscriptionRequest("t", 1))
    effects = client.send(Subscribe(9, [SubscriptionRequest("t", 1)]))
    request = only(effects, StoreRetainedRequest)
    assert effects == [request]
    assert request.subscriptions == [Subscription("c1", "t", 1)]
    assert client.packets(client.stored(request.token)) == [SubAck(9, [1])]


def test_unchanged_set_waits_for_a_store_in_flight() -> None:
    # SUBACK means "stored": a repeat of a SUBSCRIBE still being stored must not be
    # acknowledged before the store is.
    client = _connected(5)
    first = only(client.send(Subscribe(1, [_no_retained("t", 1)])), StoreSubscriptions)
    repeat = client.send(Subscribe(2, [_no_retained("t", 1)]))
    assert client.packets(repeat) == []
    second = only(repeat, StoreSubscriptions)
    assert second.subscriptions == first.subscriptions
    assert client.packets(client.stored(first.token)) == [SubAck(1, [1])]
    assert client.packets(client.stored(second.token)) == [SubAck(2, [1])]


@pytest.mark.parametrize("failed", [0, 1], ids=["subscriptions", "retained-request"])
def test_store_failure_disconnects_without_suback(failed: int) -> None:
    client = _connected(5)
    effects = client.send(Subscribe(1, [SubscriptionRequest("t", 1)]))
    assert len(effects) == 2
    after = client.store_failed(effects[failed].token)
    packets = client.packets(after)
    assert of_type(packets, SubAck) == []
    assert only(packets, Disconnect).reason_code == ReasonCode.UNSPECIFIED_ERROR
    assert closes(after)
    assert client.stored(effects[1 - failed].token) == []


def test_v311_subscription_store_failure_closes() -> None:
    client = _connected(4)
    store = only(client.send(Subscribe(1, [SubscriptionRequest("t", 1)])), StoreSubscriptions)
    effects = client.store_failed(store.token)
    assert client.packets(effects) == []
    assert closes(effects)


# ---------------------------------------------------------------------- retained requests


@pytest.mark.parametrize(
    ("retain_handling", "existed", "asked"),
    [(0, False, True), (0, True, True), (1, False, True), (1, True, False), (2, False, False)],
)
def test_retain_handling_decides_the_request(
    retain_handling: int, existed: bool, asked: bool
) -> None:
    client = _connected(5)
    if existed:
        _subscribed(client, _no_retained("t", 0))
    request = SubscriptionRequest("t", 1, retain_handling=retain_handling)
    effects = client.send(Subscribe(2, [request]))
    requests = of_type(effects, StoreRetainedRequest)
    assert bool(requests) is asked
    assert client.packets(client.store_all(effects)) == [SubAck(2, [1])]


def test_one_request_lists_every_filter_that_asks() -> None:
    client = _connected(5)
    _subscribed(client, _no_retained("old", 0))
    requests = [
        SubscriptionRequest("a", 0),
        SubscriptionRequest("old", 1, retain_handling=1),  # existed: not asked
        SubscriptionRequest("new", 2, retain_handling=1),
        _no_retained("never", 1),
        SubscriptionRequest("$share/g/s", 1),  # shared: never (MQTT 4.8.2)
        SubscriptionRequest("bad/#/x", 1),
    ]
    packet = Subscribe(3, requests, Properties(subscription_identifiers=[9]))
    effects = client.send(packet)
    request = only(effects, StoreRetainedRequest)
    assert request.subscriptions == [
        Subscription("c1", "a", 0, subscription_identifier=9),
        Subscription("c1", "new", 2, retain_handling=1, subscription_identifier=9),
    ]
    assert effects.index(only(effects, StoreSubscriptions)) < effects.index(request)
    assert client.packets(client.store_all(effects)) == [SubAck(3, [0, 1, 2, 1, 1, 0x8F])]


def test_only_shared_or_unwanted_filters_make_no_request() -> None:
    client = _connected(5)
    requests = [SubscriptionRequest("$share/g/t", 1), _no_retained("t", 1)]
    effects = client.send(Subscribe(1, requests))
    assert of_type(effects, StoreRetainedRequest) == []
    store = only(effects, StoreSubscriptions)
    assert client.packets(client.stored(store.token)) == [SubAck(1, [1, 1])]


def test_unsubscribe_makes_no_request() -> None:
    client = _connected(4)
    _subscribed(client, SubscriptionRequest("t", 1))
    assert of_type(client.send(Unsubscribe(2, ["t"])), StoreRetainedRequest) == []


def test_v5_unsuback_says_which_subscriptions_existed() -> None:
    client = _connected(5)
    _subscribed(client, SubscriptionRequest("a", 0), SubscriptionRequest("b", 1))
    effects = client.send(Unsubscribe(4, ["a", "zzz", "a/#/b"]))
    store = only(effects, StoreSubscriptions)
    assert effects == [store]
    assert store.subscriptions == [Subscription("c1", "b", 1)]
    unsuback = only(client.packets(client.stored(store.token)), UnsubAck)
    assert unsuback.packet_id == 4
    assert unsuback.reason_codes == [
        ReasonCode.SUCCESS,
        ReasonCode.NO_SUBSCRIPTION_EXISTED,
        ReasonCode.TOPIC_FILTER_INVALID,
    ]


def test_unsubscribing_the_last_filter_stores_an_empty_set() -> None:
    client = _connected(5)
    _subscribed(client, SubscriptionRequest("a", 0))
    store = only(client.send(Unsubscribe(4, ["a"])), StoreSubscriptions)
    assert store.subscriptions == []


def test_v5_unsubscribe_of_nothing_is_acknowledged_at_once() -> None:
    client = _connected(5)
    effects = client.send(Unsubscribe(4, ["nothing"]))
    assert store_effects(effects) == []
    assert client.packets(effects) == [UnsubAck(4, [ReasonCode.NO_SUBSCRIPTION_EXISTED])]


def test_v311_unsuback_has_no_reason_codes() -> None:
    client = _connected(4)
    _subscribed(client, SubscriptionRequest("a", 0))
    store = only(client.send(Unsubscribe(4, ["a", "b"])), StoreSubscriptions)
    assert client.packets(client.stored(store.token)) == [UnsubAck(4)]
    assert client.packets(client.send(Unsubscribe(5, ["b"]))) == [UnsubAck(5)]


def test_shared_subscription_can_be_unsubscribed_by_its_full_filter() -> None:
    client = _connected(5)
    _subscribed(client, SubscriptionRequest("$share/g/t", 1))
    store = only(client.send(Unsubscribe(2, ["$share/g/t"])), StoreSubscriptions)
    assert store.subscriptions == []
    assert client.packets(client.stored(store.token)) == [UnsubAck(2, [0])]
