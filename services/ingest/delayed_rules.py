"""Delayed publication's rules (sans-IO): ``PUBLISH $delayed/<seconds>/<topic>`` publishes
to ``<topic>`` after ``<seconds>`` (EMQX's form; docs/concepts/delayed-publish.md).

:func:`parse_delayed_topic` reads the Topic Name; :func:`services.ingest.handle_publish.
handle_publish` refuses what it rejects, authorizes the target topic, and asks for the
message to be stored in ``msg.delayed`` (:class:`~services.ingest.effects.StoreDelayed`,
whose record :func:`waiting_record` makes). :mod:`services.ingest.delayed_publish` publishes
it when it is due.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.common.mqtt.errors import MQTTError, TopicNameInvalid
from services.common.records import DelayedRecord, encode_meta
from services.common.topics.validation import validate_topic_name
from services.ingest.effects import StoreDelayed

DELAYED_PREFIX = "$delayed/"
"""The Topic Name prefix of a delayed publication (case-sensitive, as EMQX's)."""


@dataclass(frozen=True, slots=True)
class DelayedTopic:
    """A parsed ``$delayed/<seconds>/<topic>`` Topic Name: ``delay_seconds`` and the target
    ``topic`` (a valid Topic Name without wildcards, not ``$``-prefixed)."""

    delay_seconds: int
    topic: str


def parse_delayed_topic(name: str, max_delay_seconds: int) -> DelayedTopic | None:
    """Read a PUBLISH Topic Name (already a valid one, MQTT 4.7.3): None if it is not
    ``$delayed/``-prefixed, else its delay and target topic.

    ``<seconds>`` is a decimal integer 0..``max_delay_seconds`` (ASCII digits only); the
    target is a Topic Name (MQTT 4.7.1, 4.7.3: no ``+`` or ``#``) that does not start with
    ``$``: topics starting with ``$`` are the server's (MQTT 4.7.2), and a delayed message
    to another ``$delayed/`` topic would be delayed twice. Raises
    :class:`~services.common.mqtt.errors.TopicNameInvalid` (Reason Code 0x90 Topic Name
    invalid) when it does not hold.
    """
    if not name.startswith(DELAYED_PREFIX):
        return None
    seconds, separator, topic = name[len(DELAYED_PREFIX) :].partition("/")
    if not separator:
        raise TopicNameInvalid(f"{name!r} is not $delayed/<seconds>/<topic>")
    if not (seconds.isascii() and seconds.isdigit()) or len(seconds) > 10:
        raise TopicNameInvalid(f"the delay of {name!r} is not a number of seconds")
    delay = int(seconds)
    if delay > max_delay_seconds:
        raise TopicNameInvalid(f"a delay of {delay} s is over the {max_delay_seconds} s maximum")
    if topic.startswith("$"):
        raise TopicNameInvalid(f"a delayed message cannot be published to {topic!r} ($-topics)")
    try:
        validate_topic_name(topic)
    except MQTTError as exc:
        raise TopicNameInvalid(f"the target topic of {name!r}: {exc.message}") from None
    return DelayedTopic(delay, topic)


def waiting_record(client_id: str, delayed: StoreDelayed) -> DelayedRecord:
    """The ``msg.delayed`` record of ``client_id``'s delayed message: due
    ``delay_seconds`` after it arrived (``meta.received_at_ms``)."""
    return DelayedRecord(
        client_id,
        delayed.delayed_id,
        delayed.meta.received_at_ms + delayed.delay_seconds * 1000,
        encode_meta(delayed.meta),
        delayed.payload,
    )
