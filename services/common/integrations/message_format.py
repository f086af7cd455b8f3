"""What a sink receives of one message: the payload as published, or a JSON document of
schema :data:`SCHEMA` (docs/integrations/index.md shows it), and the Kafka headers of the
MQTT 5 User Properties.

The JSON document (UTF-8, one object)::

    {"schema": "cormorant.message/1", "topic": "plant/line-1/temp",
     "client_id": "sensor-7", "qos": 1, "retain": false, "protocol_version": 5,
     "received_at": "2026-11-27T06:00:00.123Z", "received_at_ms": 1795845600123,
     "payload": "21.5", "payload_encoding": "utf-8",
     "properties": {"payload_format_indicator": 1, "content_type": "text/plain",
                    "message_expiry_interval": 60, "response_topic": "...",
                    "correlation_data": "<base64>", "user_properties": [["k", "v"]]}}

``payload`` is the payload as text when it is UTF-8 and declared as text: a Payload Format
Indicator of 1 (MQTT 5.0 3.3.2.3.2), or a Content Type (3.3.2.3.9) of ``text/*``,
``application/json``, ``application/xml`` or ``*+json``/``*+xml``; otherwise (an MQTT 3.1.1
publisher declares nothing) it is base64 (RFC 4648 section 4) and ``payload_encoding`` says
``base64``. ``properties`` holds only the properties the publisher sent. A later schema
version adds fields or changes meanings under a new ``schema`` value; readers check it.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Any

from services.common.integrations.model import PayloadFormat
from services.common.mqtt.properties import Properties
from services.common.records import Headers, PublishMeta

SCHEMA = "cormorant.message/1"
"""The ``schema`` value of the JSON documents this module writes."""

_TEXT_TYPES = ("application/json", "application/xml")
_TEXT_SUFFIXES = ("+json", "+xml")


def declared_text(properties: Properties) -> bool:
    """Whether the publisher declared the payload to be text: Payload Format Indicator 1
    (UTF-8 Encoded Character Data, MQTT 5.0 3.3.2.3.2), or a textual Content Type."""
    if properties.payload_format_indicator == 1:
        return True
    content_type = (properties.content_type or "").split(";", 1)[0].strip().lower()
    return (
        content_type.startswith("text/")
        or content_type in _TEXT_TYPES
        or content_type.endswith(_TEXT_SUFFIXES)
    )


def encoded_payload(payload: bytes, properties: Properties) -> tuple[str, str]:
    """``(payload as JSON text, encoding)``: ``"utf-8"`` when declared text
    (:func:`declared_text`) and valid UTF-8, else ``"base64"``."""
    if declared_text(properties):
        try:
            return payload.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            pass  # declared text but not UTF-8: base64 keeps every byte
    return base64.b64encode(payload).decode("ascii"), "base64"


def _properties_json(properties: Properties) -> dict[str, Any]:
    shown: dict[str, Any] = {}
    if properties.payload_format_indicator is not None:
        shown["payload_format_indicator"] = properties.payload_format_indicator
    if properties.content_type is not None:
        shown["content_type"] = properties.content_type
    if properties.message_expiry_interval is not None:
        shown["message_expiry_interval"] = properties.message_expiry_interval
    if properties.response_topic is not None:
        shown["response_topic"] = properties.response_topic
    if properties.correlation_data is not None:
        shown["correlation_data"] = base64.b64encode(properties.correlation_data).decode("ascii")
    if properties.user_properties:
        shown["user_properties"] = [[name, value] for name, value in properties.user_properties]
    return shown


def message_json(
    client_id: str, meta: PublishMeta, properties: Properties, payload: bytes
) -> dict[str, Any]:
    """The JSON document (:data:`SCHEMA`) of a message published by ``client_id`` with
    ``meta`` (its forwarded ``properties`` decoded) and ``payload``."""
    text, encoding = encoded_payload(payload, properties)
    received = datetime.fromtimestamp(meta.received_at_ms / 1000, UTC)
    return {
        "schema": SCHEMA,
        "topic": meta.topic,
        "client_id": client_id,
        "qos": meta.qos,
        "retain": meta.retain,
        "protocol_version": meta.protocol_version,
        "received_at": received.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "received_at_ms": meta.received_at_ms,
        "payload": text,
        "payload_encoding": encoding,
        "properties": _properties_json(properties),
    }


def formatted(
    payload_format: PayloadFormat,
    client_id: str,
    meta: PublishMeta,
    properties: Properties,
    payload: bytes,
) -> bytes:
    """What the sink writes as the message's value in ``payload_format``: the payload's
    bytes, or the UTF-8 of :func:`message_json` (compact, keys in schema order)."""
    if payload_format is PayloadFormat.RAW:
        return payload
    document = message_json(client_id, meta, properties, payload)
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def user_property_headers(properties: Properties) -> Headers:
    """The message's MQTT 5 User Properties (3.3.2.3.7) as Kafka headers, in wire order,
    names repeated as sent; each value as UTF-8."""
    return [(name, value.encode("utf-8")) for name, value in properties.user_properties]
