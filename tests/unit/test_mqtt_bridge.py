"""The MQTT bridge without I/O: the level-wise topic mapping, the overlap of Topic Filters
that decides whether the two directions could loop, the sink's one check, and what the
bridge publishes of a matched message (QoS, RETAIN, MQTT 5 properties, expiry)."""

from __future__ import annotations

import uuid

import pytest

from services.common.integrations.model import (
    Integration,
    IntegrationError,
    IntegrationKind,
    MqttSink,
    PayloadFormat,
    SinkSecrets,
    check_integration,
    public_view,
)
from services.common.integrations.topic_mapping import filters_overlap, map_topic
from services.common.mqtt.properties import Properties
from services.common.records import PublishMeta
from services.integrations.matching import Outgoing
from services.integrations.mqtt_bridge import remote_message


def bridge(sink: MqttSink, **changes: object) -> Integration:
    values: dict[str, object] = {
        "id": uuid.uuid4(),
        "name": "site1",
        "kind": IntegrationKind.MQTT,
        "topic_filters": ("sensors/#",),
        "sink": sink,
        "payload_format": PayloadFormat.RAW,
    }
    values.update(changes)
    return Integration(**values)  # type: ignore[arg-type]


SITE1 = MqttSink("remote.example", local_prefix="sensors", remote_prefix="site1/sensors")


def test_prefixes_map_whole_levels_both_ways() -> None:
    assert map_topic("sensors/l1/temp", "sensors", "site1/sensors") == "site1/sensors/l1/temp"
    assert map_topic("sensors", "sensors", "site1/sensors") == "site1/sensors"  # '#' parent
    assert map_topic("sensors-old/x", "sensors", "site1") is None  # levels, not characters
    assert map_topic("a/b", "", "site1") == "site1/a/b"
    assert map_topic("sensors/a", "sensors", "") == "a"
    assert map_topic("sensors", "sensors", "") is None  # nothing left: no Topic Name
    assert map_topic("site1/sensors/+/cmd", "site1/sensors", "sensors") == "sensors/+/cmd"


@pytest.mark.parametrize(
    ("a", "b", "overlap"),
    [
        ("site1/sensors/#", "site1/sensors/+/cmd", True),
        ("site1/sensors/#", "site1/sensors", True),  # '#' takes its parent (4.7.1.2)
        ("site1/sensors/+/temp", "site1/sensors/+/cmd", False),
        ("site1/+/x", "site1/a/+", True),
        ("a/b", "a/b/c", False),
        ("a/+", "a", False),
        ("#", "$SYS/x", False),  # 4.7.2: wildcards do not take '$' first levels
        ("+/x", "$SYS/x", False),
        ("#", "a/#", True),
    ],
)
def test_topic_filters_overlap_when_one_topic_matches_both(a: str, b: str, overlap: bool) -> None:
    assert filters_overlap(a, b) is overlap
    assert filters_overlap(b, a) is overlap


@pytest.mark.parametrize(
    ("changes", "secrets", "error"),
    [
        ({"reverse_topic_filters": ("site1/sensors/+/cmd",), "local_username": "u"},
         SinkSecrets(local_password="p"), "loop"),
        ({"reverse_topic_filters": ("site1/cmd/#",)}, SinkSecrets(), "not under the remote"),
        ({"local_prefix": "", "remote_prefix": "site1", "reverse_topic_filters": ("site1/cmd/#",)},
         SinkSecrets(), "give its user name and password"),
        ({"local_prefix": "plant"}, SinkSecrets(), "not under the local prefix"),
        ({"remote_prefix": "site1/+"}, SinkSecrets(), "without wildcards"),
        ({"ca_file": "/ca.pem"}, SinkSecrets(), "needs TLS"),
        ({"tls": True, "cert_file": "/c.pem"}, SinkSecrets(), "both its certificate and key"),
        ({}, SinkSecrets(mqtt_password="p"), "needs a user name"),
        ({"qos": 3}, SinkSecrets(), "QoS 3"),
        ({"protocol_version": 3}, SinkSecrets(), "MQTT version 3"),
    ],
)  # fmt: skip
def test_the_check_refuses_sinks_that_cannot_run_or_would_loop(
    changes: dict[str, object], secrets: SinkSecrets, error: str
) -> None:
    sink = MqttSink(**{**SITE1.to_json(), **changes})  # type: ignore[arg-type]
    with pytest.raises(IntegrationError, match=error):
        check_integration(bridge(sink, secrets=secrets))


def test_a_reverse_direction_apart_from_the_forwarded_topics_is_accepted_and_secrets_hidden() -> (
    None
):
    sink = MqttSink(
        **{
            **SITE1.to_json(),
            "remote_prefix": "site1",
            "local_prefix": "",
            "reverse_topic_filters": ("site1/cmd/#",),
            "local_username": "bridge-in",
            "username": "bridge",
        }
    )
    secrets = SinkSecrets(mqtt_password="remote-secret", local_password="local-secret")
    checked = check_integration(bridge(sink, topic_filters=("sensors/#",), secrets=secrets))
    shown = repr(checked) + repr(public_view(checked))
    assert "remote-secret" not in shown and "local-secret" not in shown
    assert MqttSink.from_json(sink.to_json()) == sink


def outgoing(meta: PublishMeta, properties: Properties, value: bytes = b"21.5") -> Outgoing:
    return Outgoing(
        "sensor-7",
        meta.topic,
        meta.qos,
        meta.retain,
        value,
        [],
        properties=properties,
        received_at_ms=meta.received_at_ms,
    )


def test_the_remote_gets_the_lower_qos_the_mapped_topic_and_the_properties_left() -> None:
    meta = PublishMeta("sensors/l1/temp", 2, True, received_at_ms=1_000_000, protocol_version=5)
    properties = Properties(
        content_type="text/plain",
        message_expiry_interval=60,
        correlation_data=b"\x01",
        user_properties=[("site", "north"), ("site", "south")],
    )
    sent = remote_message(bridge(SITE1), outgoing(meta, properties), now_ms=1_010_500)
    assert sent is not None
    assert (sent.topic, sent.payload, sent.qos, sent.retain) == (
        "site1/sensors/l1/temp", b"21.5", 1, True,
    )  # fmt: skip
    assert sent.properties is not None
    assert sent.properties.MessageExpiryInterval == 50  # 10.5 s waited: 10 whole seconds
    assert sent.properties.ContentType == "text/plain"
    assert sent.properties.CorrelationData == b"\x01"
    assert sent.properties.UserProperty == [("site", "north"), ("site", "south")]
    # Expired while it waited: not forwarded (MQTT 5.0 3.3.2.3.3).
    assert remote_message(bridge(SITE1), outgoing(meta, properties), now_ms=1_060_000) is None


def test_retain_cleared_v311_without_properties_and_json_declared() -> None:
    meta = PublishMeta("sensors/a", 1, True, received_at_ms=0, protocol_version=5)
    properties = Properties(content_type="text/plain")
    v311 = MqttSink(**{**SITE1.to_json(), "protocol_version": 4, "retain": False, "qos": 0})
    sent = remote_message(bridge(v311), outgoing(meta, properties), now_ms=0)
    assert sent is not None and (sent.qos, sent.retain, sent.properties) == (0, False, None)
    as_json = bridge(SITE1, payload_format=PayloadFormat.JSON)
    sent = remote_message(as_json, outgoing(meta, properties, b"{}"), now_ms=0)
    assert sent is not None and sent.properties is not None
    assert sent.properties.ContentType == "application/json"
    assert sent.properties.PayloadFormatIndicator == 1


def test_messages_with_the_same_properties_share_their_paho_form() -> None:
    meta = PublishMeta("sensors/l1/temp", 1, False, received_at_ms=1_000_000, protocol_version=5)

    def sent_properties(now_ms: int, site: str = "north") -> object:
        properties = Properties(message_expiry_interval=60, user_properties=[("site", site)])
        sent = remote_message(bridge(SITE1), outgoing(meta, properties), now_ms=now_ms)
        assert sent is not None and sent.properties is not None
        return sent.properties

    first = sent_properties(1_000_100)
    assert sent_properties(1_000_900) is first  # equal values, built once
    later = sent_properties(1_001_000)  # one second less to live: its own
    assert later is not first and later.MessageExpiryInterval == 59  # type: ignore[attr-defined]
    assert sent_properties(1_000_100, "south") is not first
