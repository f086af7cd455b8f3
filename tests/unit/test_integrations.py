"""Integrations without I/O: the one check of a definition, the templates, the
``cormorant.message/1`` JSON document, matching ``msg.all`` records (bytes alone), the
per-integration counters, and the status the admin service reads from the stages'
``/metrics`` (the last error's text without secrets)."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterable
from dataclasses import replace

import click
import pytest
from aiokafka import ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaConnectionError
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from services.admin.cluster import Endpoint, Probe
from services.admin.integration_status import reported, status_of
from services.common.integrations.event_format import SCHEMA as EVENT_SCHEMA
from services.common.integrations.message_format import SCHEMA, message_json
from services.common.integrations.model import (
    Integration,
    IntegrationError,
    IntegrationKind,
    KafkaSink,
    PayloadFormat,
    SinkSecrets,
    WebhookSink,
    check_integration,
    kafka_topic_name,
    public_view,
    render,
    sink_from_json,
)
from services.common.integrations.status import ERROR_TEXT_MAX, RunnerState
from services.common.kafka.consumer import Record
from services.common.kafka.names import TopicNames
from services.common.metrics import parse_exposition
from services.common.mqtt.packets import PacketType
from services.common.mqtt.properties import Properties, encode_properties
from services.common.records import (
    DisconnectCause,
    EventKind,
    EventRecord,
    PublishMeta,
    client_event_record,
    publish_record,
    retained_request_record,
)
from services.common.settings import Settings
from services.common.subscription import Subscription
from services.integrations.matching import Matcher
from services.integrations.stage import (
    IntegrationCounters,
    IntegrationRunner,
    integration_families,
)
from services.integrations_cli import _sink_body

NAMES = TopicNames()


def integration(**changes: object) -> Integration:
    values: dict[str, object] = {
        "id": uuid.uuid4(),
        "name": "plant-export",
        "kind": IntegrationKind.KAFKA,
        "topic_filters": ("plant/+/temp", "alerts/#"),
        "sink": KafkaSink("k:9092", "mqtt.${topic_level[0]}", "${client_id}"),
        "payload_format": PayloadFormat.JSON,
    }
    values.update(changes)
    return Integration(**values)  # type: ignore[arg-type]


def record(client_id: str, meta: PublishMeta, payload: bytes, offset: int = 7) -> Record:
    topic, key, value, headers = publish_record(NAMES, client_id, meta, payload)
    return ConsumerRecord(topic, 3, offset, 0, 0, key, value, None, 0, 0, list(headers))


def test_templates_render_client_id_topic_and_levels_into_kafka_topic_names() -> None:
    assert render("${client_id}|${topic}", "c-1", "a/b") == "c-1|a/b"
    assert render("m.${topic_level[1]}.${topic_level[5]}", "c", "a/b/c") == "m.b."
    assert kafka_topic_name("mqtt/plant 1/$SYS") == "mqtt_plant_1__SYS"
    with pytest.raises(IntegrationError):
        kafka_topic_name("")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"name": "-x"}, "not a name"),
        ({"topic_filters": ("a/#/b",)}, "not a valid topic filter"),
        ({"topic_filters": ("$share/g/a",)}, "shared subscriptions"),
        ({"topic_filters": ()}, "at least one topic filter"),
        ({"sink": KafkaSink("k:9092", "t.${qos}")}, "${qos}"),
        ({"sink": KafkaSink("k:9092", "t", security_protocol="SASL_SSL")}, "SASL mechanism"),
        (
            {"sink": KafkaSink("k:9092", "t", "k", "SASL_SSL", "SCRAM-SHA-512", "u")},
            "user name and a password",
        ),
        ({"secrets": SinkSecrets("pw")}, "SASL settings need"),
        ({"sink": KafkaSink("k:9092", "t", ssl_cafile="/ca.pem")}, "CA file"),
        ({"sink": KafkaSink("k:9092", "t", events_topic="client/events")}, "events topic"),
    ],
)
def test_check_refuses_what_cannot_run(changes: dict[str, object], message: str) -> None:
    with pytest.raises(IntegrationError, match=message.replace("$", r"\$").replace("{", r"\{")):
        check_integration(integration(**changes))


def test_the_sasl_password_is_never_shown() -> None:
    sink = KafkaSink("k:9096", "t", "k", "SASL_SSL", "SCRAM-SHA-512", "exporter")
    secret = integration(sink=sink, secrets=SinkSecrets("hunter2-secret"))
    check_integration(secret)
    assert "hunter2-secret" not in json.dumps(public_view(secret))
    assert "hunter2-secret" not in repr(secret)
    assert public_view(secret)["sasl_password_set"] is True


def test_json_document_declared_text_as_utf8_else_base64() -> None:
    props = Properties(
        payload_format_indicator=1,
        content_type="text/plain",
        correlation_data=b"\x00\x01",
        user_properties=[("site", "north"), ("site", "south")],
    )
    meta = PublishMeta("plant/1/temp", 1, True, 1_795_845_600_123, 5)
    document = message_json("sensor-7", meta, props, "21,5 °C".encode())
    assert document == {
        "schema": SCHEMA,
        "topic": "plant/1/temp",
        "client_id": "sensor-7",
        "qos": 1,
        "retain": True,
        "protocol_version": 5,
        "received_at": "2026-11-28T06:00:00.123Z",
        "received_at_ms": 1_795_845_600_123,
        "payload": "21,5 °C",
        "payload_encoding": "utf-8",
        "properties": {
            "payload_format_indicator": 1,
            "content_type": "text/plain",
            "correlation_data": "AAE=",
            "user_properties": [["site", "north"], ["site", "south"]],
        },
    }
    undeclared = message_json("c", meta, Properties(), b"\xff\x00")
    assert undeclared["payload_encoding"] == "base64"
    assert base64.b64decode(undeclared["payload"]) == b"\xff\x00"
    assert undeclared["properties"] == {}
    declared_but_binary = message_json(
        "c", meta, Properties(content_type="application/json"), b"\xff"
    )
    assert declared_but_binary["payload_encoding"] == "base64"


def test_matcher_takes_matching_topics_and_clients_and_formats_them() -> None:
    props = Properties(user_properties=[("k", "v")])
    encoded = encode_properties(props, PacketType.PUBLISH)
    meta = PublishMeta("plant/line-1/temp", 2, False, 1000, 5, encoded)
    matcher = Matcher(integration(client_id_filter="sensor-*"))
    out = matcher.outgoing(record("sensor-7", meta, b"21.5"))
    assert out is not None
    assert (out.kafka_topic, out.key, out.headers) == ("mqtt.plant", b"sensor-7", [("k", b"v")])
    assert json.loads(out.value)["payload"] == "MjEuNQ=="  # nothing declared it text
    raw = Matcher(integration(payload_format=PayloadFormat.RAW)).outgoing(
        record("x", meta, b"\x00raw")
    )
    assert raw is not None and raw.value == b"\x00raw"
    # Another client, another topic, a $ topic under a leading wildcard (MQTT 5.0 4.7.2),
    # a retained message request: none taken.
    assert matcher.outgoing(record("other", meta, b"")) is None
    deep = PublishMeta("plant/line-1/temp/x", 0, False, 1000)
    assert matcher.outgoing(record("sensor-1", deep, b"")) is None
    everything = Matcher(integration(topic_filters=("#",)))
    assert everything.outgoing(record("c", PublishMeta("$SYS/x", 0, False, 1), b"")) is None
    topic, key, value, headers = retained_request_record(
        NAMES, "c", [Subscription("c", "plant/#", 1)]
    )
    request = ConsumerRecord(topic, 0, 1, 0, 0, key, value, None, 0, 0, list(headers))
    assert everything.outgoing(request) is None


def test_garbage_and_unwritable_records_are_skipped_and_counted() -> None:
    matcher = Matcher(integration(sink=KafkaSink("k:9092", "${topic_level[3]}")))
    garbage = ConsumerRecord("msg.all", 0, 1, 0, 0, b"c", b"v", None, 0, 0, [("m", b"\x09")])
    meta = PublishMeta("plant/1/temp", 0, False, 1)
    assert matcher.outgoing_of([garbage, record("c", meta, b"p")]) == []
    assert matcher.take_unwritable() == 1  # the level renders "": no Kafka topic name
    assert matcher.take_unwritable() == 0


def test_counters_count_committed_aborted_and_written_again() -> None:
    counters = IntegrationCounters()
    tp = TopicPartition("msg.all", 0)
    counters.handled(tp, 3)
    counters.ended({}, {tp: KafkaConnectionError()})
    assert (counters.sent, counters.failed, counters.retried) == (0, 3, 0)
    assert counters.last_error_at is not None
    counters.handled(tp, 3)
    counters.handled(tp, 2)
    counters.ended({tp: 9}, [])
    assert (counters.sent, counters.failed, counters.retried) == (5, 3, 3)


SIGNING_SECRET = "s" * 32


def webhook(**changes: object) -> Integration:
    values: dict[str, object] = {
        "kind": IntegrationKind.WEBHOOK,
        "sink": WebhookSink("https://hooks.example.com/mqtt"),
        "secrets": SinkSecrets(signing_secret=SIGNING_SECRET),
    }
    values.update(changes)
    return integration(**values)


def test_each_kind_reads_its_own_sink_from_json() -> None:
    kafka = KafkaSink("k:9092", "t", ssl_cafile="/ca.pem", security_protocol="SSL")
    hook = WebhookSink("http://h:8080/x", batch_size=10, headers=(("X-Team", "plant"),))
    assert sink_from_json(IntegrationKind.KAFKA, kafka.to_json()) == kafka
    assert sink_from_json(IntegrationKind.WEBHOOK, hook.to_json()) == hook
    # A field left out takes its default (an older stored row, an API body).
    assert sink_from_json(IntegrationKind.WEBHOOK, {"url": "http://h/"}) == WebhookSink("http://h/")
    with pytest.raises(IntegrationError, match="not a webhook sink"):
        sink_from_json(IntegrationKind.WEBHOOK, kafka.to_json())
    with pytest.raises(IntegrationError, match="not an MQTT sink"):
        sink_from_json(IntegrationKind.MQTT, {})
    check_integration(webhook())
    with pytest.raises(IntegrationError, match="not a sink of kind 'webhook'"):
        check_integration(webhook(sink=kafka, secrets=SinkSecrets()))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"sink": WebhookSink("ftp://h/x")}, "http:// or https://"),
        ({"sink": WebhookSink("http:///x")}, "with a host"),
        ({"sink": WebhookSink("http://h:port/x")}, "is not a URL"),
        ({"sink": WebhookSink("https://user:pw@h/x")}, "no user name or password"),
        ({"secrets": SinkSecrets()}, "signing secret of 32"),
        ({"secrets": SinkSecrets(signing_secret="short")}, "signing secret of 32"),
        (
            {"secrets": SinkSecrets("pw", SIGNING_SECRET)},
            "a SASL password is for Kafka sinks",
        ),
        (
            {"sink": WebhookSink("http://h/", batch_size=2), "payload_format": PayloadFormat.RAW},
            "json payload format",
        ),
        ({"sink": WebhookSink("http://h/", batch_size=1001)}, "batch size 1001"),
        ({"sink": WebhookSink("http://h/", max_attempts=0)}, "max attempts 0"),
        ({"sink": WebhookSink("http://h/", timeout_seconds=0)}, "timeout seconds 0"),
        (
            {"sink": WebhookSink("http://h/", backoff_seconds=5, backoff_max_seconds=1)},
            "longest backoff",
        ),
        ({"sink": WebhookSink("http://h/", ssl_cafile="/ca.pem")}, "https:// URL"),
        ({"sink": WebhookSink("http://h/", headers=(("Bad Name", "v"),))}, "header name"),
        ({"sink": WebhookSink("http://h/", headers=(("X-A", "v\r\nX-B: w"),))}, "header value"),
        (
            {"sink": WebhookSink("http://h/", headers=(("x-cormorant-signature", "v"),))},
            "sets header",
        ),
    ],
)
def test_webhook_check_refuses_what_cannot_run(changes: dict[str, object], message: str) -> None:
    with pytest.raises(IntegrationError, match=message):
        check_integration(webhook(**changes))


def test_the_signing_secret_is_never_shown() -> None:
    secret = webhook(secrets=SinkSecrets(signing_secret="hunter2-" * 8))
    check_integration(secret)
    assert "hunter2" not in json.dumps(public_view(secret))
    assert "hunter2" not in repr(secret)
    assert public_view(secret)["signing_secret_set"] is True


def test_the_cli_takes_the_sink_options_of_the_kind_only() -> None:
    options = {"url": "http://h/", "headers": ("X-Team: plant", "X-Empty:"), "batch_size": 5}
    assert _sink_body(options, "webhook") == {
        "url": "http://h/",
        "headers": [["X-Team", "plant"], ["X-Empty", ""]],
        "batch_size": 5,
    }
    with pytest.raises(click.UsageError, match="--bootstrap is not an option of a webhook"):
        _sink_body({"bootstrap": "k:9092"}, "webhook")
    with pytest.raises(click.UsageError, match="--url is not an option of the same"):
        _sink_body({"bootstrap": "k:9092", "url": "http://h/"}, None)
    with pytest.raises(click.UsageError, match="'Name: value'"):
        _sink_body({"headers": ("no colon",)}, None)
    # Shared by both kinds: fine when the kind is not known (an update).
    assert _sink_body({"ssl_cafile": "/ca.pem", "key": None}, None) == {"ssl_cafile": "/ca.pem"}


class _Families(Collector):
    """The stage's per-integration families of ``counters``, as a registry collects them."""

    def __init__(self, counters: dict[str, IntegrationCounters]) -> None:
        self.counters = counters

    def collect(self) -> Iterable[Metric]:
        return integration_families(self.counters)


def exposition(counters: dict[str, IntegrationCounters]) -> str:
    """What the stage's ``/metrics`` serves of ``counters``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(counters))
    return generate_latest(registry).decode("utf-8")


def test_the_last_error_is_served_without_the_sinks_secrets() -> None:
    password = 'pw-\\S3cret"quoted'
    secret = integration(
        sink=KafkaSink("k:9093", "t", security_protocol="SASL_SSL", sasl_mechanism="PLAIN",
                       sasl_username="exporter"),
        secrets=SinkSecrets(password),
    )  # fmt: skip
    runner = IntegrationRunner(Settings(), check_integration(secret), "group")
    tp = TopicPartition("msg.all", 1)
    # An error as a transaction's abort reports it: the password as written, as repr
    # escapes it, and a URL's user information.
    error = KafkaConnectionError(
        f"login {password} refused ({password!r}) by https://exporter:{password}@k:9093/x"
    )
    runner.ended({}, {tp: error})
    text = runner.counters.last_error
    assert text == "KafkaConnectionError: login *** refused ('***') by https://***@k:9093/x"
    served = exposition({"plant-export": runner.counters})
    assert "S3cret" not in served
    assert 'error="KafkaConnectionError: login *** refused' in served
    # A long one is cut, after the secrets are gone: no piece of one is left at the cut.
    runner.failure(ValueError("x" * (ERROR_TEXT_MAX - 20) + password + "y" * 300))
    text = runner.counters.last_error
    assert text is not None and len(text) == ERROR_TEXT_MAX and text.endswith("…")
    assert "S3c" not in text and "pw-" not in text


def test_the_status_sums_the_stage_processes_and_shows_the_worst_state() -> None:
    one, two = IntegrationCounters(), IntegrationCounters()
    one.sent, one.failed, one.lag, one.state = 5, 1, 3, RunnerState.RUNNING
    two.sent, two.retried, two.state = 7, 1, RunnerState.RESTARTING
    one.error("KafkaTimeoutError")
    one.last_error_at = 1000.0
    two.error("KafkaConnectionError: Unable to bootstrap")
    two.last_error_at = 2000.0
    # A family a sink adds (the webhook's dead-lettered messages): shown without a change.
    extra = (
        "# TYPE cormorant_integration_messages_dead_lettered counter\n"
        'cormorant_integration_messages_dead_lettered_total{integration="plant-export"} 2.0\n'
    )
    probes = [
        Probe(Endpoint("integrations-1", "http://a"), samples=parse_exposition(text))
        for text in (exposition({"plant-export": one}), exposition({"plant-export": two}) + extra)
    ]
    probes.append(Probe(Endpoint("gone", "http://b"), error="ClientConnectorError"))
    found = reported(probes)
    status = status_of(integration(), found)
    assert (status.state, status.instances) == ("restarting", 2)
    assert status.counters == {
        "messages_sent": 12, "messages_failed": 1, "messages_retried": 1, "lag_records": 3,
        "last_error_timestamp_seconds": 2000.0, "messages_dead_lettered": 2,
    }  # fmt: skip
    assert status.last_error == "KafkaConnectionError: Unable to bootstrap"
    assert status.last_error_at is not None and status.last_error_at.timestamp() == 2000.0
    assert status_of(integration(enabled=False), found).state == "disabled"
    unknown = status_of(integration(name="elsewhere"), found)
    assert (unknown.state, unknown.counters, unknown.last_error) == ("not running", {}, None)


def event_record(client_id: str, event: EventRecord, offset: int = 3) -> Record:
    topic, key, value, headers = client_event_record(NAMES, client_id, event)
    return ConsumerRecord(topic, 1, offset, 0, 0, key, value, None, 0, 0, list(headers))


def test_lifecycle_events_become_documents_in_the_events_topic() -> None:
    connection = bytes(range(16))
    connected = EventRecord(
        EventKind.CONNECTED, 1795759200123, "node1", "10.0.0.7:50312", connection, 5,
        clean_start=True, persistent=True, session_expiry_interval=60,
    )  # fmt: skip
    bare = replace(connected, client_address="", clean_start=False, persistent=False)
    events = [
        connected,
        replace(bare, kind=EventKind.SUBSCRIBED, topic_filters=(("plant/+/cmd", 1),)),
        replace(bare, kind=EventKind.UNSUBSCRIBED, topic_filters=(("plant/+/cmd", 0),)),
        replace(bare, kind=EventKind.AUTH_FAILED, reason_code=0x86),
        replace(bare, kind=EventKind.DISCONNECTED, reason_code=0x8E,
                cause=DisconnectCause.TAKEOVER),
    ]  # fmt: skip
    sink = KafkaSink("k:9092", "t", events_topic="mqtt.client-events")
    matcher = Matcher(integration(sink=sink, client_id_filter="sensor-*"))
    records = [event_record("sensor-7", event) for event in events]
    records.append(event_record("other-1", connected))  # another client: not its
    records.append(ConsumerRecord("client.events", 1, 9, 0, 0, b"c", b"\x09", None, 0, 0, []))
    out = matcher.events_of(records)
    assert all(
        (o.kafka_topic, o.key, o.headers) == ("mqtt.client-events", b"sensor-7", []) for o in out
    )
    documents = [json.loads(o.value) for o in out]
    assert [d["event"] for d in documents] == [
        "connected",
        "subscribed",
        "unsubscribed",
        "disconnected",
    ]  # refused authentications are not streamed
    opened, subscribed, unsubscribed, disconnected = documents
    assert opened == {
        "schema": EVENT_SCHEMA, "event": "connected", "client_id": "sensor-7",
        "at": "2026-11-27T06:00:00.123Z", "at_ms": 1795759200123, "node_id": "node1",
        "client_address": "10.0.0.7:50312", "connection_id": connection.hex(),
        "protocol_version": 5, "reason_code": 0, "clean_start": True, "persistent": True,
        "session_expiry_interval": 60,
    }  # fmt: skip
    assert subscribed["subscriptions"] == [{"topic_filter": "plant/+/cmd", "qos": 1}]
    assert subscribed["client_address"] is None
    assert unsubscribed["topic_filters"] == ["plant/+/cmd"]
    assert (disconnected["reason_code"], disconnected["reason"], disconnected["cause"]) == (
        0x8E, "session_taken_over", "takeover"
    )  # fmt: skip
    # Without an events topic, no events.
    assert Matcher(integration(client_id_filter="sensor-*")).events_of(records) == []
