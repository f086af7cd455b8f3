"""The record format of ``integrations.dead-letter`` (:attr:`~services.common.kafka.names.
TopicNames.integrations_dead_letter`): a message an integration gave up on, its webhook
having failed every attempt (docs/integrations/webhook.md shows it).

- key: the publisher's Client Identifier (UTF-8), so a publisher's dead letters stay in one
  partition, in order;
- value: the message exactly as the integration would have sent it (its payload format:
  the ``cormorant.message/1`` JSON document, or the payload's bytes);
- headers (UTF-8 values): ``dead_letter`` (the format, :data:`FORMAT`), ``integration``
  (its name), ``integration_id``, ``mqtt_topic`` (the Topic Name), ``attempts`` (a
  decimal), ``error`` (the last attempt's failure, one line, never a secret) and
  ``failed_at_ms`` (Unix milliseconds).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from services.common.kafka.names import TopicNames
from services.common.records import Headers, KafkaRecord, RecordError

FORMAT = "cormorant.dead-letter/1"
"""The ``dead_letter`` header of the records this module writes; a later layout has
another value."""


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One dead letter (see the module): ``value`` as the integration would have sent it."""

    client_id: str
    mqtt_topic: str
    value: bytes
    integration: str
    integration_id: uuid.UUID
    attempts: int
    error: str
    failed_at_ms: int


def dead_letter_record(names: TopicNames, letter: DeadLetter) -> KafkaRecord:
    """The ``integrations.dead-letter`` record of ``letter``."""
    headers: Headers = [
        ("dead_letter", FORMAT.encode()),
        ("integration", letter.integration.encode()),
        ("integration_id", str(letter.integration_id).encode()),
        ("mqtt_topic", letter.mqtt_topic.encode()),
        ("attempts", str(letter.attempts).encode()),
        ("error", letter.error.encode()),
        ("failed_at_ms", str(letter.failed_at_ms).encode()),
    ]
    return KafkaRecord(
        names.integrations_dead_letter, letter.client_id.encode(), letter.value, headers
    )


def parse_dead_letter(key: bytes | None, value: bytes | None, headers: Headers) -> DeadLetter:
    """The :class:`DeadLetter` of a record :func:`dead_letter_record` wrote. Raises
    :class:`~services.common.records.RecordError` for another format or a malformed one."""
    found = dict(headers)
    if found.get("dead_letter") != FORMAT.encode():
        raise RecordError(f"not a {FORMAT} record: {found.get('dead_letter')!r}")
    if key is None or value is None:
        raise RecordError("a dead letter without key or value")
    try:
        return DeadLetter(
            client_id=key.decode(),
            mqtt_topic=found["mqtt_topic"].decode(),
            value=value,
            integration=found["integration"].decode(),
            integration_id=uuid.UUID(found["integration_id"].decode()),
            attempts=int(found["attempts"]),
            error=found["error"].decode(),
            failed_at_ms=int(found["failed_at_ms"]),
        )
    except (KeyError, ValueError) as exc:
        raise RecordError(f"malformed dead letter: {exc!r}") from None
