"""MQTT 5.0 Properties (MQTT 5.0 section 2.2.2): the identifiers, the typed container and
the wire encoding, with the per-packet rules of table 2-4.

A property set on the wire is a Property Length (Variable Byte Integer) followed by
identifier/value pairs; the identifier is a Variable Byte Integer, the value one of Byte,
Two/Four Byte Integer, Variable Byte Integer, UTF-8 Encoded String, Binary Data or UTF-8
String Pair. MQTT 3.1.1 has no properties.

Packet types are plain ints here (``packets.PacketType`` values); ``packets`` depends on this
module, so it cannot be imported back. The Will Properties of a CONNECT payload are a context
of their own (3.1.3.2), named by ``WILL_PROPERTIES``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from enum import IntEnum
from operator import attrgetter
from typing import Any, Final, NamedTuple

from services.common.mqtt.errors import MalformedPacket, ProtocolError
from services.common.mqtt.reason_codes import ReasonCode
from services.common.mqtt.utf8 import decode_binary, decode_utf8, encode_binary, encode_utf8
from services.common.mqtt.vbi import decode_vbi, encode_vbi

WILL_PROPERTIES: Final = 0
"""Context value for the Will Properties of a CONNECT payload (MQTT 5.0 3.1.3.2).

Packet type 0 is Reserved on the wire, so it cannot collide with a real packet's context.
"""

# Packet type values (MQTT 5.0 table 2-1), mirrored from packets.PacketType.
_CONNECT: Final = 1
_CONNACK: Final = 2
_PUBLISH: Final = 3
_PUBACK: Final = 4
_PUBREC: Final = 5
_PUBREL: Final = 6
_PUBCOMP: Final = 7
_SUBSCRIBE: Final = 8
_SUBACK: Final = 9
_UNSUBSCRIBE: Final = 10
_UNSUBACK: Final = 11
_DISCONNECT: Final = 14
_AUTH: Final = 15


class PropertyId(IntEnum):
    """Property identifiers, named as in MQTT 5.0 table 2-4."""

    PAYLOAD_FORMAT_INDICATOR = 0x01
    MESSAGE_EXPIRY_INTERVAL = 0x02
    CONTENT_TYPE = 0x03
    RESPONSE_TOPIC = 0x08
    CORRELATION_DATA = 0x09
    SUBSCRIPTION_IDENTIFIER = 0x0B
    SESSION_EXPIRY_INTERVAL = 0x11
    ASSIGNED_CLIENT_IDENTIFIER = 0x12
    SERVER_KEEP_ALIVE = 0x13
    AUTHENTICATION_METHOD = 0x15
    AUTHENTICATION_DATA = 0x16
    REQUEST_PROBLEM_INFORMATION = 0x17
    WILL_DELAY_INTERVAL = 0x18
    REQUEST_RESPONSE_INFORMATION = 0x19
    RESPONSE_INFORMATION = 0x1A
    SERVER_REFERENCE = 0x1C
    REASON_STRING = 0x1F
    RECEIVE_MAXIMUM = 0x21
    TOPIC_ALIAS_MAXIMUM = 0x22
    TOPIC_ALIAS = 0x23
    MAXIMUM_QOS = 0x24
    RETAIN_AVAILABLE = 0x25
    USER_PROPERTY = 0x26
    MAXIMUM_PACKET_SIZE = 0x27
    WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
    SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
    SHARED_SUBSCRIPTION_AVAILABLE = 0x2A


@dataclass(slots=True)
class Properties:
    """The MQTT 5.0 properties of one packet or one Will; ``None`` / empty means absent.

    Integer properties are plain ints in their wire units: intervals in seconds, sizes in
    bytes. Flags whose only legal values are 0 and 1 are bools. ``subscription_identifiers``
    holds one entry in SUBSCRIBE and one or more in a PUBLISH sent to a subscriber (3.3.2.3.8);
    ``user_properties`` keeps wire order and may repeat names (3.3.2.3.7).
    """

    payload_format_indicator: int | None = None
    message_expiry_interval: int | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    subscription_identifiers: list[int] = field(default_factory=list)
    session_expiry_interval: int | None = None
    assigned_client_identifier: str | None = None
    server_keep_alive: int | None = None
    authentication_method: str | None = None
    authentication_data: bytes | None = None
    request_problem_information: bool | None = None
    will_delay_interval: int | None = None
    request_response_information: bool | None = None
    response_information: str | None = None
    server_reference: str | None = None
    reason_string: str | None = None
    receive_maximum: int | None = None
    topic_alias_maximum: int | None = None
    topic_alias: int | None = None
    maximum_qos: int | None = None
    retain_available: bool | None = None
    user_properties: list[tuple[str, str]] = field(default_factory=list)
    maximum_packet_size: int | None = None
    wildcard_subscription_available: bool | None = None
    subscription_identifier_available: bool | None = None
    shared_subscription_available: bool | None = None

    def __repr__(self) -> str:
        # Only the properties present: a full 27-field repr drowns logs and test output.
        present = (
            f"{spec.name}={value!r}"
            for spec in _SPECS
            if (value := getattr(self, spec.name)) is not None and value != []
        )
        return f"Properties({', '.join(present)})"


class _Kind(IntEnum):
    """Data representation of a property value (MQTT 5.0 1.5)."""

    BYTE = 1
    TWO_BYTE = 2  # the fixed-width kinds' values are their widths in bytes
    FOUR_BYTE = 4
    VBI = 5
    UTF8 = 6
    BINARY = 7
    UTF8_PAIR = 8
    BOOL = 9  # a Byte whose only legal values are 0 and 1, surfaced as bool


class _Spec(NamedTuple):
    pid: PropertyId
    name: str
    kind: _Kind
    contexts: frozenset[int]


_ACKS: Final = (_PUBACK, _PUBREC, _PUBREL, _PUBCOMP)
_MESSAGE: Final = (_PUBLISH, WILL_PROPERTIES)

# MQTT 5.0 table 2-4: identifier, Properties field, type, packets (and Will) allowed.
_SPECS: Final = (
    _Spec(PropertyId.PAYLOAD_FORMAT_INDICATOR, "payload_format_indicator", _Kind.BYTE,
          frozenset(_MESSAGE)),
    _Spec(PropertyId.MESSAGE_EXPIRY_INTERVAL, "message_expiry_interval", _Kind.FOUR_BYTE,
          frozenset(_MESSAGE)),
    _Spec(PropertyId.CONTENT_TYPE, "content_type", _Kind.UTF8, frozenset(_MESSAGE)),
    _Spec(PropertyId.RESPONSE_TOPIC, "response_topic", _Kind.UTF8, frozenset(_MESSAGE)),
    _Spec(PropertyId.CORRELATION_DATA, "correlation_data", _Kind.BINARY, frozenset(_MESSAGE)),
    _Spec(PropertyId.SUBSCRIPTION_IDENTIFIER, "subscription_identifiers", _Kind.VBI,
          frozenset((_PUBLISH, _SUBSCRIBE))),
    _Spec(PropertyId.SESSION_EXPIRY_INTERVAL, "session_expiry_interval", _Kind.FOUR_BYTE,
          frozenset((_CONNECT, _CONNACK, _DISCONNECT))),
    _Spec(PropertyId.ASSIGNED_CLIENT_IDENTIFIER, "assigned_client_identifier", _Kind.UTF8,
          frozenset((_CONNACK,))),
    _Spec(PropertyId.SERVER_KEEP_ALIVE, "server_keep_alive", _Kind.TWO_BYTE,
          frozenset((_CONNACK,))),
    _Spec(PropertyId.AUTHENTICATION_METHOD, "authentication_method", _Kind.UTF8,
          frozenset((_CONNECT, _CONNACK, _AUTH))),
    _Spec(PropertyId.AUTHENTICATION_DATA, "authentication_data", _Kind.BINARY,
          frozenset((_CONNECT, _CONNACK, _AUTH))),
    _Spec(PropertyId.REQUEST_PROBLEM_INFORMATION, "request_problem_information", _Kind.BOOL,
          frozenset((_CONNECT,))),
    _Spec(PropertyId.WILL_DELAY_INTERVAL, "will_delay_interval", _Kind.FOUR_BYTE,
          frozenset((WILL_PROPERTIES,))),
    _Spec(PropertyId.REQUEST_RESPONSE_INFORMATION, "request_response_information", _Kind.BOOL,
          frozenset((_CONNECT,))),
    _Spec(PropertyId.RESPONSE_INFORMATION, "response_information", _Kind.UTF8,
          frozenset((_CONNACK,))),
    _Spec(PropertyId.SERVER_REFERENCE, "server_reference", _Kind.UTF8,
          frozenset((_CONNACK, _DISCONNECT))),
    _Spec(PropertyId.REASON_STRING, "reason_string", _Kind.UTF8,
          frozenset((_CONNACK, *_ACKS, _SUBACK, _UNSUBACK, _DISCONNECT, _AUTH))),
    _Spec(PropertyId.RECEIVE_MAXIMUM, "receive_maximum", _Kind.TWO_BYTE,
          frozenset((_CONNECT, _CONNACK))),
    _Spec(PropertyId.TOPIC_ALIAS_MAXIMUM, "topic_alias_maximum", _Kind.TWO_BYTE,
          frozenset((_CONNECT, _CONNACK))),
    _Spec(PropertyId.TOPIC_ALIAS, "topic_alias", _Kind.TWO_BYTE, frozenset((_PUBLISH,))),
    _Spec(PropertyId.MAXIMUM_QOS, "maximum_qos", _Kind.BYTE, frozenset((_CONNACK,))),
    _Spec(PropertyId.RETAIN_AVAILABLE, "retain_available", _Kind.BOOL, frozenset((_CONNACK,))),
    _Spec(PropertyId.USER_PROPERTY, "user_properties", _Kind.UTF8_PAIR,
          frozenset((_CONNECT, _CONNACK, *_MESSAGE, *_ACKS, _SUBSCRIBE, _SUBACK, _UNSUBSCRIBE,
                     _UNSUBACK, _DISCONNECT, _AUTH))),
    _Spec(PropertyId.MAXIMUM_PACKET_SIZE, "maximum_packet_size", _Kind.FOUR_BYTE,
          frozenset((_CONNECT, _CONNACK))),
    _Spec(PropertyId.WILDCARD_SUBSCRIPTION_AVAILABLE, "wildcard_subscription_available",
          _Kind.BOOL, frozenset((_CONNACK,))),
    _Spec(PropertyId.SUBSCRIPTION_IDENTIFIER_AVAILABLE, "subscription_identifier_available",
          _Kind.BOOL, frozenset((_CONNACK,))),
    _Spec(PropertyId.SHARED_SUBSCRIPTION_AVAILABLE, "shared_subscription_available",
          _Kind.BOOL, frozenset((_CONNACK,))),
)  # fmt: skip

_BY_ID: Final = {spec.pid.value: spec for spec in _SPECS}

ALLOWED_PROPERTIES: Final[dict[int, frozenset[PropertyId]]] = {
    ctx: frozenset(spec.pid for spec in _SPECS if ctx in spec.contexts)
    for ctx in (WILL_PROPERTIES, _CONNECT, _CONNACK, _PUBLISH, *_ACKS, _SUBSCRIBE, _SUBACK,
                _UNSUBSCRIBE, _UNSUBACK, _DISCONNECT, _AUTH)
}  # fmt: skip
"""Context (packet type value or ``WILL_PROPERTIES``) -> identifiers table 2-4 allows there.

PINGREQ and PINGRESP carry no properties and are absent.
"""

# For encoding: the allowed specs of each context, and the field names that must be unset.
_ENCODE_PLAN: Final = {
    ctx: (
        tuple(spec for spec in _SPECS if ctx in spec.contexts),
        tuple(spec.name for spec in _SPECS if ctx not in spec.contexts),
    )
    for ctx in ALLOWED_PROPERTIES
}

# All fields at C speed, to spot the common empty set without a per-field Python loop.
_ALL_FIELDS: Final = attrgetter(*(spec.name for spec in _SPECS))
_EMPTY_VALUES: Final = _ALL_FIELDS(Properties())

_STRUCT_H: Final = struct.Struct("!BH")
_STRUCT_I: Final = struct.Struct("!BI")


def encode_properties(props: Properties, packet_type: int) -> bytes:
    """Encode ``props`` for the context ``packet_type``, Property Length prefix included.

    ``packet_type`` is a ``packets.PacketType`` value or ``WILL_PROPERTIES``. Properties are
    written in identifier order; an empty set encodes as the single byte 0x00 (2.2.2.1).

    Raises:
        ValueError: a property table 2-4 does not allow in this context is set, a value does
            not fit its wire type (e.g. a Two Byte Integer above 65,535), a string or binary
            field is longer than 65,535 bytes, or ``packet_type`` has no properties.
    """
    try:
        allowed, forbidden = _ENCODE_PLAN[packet_type]
    except KeyError:
        raise ValueError(f"packet type {packet_type} carries no properties") from None
    if _ALL_FIELDS(props) == _EMPTY_VALUES:
        return b"\x00"
    for name in forbidden:
        value = getattr(props, name)
        if value is not None and value != []:
            raise ValueError(f"property {name} is not allowed in packet type {packet_type}")
    parts: list[bytes] = []
    try:
        for spec in allowed:
            value = getattr(props, spec.name)
            if value is None or value == []:
                continue
            _encode_value(parts, spec, value)
    except struct.error as exc:
        raise ValueError(f"property value out of range: {exc}") from None
    if not parts:
        return b"\x00"
    body = b"".join(parts)
    return encode_vbi(len(body)) + body


def _encode_value(parts: list[bytes], spec: _Spec, value: Any) -> None:
    pid = spec.pid.value
    kind = spec.kind
    if kind is _Kind.BYTE or kind is _Kind.BOOL:
        if not 0 <= value <= 255:
            raise ValueError(f"{spec.name} does not fit a Byte: {value}")
        parts.append(bytes((pid, int(value))))
    elif kind is _Kind.TWO_BYTE:
        parts.append(_STRUCT_H.pack(pid, value))
    elif kind is _Kind.FOUR_BYTE:
        parts.append(_STRUCT_I.pack(pid, value))
    elif kind is _Kind.VBI:
        # Only the Subscription Identifier is a VBI, and it is stored as a list.
        parts.extend(bytes((pid,)) + encode_vbi(v) for v in value)
    elif kind is _Kind.UTF8:
        parts.append(bytes((pid,)) + encode_utf8(value))
    elif kind is _Kind.BINARY:
        parts.append(bytes((pid,)) + encode_binary(value))
    else:
        parts.extend(bytes((pid,)) + encode_utf8(k) + encode_utf8(v) for k, v in value)


def decode_properties(
    buf: bytes | bytearray | memoryview, offset: int, packet_type: int
) -> tuple[Properties, int]:
    """Decode the property set (Property Length included) starting at ``buf[offset]``.

    ``packet_type`` is a ``packets.PacketType`` value or ``WILL_PROPERTIES`` (MQTT 5.0 2.2.2).

    Returns:
        ``(properties, next_offset)``; ``next_offset`` is just past the last property.

    Raises:
        MalformedPacket: the Property Length runs past ``buf``, a value runs past the
            Property Length, an identifier is unknown, or a string is not valid UTF-8.
        ProtocolError: a property table 2-4 does not allow in this context; a property other
            than User Property (or Subscription Identifier in PUBLISH) given twice; a value out
            of its legal range (0 for Receive Maximum, Maximum Packet Size or Subscription
            Identifier; other than 0/1 for Payload Format Indicator, Maximum QoS and the
            boolean properties); Authentication Data without Authentication Method
            (3.1.2.11.10). A Topic Alias of 0 is a ProtocolError with reason code 0x94 Topic
            Alias invalid (3.3.2.3.4).
    """
    length, pos = decode_vbi(buf, offset)
    end = pos + length
    if end > len(buf):
        raise MalformedPacket("Property Length runs past the end of the packet")
    props = Properties()
    if length == 0:
        return props, end
    # Reads are bounded by the Property Length: a value crossing it is truncated.
    view = memoryview(buf)[:end]
    while pos < end:
        pid, pos = decode_vbi(view, pos)
        spec = _BY_ID.get(pid)
        if spec is None:
            raise MalformedPacket(f"unknown property identifier 0x{pid:02X}")
        if packet_type not in spec.contexts:
            raise ProtocolError(f"{spec.pid.name} is not allowed in packet type {packet_type}")
        value, pos = _decode_value(view, pos, spec)
        name = spec.name
        if spec.kind is _Kind.UTF8_PAIR:
            props.user_properties.append(value)
        elif spec.kind is _Kind.VBI:
            ids = props.subscription_identifiers
            if ids and packet_type != _PUBLISH:
                raise ProtocolError("Subscription Identifier given more than once")
            ids.append(value)
        elif getattr(props, name) is not None:
            raise ProtocolError(f"{spec.pid.name} given more than once")
        else:
            setattr(props, name, value)
    if props.authentication_data is not None and props.authentication_method is None:
        raise ProtocolError("Authentication Data without Authentication Method")
    return props, end


def _decode_value(view: memoryview, pos: int, spec: _Spec) -> tuple[Any, int]:
    kind = spec.kind
    end = len(view)
    if kind is _Kind.UTF8:
        return decode_utf8(view, pos)
    if kind is _Kind.BINARY:
        return decode_binary(view, pos)
    if kind is _Kind.UTF8_PAIR:
        key, pos = decode_utf8(view, pos)
        val, pos = decode_utf8(view, pos)
        return (key, val), pos
    if kind is _Kind.VBI:
        value, pos = decode_vbi(view, pos)
        if value == 0:
            raise ProtocolError("Subscription Identifier of 0")
        return value, pos
    size = 1 if kind is _Kind.BYTE or kind is _Kind.BOOL else int(kind)
    if pos + size > end:
        raise MalformedPacket(f"truncated {spec.pid.name}")
    value = int.from_bytes(view[pos : pos + size], "big")
    pos += size
    pid = spec.pid
    if kind is _Kind.BOOL:
        if value > 1:
            raise ProtocolError(f"{pid.name} must be 0 or 1, got {value}")
        return bool(value), pos
    if value > 1 and pid in (PropertyId.PAYLOAD_FORMAT_INDICATOR, PropertyId.MAXIMUM_QOS):
        raise ProtocolError(f"{pid.name} must be 0 or 1, got {value}")
    if value == 0:
        if pid is PropertyId.TOPIC_ALIAS:
            raise ProtocolError("Topic Alias of 0", ReasonCode.TOPIC_ALIAS_INVALID)
        if pid in (PropertyId.RECEIVE_MAXIMUM, PropertyId.MAXIMUM_PACKET_SIZE):
            raise ProtocolError(f"{pid.name} of 0")
    return value, pos
