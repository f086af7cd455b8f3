"""One routed message to the targets of a downlink record (``ServerConnection.deliver_routed``
with a shared :class:`FanOut`): what each target's PUBLISH carries, and which targets share
one QoS 0 encoding (docs/design.md: encode-once fan-out).

MQTT 5.0 3.3.1.3 (RETAIN and Retain As Published), 3.3.2.3.3 (Message Expiry Interval),
3.3.4 (Subscription Identifiers); MQTT 3.1.1 3.3.1.3.
"""

from __future__ import annotations

import pytest
from test_ingest_support import NOW_MS, Client, fan_out, of_type

from services.common.mqtt.packets import Publish
from services.common.mqtt.properties import Properties
from services.common.records import PublishMeta, RecordError, Target
from services.ingest.effects import Send
from services.ingest.fan_out import FanOut

VERSIONS = [4, 5]
FORWARDED = Properties(content_type="text/plain", user_properties=[("k", "v")])


def _connected(version: int, properties: Properties | None = None) -> Client:
    client = Client(version)
    client.connect("sub", properties=properties)
    return client


def _received(client: Client, message: FanOut, target: Target) -> Publish:
    [packet] = of_type(client.packets(client.conn.deliver_routed(message, target)), Publish)
    return packet


def _sent(client: Client, message: FanOut, target: Target) -> bytes:
    [send] = of_type(client.conn.deliver_routed(message, target), Send)
    return send.data


# ---------------------------------------------------------------------- what a target gets


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("qos", [0, 1])
def test_retain_is_kept_only_with_retain_as_published(version: int, qos: int) -> None:
    message = fan_out("t", b"r", retain=True)
    kept = _received(_connected(version), message, Target("sub", qos, True))
    cleared = _received(_connected(version), message, Target("sub", qos, False))
    assert (kept.retain, cleared.retain) == (True, False)
    assert (
        _received(_connected(version), fan_out("t", b"l"), Target("sub", qos, True)).retain is False
    )


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_a_v5_target_gets_its_subscription_identifiers_and_the_forwarded_properties(
    qos: int,
) -> None:
    packet = _received(
        _connected(5), fan_out("t", b"p", FORWARDED), Target("sub", qos, False, (3, 9))
    )
    assert packet.properties == Properties(
        content_type="text/plain", user_properties=[("k", "v")], subscription_identifiers=[3, 9]
    )
    assert (packet.topic, packet.payload, packet.qos) == ("t", b"p", qos)


@pytest.mark.parametrize("qos", [0, 1])
def test_a_v311_target_gets_no_properties(qos: int) -> None:
    packet = _received(
        _connected(4), fan_out("t", b"p", FORWARDED), Target("sub", qos, False, (3,))
    )
    assert packet.properties == Properties()


def test_a_store_assigned_delivery_keeps_its_packet_identifier_and_dup() -> None:
    packet = _received(_connected(5), fan_out("t", b"s"), Target("sub", 2, False, (), 77, True))
    assert (packet.qos, packet.packet_id, packet.dup) == (2, 77, True)


def test_a_qos0_target_never_carries_a_packet_identifier_or_dup() -> None:
    # A downlink record may say so (the format allows it); the PUBLISH must not (3.3.1.1).
    packet = _received(_connected(5), fan_out("t", b"z"), Target("sub", 0, False, (), 5, True))
    assert (packet.packet_id, packet.dup) == (None, False)


# ---------------------------------------------------------------------- Message Expiry


def test_the_interval_left_is_computed_at_the_fan_out() -> None:
    published = fan_out("t", b"", Properties(message_expiry_interval=10)).meta
    message = FanOut(published, b"", NOW_MS + 2500)  # routed 2.5 s after it was published
    assert message.expires_at_ms == NOW_MS + 10_000
    client = _connected(5)
    client.now = NOW_MS + 2600
    assert _received(client, message, Target("sub", 0)).properties.message_expiry_interval == 8
    client.now = NOW_MS + 4100  # a QoS 1 copy says what is left when it is sent
    assert _received(client, message, Target("sub", 1)).properties.message_expiry_interval == 6


@pytest.mark.parametrize("qos", [0, 1])
def test_an_expired_routed_message_is_not_sent(qos: int) -> None:
    message = fan_out("t", b"", Properties(message_expiry_interval=1))
    client = _connected(5)
    client.now = NOW_MS + 1000
    assert client.conn.deliver_routed(message, Target("sub", qos)) == []


def test_undecodable_forwarded_properties_are_a_record_error() -> None:
    with pytest.raises(RecordError):
        FanOut(PublishMeta("t", 0, False, NOW_MS, 5, b"\x05\x02"), b"", NOW_MS)


# ---------------------------------------------------------------------- encode-once


def test_targets_of_one_variant_share_one_encoding() -> None:
    message = fan_out("t", b"same", FORWARDED, retain=True)
    v311 = [_sent(_connected(4), message, Target("sub", 0, False, (1,))) for _ in range(3)]
    v5 = [_sent(_connected(5), message, Target("sub", 0, False, (1,))) for _ in range(3)]
    assert all(data is v311[0] for data in v311)  # the very same bytes object
    assert all(data is v5[0] for data in v5)
    assert v311[0] != v5[0]
    assert message.encodings == 2


def test_each_variant_is_encoded_once() -> None:
    message = fan_out("t", b"v", retain=True)
    variants = [
        (4, Target("a", 0, False)),
        (4, Target("b", 0, True)),  # RETAIN kept
        (5, Target("c", 0, False, (1,))),
        (5, Target("d", 0, False, (2,))),  # another Subscription Identifier
        (5, Target("e", 0, False, (1,))),  # as c
        (4, Target("f", 0, False, (7,))),  # v3.1.1 has no identifiers: as a
    ]
    for version, target in variants:
        _sent(_connected(version), message, target)
    assert message.encodings == 4


def test_qos1_copies_are_encoded_per_connection() -> None:
    message = fan_out("t", b"q1")
    first = _sent(_connected(5), message, Target("sub", 1))
    second = _sent(_connected(5), message, Target("sub", 1))
    assert first == second and first is not second  # each has its own Packet Identifier slot
    assert message.encodings == 0
