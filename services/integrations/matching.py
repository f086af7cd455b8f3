"""Which ``msg.all`` records an integration takes, and what its sink receives of each:
what every sink shares (the Kafka sink, the HTTP webhook and the MQTT bridge take the same
:class:`Outgoing` messages).

An integration's Topic Filters go into a :class:`~services.common.topics.trie.
SubscriptionTrie` (the router's), so a Topic Name matches exactly as a subscription's
would (MQTT 5.0 4.7: ``+``, ``#``, no wildcard match of a ``$`` topic's first level).
A Kafka sink with an ``events_topic`` also takes the ``client.events`` records of the
clients its Client Identifier pattern matches (:meth:`Matcher.events_of`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from services.common.integrations.event_format import formatted_event
from services.common.integrations.message_format import formatted, user_property_headers
from services.common.integrations.model import (
    Integration,
    KafkaSink,
    kafka_topic_name,
    render,
)
from services.common.kafka.consumer import Record, log_undecodable
from services.common.mqtt.properties import Properties
from services.common.records import (
    Headers,
    Published,
    RecordError,
    decode_forwarded_properties,
    parse_client_event,
    parse_msg_all,
)
from services.common.subscription import Subscription
from services.common.topics.trie import SubscriptionTrie

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One matched message as a sink writes it: the publisher's ``client_id``, the MQTT
    ``topic`` (Topic Name; ``""`` for a lifecycle event), ``qos`` and ``retain`` as
    published; ``value``: the payload in the integration's format; ``headers``: the MQTT 5
    User Properties (MQTT 5.0 3.3.2.3.7) as ``(name, UTF-8 value)`` pairs; for a Kafka
    sink, ``kafka_topic`` and ``key`` (UTF-8) rendered from its templates (empty for other
    sinks); ``properties``: the forwarded MQTT 5 properties and ``received_at_ms`` when the
    broker accepted it (Unix milliseconds), which the MQTT bridge republishes."""

    client_id: str
    topic: str
    qos: int
    retain: bool
    value: bytes
    headers: Headers
    kafka_topic: str = ""
    key: bytes = b""
    properties: Properties = field(default_factory=Properties)
    received_at_ms: int = 0


class Matcher:
    """Matches records against one ``integration`` and formats those it takes."""

    def __init__(self, integration: Integration) -> None:
        self.integration = integration
        self.trie = SubscriptionTrie()
        for topic_filter in integration.topic_filters:
            self.trie.add(Subscription(integration.name, topic_filter, 2))
        self.unwritable = 0

    def take_unwritable(self) -> int:
        """The matched messages skipped since the last call because they cannot be
        written (their topic template renders no Kafka topic name)."""
        count, self.unwritable = self.unwritable, 0
        return count

    def matches(self, client_id: str, topic: str) -> bool:
        """Whether a message of ``client_id`` on Topic Name ``topic`` is the integration's."""
        return self.integration.matches_client(client_id) and bool(self.trie.match(topic).clients)

    def outgoing(self, record: Record) -> Outgoing | None:
        """What the sink writes for ``record`` (a ``msg.all`` record), or None when it is
        not a message the integration takes (a retained message request, another topic or
        client). A record that does not decode is logged and skipped (it must not stop the
        partition); so is one whose topic template (a Kafka sink's) renders no Kafka topic
        name."""
        try:
            parsed = parse_msg_all(record.key, record.value, record.headers)
            if not isinstance(parsed, Published):
                return None
            meta = parsed.message.meta
            if not self.matches(parsed.client_id, meta.topic):
                return None
            properties = decode_forwarded_properties(meta)
        except RecordError as exc:
            log_undecodable(log, record, exc)
            return None
        client_id = parsed.client_id
        kafka_topic, key = "", b""
        sink = self.integration.sink
        if isinstance(sink, KafkaSink):
            rendered = render(sink.topic, client_id, meta.topic)
            try:
                kafka_topic = kafka_topic_name(rendered)
            except ValueError as exc:
                self.unwritable += 1
                log.warning(
                    "integration %s skips %s[%d]@%d: %s",
                    self.integration.name,
                    record.topic,
                    record.partition,
                    record.offset,
                    exc,
                )
                return None
            key = render(sink.key, client_id, meta.topic).encode("utf-8")
        value = formatted(
            self.integration.payload_format, client_id, meta, properties, parsed.message.payload
        )
        return Outgoing(
            client_id,
            meta.topic,
            meta.qos,
            meta.retain,
            value,
            user_property_headers(properties),
            kafka_topic,
            key,
            properties,
            meta.received_at_ms,
        )

    def outgoing_of(self, records: Sequence[Record]) -> list[Outgoing]:
        """:meth:`outgoing` of each of ``records``, those the integration takes."""
        return [out for record in records if (out := self.outgoing(record)) is not None]

    def event(self, record: Record) -> Outgoing | None:
        """What the sink's events stream receives of ``record`` (a ``client.events``
        record): the ``cormorant.client_event/1`` document, keyed by the Client Identifier,
        to the sink's ``events_topic``; None when the sink has none, the client does not
        match the Client Identifier pattern, or the event is not streamed. A record that
        does not decode is logged and skipped."""
        sink = self.integration.sink
        events_topic = sink.events_topic if isinstance(sink, KafkaSink) else None
        if events_topic is None:
            return None
        try:
            client_id, event = parse_client_event(record.key, record.value)
        except RecordError as exc:
            log_undecodable(log, record, exc)
            return None
        if not self.integration.matches_client(client_id):
            return None
        value = formatted_event(client_id, event)
        if value is None:
            return None
        return Outgoing(client_id, "", 0, False, value, [], events_topic, client_id.encode("utf-8"))

    def events_of(self, records: Sequence[Record]) -> list[Outgoing]:
        """:meth:`event` of each of ``records``, those the events stream takes."""
        return [out for record in records if (out := self.event(record)) is not None]
