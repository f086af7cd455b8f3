"""Wire vectors: known-good bytes from the specifications and real clients, and a corpus of
malformed packets, each with the exact error class and Reason Code the codec must raise.
"""

from __future__ import annotations

import pytest

from services.common.mqtt.codec import StreamDecoder, decode, encode
from services.common.mqtt.errors import (
    MalformedPacket,
    MQTTError,
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
from services.common.mqtt.properties import Properties
from services.common.mqtt.reason_codes import ReasonCode
from services.common.mqtt.vbi import encode_vbi


def s(text: str) -> bytes:
    """A UTF-8 Encoded String / Binary Data field: 2-byte length, then the bytes."""
    raw = text.encode()
    return len(raw).to_bytes(2, "big") + raw


def frame(first_byte: int, body: bytes) -> bytes:
    return bytes((first_byte,)) + encode_vbi(len(body)) + body


# ----------------------------------------------------------------------- known good

# Captured from mosquitto_pub 2.x on a loopback socket.
# mosquitto_pub -i testclient -t t -m x (MQTT 3.1.1): clean session, keep alive 60.
MOSQUITTO_PUB_CONNECT_V311 = bytes.fromhex("101600044d5154540402003c000a74657374636c69656e74")
# mosquitto_pub -V mqttv5 -i testclient -t t -m x: adds Receive Maximum 20.
MOSQUITTO_PUB_CONNECT_V5 = bytes.fromhex("101a00044d5154540502003c03210014000a74657374636c69656e74")
# ... -u user -P pass --will-topic w --will-payload bye --will-qos 1 -k 10
MOSQUITTO_PUB_CONNECT_WILL_V311 = bytes.fromhex(
    "102a00044d51545404ce000a000a74657374636c69656e740001770003627965000475736572000470617373"
)
# ... -V mqttv5 (same options) -D connect session-expiry-interval 10
#     -D will will-delay-interval 5
MOSQUITTO_PUB_CONNECT_WILL_V5 = bytes.fromhex(
    "103900044d51545405ce000a08110000000a210014000a74657374636c69656e74"
    "0518000000050001770003627965000475736572000470617373"
)

# MQTT 3.1.1 figure 3.6 variable header (00 04 MQTT 04 CE 00 0A): user name, password,
# Will QoS 1, Will Flag, Clean Session, keep alive 10; payload fields in 3.1.3 order.
SPEC_CONNECT_V311 = frame(
    0x10,
    bytes.fromhex("00044d51545404ce000a")
    + s("cid")
    + s("will/topic")
    + s("bye")
    + s("user")
    + s("pass"),
)
# MQTT 5.0 figure 3-7: the same flags, then Property Length 5 with Session Expiry
# Interval (17) = 10; the payload adds an empty Will Properties set.
SPEC_CONNECT_V5 = frame(
    0x10,
    bytes.fromhex("00044d51545405ce000a" + "05110000000a")
    + s("cid")
    + b"\x00"
    + s("will/topic")
    + s("bye")
    + s("user")
    + s("pass"),
)
SPEC_WILL = Will("will/topic", b"bye", 1, False, Properties())

KNOWN_GOOD: list[tuple[str, int, bytes, Packet]] = [
    ("mosquitto_pub CONNECT 3.1.1", 4, MOSQUITTO_PUB_CONNECT_V311,
     Connect(4, "testclient", True, 60)),
    ("mosquitto_pub CONNECT 5.0", 5, MOSQUITTO_PUB_CONNECT_V5,
     Connect(5, "testclient", True, 60, properties=Properties(receive_maximum=20))),
    ("mosquitto_pub CONNECT with Will 3.1.1", 4, MOSQUITTO_PUB_CONNECT_WILL_V311,
     Connect(4, "testclient", True, 10, "user", b"pass", Will("w", b"bye", 1))),
    ("mosquitto_pub CONNECT with Will 5.0", 5, MOSQUITTO_PUB_CONNECT_WILL_V5,
     Connect(5, "testclient", True, 10, "user", b"pass",
             Will("w", b"bye", 1, properties=Properties(will_delay_interval=5)),
             Properties(session_expiry_interval=10, receive_maximum=20))),
    ("spec CONNECT 3.1.1", 4, SPEC_CONNECT_V311,
     Connect(4, "cid", True, 10, "user", b"pass", SPEC_WILL)),
    ("spec CONNECT 5.0", 5, SPEC_CONNECT_V5,
     Connect(5, "cid", True, 10, "user", b"pass", SPEC_WILL,
             Properties(session_expiry_interval=10))),
    ("MQTT 3.1 CONNECT (MQIsdp)", 3,
     frame(0x10, bytes.fromhex("00064d514973647003020000") + s("c")),
     Connect(3, "c", True, 0)),
    ("5.0 CONNECT password without user name", 5,
     frame(0x10, bytes.fromhex("00044d5154540540001e00") + s("c") + s("pw")),
     Connect(5, "c", False, 30, None, b"pw")),
    ("CONNACK accepted 3.1.1", 4, bytes.fromhex("20020000"), ConnAck(False, 0)),
    ("CONNACK session present, bad credentials 3.1.1", 4, bytes.fromhex("20020104"),
     ConnAck(True, 4)),
    ("CONNACK success 5.0", 5, bytes.fromhex("2003000000"), ConnAck(False, 0)),
    ("CONNACK 5.0 with Maximum QoS 1, Retain Available 0", 5,
     bytes.fromhex("200700000424012500"),
     ConnAck(False, 0, Properties(maximum_qos=1, retain_available=False))),
    # 3.1.1 figure 3.11 / 5.0 figure 3-9: Topic Name "a/b", Packet Identifier 10.
    ("spec PUBLISH 3.1.1", 4, frame(0x32, bytes.fromhex("0003612f62000a") + b"hi"),
     Publish("a/b", b"hi", 1, packet_id=10)),
    ("spec PUBLISH 5.0", 5, frame(0x32, bytes.fromhex("0003612f62000a00") + b"hi"),
     Publish("a/b", b"hi", 1, packet_id=10)),
    ("PUBLISH QoS 2 DUP retain", 4, frame(0x3D, bytes.fromhex("0001740001")),
     Publish("t", b"", 2, True, True, 1)),
    ("PUBLISH 5.0 alias only", 5, frame(0x30, bytes.fromhex("0000032300077061")),
     Publish("", b"pa", properties=Properties(topic_alias=7))),
    ("PUBACK 3.1.1", 4, bytes.fromhex("4002000a"), PubAck(10)),
    ("PUBACK 5.0 short form", 5, bytes.fromhex("4002000a"), PubAck(10)),
    ("PUBACK 5.0 reason only", 5, bytes.fromhex("4003000a10"), PubAck(10, 0x10)),
    ("PUBREC 5.0 reason and properties", 5, bytes.fromhex("5008000a97041f00016e"),
     PubRec(10, 0x97, Properties(reason_string="n"))),
    ("PUBREL", 4, bytes.fromhex("6202000a"), PubRel(10)),
    ("PUBCOMP 5.0 not found", 5, bytes.fromhex("7003000a92"), PubComp(10, 0x92)),
    # 3.1.1 figure 3.22: "a/b" QoS 1, "c/d" QoS 2.
    ("spec SUBSCRIBE 3.1.1", 4,
     bytes.fromhex("820e000a0003612f6201" + "0003632f6402"),
     Subscribe(10, [SubscriptionRequest("a/b", 1), SubscriptionRequest("c/d", 2)])),
    ("SUBSCRIBE 5.0 options", 5,
     bytes.fromhex("8209000a000003612f622d"),
     Subscribe(10, [SubscriptionRequest("a/b", 1, True, True, 2)])),
    # 3.1.1 figure 3.26: Success QoS 0, Success QoS 2, Failure.
    ("spec SUBACK 3.1.1", 4, bytes.fromhex("9005000a000280"), SubAck(10, [0, 2, 0x80])),
    ("SUBACK 5.0", 5, bytes.fromhex("9005000a00018f"), SubAck(10, [1, 0x8F])),
    ("spec UNSUBSCRIBE 3.1.1", 4, bytes.fromhex("a20c000a0003612f620003632f64"),
     Unsubscribe(10, ["a/b", "c/d"])),
    ("UNSUBACK 3.1.1", 4, bytes.fromhex("b002000a"), UnsubAck(10)),
    ("UNSUBACK 5.0", 5, bytes.fromhex("b005000a000011"), UnsubAck(10, [0, 0x11])),
    ("PINGREQ", 4, bytes.fromhex("c000"), PingReq()),
    ("PINGRESP", 5, bytes.fromhex("d000"), PingResp()),
    ("DISCONNECT 3.1.1", 4, bytes.fromhex("e000"), Disconnect()),
    ("DISCONNECT 5.0 with Will", 5, bytes.fromhex("e00104"), Disconnect(0x04)),
    ("DISCONNECT 5.0 session expiry", 5, bytes.fromhex("e0070005110000012c"),
     Disconnect(0, Properties(session_expiry_interval=300))),
    ("AUTH 5.0 success", 5, bytes.fromhex("f000"), Auth()),
    ("AUTH 5.0 continue", 5, frame(0xF0, b"\x18\x0c\x15" + s("SCRAM") + b"\x16\x00\x01\x01"),
     Auth(0x18, Properties(authentication_method="SCRAM", authentication_data=b"\x01"))),
]  # fmt: skip


@pytest.mark.parametrize(("level", "data", "packet"), [c[1:] for c in KNOWN_GOOD],
                         ids=[c[0] for c in KNOWN_GOOD])  # fmt: skip
def test_known_good_decodes(level: int, data: bytes, packet: Packet) -> None:
    decoder = StreamDecoder(protocol_version=level)
    assert decoder.feed(data) == [packet]


@pytest.mark.parametrize(("level", "data", "packet"), [c[1:] for c in KNOWN_GOOD],
                         ids=[c[0] for c in KNOWN_GOOD])  # fmt: skip
def test_known_good_encodes(level: int, data: bytes, packet: Packet) -> None:
    assert encode(packet, level) == data


def test_server_adopts_connect_version() -> None:
    decoder = StreamDecoder()
    stream = MOSQUITTO_PUB_CONNECT_V5 + frame(0x30, s("t") + b"\x03\x23\x00\x01" + b"x")
    packets = decoder.feed(stream)
    assert decoder.protocol_version == 5
    assert packets[1] == Publish("t", b"x", properties=Properties(topic_alias=1))


# ------------------------------------------------------------ 3.1.1 drops 5.0-only fields

DOWNGRADES: list[tuple[Packet, str]] = [
    (PubAck(10, 0x10, Properties(reason_string="r")), "4002000a"),
    (PubRec(10, 0x80), "5002000a"),
    (PubRel(10, 0x92), "6202000a"),
    (SubAck(10, [0x00, 0x02, 0x87, 0xA2]), "9006000a00028080"),
    (UnsubAck(10, [0x11]), "b002000a"),
    (Disconnect(0x04, Properties(reason_string="r")), "e000"),
    (ConnAck(True, 0, Properties(maximum_qos=1)), "20020100"),
    (Publish("a", b"", properties=Properties(content_type="c")), "3003000161"),
]


@pytest.mark.parametrize(("packet", "hex_bytes"), DOWNGRADES)
def test_v311_encoding_omits_v5_fields(packet: Packet, hex_bytes: str) -> None:
    assert encode(packet, 4).hex() == hex_bytes


# ----------------------------------------------------------------------- malformed corpus

MALFORMED = MalformedPacket, ReasonCode.MALFORMED_PACKET
PROTOCOL = ProtocolError, ReasonCode.PROTOCOL_ERROR
UNSUPPORTED = UnsupportedProtocolVersion, ReasonCode.UNSUPPORTED_PROTOCOL_VERSION
CONNECT_HEAD_V4 = bytes.fromhex("00044d5154540402003c")  # MQTT 4, Clean Session, keep 60
CONNECT_HEAD_V5 = bytes.fromhex("00044d5154540502003c")


def connect(flags: int, level: int = 4) -> bytes:
    """CONNECT variable header with the given Connect Flags (properties empty in 5.0)."""
    head = bytes.fromhex("00044d515454") + bytes((level, flags)) + b"\x00\x3c"
    return head + (b"\x00" if level == 5 else b"")


CORPUS: list[tuple[str, int, bytes, tuple[type[MQTTError], int]]] = [
    # Fixed header (5.0 2.1.3, 3.1.1 2.2.2)
    ("reserved packet type 0", 4, bytes.fromhex("0000"), MALFORMED),
    ("AUTH in 3.1.1", 4, bytes.fromhex("f000"), MALFORMED),
    ("PUBACK flags 0001", 4, bytes.fromhex("4102000a"), MALFORMED),
    ("PUBREL flags 0000", 4, bytes.fromhex("6002000a"), MALFORMED),
    ("PUBREL flags 0011", 5, bytes.fromhex("6302000a"), MALFORMED),
    ("SUBSCRIBE flags 0000", 4, frame(0x80, b"\x00\x0a" + s("a") + b"\x00"), MALFORMED),
    ("UNSUBSCRIBE flags 0000", 4, frame(0xA0, b"\x00\x0a" + s("a")), MALFORMED),
    ("CONNACK flags 1000", 4, bytes.fromhex("28020000"), MALFORMED),
    ("DISCONNECT flags 0001", 5, bytes.fromhex("e100"), MALFORMED),
    ("Remaining Length of five bytes", 4, bytes.fromhex("30ffffffff7f"), MALFORMED),
    ("Remaining Length not minimal", 4, bytes.fromhex("c08000"), MALFORMED),
    # PUBLISH (3.3)
    ("PUBLISH QoS 3", 4, frame(0x36, s("a") + b"\x00\x01"), MALFORMED),
    ("PUBLISH QoS 0 with DUP", 4, frame(0x38, s("a")), MALFORMED),
    ("PUBLISH QoS 1 without Packet Identifier", 4, frame(0x32, s("a/b")), MALFORMED),
    ("PUBLISH QoS 1 half a Packet Identifier", 4, frame(0x32, s("a/b") + b"\x00"), MALFORMED),
    ("PUBLISH Packet Identifier 0", 4, frame(0x32, s("a") + b"\x00\x00"), PROTOCOL),
    ("PUBLISH empty body", 4, frame(0x30, b""), MALFORMED),
    ("PUBLISH topic length past the end", 4, frame(0x30, b"\x00\x05ab"), MALFORMED),
    ("PUBLISH topic invalid UTF-8", 4, frame(0x30, b"\x00\x02\xff\xfe"), MALFORMED),
    ("PUBLISH topic overlong UTF-8", 4, frame(0x30, b"\x00\x02\xc0\xaf"), MALFORMED),
    ("PUBLISH topic with U+0000", 4, frame(0x30, b"\x00\x02a\x00"), MALFORMED),
    ("PUBLISH topic with a surrogate", 4, frame(0x30, b"\x00\x03\xed\xa0\x80"), MALFORMED),
    ("PUBLISH 5.0 without Property Length", 5, frame(0x30, s("a")), MALFORMED),
    ("PUBLISH 5.0 Property Length past the end", 5, frame(0x30, s("a") + b"\x09\x23"),
     MALFORMED),
    ("PUBLISH 5.0 empty topic, no alias", 5, frame(0x30, s("") + b"\x00"), PROTOCOL),
    ("PUBLISH 5.0 Topic Alias 0", 5, frame(0x30, s("a") + b"\x03\x23\x00\x00"),
     (ProtocolError, ReasonCode.TOPIC_ALIAS_INVALID)),
    ("PUBLISH 5.0 Session Expiry Interval", 5,
     frame(0x30, s("a") + b"\x05\x11\x00\x00\x00\x01"), PROTOCOL),
    ("PUBLISH 5.0 unknown property", 5, frame(0x30, s("a") + b"\x02\x07\x00"), MALFORMED),
    ("PUBLISH 5.0 Payload Format Indicator 2", 5, frame(0x30, s("a") + b"\x02\x01\x02"),
     PROTOCOL),
    ("PUBLISH 5.0 two Topic Aliases", 5,
     frame(0x30, s("a") + b"\x06\x23\x00\x01\x23\x00\x02"), PROTOCOL),
    # CONNECT (3.1)
    ("CONNECT unknown Protocol Name", 4,
     frame(0x10, s("MQTX") + bytes.fromhex("0402003c") + s("c")), UNSUPPORTED),
    ("CONNECT MQTT level 3", 4,
     frame(0x10, s("MQTT") + bytes.fromhex("0302003c") + s("c")), UNSUPPORTED),
    ("CONNECT MQTT level 6", 4,
     frame(0x10, s("MQTT") + bytes.fromhex("0602003c") + s("c")), UNSUPPORTED),
    ("CONNECT MQIsdp level 4", 4,
     frame(0x10, s("MQIsdp") + bytes.fromhex("0402003c") + s("c")), UNSUPPORTED),
    ("CONNECT lowercase name", 4,
     frame(0x10, s("mqtt") + bytes.fromhex("0402003c") + s("c")), UNSUPPORTED),
    ("CONNECT Protocol Name invalid UTF-8", 4,
     frame(0x10, b"\x00\x04MQT\xff" + bytes.fromhex("0402003c") + s("c")), MALFORMED),
    ("CONNECT without Protocol Level", 4, frame(0x10, s("MQTT")), MALFORMED),
    ("CONNECT without Keep Alive", 4, frame(0x10, s("MQTT") + b"\x04\x02\x00"), MALFORMED),
    ("CONNECT reserved flag", 4, frame(0x10, connect(0x03) + s("c")), MALFORMED),
    ("CONNECT Will QoS 3", 4,
     frame(0x10, connect(0x1E) + s("c") + s("w") + s("m")), MALFORMED),
    ("CONNECT Will QoS without Will Flag", 4, frame(0x10, connect(0x0A) + s("c")), MALFORMED),
    ("CONNECT Will Retain without Will Flag", 4, frame(0x10, connect(0x22) + s("c")),
     MALFORMED),
    ("CONNECT 3.1.1 password without user name", 4,
     frame(0x10, connect(0x42) + s("c") + s("pw")), MALFORMED),
    ("CONNECT client id past the end", 4, frame(0x10, connect(0x02) + b"\x00\x05ab"),
     MALFORMED),
    ("CONNECT user name flag, no user name", 4, frame(0x10, connect(0x82) + s("c")),
     MALFORMED),
    ("CONNECT Will Flag, no Will Payload", 4, frame(0x10, connect(0x06) + s("c") + s("w")),
     MALFORMED),
    ("CONNECT trailing byte", 4, frame(0x10, connect(0x02) + s("c") + b"\x00"), MALFORMED),
    ("CONNECT 5.0 Topic Alias property", 5,
     frame(0x10, CONNECT_HEAD_V5 + b"\x03\x23\x00\x01" + s("c")), PROTOCOL),
    ("CONNECT 5.0 Receive Maximum 0", 5,
     frame(0x10, CONNECT_HEAD_V5 + b"\x03\x21\x00\x00" + s("c")), PROTOCOL),
    ("CONNECT 5.0 Will Properties with Session Expiry", 5,
     frame(0x10, connect(0x06, 5) + s("c") + b"\x05\x11\x00\x00\x00\x01" + s("w") + s("m")),
     PROTOCOL),
    ("CONNECT 5.0 Will Properties missing", 5,
     frame(0x10, connect(0x06, 5) + s("c")), MALFORMED),
    ("CONNECT 5.0 Authentication Data without Method", 5,
     frame(0x10, CONNECT_HEAD_V5 + b"\x04\x16\x00\x01\x01" + s("c")), PROTOCOL),
    # CONNACK (3.2)
    ("CONNACK 3.1.1 Remaining Length 3", 4, bytes.fromhex("2003000000"), MALFORMED),
    ("CONNACK truncated", 4, bytes.fromhex("200100"), MALFORMED),
    ("CONNACK reserved acknowledge flag", 4, bytes.fromhex("20020200"), MALFORMED),
    ("CONNACK 3.1.1 return code 6", 4, bytes.fromhex("20020006"), PROTOCOL),
    ("CONNACK 5.0 reason 0x01", 5, bytes.fromhex("2003000100"), PROTOCOL),
    ("CONNACK 5.0 without Property Length", 5, bytes.fromhex("20020000"), MALFORMED),
    ("CONNACK 5.0 Maximum QoS 2", 5, bytes.fromhex("20050000022402"), PROTOCOL),
    # PUBACK, PUBREC, PUBREL, PUBCOMP (3.4-3.7)
    ("PUBACK truncated", 4, bytes.fromhex("400100"), MALFORMED),
    ("PUBACK 3.1.1 trailing byte", 4, bytes.fromhex("4003000a00"), MALFORMED),
    ("PUBACK Packet Identifier 0", 4, bytes.fromhex("40020000"), PROTOCOL),
    ("PUBCOMP Packet Identifier 0", 5, bytes.fromhex("70020000"), PROTOCOL),
    ("PUBACK 5.0 reason 0x92", 5, bytes.fromhex("4003000a92"), PROTOCOL),
    ("PUBREL 5.0 reason 0x10", 5, bytes.fromhex("6203000a10"), PROTOCOL),
    ("PUBREC 5.0 Property Length past the end", 5, bytes.fromhex("5004000a0005"), MALFORMED),
    ("PUBACK 5.0 trailing byte", 5, bytes.fromhex("4005000a000000"), MALFORMED),
    ("PUBACK 5.0 Topic Alias property", 5, bytes.fromhex("4007000a0003230001"), PROTOCOL),
    # SUBSCRIBE (3.8)
    ("SUBSCRIBE without filters", 4, bytes.fromhex("8202000a"), PROTOCOL),
    ("SUBSCRIBE 5.0 without filters", 5, bytes.fromhex("8203000a00"), PROTOCOL),
    ("SUBSCRIBE Packet Identifier 0", 4, frame(0x82, b"\x00\x00" + s("a") + b"\x00"),
     PROTOCOL),
    ("SUBSCRIBE filter without options", 4, frame(0x82, b"\x00\x0a" + s("a")), MALFORMED),
    ("SUBSCRIBE filter past the end", 4, frame(0x82, b"\x00\x0a\x00\x09a"), MALFORMED),
    ("SUBSCRIBE 3.1.1 QoS 3", 4, frame(0x82, b"\x00\x0a" + s("a") + b"\x03"), MALFORMED),
    ("SUBSCRIBE 3.1.1 reserved bit 2", 4, frame(0x82, b"\x00\x0a" + s("a") + b"\x04"),
     MALFORMED),
    ("SUBSCRIBE 5.0 reserved bit 6", 5, frame(0x82, b"\x00\x0a\x00" + s("a") + b"\x40"),
     MALFORMED),
    ("SUBSCRIBE 5.0 reserved bit 7", 5, frame(0x82, b"\x00\x0a\x00" + s("a") + b"\x81"),
     MALFORMED),
    ("SUBSCRIBE 5.0 Maximum QoS 3", 5, frame(0x82, b"\x00\x0a\x00" + s("a") + b"\x03"),
     PROTOCOL),
    ("SUBSCRIBE 5.0 Retain Handling 3", 5, frame(0x82, b"\x00\x0a\x00" + s("a") + b"\x30"),
     PROTOCOL),
    ("SUBSCRIBE 5.0 two Subscription Identifiers", 5,
     frame(0x82, b"\x00\x0a\x04\x0b\x01\x0b\x02" + s("a") + b"\x00"), PROTOCOL),
    ("SUBSCRIBE 5.0 Subscription Identifier 0", 5,
     frame(0x82, b"\x00\x0a\x02\x0b\x00" + s("a") + b"\x00"), PROTOCOL),
    # SUBACK (3.9)
    ("SUBACK without codes", 4, bytes.fromhex("9002000a"), PROTOCOL),
    ("SUBACK 3.1.1 code 0x87", 4, bytes.fromhex("9003000a87"), PROTOCOL),
    ("SUBACK 5.0 code 0x03", 5, bytes.fromhex("9004000a0003"), PROTOCOL),
    # UNSUBSCRIBE (3.10)
    ("UNSUBSCRIBE without filters", 4, bytes.fromhex("a202000a"), PROTOCOL),
    ("UNSUBSCRIBE 5.0 without filters", 5, bytes.fromhex("a203000a00"), PROTOCOL),
    ("UNSUBSCRIBE filter past the end", 4, frame(0xA2, b"\x00\x0a" + s("a") + b"\x00"),
     MALFORMED),
    ("UNSUBSCRIBE Packet Identifier 0", 4, frame(0xA2, b"\x00\x00" + s("a")), PROTOCOL),
    # UNSUBACK (3.11)
    ("UNSUBACK 3.1.1 with a code", 4, bytes.fromhex("b003000a00"), MALFORMED),
    ("UNSUBACK 5.0 without codes", 5, bytes.fromhex("b003000a00"), PROTOCOL),
    ("UNSUBACK 5.0 code 0x10", 5, bytes.fromhex("b004000a0010"), PROTOCOL),
    # PINGREQ, PINGRESP (3.12, 3.13)
    ("PINGREQ with a body", 4, bytes.fromhex("c00100"), MALFORMED),
    ("PINGRESP with a body", 5, bytes.fromhex("d00100"), MALFORMED),
    # DISCONNECT (3.14)
    ("DISCONNECT 3.1.1 with a body", 4, bytes.fromhex("e00100"), MALFORMED),
    ("DISCONNECT 5.0 reason 0x05", 5, bytes.fromhex("e00105"), PROTOCOL),
    ("DISCONNECT 5.0 Property Length past the end", 5, bytes.fromhex("e0020005"), MALFORMED),
    ("DISCONNECT 5.0 trailing byte", 5, bytes.fromhex("e003000000"), MALFORMED),
    ("DISCONNECT 5.0 Topic Alias Maximum", 5, bytes.fromhex("e0050003220001"), PROTOCOL),
    # AUTH (3.15)
    ("AUTH 5.0 reason 0x01", 5, bytes.fromhex("f00101"), PROTOCOL),
    ("AUTH 5.0 Authentication Data without Method", 5, bytes.fromhex("f0051803160000"),
     PROTOCOL),
]  # fmt: skip


@pytest.mark.parametrize(("level", "data", "expected"), [c[1:] for c in CORPUS],
                         ids=[c[0] for c in CORPUS])  # fmt: skip
def test_malformed_corpus(level: int, data: bytes, expected: tuple[type[MQTTError], int]) -> None:
    error_class, reason = expected
    with pytest.raises(MQTTError) as info:
        StreamDecoder(protocol_version=level).feed(data)
    assert type(info.value) is error_class
    assert info.value.reason_code == reason


@pytest.mark.parametrize(("level", "data", "expected"), [c[1:] for c in CORPUS],
                         ids=[c[0] for c in CORPUS])  # fmt: skip
def test_malformed_corpus_fed_byte_by_byte(
    level: int, data: bytes, expected: tuple[type[MQTTError], int]
) -> None:
    # The error must surface no later than the last byte, whatever the segmentation.
    error_class, _reason = expected
    decoder = StreamDecoder(protocol_version=level)
    with pytest.raises(error_class):
        for i in range(len(data)):
            decoder.feed(data[i : i + 1])


# ----------------------------------------------------------------------- stream rules


def test_first_packet_must_be_connect() -> None:
    decoder = StreamDecoder()
    with pytest.raises(ProtocolError) as info:
        decoder.feed(b"\x30")  # the type alone is enough to know
    assert info.value.reason_code == ReasonCode.PROTOCOL_ERROR


def test_packet_too_large_on_fixed_header_alone() -> None:
    decoder = StreamDecoder(max_packet_size=100, protocol_version=4)
    # Remaining Length 98 + 2 header bytes = 100: fits, keeps waiting for the body.
    assert decoder.feed(b"\x30\x62") == []
    decoder = StreamDecoder(max_packet_size=100, protocol_version=4)
    with pytest.raises(PacketTooLarge) as info:
        decoder.feed(b"\x30\x63")  # 101 bytes announced, none of the body sent
    assert info.value.reason_code == ReasonCode.PACKET_TOO_LARGE


def test_packet_too_large_huge_remaining_length() -> None:
    decoder = StreamDecoder(max_packet_size=1024)
    with pytest.raises(PacketTooLarge):
        decoder.feed(b"\x10\xff\xff\xff\x7f")


def test_max_packet_size_can_change_between_feeds() -> None:
    packet = encode(Publish("t", b"x" * 50), 4)
    decoder = StreamDecoder(protocol_version=4)
    assert decoder.feed(packet) == [Publish("t", b"x" * 50)]
    decoder.max_packet_size = len(packet) - 1
    with pytest.raises(PacketTooLarge):
        decoder.feed(packet)


def test_partial_packet_is_kept() -> None:
    decoder = StreamDecoder(protocol_version=4)
    ping, puback = bytes.fromhex("c000"), bytes.fromhex("4002000a")
    assert decoder.feed(ping + puback[:3]) == [PingReq()]
    assert decoder.feed(puback[3:] + ping[:1]) == [PubAck(10)]
    assert decoder.feed(ping[1:]) == [PingReq()]


def test_auth_after_v311_connect_is_malformed() -> None:
    decoder = StreamDecoder()
    assert decoder.feed(MOSQUITTO_PUB_CONNECT_V311) == [Connect(4, "testclient", True, 60)]
    with pytest.raises(MalformedPacket):
        decoder.feed(bytes.fromhex("f000"))


def test_unknown_protocol_version_arguments() -> None:
    with pytest.raises(ValueError):
        StreamDecoder(protocol_version=6)
    with pytest.raises(ValueError):
        decode(0xC0, b"", 2)
    with pytest.raises(ValueError):
        encode(PingReq(), 6)


def test_decode_single_packet_directly() -> None:
    assert decode(0x62, memoryview(b"\x00\x0a"), 5) == PubRel(10)
    with pytest.raises(MalformedPacket):
        decode(0x40, b"\x00\x0a\x00\x00\x00", 4)


# ----------------------------------------------------------------------- encode refusals

BAD_FOR_ENCODING: list[tuple[Packet, int]] = [
    (Publish("t", b"", qos=3), 4),
    (Publish("t", b"", qos=1), 4),  # QoS 1 without a Packet Identifier
    (Publish("t", b"", qos=1, packet_id=0), 4),
    (Publish("t", b"", qos=1, packet_id=65_536), 4),
    (Publish("t", b"", dup=True), 4),  # DUP on QoS 0
    (Publish("t", b"", packet_id=5), 4),  # Packet Identifier on QoS 0
    (Publish("t\x00", b""), 4),
    (Publish("x" * 65_536, b""), 4),
    (Publish("t", b"", properties=Properties(session_expiry_interval=1)), 5),
    (PubAck(0), 4),
    (Connect(4, "c", True, 70_000), 4),  # Keep Alive over 65,535
    (Connect(4, "c", True, 60, password=b"pw"), 4),  # 3.1.1 password without user name
    (Connect(6, "c", True, 60), 4),
    (Connect(5, "c", True, 60, will=Will("w", b"", 3, False, Properties())), 5),
    (Subscribe(1, []), 4),
    (Subscribe(1, [SubscriptionRequest("a", 3)]), 4),
    (Subscribe(1, [SubscriptionRequest("a", 0, retain_handling=3)]), 5),
    (Unsubscribe(1, []), 5),
    (Auth(), 4),
    (ConnAck(False, 0x86), 4),  # a 5.0 Reason Code where 3.1.1 needs a return code
    (Disconnect(0x100), 5),
]


@pytest.mark.parametrize(("packet", "level"), BAD_FOR_ENCODING)
def test_encode_refuses_invalid_packets(packet: Packet, level: int) -> None:
    with pytest.raises(ValueError):
        encode(packet, level)


def test_encode_refuses_oversized_remaining_length() -> None:
    class HugePayload(bytes):
        def __len__(self) -> int:
            return 268_435_456

    with pytest.raises(ValueError):
        encode(Publish("t", HugePayload()), 4)
