"""MQTT 5.0 properties (2.2.2, table 2-4): identifiers, per-packet rules, values, wire form.

The expectations below are transcribed from the specification independently of the
implementation's own table, so a wrong entry there fails here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common.mqtt.errors import MalformedPacket, ProtocolError
from services.common.mqtt.packets import PacketType
from services.common.mqtt.properties import (
    ALLOWED_PROPERTIES,
    WILL_PROPERTIES,
    Properties,
    PropertyId,
    decode_properties,
    encode_properties,
)
from services.common.mqtt.reason_codes import ReasonCode
from services.common.mqtt.vbi import encode_vbi

P = PacketType
W = WILL_PROPERTIES
ACKS = {P.PUBACK, P.PUBREC, P.PUBREL, P.PUBCOMP}
ALL_WITH_USER_PROPERTY = {
    P.CONNECT, P.CONNACK, P.PUBLISH, W, *ACKS, P.SUBSCRIBE, P.SUBACK, P.UNSUBSCRIBE,
    P.UNSUBACK, P.DISCONNECT, P.AUTH,
}  # fmt: skip
CONTEXTS = [W, *PacketType]


def s(text: str) -> bytes:
    raw = text.encode()
    return len(raw).to_bytes(2, "big") + raw


# identifier: (Properties field, a valid encoded value, its decoded form, contexts allowed)
TABLE: dict[int, tuple[str, bytes, Any, set[int]]] = {
    0x01: ("payload_format_indicator", b"\x01", 1, {P.PUBLISH, W}),
    0x02: ("message_expiry_interval", b"\x00\x00\x00\x10", 16, {P.PUBLISH, W}),
    0x03: ("content_type", s("text/plain"), "text/plain", {P.PUBLISH, W}),
    0x08: ("response_topic", s("a/b"), "a/b", {P.PUBLISH, W}),
    0x09: ("correlation_data", b"\x00\x02\x01\x02", b"\x01\x02", {P.PUBLISH, W}),
    0x0B: ("subscription_identifiers", b"\x05", [5], {P.PUBLISH, P.SUBSCRIBE}),
    0x11: ("session_expiry_interval", b"\x00\x00\x00\x0a", 10, {P.CONNECT, P.CONNACK,
                                                                 P.DISCONNECT}),
    0x12: ("assigned_client_identifier", s("cid"), "cid", {P.CONNACK}),
    0x13: ("server_keep_alive", b"\x00\x0a", 10, {P.CONNACK}),
    0x15: ("authentication_method", s("SCRAM"), "SCRAM", {P.CONNECT, P.CONNACK, P.AUTH}),
    0x16: ("authentication_data", b"\x00\x01\xff", b"\xff", {P.CONNECT, P.CONNACK, P.AUTH}),
    0x17: ("request_problem_information", b"\x00", False, {P.CONNECT}),
    0x18: ("will_delay_interval", b"\x00\x00\x00\x3c", 60, {W}),
    0x19: ("request_response_information", b"\x01", True, {P.CONNECT}),
    0x1A: ("response_information", s("resp/"), "resp/", {P.CONNACK}),
    0x1C: ("server_reference", s("other:1883"), "other:1883", {P.CONNACK, P.DISCONNECT}),
    0x1F: ("reason_string", s("why"), "why", {P.CONNACK, *ACKS, P.SUBACK, P.UNSUBACK,
                                              P.DISCONNECT, P.AUTH}),
    0x21: ("receive_maximum", b"\x00\x14", 20, {P.CONNECT, P.CONNACK}),
    0x22: ("topic_alias_maximum", b"\x00\x0a", 10, {P.CONNECT, P.CONNACK}),
    0x23: ("topic_alias", b"\x00\x01", 1, {P.PUBLISH}),
    0x24: ("maximum_qos", b"\x01", 1, {P.CONNACK}),
    0x25: ("retain_available", b"\x00", False, {P.CONNACK}),
    0x26: ("user_properties", s("k") + s("v"), [("k", "v")], ALL_WITH_USER_PROPERTY),
    0x27: ("maximum_packet_size", b"\x00\x01\x00\x00", 65_536, {P.CONNECT, P.CONNACK}),
    0x28: ("wildcard_subscription_available", b"\x01", True, {P.CONNACK}),
    0x29: ("subscription_identifier_available", b"\x01", True, {P.CONNACK}),
    0x2A: ("shared_subscription_available", b"\x00", False, {P.CONNACK}),
}  # fmt: skip

AUTH_METHOD = b"\x15" + s("SCRAM")


def with_length(body: bytes) -> bytes:
    return encode_vbi(len(body)) + body


def prop(pid: int) -> bytes:
    """One property, identifier and value; Authentication Data brings its Method along."""
    raw = bytes((pid,)) + TABLE[pid][1]
    return AUTH_METHOD + raw if pid == 0x16 else raw


def test_property_ids_match_table_2_4() -> None:
    assert len(PropertyId) == 27
    assert {p.value for p in PropertyId} == set(TABLE)
    assert PropertyId.SUBSCRIPTION_IDENTIFIER.value == 0x0B
    assert PropertyId.USER_PROPERTY.value == 38
    assert PropertyId.SHARED_SUBSCRIPTION_AVAILABLE.value == 42


def test_properties_fields_and_defaults() -> None:
    names = [f.name for f in dataclasses.fields(Properties)]
    assert sorted(names) == sorted(entry[0] for entry in TABLE.values())
    empty = Properties()
    for name in names:
        expected: object = [] if name in ("subscription_identifiers", "user_properties") else None
        assert getattr(empty, name) == expected
    # Lists are per instance, never shared through the default.
    empty.user_properties.append(("a", "b"))
    assert Properties().user_properties == []


def test_allowed_table_matches_spec() -> None:
    for ctx in CONTEXTS:
        expected = {PropertyId(pid) for pid, entry in TABLE.items() if ctx in entry[3]}
        assert ALLOWED_PROPERTIES.get(ctx, frozenset()) == expected, ctx


@pytest.mark.parametrize("pid", sorted(TABLE))
@pytest.mark.parametrize("ctx", CONTEXTS)
def test_decode_each_property_in_each_context(pid: int, ctx: int) -> None:
    name, _raw, value, allowed = TABLE[pid]
    data = with_length(prop(pid)) + b"rest"
    if ctx in allowed:
        props, end = decode_properties(data, 0, ctx)
        assert getattr(props, name) == value
        assert data[end:] == b"rest"
    else:
        with pytest.raises(ProtocolError) as info:
            decode_properties(data, 0, ctx)
        assert info.value.reason_code == ReasonCode.PROTOCOL_ERROR


@pytest.mark.parametrize("pid", sorted(TABLE))
def test_encode_each_property_matches_spec_bytes(pid: int) -> None:
    name, _raw, value, allowed = TABLE[pid]
    props = Properties(**{name: value})
    if pid == 0x16:
        props.authentication_method = "SCRAM"
    for ctx in CONTEXTS:
        if ctx in allowed:
            assert encode_properties(props, ctx) == with_length(prop(pid))
        else:
            with pytest.raises(ValueError):
                encode_properties(props, ctx)


@pytest.mark.parametrize(
    "pid", sorted(pid for pid in TABLE if pid not in (0x26, 0x0B))
)  # every property but User Property and Subscription Identifier
def test_duplicate_is_protocol_error(pid: int) -> None:
    ctx = min(TABLE[pid][3])
    raw = bytes((pid,)) + TABLE[pid][1]
    data = with_length((AUTH_METHOD if pid == 0x16 else b"") + raw + raw)
    with pytest.raises(ProtocolError):
        decode_properties(data, 0, ctx)


def test_user_property_repeats_in_order() -> None:
    body = b"\x26" + s("k") + s("1") + b"\x26" + s("k") + s("2") + b"\x26" + s("j") + s("")
    props, _ = decode_properties(with_length(body), 0, P.PUBACK)
    assert props.user_properties == [("k", "1"), ("k", "2"), ("j", "")]


def test_subscription_identifier_repeats_only_in_publish() -> None:
    body = b"\x0b\x01\x0b\xff\xff\xff\x7f"
    props, _ = decode_properties(with_length(body), 0, P.PUBLISH)
    assert props.subscription_identifiers == [1, 268_435_455]
    with pytest.raises(ProtocolError):
        decode_properties(with_length(body), 0, P.SUBSCRIBE)


@pytest.mark.parametrize(
    ("body", "ctx", "reason"),
    [
        (b"\x21\x00\x00", P.CONNECT, ReasonCode.PROTOCOL_ERROR),  # Receive Maximum 0
        (b"\x27\x00\x00\x00\x00", P.CONNACK, ReasonCode.PROTOCOL_ERROR),  # Max Packet Size 0
        (b"\x0b\x00", P.SUBSCRIBE, ReasonCode.PROTOCOL_ERROR),  # Subscription Identifier 0
        (b"\x01\x02", P.PUBLISH, ReasonCode.PROTOCOL_ERROR),  # Payload Format Indicator 2
        (b"\x24\x02", P.CONNACK, ReasonCode.PROTOCOL_ERROR),  # Maximum QoS 2
        (b"\x17\x02", P.CONNECT, ReasonCode.PROTOCOL_ERROR),  # Request Problem Info 2
        (b"\x19\xff", P.CONNECT, ReasonCode.PROTOCOL_ERROR),  # Request Response Info 255
        (b"\x25\x02", P.CONNACK, ReasonCode.PROTOCOL_ERROR),  # Retain Available 2
        (b"\x28\x02", P.CONNACK, ReasonCode.PROTOCOL_ERROR),  # Wildcard Sub Available 2
        (b"\x29\x02", P.CONNACK, ReasonCode.PROTOCOL_ERROR),  # Sub Id Available 2
        (b"\x2a\x02", P.CONNACK, ReasonCode.PROTOCOL_ERROR),  # Shared Sub Available 2
        (b"\x23\x00\x00", P.PUBLISH, ReasonCode.TOPIC_ALIAS_INVALID),  # Topic Alias 0
        (b"\x16\x00\x01\xff", P.CONNECT, ReasonCode.PROTOCOL_ERROR),  # Auth Data, no Method
    ],
)
def test_value_out_of_range_is_protocol_error(body: bytes, ctx: int, reason: int) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_properties(with_length(body), 0, ctx)
    assert info.value.reason_code == reason


@pytest.mark.parametrize(
    "body",
    [
        b"\x00\x00",  # identifier 0 is not a property
        b"\x04\x00",  # gap in the table
        b"\x2b\x00",  # first identifier after the table
        b"\x7f\x00",
        b"\x80\x01\x00",  # identifier 128, two-byte VBI
    ],
)
def test_unknown_identifier_is_malformed(body: bytes) -> None:
    with pytest.raises(MalformedPacket) as info:
        decode_properties(with_length(body), 0, P.PUBLISH)
    assert info.value.reason_code == ReasonCode.MALFORMED_PACKET


@pytest.mark.parametrize(
    "data",
    [
        b"",  # no Property Length at all
        b"\x05\x02\x00\x00",  # Property Length past the end of the buffer
        b"\x02\x02\x00\x00\x00\x10",  # Four Byte Integer crossing the Property Length
        b"\x02\x23\x00",  # Two Byte Integer cut short
        b"\x03\x03\x00\x05abc",  # string length crossing the Property Length
        b"\x04\x03\x00\x02\xff\xfe",  # invalid UTF-8
        b"\x04\x03\x00\x02a\x00",  # U+0000 in a string
        b"\x05\x03\x00\x03\xed\xa0\x80",  # encoded surrogate U+D800
        b"\x04\x26\x00\x01k",  # User Property without its value string
        b"\x02\x0b\x80",  # Subscription Identifier VBI cut short
        b"\x81",  # Property Length VBI cut short
    ],
)
def test_truncated_or_invalid_is_malformed(data: bytes) -> None:
    with pytest.raises(MalformedPacket):
        decode_properties(data, 0, P.PUBLISH)


def test_decode_at_offset_and_empty() -> None:
    props, end = decode_properties(b"xyz\x00tail", 3, P.PUBLISH)
    assert props == Properties()
    assert end == 4


def test_empty_encodes_as_single_zero() -> None:
    for ctx in CONTEXTS:
        if ctx in (P.PINGREQ, P.PINGRESP):
            with pytest.raises(ValueError):
                encode_properties(Properties(), ctx)
        else:
            assert encode_properties(Properties(), ctx) == b"\x00"


def test_spec_example_session_expiry_in_connect() -> None:
    # MQTT 5.0 figure 3-6: Property Length 5, Session Expiry Interval (17) of 10 seconds.
    props = Properties(session_expiry_interval=10)
    assert encode_properties(props, P.CONNECT) == bytes.fromhex("05110000000a")


@pytest.mark.parametrize(
    ("props", "ctx"),
    [
        (Properties(receive_maximum=70_000), P.CONNECT),
        (Properties(session_expiry_interval=2**32), P.DISCONNECT),
        (Properties(subscription_identifiers=[268_435_456]), P.PUBLISH),
        (Properties(reason_string="x" * 65_536), P.PUBACK),
        (Properties(correlation_data=b"x" * 65_536), P.PUBLISH),
        (Properties(user_properties=[("a\x00", "b")]), P.PUBLISH),
        (Properties(content_type="\ud800"), P.PUBLISH),
        (Properties(payload_format_indicator=256), P.PUBLISH),
    ],
)
def test_encode_out_of_range_raises_value_error(props: Properties, ctx: int) -> None:
    with pytest.raises(ValueError):
        encode_properties(props, ctx)


def test_repr_lists_only_present_properties() -> None:
    assert repr(Properties()) == "Properties()"
    assert repr(Properties(topic_alias=3)) == "Properties(topic_alias=3)"


# ---------------------------------------------------------------- round trip per context

mqtt_text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=20)
u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFF_FFFF)
flag = st.booleans()

FIELD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "payload_format_indicator": st.integers(0, 1),
    "message_expiry_interval": u32,
    "content_type": mqtt_text,
    "response_topic": mqtt_text,
    "correlation_data": st.binary(max_size=20),
    "subscription_identifiers": st.lists(st.integers(1, 268_435_455), min_size=1, max_size=3),
    "session_expiry_interval": u32,
    "assigned_client_identifier": mqtt_text,
    "server_keep_alive": u16,
    "authentication_method": mqtt_text,
    "authentication_data": st.binary(max_size=20),
    "request_problem_information": flag,
    "will_delay_interval": u32,
    "request_response_information": flag,
    "response_information": mqtt_text,
    "server_reference": mqtt_text,
    "reason_string": mqtt_text,
    "receive_maximum": st.integers(1, 0xFFFF),
    "topic_alias_maximum": u16,
    "topic_alias": st.integers(1, 0xFFFF),
    "maximum_qos": st.integers(0, 1),
    "retain_available": flag,
    "user_properties": st.lists(st.tuples(mqtt_text, mqtt_text), max_size=3),
    "maximum_packet_size": st.integers(1, 0xFFFF_FFFF),
    "wildcard_subscription_available": flag,
    "subscription_identifier_available": flag,
    "shared_subscription_available": flag,
}


@st.composite
def properties_for(draw: st.DrawFn, ctx: int) -> Properties:
    """A random valid property set for the context ``ctx``."""
    props = Properties()
    for name, _raw, _value, allowed in TABLE.values():
        if ctx in allowed and draw(st.booleans()):
            value = draw(FIELD_VALUES[name])
            if name == "subscription_identifiers" and ctx != P.PUBLISH:
                value = value[:1]
            setattr(props, name, value)
    if props.authentication_data is not None and props.authentication_method is None:
        props.authentication_method = "m"
    return props


@pytest.mark.parametrize("ctx", [c for c in CONTEXTS if c not in (P.PINGREQ, P.PINGRESP)])
@given(data=st.data())
def test_roundtrip_per_context(ctx: int, data: st.DataObject) -> None:
    props = data.draw(properties_for(ctx))
    encoded = encode_properties(props, ctx)
    decoded, end = decode_properties(encoded + b"payload", 0, ctx)
    assert decoded == props
    assert end == len(encoded)
