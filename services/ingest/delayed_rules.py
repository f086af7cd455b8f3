"""Delayed publication's rules (sans-IO): ``PUBLISH $delayed/<seconds>/<topic>`` publishes
to ``<topic>`` after ``<seconds>`` (EMQX's form; docs/concepts/delayed-publish.md).

:func:`parse_delayed_topic` reads the Topic Name; :func:`services.ingest.handle_publish.
handle_publish` refuses what it rejects, authorizes the target topic, and asks for the
message to be stored in ``msg.delayed`` (:class:`~services.ingest.effects.StoreDelayed`,
whose record :func:`waiting_record` makes). :mod:`services.ingest.delayed_publish` publishes
it when it is due.

How many may wait is bounded (``max_delayed_messages`` in the cluster,
``max_delayed_messages_per_client`` per publisher): :class:`DelayedCounts` counts them as a
process follows ``msg.delayed``, and :meth:`DelayedCounts.refusal` says when one more is
over a bound (the PUBLISH is then refused with 0x97 Quota exceeded, see
:mod:`services.ingest.handle_publish`).
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


class DelayedCounts:
    """The delayed messages waiting in the cluster, as one process knows them: the keys
    (publisher client id, message id) of ``msg.delayed`` whose latest record it read is a
    waiting message, plus those it is storing itself (:meth:`add` at acceptance, so that a
    burst of PUBLISHes in one read is counted before Kafka answers).

    Another node's acceptances count once this process has read them (the ingest nodes and
    the admin service follow ``msg.delayed`` in full): PUBLISHes racing through two nodes
    at once may pass a bound by the few that node has not read yet.
    """

    def __init__(self) -> None:
        self._by_client: dict[str, set[bytes]] = {}
        self.total = 0

    def of(self, client_id: str) -> int:
        """How many delayed messages of ``client_id`` wait."""
        return len(self._by_client.get(client_id, ()))

    def add(self, client_id: str, delayed_id: bytes) -> None:
        """``client_id``'s message ``delayed_id`` waits (idempotent)."""
        ids = self._by_client.setdefault(client_id, set())
        if delayed_id not in ids:
            ids.add(delayed_id)
            self.total += 1

    def remove(self, client_id: str, delayed_id: bytes) -> None:
        """``client_id``'s message ``delayed_id`` waits no more: published, cancelled, or
        its store failed (idempotent)."""
        ids = self._by_client.get(client_id)
        if ids is None or delayed_id not in ids:
            return
        ids.discard(delayed_id)
        self.total -= 1
        if not ids:
            del self._by_client[client_id]

    def refusal(
        self, client_id: str, max_total: int, max_per_client: int, more: int = 1
    ) -> str | None:
        """Why ``more`` delayed messages of ``client_id`` are over the bounds (the settings
        ``max_delayed_messages`` and ``max_delayed_messages_per_client``), for the log and
        the HTTP answer; None: they may wait."""
        if self.total + more > max_total:
            return f"{self.total} delayed messages wait in the cluster (max {max_total})"
        mine = self.of(client_id)
        if mine + more > max_per_client:
            return f"{mine} delayed messages of this client wait (max {max_per_client})"
        return None
