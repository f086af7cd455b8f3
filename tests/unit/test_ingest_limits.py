"""The limits the sans-IO ingest core applies, and the reactions MQTT gives them.

Subscriptions per client and Topic Filter levels (SUBACK 0x97 Quota exceeded in v5, 0x80
Failure in v3.1.1: MQTT 5.0 3.9.3, 3.1.1 3.9.3), inbound QoS 2 messages not yet released
(v5 PUBREC 0x97, 3.5.2.1; v3.1.1 closes), and a CONNECT the shell refused for a
connection limit (CONNACK 0x97 / 0x9F, v3.1.1 0x03: 3.2.2.2, 3.2.2.3). Each refusal comes
with one :class:`LimitRefused` effect for the node's counters.
"""

from __future__ import annotations

import pytest
from test_ingest_support import Client, closes, make_settings, of_type, only, store_effects

from services.common.mqtt.errors import MQTTError
from services.common.mqtt.packets import (
    ConnAck,
    Connect,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    SubscriptionRequest,
)
from services.common.mqtt.properties import Properties
from services.common.mqtt.reason_codes import ReasonCode
from services.ingest.effects import LimitRefused, StorePublish
from services.ingest.limits import Refusal

VERSIONS = [4, 5]


def _connected(version: int, **limits: int) -> Client:
    client = Client(version, make_settings(**limits))
    client.connect("c1")
    return client


def _suback(client: Client, *filters: str, packet_id: int = 1) -> tuple[SubAck, list[LimitRefused]]:
    requests = [SubscriptionRequest(f, 1, retain_handling=2) for f in filters]
    effects = client.send(Subscribe(packet_id, requests))
    refused = of_type(effects, LimitRefused)
    return only(client.packets(client.store_all(effects) + effects), SubAck), refused


def _quota(version: int) -> int:
    return ReasonCode.QUOTA_EXCEEDED if version == 5 else 0x80


@pytest.mark.parametrize("version", VERSIONS)
def test_a_new_filter_beyond_max_subscriptions_is_refused_alone(version: int) -> None:
    client = _connected(version, max_subscriptions=2)
    suback, refused = _suback(client, "a", "b", "c")
    assert suback.reason_codes == [1, 1, _quota(version)]
    assert [r.refusal for r in refused] == [Refusal.SUBSCRIPTIONS]
    assert sorted(client.conn.state.subscriptions) == ["a", "b"]


@pytest.mark.parametrize("version", VERSIONS)
def test_at_max_subscriptions_an_existing_filter_may_still_be_subscribed_again(
    version: int,
) -> None:
    client = _connected(version, max_subscriptions=2)
    _suback(client, "a", "b")
    suback, refused = _suback(client, "b", packet_id=2)
    assert suback.reason_codes == [1] and refused == []


@pytest.mark.parametrize("version", VERSIONS)
def test_a_filter_deeper_than_max_topic_levels_is_refused(version: int) -> None:
    client = _connected(version, max_topic_levels=3)
    suback, refused = _suback(client, "a/b/c", "a/b/c/d", "$share/g/a/+/#", "$share/g/a/b/c/d")
    assert suback.reason_codes == [1, _quota(version), 1, _quota(version)]
    assert [r.refusal for r in refused] == [Refusal.TOPIC_LEVELS]  # one per SUBSCRIBE


def _qos2(client: Client, packet_id: int) -> list[object]:
    return list(client.send(Publish("t", b"x", qos=2, packet_id=packet_id)))


def test_a_v5_qos2_publish_over_max_inflight_qos2_gets_pubrec_quota_exceeded_in_order() -> None:
    client = _connected(5, max_inflight_qos2=2)
    first = _qos2(client, 1)
    _qos2(client, 2)
    refused = client.send(Publish("t", b"x", qos=2, packet_id=3))
    assert only(refused, LimitRefused).refusal is Refusal.INFLIGHT_QOS2
    assert not of_type(refused, StorePublish)
    assert client.packets(refused) == []  # its PUBREC waits for the earlier ones (MQTT 4.6)
    answered = client.store_all(first)
    (rec1,) = client.packets(answered)
    assert isinstance(rec1, PubRec) and (rec1.packet_id, rec1.reason_code) == (1, 0)
    # PUBREL of 1 frees a place: the client may send a new QoS 2 message.
    client.send(PubRel(1))
    assert _qos2(client, 4)


def test_the_refused_pubrec_follows_the_pending_ones() -> None:
    client = _connected(5, max_inflight_qos2=1)
    pending = client.send(Publish("t", b"x", qos=2, packet_id=1))
    client.send(Publish("t", b"x", qos=2, packet_id=2))
    recs = [p for p in client.packets(client.store_all(pending)) if isinstance(p, PubRec)]
    assert [(r.packet_id, r.reason_code) for r in recs] == [
        (1, 0),
        (2, ReasonCode.QUOTA_EXCEEDED),
    ]
    assert client.conn.state.unreleased_qos2 == {1}  # the refused one holds no id


def test_a_v3_qos2_publish_over_max_inflight_qos2_closes_the_connection() -> None:
    client = _connected(4, max_inflight_qos2=1)
    _qos2(client, 1)
    effects = client.send(Publish("t", b"x", qos=2, packet_id=2))
    assert closes(effects)
    assert not store_effects(effects)


@pytest.mark.parametrize(
    ("version", "code", "expected"),
    [
        (5, ReasonCode.QUOTA_EXCEEDED, ReasonCode.QUOTA_EXCEEDED),
        (5, ReasonCode.CONNECTION_RATE_EXCEEDED, ReasonCode.CONNECTION_RATE_EXCEEDED),
        (4, ReasonCode.QUOTA_EXCEEDED, 0x03),
        (4, ReasonCode.CONNECTION_RATE_EXCEEDED, 0x03),
    ],
)
def test_a_connect_refused_by_the_shell_gets_its_connack(
    version: int, code: int, expected: int
) -> None:
    client = Client(version)
    client.conn.state.refusal = MQTTError("too many connections", code)
    effects = client.send(Connect(version, "c1", True, 30, properties=Properties()))
    (connack,) = client.packets(effects)
    assert isinstance(connack, ConnAck)
    assert connack.reason_code == expected and not connack.session_present
    assert closes(effects)
    assert not store_effects(effects)  # no session record for a refused CONNECT
