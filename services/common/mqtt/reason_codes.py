"""MQTT 5.0 Reason Codes (MQTT 5.0 section 2.4) and MQTT 3.1.1 CONNACK return codes (3.2.2.3)."""

from __future__ import annotations

from enum import IntEnum


class ReasonCode(IntEnum):
    """MQTT 5.0 Reason Codes, named as in the specification's table 2-6."""

    SUCCESS = 0x00  # also Normal disconnection, Granted QoS 0
    GRANTED_QOS_1 = 0x01
    GRANTED_QOS_2 = 0x02
    DISCONNECT_WITH_WILL_MESSAGE = 0x04
    NO_MATCHING_SUBSCRIBERS = 0x10
    NO_SUBSCRIPTION_EXISTED = 0x11
    CONTINUE_AUTHENTICATION = 0x18
    RE_AUTHENTICATE = 0x19
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    UNSUPPORTED_PROTOCOL_VERSION = 0x84
    CLIENT_IDENTIFIER_NOT_VALID = 0x85
    BAD_USER_NAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    BANNED = 0x8A
    SERVER_SHUTTING_DOWN = 0x8B
    BAD_AUTHENTICATION_METHOD = 0x8C
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    TOPIC_FILTER_INVALID = 0x8F
    TOPIC_NAME_INVALID = 0x90
    PACKET_IDENTIFIER_IN_USE = 0x91
    PACKET_IDENTIFIER_NOT_FOUND = 0x92
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    MESSAGE_RATE_TOO_HIGH = 0x96
    QUOTA_EXCEEDED = 0x97
    ADMINISTRATIVE_ACTION = 0x98
    PAYLOAD_FORMAT_INVALID = 0x99
    RETAIN_NOT_SUPPORTED = 0x9A
    QOS_NOT_SUPPORTED = 0x9B
    USE_ANOTHER_SERVER = 0x9C
    SERVER_MOVED = 0x9D
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    CONNECTION_RATE_EXCEEDED = 0x9F
    MAXIMUM_CONNECT_TIME = 0xA0
    SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2


#: The Reason Codes a CONNACK may carry (MQTT 5.0 3.2.2.2).
CONNACK_REASON_CODES = frozenset(
    (0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A, 0x8C, 0x90,
     0x95, 0x97, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F)
)  # fmt: skip


class ConnectReturnCode(IntEnum):
    """MQTT 3.1.1 CONNACK return codes (MQTT 3.1.1 table 3.1)."""

    ACCEPTED = 0x00
    UNACCEPTABLE_PROTOCOL_VERSION = 0x01
    IDENTIFIER_REJECTED = 0x02
    SERVER_UNAVAILABLE = 0x03
    BAD_USER_NAME_OR_PASSWORD = 0x04
    NOT_AUTHORIZED = 0x05


def v3_connack_code(reason: int) -> ConnectReturnCode:
    """Map a v5 CONNACK Reason Code to the closest MQTT 3.1.1 return code.

    The mapping follows the pairs the 5.0 specification lists as equivalent (3.2.2.2), with
    0x8A Banned as Not authorized (a disabled credential); any other failure becomes Server
    unavailable (0x03), the generic v3.1.1 refusal.
    """
    mapping = {
        ReasonCode.SUCCESS: ConnectReturnCode.ACCEPTED,
        ReasonCode.UNSUPPORTED_PROTOCOL_VERSION: ConnectReturnCode.UNACCEPTABLE_PROTOCOL_VERSION,
        ReasonCode.CLIENT_IDENTIFIER_NOT_VALID: ConnectReturnCode.IDENTIFIER_REJECTED,
        ReasonCode.BAD_USER_NAME_OR_PASSWORD: ConnectReturnCode.BAD_USER_NAME_OR_PASSWORD,
        ReasonCode.NOT_AUTHORIZED: ConnectReturnCode.NOT_AUTHORIZED,
        ReasonCode.BANNED: ConnectReturnCode.NOT_AUTHORIZED,
    }
    return mapping.get(ReasonCode(reason), ConnectReturnCode.SERVER_UNAVAILABLE)
