"""SUBSCRIBE / SUBACK and UNSUBSCRIBE / UNSUBACK of the sans-IO ingest core.

MQTT 3.1.1 sections 3.8-3.11; MQTT 5.0 sections 3.8-3.11, 4.8.2.
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
from services.common.topics.trie import Subscription
from services.ingest.effects import StoreSubscriptions

VERSIONS = [4, 5]


def _connected(version: int) -> Client:
    client = Client(version)
    client.connect("c1")
    return client


def _subscribed(client: Client, *requests: SubscriptionRequest, packet_id: int = 1) -> None:
    store = only(client.send(Subscribe(packet_id, list(requests))), StoreSubscriptions)
    only(client.packets(client.stored(store.token)), SubAck)


@pytest.mark.parametrize("version", VERSIONS)
def test_suback_only_after_stored(version: int) -> None:
    client = _connected(version)
    effects = client.send(Subscribe(3, [SubscriptionRequest("a/+", 1)]))
    store = only(effects, StoreSubscriptions)
    assert effects == [store]
    assert store.subscriptions == [Subscription("c1", "a/+", 1)]
    assert client.packets(client.stored(store.token)) == [SubAck(3, [1])]


@pytest.mark.parametrize("version", VERSIONS)
def test_granted_qos_is_at_most_one(version: int) -> None:
    client = _connected(version)
    requests = [SubscriptionRequest(f"t/{q}", q) for q in (0, 1, 2)]
    store = only(client.send(Subscribe(1, requests)), StoreSubscriptions)
    assert [s.qos for s in store.subscriptions] == [0, 1, 1]
    assert client.packets(client.stored(store.token)) == [SubAck(1, [0, 1, 1])]


@pytest.mark.parametrize(("version", "failure"), [(5, 0x8F), (4, 0x80)])
def test_invalid_filter_fails_only_its_entry(version: int, failure: int) -> None:
    client = _connected(version)
    requests = [SubscriptionRequest("a/#/b", 1), SubscriptionRequest("ok", 1)]
    store = only(client.send(Subscribe(1, requests)), StoreSubscriptions)
    assert [s.topic_filter for s in store.subscriptions] == ["ok"]
    assert client.packets(client.stored(store.token)) == [SubAck(1, [failure, 1])]
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
    store = only(client.send(packet), StoreSubscriptions)
    assert store.subscriptions == [
        Subscription("c1", "$share/g/t/#", 1, subscription_identifier=42),
        Subscription("c1", "own/+", 0, True, True, 2, 42),
    ]


def test_resubscribing_replaces_the_subscription() -> None:
    client = _connected(5)
    _subscribed(client, SubscriptionRequest("t", 0))
    store = only(
        client.send(
            Subscribe(2, [SubscriptionRequest("t", 1)], Properties(subscription_identifiers=[5]))
        ),
        StoreSubscriptions,
    )
    assert store.subscriptions == [Subscription("c1", "t", 1, subscription_identifier=5)]


@pytest.mark.parametrize("version", VERSIONS)
def test_unchanged_set_gets_an_immediate_suback(version: int) -> None:
    client = _connected(version)
    _subscribed(client, SubscriptionRequest("t", 1))
    effects = client.send(Subscribe(9, [SubscriptionRequest("t", 1)]))
    assert store_effects(effects) == []
    assert client.packets(effects) == [SubAck(9, [1])]


def test_unchanged_set_waits_for_a_store_in_flight() -> None:
    # SUBACK means "stored": a repeat of a SUBSCRIBE still being stored must not be
    # acknowledged before the store is.
    client = _connected(5)
    first = only(client.send(Subscribe(1, [SubscriptionRequest("t", 1)])), StoreSubscriptions)
    repeat = client.send(Subscribe(2, [SubscriptionRequest("t", 1)]))
    assert client.packets(repeat) == []
    second = only(repeat, StoreSubscriptions)
    assert second.subscriptions == first.subscriptions
    assert client.packets(client.stored(first.token)) == [SubAck(1, [1])]
    assert client.packets(client.stored(second.token)) == [SubAck(2, [1])]


def test_subscription_store_failure_disconnects_without_suback() -> None:
    client = _connected(5)
    store = only(client.send(Subscribe(1, [SubscriptionRequest("t", 1)])), StoreSubscriptions)
    effects = client.store_failed(store.token)
    packets = client.packets(effects)
    assert of_type(packets, SubAck) == []
    assert only(packets, Disconnect).reason_code == ReasonCode.UNSPECIFIED_ERROR
    assert closes(effects)


def test_v311_subscription_store_failure_closes() -> None:
    client = _connected(4)
    store = only(client.send(Subscribe(1, [SubscriptionRequest("t", 1)])), StoreSubscriptions)
    effects = client.store_failed(store.token)
    assert client.packets(effects) == []
    assert closes(effects)


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
