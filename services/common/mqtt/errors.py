"""Typed MQTT protocol errors; each carries the v5 Reason Code the specification requires.

The connection layer turns an error into the mandated reaction: before CONNACK a CONNACK
with ``reason_code`` (v5) or the mapped return code (v3.1.1) where the spec allows one, after
it a DISCONNECT with ``reason_code`` (v5) or a plain close (v3.1.1, MQTT 4.8.0).
"""

from __future__ import annotations

from services.common.mqtt.reason_codes import ReasonCode


class MQTTError(Exception):
    """Base of every protocol error. ``reason_code`` is an MQTT 5.0 Reason Code (int)."""

    default_reason: ReasonCode = ReasonCode.UNSPECIFIED_ERROR

    def __init__(self, message: str, reason_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.reason_code = int(self.default_reason if reason_code is None else reason_code)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, reason_code=0x{self.reason_code:02X})"


class MalformedPacket(MQTTError):
    """The bytes do not form a packet as the spec's encoding rules require (0x81, MQTT 4.13)."""

    default_reason = ReasonCode.MALFORMED_PACKET


class ProtocolError(MQTTError):
    """A well-formed packet that breaks a protocol rule (0x82, MQTT 4.13)."""

    default_reason = ReasonCode.PROTOCOL_ERROR


class PacketTooLarge(MQTTError):
    """A packet whose size exceeds the Maximum Packet Size in force (0x95, MQTT 3.2.2.3.6)."""

    default_reason = ReasonCode.PACKET_TOO_LARGE


class UnsupportedProtocolVersion(MQTTError):
    """CONNECT with a protocol name/level this server does not speak (0x84, MQTT 3.1.2.2)."""

    default_reason = ReasonCode.UNSUPPORTED_PROTOCOL_VERSION


class TopicNameInvalid(MQTTError):
    """A Topic Name that is empty, holds a wildcard or is otherwise invalid (0x90, MQTT 4.7)."""

    default_reason = ReasonCode.TOPIC_NAME_INVALID


class TopicFilterInvalid(MQTTError):
    """A Topic Filter with misplaced wildcards or an invalid share name (0x8F, MQTT 4.7/4.8)."""

    default_reason = ReasonCode.TOPIC_FILTER_INVALID
