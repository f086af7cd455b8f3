"""Delayed publication: ``PUBLISH $delayed/<seconds>/<topic>`` publishes to ``<topic>`` after
``<seconds>`` (EMQX's form; docs/concepts/delayed-publish.md).

:mod:`services.ingest.delayed_rules` reads the Topic Name
(:func:`~services.ingest.delayed_rules.parse_delayed_topic`;
:func:`services.ingest.handle_publish.handle_publish` refuses what it rejects, and authorizes
the target topic). An accepted one is stored in ``msg.delayed``
(:class:`~services.ingest.effects.StoreDelayed`) before it is acknowledged, like any accepted
PUBLISH. The ingest nodes read ``msg.delayed`` in one
consumer group (:attr:`~services.common.kafka.names.TopicNames.delayed_group`); the owner of a
partition times its messages (:class:`DelayedTimers`) and, when one is due, commits its
``msg.all`` record (and ``msg.retained`` record, with RETAIN) with its tombstone in one
transaction of the partition: exactly once through any single crash, by the machinery Will
Messages with a Will Delay Interval use (:mod:`services.ingest.timed_records`).

An administrator's cancel (``DELETE /api/delayed/{id}``) is a request in the partition
(:class:`~services.common.records.DelayedCancel`): the owner that reads it cancels the
message unless its publication is under way, and its tombstone says which happened
(:class:`~services.common.records.DelayedOutcome`; :mod:`services.ingest.timed_records`).
"""

from __future__ import annotations

from services.common.records import DelayedOutcome, DelayedRecord, KafkaRecord, delayed_tombstone
from services.ingest.effects import Publication, published_now
from services.ingest.timed_records import Key, TimedRecords


class DelayedTimers(TimedRecords[DelayedRecord]):
    """The waiting delayed messages of the ``msg.delayed`` partitions this node owns, keyed
    by (publisher client id, message id); each is published when due, stamped with its
    publication time (its Message Expiry Interval runs from then, as a delayed Will
    Message's does, MQTT 5.0 3.1.3.2.4)."""

    what = "delayed message"

    def due_at_ms(self, value: DelayedRecord) -> int:
        """Its arrival plus its delay."""
        return value.due_at_ms

    def tombstone(self, key: Key, outcome: DelayedOutcome) -> KafkaRecord:
        """Its ``msg.delayed`` tombstone, saying how it ended."""
        return delayed_tombstone(self.names, *key, outcome)

    async def at_due(self, key: Key, value: DelayedRecord) -> Publication:
        """Its publication, stamped now."""
        return published_now(value.meta_raw, value.payload, self._clock())
