"""What a Kafka sink's events stream receives of a client's life (its ``events_topic``,
docs/integrations/kafka.md): a JSON document of schema :data:`SCHEMA` per ``client.events``
record of the kinds in :data:`STREAMED`.

One document (UTF-8, one object; the record's key is the Client Identifier)::

    {"schema": "cormorant.client_event/1", "event": "disconnected",
     "client_id": "sensor-7", "at": "2026-11-27T06:00:00.123Z", "at_ms": 1795759200123,
     "node_id": "node1", "client_address": "10.0.0.7:50312",
     "connection_id": "5f0c...32 hex digits", "protocol_version": 5,
     "reason_code": 0, "reason": "normal_disconnection", "cause": "client_disconnect"}

Every document has the fields up to ``protocol_version``; each event adds its own:
``connected``: ``reason_code`` 0, ``clean_start``, ``persistent``,
``session_expiry_interval`` (seconds); ``disconnected``: ``reason_code`` and ``reason``
(the DISCONNECT's Reason Code sent or received, MQTT 5.0 section 3.14.2.1, and its name) and
``cause`` (:class:`~services.common.records.DisconnectCause`, snake case);
``subscribed``: ``subscriptions``, the Topic Filters granted with their QoS;
``unsubscribed``: ``topic_filters``; ``session_expired``: ``persistent`` and
``session_expiry_interval``. ``client_address`` is null when unknown. A later schema
version adds fields or changes meanings under a new ``schema`` value; readers check it.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from services.common.mqtt.reason_codes import ReasonCode
from services.common.records import EventKind, EventRecord

SCHEMA = "cormorant.client_event/1"
"""The ``schema`` value of the JSON documents this module writes."""

STREAMED = {
    EventKind.CONNECTED: "connected",
    EventKind.DISCONNECTED: "disconnected",
    EventKind.SUBSCRIBED: "subscribed",
    EventKind.UNSUBSCRIBED: "unsubscribed",
    EventKind.SESSION_EXPIRED: "session_expired",
}
"""The events streamed, by their ``event`` name. Refused authentications are not: they
are the security log's (``client.events`` keeps them), not a client's life."""


def _reason(reason_code: int) -> str:
    """A DISCONNECT Reason Code's name in the specification's words, snake case (0x00:
    Normal disconnection, MQTT 5.0 section 3.14.2.1)."""
    if reason_code == 0:
        return "normal_disconnection"
    try:
        return ReasonCode(reason_code).name.lower()
    except ValueError:
        return f"reason_{reason_code:#04x}"


def event_json(client_id: str, event: EventRecord) -> dict[str, Any] | None:
    """The JSON document (:data:`SCHEMA`) of ``client_id``'s ``event``, or None when its
    kind is not streamed (:data:`STREAMED`)."""
    name = STREAMED.get(event.kind)
    if name is None:
        return None
    at = datetime.fromtimestamp(event.at_ms / 1000, UTC)
    document: dict[str, Any] = {
        "schema": SCHEMA,
        "event": name,
        "client_id": client_id,
        "at": at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "at_ms": event.at_ms,
        "node_id": event.node_id,
        "client_address": event.client_address or None,
        "connection_id": event.connection_id.hex(),
        "protocol_version": event.protocol_version,
    }
    kind = event.kind
    if kind is EventKind.CONNECTED:
        document |= {
            "reason_code": event.reason_code,
            "clean_start": event.clean_start,
            "persistent": event.persistent,
            "session_expiry_interval": event.session_expiry_interval,
        }
    elif kind is EventKind.DISCONNECTED:
        document |= {
            "reason_code": event.reason_code,
            "reason": _reason(event.reason_code),
            "cause": event.cause.name.lower(),
        }
    elif kind is EventKind.SUBSCRIBED:
        document["subscriptions"] = [
            {"topic_filter": topic_filter, "qos": qos} for topic_filter, qos in event.topic_filters
        ]
    elif kind is EventKind.UNSUBSCRIBED:
        document["topic_filters"] = [topic_filter for topic_filter, _ in event.topic_filters]
    else:
        document |= {
            "persistent": event.persistent,
            "session_expiry_interval": event.session_expiry_interval,
        }
    return document


def formatted_event(client_id: str, event: EventRecord) -> bytes | None:
    """The UTF-8 of :func:`event_json` (compact, keys in schema order), or None when the
    event is not streamed."""
    document = event_json(client_id, event)
    if document is None:
        return None
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
