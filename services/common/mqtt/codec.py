"""Sans-IO MQTT 3.1.1 / 5.0 codec: packets to bytes, bytes to packets.

``encode`` and ``decode`` work on one packet; ``StreamDecoder`` frames a byte stream (MQTT
5.0 2.1: fixed header, Remaining Length as a Variable Byte Integer, then the body). Protocol
versions are Protocol Levels: 3 (MQTT 3.1), 4 (3.1.1) and 5 (5.0); 3 and 4 share a wire format
here.

Decoding enforces the encoding rules of the specification and raises the typed errors of
``errors``: ``MalformedPacket`` when the bytes cannot be parsed as the spec requires,
``ProtocolError`` when a parsed value is not allowed, ``UnsupportedProtocolVersion`` for a
CONNECT this server does not speak, ``PacketTooLarge`` for a frame over the size limit.
Topic Name / Topic Filter semantics (wildcards, shared subscriptions) are checked elsewhere.
Encoding raises ``ValueError`` for a packet a conforming receiver would have to reject.
"""

from __future__ import annotations

import struct
from typing import Final

from services.common.mqtt.errors import (
    MalformedPacket,
    PacketTooLarge,
    ProtocolError,
    UnsupportedProtocolVersion,
)
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
    WILL_PROPERTIES,
    Properties,
    decode_properties,
    encode_properties,
)
from services.common.mqtt.reason_codes import CONNACK_REASON_CODES
from services.common.mqtt.utf8 import decode_binary, decode_utf8, encode_binary, encode_utf8
from services.common.mqtt.vbi import VBI_MAX, encode_vbi

MAX_PACKET_SIZE: Final = 1 + 4 + VBI_MAX
"""Largest possible MQTT packet: fixed header byte, 4-byte Remaining Length, 268,435,455."""

_VERSIONS: Final = (3, 4, 5)
_H: Final = struct.Struct("!H")

# Fixed header flags every packet type but PUBLISH must carry (5.0 2.1.3, 3.1.1 2.2.2).
_FIXED_FLAGS: Final[dict[int, int]] = {
    PacketType.CONNECT: 0,
    PacketType.CONNACK: 0,
    PacketType.PUBACK: 0,
    PacketType.PUBREC: 0,
    PacketType.PUBREL: 0b0010,
    PacketType.PUBCOMP: 0,
    PacketType.SUBSCRIBE: 0b0010,
    PacketType.SUBACK: 0,
    PacketType.UNSUBSCRIBE: 0b0010,
    PacketType.UNSUBACK: 0,
    PacketType.PINGREQ: 0,
    PacketType.PINGRESP: 0,
    PacketType.DISCONNECT: 0,
    PacketType.AUTH: 0,
}

# Reason Codes each 5.0 packet may carry (5.0 3.2.2.2, 3.4.2.1 ... 3.15.2.1).
_PUBACK_REASONS: Final = frozenset((0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99))
_PUBREL_REASONS: Final = frozenset((0x00, 0x92))
_SUBACK_REASONS: Final = frozenset(
    (0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2)
)
_UNSUBACK_REASONS: Final = frozenset((0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91))
_DISCONNECT_REASONS: Final = frozenset(
    (0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E, 0x8F, 0x90, 0x93,
     0x94, 0x95, 0x96, 0x97, 0x98, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9E, 0x9F, 0xA0, 0xA1, 0xA2)
)  # fmt: skip
_AUTH_REASONS: Final = frozenset((0x00, 0x18, 0x19))
_V3_CONNACK_RETURN_CODES: Final = frozenset(range(6))  # 3.1.1 table 3.1
_V3_SUBACK_RETURN_CODES: Final = frozenset((0x00, 0x01, 0x02, 0x80))  # 3.1.1 3.9.3

_AckClass = type[PubAck] | type[PubRec] | type[PubRel] | type[PubComp]
_ACKS: Final[dict[int, tuple[_AckClass, frozenset[int]]]] = {
    PacketType.PUBACK: (PubAck, _PUBACK_REASONS),
    PacketType.PUBREC: (PubRec, _PUBACK_REASONS),
    PacketType.PUBREL: (PubRel, _PUBREL_REASONS),
    PacketType.PUBCOMP: (PubComp, _PUBREL_REASONS),
}
_ACK_FIRST_BYTE: Final = {PubAck: 0x40, PubRec: 0x50, PubRel: 0x62, PubComp: 0x70}


# --------------------------------------------------------------------------- decoding


def decode(first_byte: int, body: bytes | bytearray | memoryview, protocol_version: int) -> Packet:
    """Decode one packet from its fixed header's first byte and its body.

    Args:
        first_byte: byte 1 of the fixed header (packet type in bits 7-4, flags in 3-0).
        body: the Remaining Length bytes: variable header and payload, nothing after.
        protocol_version: 3, 4 or 5, the version in force on the connection; a CONNECT is
            decoded by the version it announces and ignores this.

    Returns:
        The packet dataclass; ``bytes`` fields are copies, independent of ``body``.

    Raises:
        MalformedPacket: reserved packet type (0, or 15 before 5.0), wrong fixed header
            flags, PUBLISH QoS 3 or DUP on QoS 0, truncated fields, bytes left after the
            last field, invalid UTF-8, reserved bits set (CONNECT flags, Subscription
            Options, CONNACK flags), inconsistent Will flags, non-empty PINGREQ/PINGRESP.
        ProtocolError: Packet Identifier 0, a Reason Code the packet type does not define,
            SUBSCRIBE/UNSUBSCRIBE without filters, a 5.0 PUBLISH with an empty topic and no
            Topic Alias, and every property rule of ``properties.decode_properties``.
        UnsupportedProtocolVersion: CONNECT with a Protocol Name other than "MQTT" or
            "MQIsdp", or a Protocol Level not matching its name (3.1.2.1, 3.1.2.2).
        ValueError: ``protocol_version`` is not 3, 4 or 5.
    """
    if protocol_version not in _VERSIONS:
        raise ValueError(f"unknown protocol version {protocol_version}")
    view = body if isinstance(body, memoryview) else memoryview(body)
    ptype = first_byte >> 4
    flags = first_byte & 0x0F
    if ptype == PacketType.PUBLISH:
        return _decode_publish(flags, view, protocol_version)
    if ptype == 0 or (ptype == PacketType.AUTH and protocol_version != 5):
        raise MalformedPacket(f"reserved packet type {ptype}")
    if flags != _FIXED_FLAGS[ptype]:
        raise MalformedPacket(f"invalid fixed header flags 0x{flags:X} for packet type {ptype}")
    v5 = protocol_version == 5
    if ptype == PacketType.CONNECT:
        return _decode_connect(view)
    if ptype == PacketType.CONNACK:
        return _decode_connack(view, v5)
    if ptype in _ACKS:
        return _decode_ack(ptype, view, v5)
    if ptype == PacketType.SUBSCRIBE:
        return _decode_subscribe(view, v5)
    if ptype == PacketType.SUBACK:
        return _decode_suback(view, v5)
    if ptype == PacketType.UNSUBSCRIBE:
        return _decode_unsubscribe(view, v5)
    if ptype == PacketType.UNSUBACK:
        return _decode_unsuback(view, v5)
    if ptype == PacketType.PINGREQ or ptype == PacketType.PINGRESP:
        if len(view) != 0:
            raise MalformedPacket(f"{PacketType(ptype).name} with a non-zero Remaining Length")
        return PingReq() if ptype == PacketType.PINGREQ else PingResp()
    if ptype == PacketType.DISCONNECT:
        return _decode_disconnect(view, v5)
    return _decode_auth(view)


def _packet_id(view: memoryview, pos: int) -> tuple[int, int]:
    if pos + 2 > len(view):
        raise MalformedPacket("truncated Packet Identifier")
    packet_id = (view[pos] << 8) | view[pos + 1]
    if packet_id == 0:
        # Non-zero Packet Identifier [MQTT-2.2.1-3]; 0 can never match an acknowledgement.
        raise ProtocolError("Packet Identifier 0")
    return packet_id, pos + 2


def _expect_end(view: memoryview, pos: int, what: str) -> None:
    if pos != len(view):
        raise MalformedPacket(f"{len(view) - pos} bytes left over after the {what} fields")


def _reason(code: int, allowed: frozenset[int], what: str) -> int:
    if code not in allowed:
        raise ProtocolError(f"Reason Code 0x{code:02X} is not defined for {what}")
    return code


def _decode_publish(flags: int, view: memoryview, version: int) -> Publish:
    qos = (flags >> 1) & 0b11
    if qos == 3:
        raise MalformedPacket("PUBLISH with QoS 3")  # [MQTT-3.3.1-4]
    dup = bool(flags & 0b1000)
    if dup and qos == 0:
        raise MalformedPacket("PUBLISH QoS 0 with DUP set")  # [MQTT-3.3.1-2]
    topic, pos = decode_utf8(view, 0)
    packet_id = None
    if qos:
        packet_id, pos = _packet_id(view, pos)
    if version == 5:
        if pos < len(view) and view[pos] == 0:
            # Property Length 0, the usual case: skip the generic property decoder.
            props = Properties()
            pos += 1
        else:
            props, pos = decode_properties(view, pos, PacketType.PUBLISH)
        if not topic and props.topic_alias is None:
            raise ProtocolError("PUBLISH with an empty Topic Name and no Topic Alias")
    else:
        props = Properties()
    return Publish(topic, bytes(view[pos:]), qos, bool(flags & 1), dup, packet_id, props)


def _decode_connect(view: memoryview) -> Connect:
    name, pos = decode_utf8(view, 0)
    if pos >= len(view):
        raise MalformedPacket("truncated Protocol Level")
    level = view[pos]
    pos += 1
    if name not in ("MQTT", "MQIsdp"):
        # 5.0 3.1.2.1: a server not processing another protocol MAY answer 0x84.
        raise UnsupportedProtocolVersion(f"unknown Protocol Name {name!r}")
    if (name == "MQTT" and level not in (4, 5)) or (name == "MQIsdp" and level != 3):
        raise UnsupportedProtocolVersion(f"Protocol Level {level} with Protocol Name {name!r}")
    if pos + 3 > len(view):
        raise MalformedPacket("truncated Connect Flags / Keep Alive")
    flags = view[pos]
    keep_alive = (view[pos + 1] << 8) | view[pos + 2]
    pos += 3
    if flags & 0x01:
        raise MalformedPacket("CONNECT reserved flag set")  # [MQTT-3.1.2-3]
    will_flag = bool(flags & 0x04)
    will_qos = (flags >> 3) & 0b11
    will_retain = bool(flags & 0x20)
    if will_flag and will_qos == 3:
        raise MalformedPacket("Will QoS 3")
    if not will_flag and (will_qos or will_retain):
        raise MalformedPacket("Will QoS or Will Retain set without the Will Flag")
    has_password = bool(flags & 0x40)
    has_username = bool(flags & 0x80)
    if level != 5 and has_password and not has_username:
        raise MalformedPacket("Password Flag without User Name Flag")  # [MQTT-3.1.2-22]
    props = Properties()
    if level == 5:
        props, pos = decode_properties(view, pos, PacketType.CONNECT)
    client_id, pos = decode_utf8(view, pos)
    will = None
    if will_flag:
        will_props = Properties()
        if level == 5:
            will_props, pos = decode_properties(view, pos, WILL_PROPERTIES)
        will_topic, pos = decode_utf8(view, pos)
        will_payload, pos = decode_binary(view, pos)
        will = Will(will_topic, will_payload, will_qos, will_retain, will_props)
    username = password = None
    if has_username:
        username, pos = decode_utf8(view, pos)
    if has_password:
        password, pos = decode_binary(view, pos)
    _expect_end(view, pos, "CONNECT")
    clean_start = bool(flags & 0x02)
    return Connect(level, client_id, clean_start, keep_alive, username, password, will, props)


def _decode_connack(view: memoryview, v5: bool) -> ConnAck:
    if len(view) < 2:
        raise MalformedPacket("truncated CONNACK")
    ack_flags = view[0]
    if ack_flags & 0xFE:
        raise MalformedPacket("CONNACK reserved flags set")
    code = view[1]
    props = Properties()
    if v5:
        _reason(code, CONNACK_REASON_CODES, "CONNACK")
        props, pos = decode_properties(view, 2, PacketType.CONNACK)
        _expect_end(view, pos, "CONNACK")
    else:
        _expect_end(view, 2, "CONNACK")
        _reason(code, _V3_CONNACK_RETURN_CODES, "CONNACK")
    return ConnAck(bool(ack_flags), code, props)


def _decode_ack(ptype: int, view: memoryview, v5: bool) -> PubAck | PubRec | PubRel | PubComp:
    cls, allowed = _ACKS[ptype]
    packet_id, pos = _packet_id(view, 0)
    if not v5 or len(view) == 2:
        _expect_end(view, pos, cls.__name__.upper())
        return cls(packet_id)
    # 5.0 3.4.2.1: Remaining Length 3 carries a Reason Code and no Property Length.
    code = _reason(view[2], allowed, cls.__name__.upper())
    props = Properties()
    if len(view) > 3:
        props, pos = decode_properties(view, 3, ptype)
        _expect_end(view, pos, cls.__name__.upper())
    return cls(packet_id, code, props)


def _decode_subscribe(view: memoryview, v5: bool) -> Subscribe:
    packet_id, pos = _packet_id(view, 0)
    props = Properties()
    if v5:
        props, pos = decode_properties(view, pos, PacketType.SUBSCRIBE)
    subscriptions = []
    end = len(view)
    while pos < end:
        topic_filter, pos = decode_utf8(view, pos)
        if pos >= end:
            raise MalformedPacket("Topic Filter without Subscription Options")
        options = view[pos]
        pos += 1
        qos = options & 0b11
        if v5:
            if options & 0xC0:
                raise MalformedPacket("Subscription Options reserved bits set")  # [MQTT-3.8.3-5]
            retain_handling = (options >> 4) & 0b11
            # 5.0 3.8.3.1 names these two a Protocol Error (3.1.1 calls QoS 3 malformed).
            if qos == 3:
                raise ProtocolError("Subscription Options Maximum QoS 3")
            if retain_handling == 3:
                raise ProtocolError("Subscription Options Retain Handling 3")
            no_local = bool(options & 0x04)
            retain_as_published = bool(options & 0x08)
            subscriptions.append(
                SubscriptionRequest(
                    topic_filter, qos, no_local, retain_as_published, retain_handling
                )
            )
        else:
            if options & 0xFC or qos == 3:
                raise MalformedPacket("SUBSCRIBE requested QoS byte invalid")  # [MQTT-3-8.3-4]
            subscriptions.append(SubscriptionRequest(topic_filter, qos))
    if not subscriptions:
        # 5.0 [MQTT-3.8.3-2], 3.1.1 [MQTT-3.8.3-3]
        raise ProtocolError("SUBSCRIBE without Topic Filters")
    return Subscribe(packet_id, subscriptions, props)


def _decode_suback(view: memoryview, v5: bool) -> SubAck:
    packet_id, pos = _packet_id(view, 0)
    props = Properties()
    allowed = _V3_SUBACK_RETURN_CODES
    if v5:
        props, pos = decode_properties(view, pos, PacketType.SUBACK)
        allowed = _SUBACK_REASONS
    codes = [_reason(code, allowed, "SUBACK") for code in view[pos:]]
    if not codes:
        raise ProtocolError("SUBACK without Reason Codes")
    return SubAck(packet_id, codes, props)


def _decode_unsubscribe(view: memoryview, v5: bool) -> Unsubscribe:
    packet_id, pos = _packet_id(view, 0)
    props = Properties()
    if v5:
        props, pos = decode_properties(view, pos, PacketType.UNSUBSCRIBE)
    topic_filters = []
    while pos < len(view):
        topic_filter, pos = decode_utf8(view, pos)
        topic_filters.append(topic_filter)
    if not topic_filters:
        raise ProtocolError("UNSUBSCRIBE without Topic Filters")  # [MQTT-3.10.3-2]
    return Unsubscribe(packet_id, topic_filters, props)


def _decode_unsuback(view: memoryview, v5: bool) -> UnsubAck:
    packet_id, pos = _packet_id(view, 0)
    if not v5:
        _expect_end(view, pos, "UNSUBACK")
        return UnsubAck(packet_id)
    props, pos = decode_properties(view, pos, PacketType.UNSUBACK)
    codes = [_reason(code, _UNSUBACK_REASONS, "UNSUBACK") for code in view[pos:]]
    if not codes:
        raise ProtocolError("UNSUBACK without Reason Codes")
    return UnsubAck(packet_id, codes, props)


def _decode_reason_and_properties(
    view: memoryview, ptype: PacketType, allowed: frozenset[int]
) -> tuple[int, Properties]:
    # DISCONNECT and AUTH (5.0 3.14.2, 3.15.2): Remaining Length 0 means Success and no
    # properties; 1 means a Reason Code and no Property Length.
    if len(view) == 0:
        return 0, Properties()
    code = _reason(view[0], allowed, ptype.name)
    if len(view) == 1:
        return code, Properties()
    props, pos = decode_properties(view, 1, ptype)
    _expect_end(view, pos, ptype.name)
    return code, props


def _decode_disconnect(view: memoryview, v5: bool) -> Disconnect:
    if not v5:
        _expect_end(view, 0, "DISCONNECT")
        return Disconnect()
    code, props = _decode_reason_and_properties(view, PacketType.DISCONNECT, _DISCONNECT_REASONS)
    return Disconnect(code, props)


def _decode_auth(view: memoryview) -> Auth:
    code, props = _decode_reason_and_properties(view, PacketType.AUTH, _AUTH_REASONS)
    return Auth(code, props)


# --------------------------------------------------------------------------- encoding


def encode(packet: Packet, protocol_version: int) -> bytes:
    """Encode ``packet`` as the complete bytes of one MQTT Control Packet.

    For protocol versions 3 and 4 the fields 3.1.1 lacks are dropped: properties, and the
    Reason Codes of PUBACK/PUBREC/PUBREL/PUBCOMP/UNSUBACK/DISCONNECT; SUBACK failure codes
    (0x80 and up) become the 3.1.1 Failure return code 0x80. In 5.0, PUBACK/PUBREC/PUBREL/
    PUBCOMP, DISCONNECT and AUTH use their short forms when the Reason Code is 0x00 and there
    are no properties (3.4.2.1, 3.14.2.1, 3.15.2.1). A ``Connect`` is encoded in the version
    of its own ``protocol_version`` field; the argument is not consulted for it. A 3.x
    ``ConnAck`` must already hold a 3.1.1 return code (``reason_codes.v3_connack_code``).

    Raises:
        ValueError: ``protocol_version`` is not 3, 4 or 5; AUTH before 5.0; a value out of
            its wire range (QoS, Packet Identifier missing or 0 when required or present on
            QoS 0, DUP on QoS 0, keep alive, reason codes, a 3.x CONNACK code above 5, strings
            over 65,535 bytes, a Remaining Length over 268,435,455); a 3.1.1 CONNECT with a
            password and no user name; SUBSCRIBE/UNSUBSCRIBE without filters; a property the
            packet type does not allow.
    """
    if protocol_version not in _VERSIONS:
        raise ValueError(f"unknown protocol version {protocol_version}")
    v5 = protocol_version == 5
    try:
        if isinstance(packet, Publish):
            return _encode_publish(packet, v5)
        if isinstance(packet, PubAck | PubRec | PubRel | PubComp):
            return _encode_ack(packet, v5)
        if isinstance(packet, Connect):
            return _encode_connect(packet)
        if isinstance(packet, ConnAck):
            return _encode_connack(packet, v5)
        if isinstance(packet, Subscribe):
            return _encode_subscribe(packet, v5)
        if isinstance(packet, SubAck):
            return _encode_suback(packet, v5)
        if isinstance(packet, Unsubscribe):
            return _encode_unsubscribe(packet, v5)
        if isinstance(packet, UnsubAck):
            return _encode_unsuback(packet, v5)
        if isinstance(packet, PingReq):
            return b"\xc0\x00"
        if isinstance(packet, PingResp):
            return b"\xd0\x00"
        if isinstance(packet, Disconnect):
            if not v5:
                return b"\xe0\x00"
            return _encode_reason_and_properties(
                0xE0, packet.reason_code, packet.properties, PacketType.DISCONNECT
            )
        if not v5:
            raise ValueError("AUTH exists only in MQTT 5.0")
        return _encode_reason_and_properties(
            0xF0, packet.reason_code, packet.properties, PacketType.AUTH
        )
    except (struct.error, OverflowError) as exc:
        raise ValueError(f"field out of range in {type(packet).__name__}: {exc}") from None


def _frame(first_byte: int, body: bytes) -> bytes:
    return bytes((first_byte,)) + encode_vbi(len(body)) + body


def _check_packet_id(packet_id: int | None) -> int:
    if packet_id is None or not 0 < packet_id <= 0xFFFF:
        raise ValueError(f"Packet Identifier must be 1..65535, got {packet_id}")
    return packet_id


def _encode_publish(packet: Publish, v5: bool) -> bytes:
    qos = packet.qos
    if qos not in (0, 1, 2):
        raise ValueError(f"PUBLISH QoS must be 0..2, got {qos}")
    first = 0x30 | (qos << 1)
    if packet.retain:
        first |= 0x01
    parts = [encode_utf8(packet.topic)]
    if qos:
        parts.append(_H.pack(_check_packet_id(packet.packet_id)))
        if packet.dup:
            first |= 0x08
    elif packet.dup or packet.packet_id is not None:
        raise ValueError("PUBLISH QoS 0 carries neither DUP nor a Packet Identifier")
    if v5:
        parts.append(encode_properties(packet.properties, PacketType.PUBLISH))
    payload = packet.payload
    header_len = sum(map(len, parts))
    return b"".join((bytes((first,)), encode_vbi(header_len + len(payload)), *parts, payload))


def _encode_ack(packet: PubAck | PubRec | PubRel | PubComp, v5: bool) -> bytes:
    first = _ACK_FIRST_BYTE[type(packet)]
    packet_id = _H.pack(_check_packet_id(packet.packet_id))
    if not v5:
        return bytes((first, 2)) + packet_id
    props = encode_properties(packet.properties, first >> 4)
    code = packet.reason_code
    if props == b"\x00":
        if code == 0:
            return bytes((first, 2)) + packet_id
        return bytes((first, 3)) + packet_id + bytes((code,))
    return _frame(first, packet_id + bytes((code,)) + props)


def _encode_connect(packet: Connect) -> bytes:
    level = packet.protocol_version
    if level not in _VERSIONS:
        raise ValueError(f"unknown protocol version {level}")
    v5 = level == 5
    flags = 0x02 if packet.clean_start else 0
    will = packet.will
    if will is not None:
        if will.qos not in (0, 1, 2):
            raise ValueError(f"Will QoS must be 0..2, got {will.qos}")
        flags |= 0x04 | (will.qos << 3) | (0x20 if will.retain else 0)
    if packet.password is not None:
        if packet.username is None and not v5:
            raise ValueError("MQTT 3.1.1 CONNECT with a password needs a user name")
        flags |= 0x40
    if packet.username is not None:
        flags |= 0x80
    parts = [
        b"\x00\x06MQIsdp" if level == 3 else b"\x00\x04MQTT",
        bytes((level, flags)),
        _H.pack(packet.keep_alive),
    ]
    if v5:
        parts.append(encode_properties(packet.properties, PacketType.CONNECT))
    parts.append(encode_utf8(packet.client_id))
    if will is not None:
        if v5:
            parts.append(encode_properties(will.properties, WILL_PROPERTIES))
        parts.append(encode_utf8(will.topic))
        parts.append(encode_binary(will.payload))
    if packet.username is not None:
        parts.append(encode_utf8(packet.username))
    if packet.password is not None:
        parts.append(encode_binary(packet.password))
    return _frame(0x10, b"".join(parts))


def _encode_connack(packet: ConnAck, v5: bool) -> bytes:
    body = bytes((1 if packet.session_present else 0, packet.reason_code))
    if v5:
        body += encode_properties(packet.properties, PacketType.CONNACK)
    elif packet.reason_code not in _V3_CONNACK_RETURN_CODES:
        raise ValueError(f"0x{packet.reason_code:02X} is not a 3.1.1 CONNACK return code")
    return _frame(0x20, body)


def _encode_subscribe(packet: Subscribe, v5: bool) -> bytes:
    if not packet.subscriptions:
        raise ValueError("SUBSCRIBE needs at least one subscription")
    parts = [_H.pack(_check_packet_id(packet.packet_id))]
    if v5:
        parts.append(encode_properties(packet.properties, PacketType.SUBSCRIBE))
    for sub in packet.subscriptions:
        if sub.qos not in (0, 1, 2):
            raise ValueError(f"subscription QoS must be 0..2, got {sub.qos}")
        options = sub.qos
        if v5:
            if sub.retain_handling not in (0, 1, 2):
                raise ValueError(f"Retain Handling must be 0..2, got {sub.retain_handling}")
            options |= sub.retain_handling << 4
            if sub.no_local:
                options |= 0x04
            if sub.retain_as_published:
                options |= 0x08
        parts.append(encode_utf8(sub.topic_filter))
        parts.append(bytes((options,)))
    return _frame(0x82, b"".join(parts))


def _encode_suback(packet: SubAck, v5: bool) -> bytes:
    body = _H.pack(_check_packet_id(packet.packet_id))
    if v5:
        body += encode_properties(packet.properties, PacketType.SUBACK)
        codes = bytes(packet.reason_codes)
    else:
        codes = bytes(code if code < 0x80 else 0x80 for code in packet.reason_codes)
    return _frame(0x90, body + codes)


def _encode_unsubscribe(packet: Unsubscribe, v5: bool) -> bytes:
    if not packet.topic_filters:
        raise ValueError("UNSUBSCRIBE needs at least one Topic Filter")
    parts = [_H.pack(_check_packet_id(packet.packet_id))]
    if v5:
        parts.append(encode_properties(packet.properties, PacketType.UNSUBSCRIBE))
    parts.extend(encode_utf8(topic_filter) for topic_filter in packet.topic_filters)
    return _frame(0xA2, b"".join(parts))


def _encode_unsuback(packet: UnsubAck, v5: bool) -> bytes:
    body = _H.pack(_check_packet_id(packet.packet_id))
    if v5:
        body += encode_properties(packet.properties, PacketType.UNSUBACK)
        body += bytes(packet.reason_codes)
    return _frame(0xB0, body)


def _encode_reason_and_properties(
    first_byte: int, code: int, properties: Properties, ptype: PacketType
) -> bytes:
    props = encode_properties(properties, ptype)
    if props == b"\x00":
        return bytes((first_byte, 0)) if code == 0 else bytes((first_byte, 1, code))
    return _frame(first_byte, bytes((code,)) + props)


# --------------------------------------------------------------------------- streaming


class StreamDecoder:
    """Frame and decode the packets of one byte stream (one direction of a connection).

    ``feed`` buffers bytes and returns every packet completed so far, in order, keeping any
    partial packet for the next call.

    Server side (``protocol_version=None``): the first packet must be CONNECT
    ([MQTT-3.1.0-1]); its Protocol Level becomes ``protocol_version`` for the rest of the
    stream. Client side: pass the version sent in the CONNECT.

    ``max_packet_size`` (bytes, whole packet including the fixed header; 5.0 3.1.2.11.4) is
    checked as soon as a fixed header is complete, before any of the body is buffered. It may
    be changed between calls, e.g. after CONNACK.

    After ``feed`` raises an ``MQTTError`` the stream cannot be resynchronised: the caller
    reacts as 4.13 requires and closes the connection; packets completed in the same call
    before the bad one are not returned.
    """

    def __init__(self, max_packet_size: int = MAX_PACKET_SIZE, protocol_version: int | None = None):
        """Create a decoder; see the class docstring for the two arguments.

        Raises:
            ValueError: ``protocol_version`` is neither None nor 3, 4 or 5.
        """
        if protocol_version is not None and protocol_version not in _VERSIONS:
            raise ValueError(f"unknown protocol version {protocol_version}")
        self.max_packet_size = max_packet_size
        self.protocol_version = protocol_version
        self._server = protocol_version is None
        self._buffer = bytearray()

    def feed(self, data: bytes | bytearray | memoryview) -> list[Packet]:
        """Append ``data`` to the stream and decode every packet now complete.

        Returns:
            The decoded packets in stream order; empty when no packet is complete yet.

        Raises:
            MalformedPacket: a Remaining Length longer than four bytes, or any decode error.
            PacketTooLarge: a fixed header announces a packet over ``max_packet_size``.
            ProtocolError: server side, a first packet that is not CONNECT or a second
                CONNECT; or decode errors.
            UnsupportedProtocolVersion: a CONNECT this codec does not speak.
        """
        buf = self._buffer
        buf += data
        packets: list[Packet] = []
        pos = 0
        end = len(buf)
        with memoryview(buf) as view:
            while pos < end:
                first_byte = buf[pos]
                version = self.protocol_version
                if version is None and first_byte >> 4 != PacketType.CONNECT:
                    raise ProtocolError("first packet on a connection must be CONNECT")
                if self._server and version is not None and first_byte >> 4 == PacketType.CONNECT:
                    # Refused whatever it holds: decoded, an unknown Protocol Name would
                    # raise UnsupportedProtocolVersion, a reason no DISCONNECT may carry.
                    raise ProtocolError("a second CONNECT on a connection [MQTT-3.1.0-2]")
                header = _read_remaining_length(buf, pos + 1, end)
                if header is None:
                    break
                remaining, body_start = header
                body_end = body_start + remaining
                if body_end - pos > self.max_packet_size:
                    raise PacketTooLarge(
                        f"packet of {body_end - pos} bytes exceeds {self.max_packet_size}"
                    )
                if body_end > end:
                    break
                with view[body_start:body_end] as body:
                    # Before CONNECT only a CONNECT gets here, and it names its own version.
                    packet = decode(first_byte, body, version or 5)
                if version is None and isinstance(packet, Connect):
                    self.protocol_version = packet.protocol_version
                packets.append(packet)
                pos = body_end
        if pos:
            del buf[:pos]
        return packets


def _read_remaining_length(buf: bytearray, pos: int, end: int) -> tuple[int, int] | None:
    """Remaining Length at ``buf[pos]`` as ``(value, body_start)``; None if incomplete."""
    value = 0
    for shift in (0, 7, 14, 21):
        if pos >= end:
            return None
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if byte == 0 and shift:
                raise MalformedPacket("Remaining Length not in its shortest form")
            return value, pos
    raise MalformedPacket("Remaining Length longer than four bytes")
