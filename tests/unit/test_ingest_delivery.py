"""Outbound PUBLISH to a subscriber (``ServerConnection.deliver``) and its PUBACK.

MQTT 3.1.1 sections 4.3.2, 4.4; MQTT 5.0 sections 3.1.2.11.3 (Receive Maximum), 3.1.2.11.4
(Maximum Packet Size), 4.9 (flow control).
"""

from __future__ import annotations

import pytest
from test_ingest_support import Client, closes, of_type, only

from services.common.mqtt.codec import encode
from services.common.mqtt.packets import Connect, PubAck, Publish
from services.common.mqtt.properties import Properties
from services.ingest.effects import Send, StoreSession

VERSIONS = [4, 5]


def _connected(version: int, properties: Properties | None = None) -> Client:
    client = Client(version)
    client.connect("sub", properties=properties)
    return client


def _delivered(client: Client, packet: Publish) -> list[Publish]:
    packets = client.packets(client.conn.deliver(packet))
    publishes = of_type(packets, Publish)
    assert publishes == packets
    return publishes


def _acked(client: Client, packet: Publish) -> list[Publish]:
    """PUBACK ``packet``; returns the PUBLISHes that released."""
    assert packet.packet_id is not None
    packets = client.packets(client.send(PubAck(packet.packet_id)))
    publishes = of_type(packets, Publish)
    assert publishes == packets
    return publishes


@pytest.mark.parametrize("version", VERSIONS)
def test_qos0_is_sent_without_packet_identifier(version: int) -> None:
    client = _connected(version)
    assert _delivered(client, Publish("t", b"hello")) == [Publish("t", b"hello")]


def test_qos0_uses_the_encoded_bytes_when_given() -> None:
    client = _connected(5)
    shared = encode(Publish("t", b"once", properties=Properties(subscription_identifiers=[4])), 5)
    effects = client.conn.deliver(Publish("t", b"once"), shared)
    assert effects == [Send(shared)]


@pytest.mark.parametrize("version", VERSIONS)
def test_qos1_gets_distinct_packet_identifiers(version: int) -> None:
    client = _connected(version)
    sent = [_delivered(client, Publish("t", bytes([i]), qos=1))[0] for i in range(3)]
    ids = [p.packet_id for p in sent]
    assert None not in ids
    assert len(set(ids)) == 3
    assert [p.payload for p in sent] == [b"\x00", b"\x01", b"\x02"]
    assert all(p.qos == 1 for p in sent)


def test_packet_identifiers_wrap_and_skip_those_in_flight() -> None:
    client = _connected(5)
    first = _delivered(client, Publish("t", b"", qos=1))[0]
    assert first.packet_id == 1
    client.conn.state.last_packet_id = 65534
    ids = [_delivered(client, Publish("t", b"", qos=1))[0].packet_id for _ in range(3)]
    assert ids == [65535, 2, 3]  # 1 is still in flight


def test_client_receive_maximum_queues_the_rest_in_order() -> None:
    client = _connected(5, Properties(receive_maximum=2))
    sent = [_delivered(client, Publish("t", bytes([i]), qos=1)) for i in range(5)]
    assert [len(s) for s in sent] == [1, 1, 0, 0, 0]
    first, second = sent[0][0], sent[1][0]
    # A QoS 0 message does not wait behind the window.
    assert _delivered(client, Publish("t", b"q0")) == [Publish("t", b"q0")]

    released = _acked(client, first)
    assert [p.payload for p in released] == [b"\x02"]
    released += _acked(client, second)
    assert [p.payload for p in released] == [b"\x02", b"\x03"]
    in_flight = {p.packet_id for p in released}
    assert len(in_flight) == 2 and None not in in_flight
    # Still two in flight: the fifth waits.
    assert len(client.conn.state.outbound) == 2
    assert len(client.conn.state.outbound_queue) == 1


def test_v311_has_no_outbound_window_limit_below_65535() -> None:
    client = _connected(4)
    sent = [_delivered(client, Publish("t", b"", qos=1)) for _ in range(200)]
    assert all(len(s) == 1 for s in sent)


def test_unknown_puback_is_ignored() -> None:
    client = _connected(5)
    effects = client.send(PubAck(999))
    assert effects == []
    assert not client.conn.closed


def test_packets_over_the_client_maximum_packet_size_are_dropped() -> None:
    client = _connected(5, Properties(maximum_packet_size=64))
    assert client.conn.deliver(Publish("t", b"x" * 100)) == []
    assert client.conn.deliver(Publish("t", b"x" * 100, qos=1)) == []
    assert client.conn.state.outbound == {}  # a dropped QoS 1 takes no window slot
    small = _delivered(client, Publish("t", b"ok", qos=1))
    assert len(small) == 1 and small[0].payload == b"ok"
    assert len(encode(small[0], 5)) <= 64


def test_encoded_qos0_over_the_maximum_packet_size_is_dropped() -> None:
    client = _connected(5, Properties(maximum_packet_size=32))
    big = encode(Publish("t", b"y" * 40), 5)
    assert client.conn.deliver(Publish("t", b"y" * 40), big) == []


def test_subscription_identifiers_and_properties_reach_a_v5_client() -> None:
    client = _connected(5)
    props = Properties(content_type="text/plain", subscription_identifiers=[1, 7])
    got = _delivered(client, Publish("t", b"p", qos=1, properties=props))
    assert got[0].properties == props


def test_nothing_is_delivered_before_connack() -> None:
    client = Client(5)
    store = only(client.send(Connect(5, "c", True, 30)), StoreSession)
    assert client.conn.deliver(Publish("t", b"x", qos=1)) == []
    client.stored(store.token)
    assert len(_delivered(client, Publish("t", b"x", qos=1))) == 1


def test_nothing_is_delivered_after_close() -> None:
    client = _connected(5)
    assert closes(client.conn.keep_alive_expired())
    assert client.conn.deliver(Publish("t", b"x")) == []
