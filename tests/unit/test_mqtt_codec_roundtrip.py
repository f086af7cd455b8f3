"""Property-based round trips of every MQTT packet type, 3.1.1 (and 3.1) and 5.0.

encode -> decode must give back an equal packet, re-encoding must give the same bytes, and a
StreamDecoder fed the concatenated stream in arbitrary chunks must yield the same packets.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.mqtt.codec import StreamDecoder, decode, encode
from services.common.mqtt.packets import (
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PacketType,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    SubscriptionRequest,
    UnsubAck,
    Unsubscribe,
    Will,
)
from services.common.mqtt.properties import (
    ALLOWED_PROPERTIES,
    WILL_PROPERTIES,
    Properties,
    PropertyId,
)
from services.common.mqtt.vbi import decode_vbi

P = PacketType

# ------------------------------------------------------------------------ primitives

mqtt_text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=24)
packet_ids = st.integers(1, 0xFFFF)
u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFF_FFFF)
payloads = st.binary(max_size=300)  # > 127 bytes exercises multi-byte Remaining Lengths

PROPERTY_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "payload_format_indicator": st.integers(0, 1),
    "message_expiry_interval": u32,
    "content_type": mqtt_text,
    "response_topic": mqtt_text,
    "correlation_data": st.binary(max_size=16),
    "subscription_identifiers": st.lists(st.integers(1, 268_435_455), min_size=1, max_size=3),
    "session_expiry_interval": u32,
    "assigned_client_identifier": mqtt_text,
    "server_keep_alive": u16,
    "authentication_method": mqtt_text,
    "authentication_data": st.binary(max_size=16),
    "request_problem_information": st.booleans(),
    "will_delay_interval": u32,
    "request_response_information": st.booleans(),
    "response_information": mqtt_text,
    "server_reference": mqtt_text,
    "reason_string": mqtt_text,
    "receive_maximum": st.integers(1, 0xFFFF),
    "topic_alias_maximum": u16,
    "topic_alias": st.integers(1, 0xFFFF),
    "maximum_qos": st.integers(0, 1),
    "retain_available": st.booleans(),
    "user_properties": st.lists(st.tuples(mqtt_text, mqtt_text), min_size=1, max_size=3),
    "maximum_packet_size": st.integers(1, 0xFFFF_FFFF),
    "wildcard_subscription_available": st.booleans(),
    "subscription_identifier_available": st.booleans(),
    "shared_subscription_available": st.booleans(),
}


# Field names are the identifiers' names in snake case, but for the two repeatable ones.
LIST_FIELDS = {
    PropertyId.SUBSCRIPTION_IDENTIFIER: "subscription_identifiers",
    PropertyId.USER_PROPERTY: "user_properties",
}


@st.composite
def properties(draw: st.DrawFn, ctx: int) -> Properties:
    """Random valid Properties for ``ctx`` (a packet type or WILL_PROPERTIES)."""
    props = Properties()
    for pid in sorted(ALLOWED_PROPERTIES[ctx]):
        name = LIST_FIELDS.get(pid, pid.name.lower())
        if draw(st.integers(0, 3)) == 0:  # most sets stay small
            value = draw(PROPERTY_VALUES[name])
            if name == "subscription_identifiers" and ctx != P.PUBLISH:
                value = value[:1]  # only PUBLISH may carry several (3.3.2.3.8)
            setattr(props, name, value)
    if props.authentication_data is not None and props.authentication_method is None:
        props.authentication_method = "SCRAM-SHA-1"  # Data needs a Method (3.1.2.11.10)
    return props


def no_properties(_ctx: int) -> st.SearchStrategy[Properties]:
    return st.builds(Properties)


# Reason Codes per packet, transcribed from MQTT 5.0 chapter 3.
CONNACK_CODES = [0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A,
                 0x8C, 0x90, 0x95, 0x97, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F]  # fmt: skip
PUBACK_CODES = [0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99]
PUBREL_CODES = [0x00, 0x92]
SUBACK_CODES = [0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2]
UNSUBACK_CODES = [0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91]
DISCONNECT_CODES = [0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E, 0x8F,
                    0x90, 0x93, 0x94, 0x95, 0x96, 0x97, 0x98, 0x99, 0x9A, 0x9B, 0x9C, 0x9D,
                    0x9E, 0x9F, 0xA0, 0xA1, 0xA2]  # fmt: skip
AUTH_CODES = [0x00, 0x18, 0x19]

# ------------------------------------------------------------------------ packets


@st.composite
def connects(draw: st.DrawFn, level: int) -> Connect:
    v5 = level == 5
    props = properties if v5 else no_properties
    will = None
    if draw(st.booleans()):
        will = Will(
            draw(mqtt_text),
            draw(st.binary(max_size=64)),
            draw(st.integers(0, 2)),
            draw(st.booleans()),
            draw(props(WILL_PROPERTIES)),
        )
    username = draw(st.none() | mqtt_text)
    # 3.1.1 forbids a password without a user name [MQTT-3.1.2-22]; 5.0 allows it.
    password = draw(st.none() | st.binary(max_size=32)) if username is not None or v5 else None
    return Connect(
        protocol_version=level,
        client_id=draw(mqtt_text),
        clean_start=draw(st.booleans()),
        keep_alive=draw(u16),
        username=username,
        password=password,
        will=will,
        properties=draw(props(P.CONNECT)),
    )


@st.composite
def publishes(draw: st.DrawFn, v5: bool) -> Publish:
    qos = draw(st.integers(0, 2))
    props = draw(properties(P.PUBLISH)) if v5 else Properties()
    topic = draw(mqtt_text)
    if v5 and not topic and props.topic_alias is None:
        props.topic_alias = draw(st.integers(1, 0xFFFF))  # empty topic needs an alias
    return Publish(
        topic=topic,
        payload=draw(payloads),
        qos=qos,
        retain=draw(st.booleans()),
        dup=draw(st.booleans()) if qos else False,
        packet_id=draw(packet_ids) if qos else None,
        properties=props,
    )


def subscription_requests(v5: bool) -> st.SearchStrategy[SubscriptionRequest]:
    if not v5:
        return st.builds(SubscriptionRequest, mqtt_text, st.integers(0, 2))
    return st.builds(
        SubscriptionRequest,
        mqtt_text,
        st.integers(0, 2),
        st.booleans(),
        st.booleans(),
        st.integers(0, 2),
    )


def packets(level: int) -> st.SearchStrategy[Packet]:
    """Any packet valid in protocol ``level`` (4 or 5), except CONNECT."""
    v5 = level == 5
    props = properties if v5 else no_properties

    def ack(cls: Any, codes: list[int], ptype: P) -> st.SearchStrategy[Packet]:
        if not v5:
            return st.builds(cls, packet_ids)
        return st.builds(cls, packet_ids, st.sampled_from(codes), props(ptype))

    choices: list[st.SearchStrategy[Packet]] = [
        publishes(v5),
        ack(PubAck, PUBACK_CODES, P.PUBACK),
        ack(PubRec, PUBACK_CODES, P.PUBREC),
        ack(PubRel, PUBREL_CODES, P.PUBREL),
        ack(PubComp, PUBREL_CODES, P.PUBCOMP),
        st.builds(
            Subscribe,
            packet_ids,
            st.lists(subscription_requests(v5), min_size=1, max_size=4),
            props(P.SUBSCRIBE),
        ),
        st.builds(
            SubAck,
            packet_ids,
            st.lists(st.sampled_from(SUBACK_CODES if v5 else [0, 1, 2, 0x80]), min_size=1),
            props(P.SUBACK),
        ),
        st.builds(
            Unsubscribe,
            packet_ids,
            st.lists(mqtt_text, min_size=1, max_size=4),
            props(P.UNSUBSCRIBE),
        ),
        st.builds(PingReq),
        st.builds(PingResp),
    ]
    if v5:
        choices += [
            st.builds(ConnAck, st.booleans(), st.sampled_from(CONNACK_CODES), props(P.CONNACK)),
            st.builds(
                UnsubAck,
                packet_ids,
                st.lists(st.sampled_from(UNSUBACK_CODES), min_size=1),
                props(P.UNSUBACK),
            ),
            st.builds(Disconnect, st.sampled_from(DISCONNECT_CODES), props(P.DISCONNECT)),
            st.builds(Auth, st.sampled_from(AUTH_CODES), props(P.AUTH)),
        ]
    else:
        choices += [
            st.builds(ConnAck, st.booleans(), st.integers(0, 5)),
            st.builds(UnsubAck, packet_ids),
            st.builds(Disconnect),
        ]
    return st.one_of(choices)


# ------------------------------------------------------------------------ helpers


def split_frame(data: bytes) -> tuple[int, bytes]:
    """(first byte, body) of one encoded packet, checking the Remaining Length."""
    remaining, body_start = decode_vbi(data, 1)
    assert len(data) == body_start + remaining
    return data[0], data[body_start:]


def assert_roundtrip(packet: Packet, level: int) -> None:
    data = encode(packet, level)
    first, body = split_frame(data)
    decoded = decode(first, body, level)
    assert decoded == packet
    assert encode(decoded, level) == data
    assert decode(first, memoryview(body), level) == packet


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in pairwise(edges)]


# ------------------------------------------------------------------------ tests


@pytest.mark.parametrize("level", [3, 4, 5])
@given(data=st.data())
def test_connect_roundtrip(level: int, data: st.DataObject) -> None:
    assert_roundtrip(data.draw(connects(level)), level)


@pytest.mark.parametrize("level", [4, 5])
@settings(max_examples=300)
@given(data=st.data())
def test_packet_roundtrip(level: int, data: st.DataObject) -> None:
    assert_roundtrip(data.draw(packets(level)), level)


@given(packet=packets(4))
def test_level_3_shares_the_3_1_1_wire_format(packet: Packet) -> None:
    assert encode(packet, 3) == encode(packet, 4)
    assert_roundtrip(packet, 3)


@pytest.mark.parametrize("level", [3, 4, 5])
@settings(max_examples=150)
@given(data=st.data())
def test_server_stream_in_random_chunks(level: int, data: st.DataObject) -> None:
    connect = data.draw(connects(level))
    rest = data.draw(st.lists(packets(5 if level == 5 else 4), max_size=8))
    stream = b"".join([encode(connect, level), *(encode(p, level) for p in rest)])
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=12))
    decoder = StreamDecoder()
    assert decoder.protocol_version is None
    out: list[Packet] = []
    for chunk in chunked(stream, cuts):
        out += decoder.feed(chunk)
    assert out == [connect, *rest]
    assert decoder.protocol_version == level


@pytest.mark.parametrize("level", [4, 5])
@given(data=st.data())
def test_client_stream_byte_by_byte(level: int, data: st.DataObject) -> None:
    sent = data.draw(st.lists(packets(level), min_size=1, max_size=5))
    stream = b"".join(encode(p, level) for p in sent)
    decoder = StreamDecoder(protocol_version=level)
    out: list[Packet] = []
    for i in range(len(stream)):
        out += decoder.feed(stream[i : i + 1])
    assert out == sent
    assert decoder.feed(b"") == []


@pytest.mark.parametrize("level", [4, 5])
@given(data=st.data())
def test_stream_at_exact_max_packet_size(level: int, data: st.DataObject) -> None:
    packet = data.draw(publishes(level == 5))
    encoded = encode(packet, level)
    decoder = StreamDecoder(max_packet_size=len(encoded), protocol_version=level)
    assert decoder.feed(encoded + encoded) == [packet, packet]
