"""The HTTP publish API without servers: its records are the ingest node's for the same
PUBLISH, its refusals, its rate limit, and API keys (services/admin/publish_api.py,
services/common/auth/api_keys.py)."""

from __future__ import annotations

import pytest
from test_ingest_support import NOW_MS, Client, make_settings, store_effects

from services.admin import publish_api
from services.admin.commands import CommandWriter
from services.admin.publish_api import HttpPublisher, Problem, Publisher, PublishMessage
from services.common.auth.api_keys import ApiKeyError, new_api_key, parse_token
from services.common.auth.authorize import ALLOW_ALL, authorizer_for, parse_rules
from services.common.auth.store import CredentialStore
from services.common.kafka.names import TopicNames
from services.common.mqtt.packets import Publish
from services.common.mqtt.properties import Properties
from services.common.records import DELAYED_ID_SIZE, DelayedRecord, parse_delayed
from services.common.settings import Settings
from services.ingest.store_pipeline import record_of


def _publisher(settings: Settings) -> HttpPublisher:
    # Nothing here reaches Kafka or PostgreSQL: the store's pool opens on first use.
    return HttpPublisher(settings, CommandWriter(settings), CredentialStore("postgresql://"))


ANYONE = Publisher("test", "k:test", "http-test", ALLOW_ALL)


async def test_the_records_are_those_an_ingest_node_writes_for_the_same_publish(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = make_settings()
    props = Properties(
        payload_format_indicator=1,
        message_expiry_interval=60,
        content_type="text/plain",
        response_topic="r/1",
        correlation_data=b"\x00c",
        user_properties=[("a", "1"), ("a", "2")],
    )
    mqtt = Client(5, settings)
    mqtt.connect(client_id="http-test")
    effects = mqtt.send(Publish("t/x", b"hello", 1, True, packet_id=1, properties=props))
    names = TopicNames.from_settings(settings)
    ingested = [record_of(names, "http-test", e) for e in store_effects(effects)]
    monkeypatch.setattr(publish_api, "now_ms", lambda: NOW_MS)
    message = PublishMessage.model_validate(
        {
            "topic": "t/x",
            "payload": "aGVsbG8=",
            "payload_encoding": "base64",
            "qos": 1,
            "retain": True,
            "payload_format_indicator": True,
            "message_expiry_interval": 60,
            "content_type": "text/plain",
            "response_topic": "r/1",
            "correlation_data": "AGM=",
            "user_properties": [{"name": "a", "value": "1"}, {"name": "a", "value": "2"}],
        }
    )
    publisher = _publisher(settings)
    try:
        assert publisher.records(ANYONE, message) == ingested
        assert [r.topic for r in ingested] == [names.msg_all, names.msg_retained]
    finally:
        publisher.close()


@pytest.mark.parametrize(
    ("fields", "status", "kind"),
    [
        ({"topic": "a/#"}, 400, "topic-invalid"),
        ({"topic": ""}, 400, "topic-invalid"),
        ({"topic": "a/\u0000"}, 400, "topic-invalid"),
        ({"topic": "a", "payload": "\ud800"}, 400, "payload-invalid"),
        ({"topic": "a", "payload": "%%", "payload_encoding": "base64"}, 400, "payload-invalid"),
        (
            {"topic": "a", "payload": "/w==", "payload_encoding": "base64",
             "payload_format_indicator": True},
            400, "payload-invalid",
        ),
        ({"topic": "a", "content_type": "\ud800"}, 400, "not-utf8"),
        ({"topic": "a", "response_topic": "r/+"}, 400, "topic-invalid"),
        ({"topic": "denied/x"}, 403, "not-authorized"),
        ({"topic": "a", "payload": "x" * 200}, 413, "message-too-large"),
    ],
)  # fmt: skip
async def test_a_message_mqtt_would_refuse_is_a_problem(
    fields: dict[str, object], status: int, kind: str
) -> None:
    publisher = _publisher(make_settings(max_packet_size=128))
    rules = parse_rules(["deny publish denied/#", "allow publish #"])
    who = Publisher("test", "k:test", "http-test", authorizer_for(rules, "http-test", None))
    try:
        with pytest.raises(Problem) as refused:
            publisher.records(who, PublishMessage.model_validate(fields))
        assert (refused.value.status, refused.value.kind) == (status, kind)
    finally:
        publisher.close()


async def test_the_rate_per_key_refuses_with_retry_after_and_refills() -> None:
    publisher = _publisher(make_settings(http_publish_rate_per_key=10, http_publish_max_batch=5))
    clock = [100.0]
    publisher._clock = lambda: clock[0]
    other = Publisher("other", "k:other", "http-other", ALLOW_ALL)
    try:
        publisher.take(ANYONE, 10)  # the bucket holds one second's worth
        with pytest.raises(Problem) as refused:
            publisher.take(ANYONE, 5)
        assert (refused.value.status, refused.value.headers) == (429, {"Retry-After": "1"})
        publisher.take(other, 10)  # each key has its own bucket
        clock[0] += 0.5
        publisher.take(ANYONE, 5)
    finally:
        publisher.close()


async def test_a_delayed_message_is_the_record_an_ingest_node_writes_and_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = make_settings(max_delayed_messages_per_client=2)
    mqtt = Client(5, settings)
    mqtt.connect(client_id="http-test")
    [stored] = store_effects(mqtt.send(Publish("$delayed/5/t/x", b"later", 1, packet_id=1)))
    names = TopicNames.from_settings(settings)
    ingested = record_of(names, "http-test", stored)
    monkeypatch.setattr(publish_api, "now_ms", lambda: NOW_MS)
    message = PublishMessage.model_validate({"topic": "$delayed/5/t/x", "payload": "later"})
    publisher = _publisher(settings)
    try:
        [record] = publisher.records(ANYONE, message)
        assert record.topic == names.msg_delayed
        client_id, ident, waiting = parse_delayed(record.key, record.value)
        _, _, expected = parse_delayed(ingested.key, ingested.value)
        assert isinstance(waiting, DelayedRecord) and isinstance(expected, DelayedRecord)
        assert client_id == "http-test" and len(ident) == DELAYED_ID_SIZE
        assert (waiting.due_at_ms, waiting.meta_raw, waiting.payload) == (
            expected.due_at_ms,
            expected.meta_raw,
            expected.payload,
        )
        assert publisher.records(ANYONE, message)[0].key != record.key  # a fresh id each
        publisher.delayed.add("http-test", b"w" * DELAYED_ID_SIZE)  # one waits already
        with pytest.raises(Problem) as refused:  # before anything reaches Kafka
            await publisher.publish(ANYONE, [message, message])
        assert (refused.value.status, refused.value.kind) == (429, "quota-exceeded")
    finally:
        publisher.close()


def test_an_api_key_is_its_id_and_a_secret_only_its_hash_is_kept() -> None:
    key, token = new_api_key("billing", ["allow publish commands/${client_id}/#"])
    parsed = parse_token(token)
    assert parsed is not None and parsed[0] == key.id
    assert token.startswith("cmk_") and parsed[1] not in key.key_hash
    assert key.matches(parsed[1]) and not key.matches(parsed[1][:-1] + "x")
    assert key.client_id == "http-billing"
    assert parse_token("cmk_nothex.secret") is None
    with pytest.raises(ApiKeyError, match="username"):
        new_api_key("k", ["allow publish a/${username}"])
    with pytest.raises(ApiKeyError, match="name"):
        new_api_key("-bad name", [])
