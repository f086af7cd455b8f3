"""MQTT Control Packets as plain data (MQTT 3.1.1 and 5.0 chapter 3).

One dataclass per packet type, version-neutral: fields that exist only in 5.0 (properties,
most reason codes) keep their defaults for 3.1.1 and are omitted by the encoder. The codec
(``codec.py``) turns these into bytes and back; nothing here validates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import TypeAlias

from services.common.mqtt.properties import Properties


class PacketType(IntEnum):
    """MQTT Control Packet types (MQTT 5.0 table 2-1); 0 is Reserved."""

    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15  # 5.0 only; Reserved in 3.1.1


@dataclass(slots=True)
class Will:
    """The Will Message of a CONNECT (5.0 3.1.2.5, 3.1.3.2-3.1.3.4).

    ``qos`` is 0..2; ``properties`` are the Will Properties (5.0 only).
    """

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Connect:
    """CONNECT (5.0 3.1, 3.1.1 3.1).

    ``protocol_version`` is the Protocol Level: 3 = MQTT 3.1 (Protocol Name "MQIsdp"),
    4 = 3.1.1, 5 = 5.0. ``clean_start`` is Clean Session in 3.x. ``keep_alive`` is in seconds
    (0 disables it). ``password`` is Binary Data (5.0) / binary (3.1.1).
    """

    protocol_version: int
    client_id: str
    clean_start: bool
    keep_alive: int
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class ConnAck:
    """CONNACK (5.0 3.2, 3.1.1 3.2).

    ``reason_code`` is a 5.0 Connect Reason Code, or for 3.x the 3.1.1 Connect Return Code
    (``reason_codes.ConnectReturnCode``).
    """

    session_present: bool
    reason_code: int = 0
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Publish:
    """PUBLISH (5.0 3.3, 3.1.1 3.3).

    ``packet_id`` is present (1..65,535) exactly when ``qos`` > 0. In 5.0 ``topic`` may be ""
    when ``properties.topic_alias`` is set (3.3.2.3.4). ``payload`` is opaque bytes.
    """

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class PubAck:
    """PUBACK (5.0 3.4, 3.1.1 3.4); ``reason_code`` is 5.0 only."""

    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class PubRec:
    """PUBREC (5.0 3.5, 3.1.1 3.5); ``reason_code`` is 5.0 only."""

    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class PubRel:
    """PUBREL (5.0 3.6, 3.1.1 3.6); ``reason_code`` is 5.0 only."""

    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class PubComp:
    """PUBCOMP (5.0 3.7, 3.1.1 3.7); ``reason_code`` is 5.0 only."""

    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class SubscriptionRequest:
    """One Topic Filter and its Subscription Options (5.0 3.8.3.1).

    ``qos`` is the Maximum QoS (0..2); ``retain_handling`` is 0..2. ``no_local``,
    ``retain_as_published`` and ``retain_handling`` are 5.0 only.
    """

    topic_filter: str
    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0


@dataclass(slots=True)
class Subscribe:
    """SUBSCRIBE (5.0 3.8, 3.1.1 3.8): at least one subscription."""

    packet_id: int
    subscriptions: list[SubscriptionRequest]
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class SubAck:
    """SUBACK (5.0 3.9, 3.1.1 3.9): one reason (3.1.1: return) code per subscription."""

    packet_id: int
    reason_codes: list[int]
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Unsubscribe:
    """UNSUBSCRIBE (5.0 3.10, 3.1.1 3.10): at least one Topic Filter."""

    packet_id: int
    topic_filters: list[str]
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class UnsubAck:
    """UNSUBACK (5.0 3.11, 3.1.1 3.11): one reason code per filter in 5.0, none in 3.1.1."""

    packet_id: int
    reason_codes: list[int] = field(default_factory=list)
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class PingReq:
    """PINGREQ (5.0 3.12, 3.1.1 3.12)."""


@dataclass(slots=True)
class PingResp:
    """PINGRESP (5.0 3.13, 3.1.1 3.13)."""


@dataclass(slots=True)
class Disconnect:
    """DISCONNECT (5.0 3.14, 3.1.1 3.14); ``reason_code`` and properties are 5.0 only."""

    reason_code: int = 0
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Auth:
    """AUTH (5.0 3.15), 5.0 only: ``reason_code`` 0x00, 0x18 or 0x19."""

    reason_code: int = 0
    properties: Properties = field(default_factory=Properties)


Packet: TypeAlias = (
    Connect
    | ConnAck
    | Publish
    | PubAck
    | PubRec
    | PubRel
    | PubComp
    | Subscribe
    | SubAck
    | Unsubscribe
    | UnsubAck
    | PingReq
    | PingResp
    | Disconnect
    | Auth
)
"""Any MQTT Control Packet."""
