"""Exactly once without router transactions: readers drop what a router routed twice.

The router commits its ``msg.all`` offsets after what it wrote is stored (at least once),
so a router that crashes routes the records after its last commit again, and so does a
router that is handed a partition another one was still routing. Each record it writes
carries its :class:`~services.common.records.Origin` (``msg.all`` partition, offset, and an
index among the records of the same topic and key written for that one). The router writes
a partition's records in offset order, so in any partition it writes to, the origins of
one ``msg.all`` partition only grow, except where records are routed again: those repeat
origins the reader has passed already.

:class:`RerouteFilter` keeps, per (topic, partition, scope, ``msg.all`` partition), the
highest origin read and the offset of the record that carried it. A record whose origin is
not above it is a copy routed again when it stands after that record, and is dropped; when
it stands at or before it, the reader is reading its partition again (a batch retried after
a failure, a rewind), which the reader's own offset bookkeeping handles as before
(device_persist's store skips offsets it has stored; app_delivery's window its sent marks),
so it passes. Copies routed again always stand after their originals: they are written
after the first routing's records were acknowledged (the router commits only then).

Why it is enough: a router routes a ``msg.all`` record again only if it had not committed
past it, and the second routing writes each output after the first routing's outputs of
that record and of every earlier one (their writes were acknowledged before the router
commits, or the crashed router's writes precede the restart). Where the second routing
differs from the first (a subscription changed in between), the first counts: it was made
after the state barrier, so it honoured every subscription acknowledged before the PUBLISH
(docs/architecture.md, "Ordering"); a subscriber only the second routing found gets
nothing of that message, as it would not have with a first routing made a moment earlier.

The marks live in the reader's memory. A reader given a partition (at start, or when its
group moves one to it) that resumes at a committed offset reads back what precedes it
first (:func:`recall`, device_persist: :data:`RECALL_SECONDS` of it), so a copy that comes
after the offset of an original that stood before it is still known. The ingest nodes read
their downlink from its end (a restarted node has no connection that got anything), and
app_delivery keeps a client's marks across its connections (docs/guarantees/index.md).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Hashable

from aiokafka import TopicPartition

from services.common.clock import now_ms
from services.common.kafka.consumer import Record, make_consumer
from services.common.records import RecordError, origin_of
from services.common.settings import Settings

log = logging.getLogger(__name__)

#: Seconds of records before a partition's committed offset that :func:`recall` reads
#: back: beyond what a router routes again after a crash (its commit interval, 0.2 s) and
#: the seconds until it routes again (a restart, or the group handing the partition on
#: after the consumer session timeout, 6 s by default).
RECALL_SECONDS = 60.0

#: Seconds :func:`recall` waits for a fetch before it gives the partitions up (logged).
RECALL_FETCH_SECONDS = 10.0


class RerouteFilter:
    """The marks of one reader (module docstring). Not thread-safe; one per consumer loop."""

    def __init__(self) -> None:
        # (topic, partition, scope, msg.all partition) → (offset, index, own offset).
        self._marks: dict[tuple[str, int, Hashable, int], tuple[int, int, int]] = {}
        #: Records dropped as routed twice, since start.
        self.dropped = 0

    def first(self, record: Record, scope: Hashable = None) -> bool:
        """Whether ``record`` is not a copy routed again of one read before: False drops
        it. ``scope`` splits a partition where one ``msg.all`` record has outputs for
        subscribers under different keys (``msg.persisted``: the subscriber's client id,
        its key): the router numbers the outputs of a record per topic and key.
        A record without an origin (not routed, or by an older router) passes. Raises
        :class:`~services.common.records.RecordError` for a malformed origin."""
        origin = origin_of(record.headers)
        if origin is None:
            return True
        key = (record.topic, record.partition, scope, origin.partition)
        mark = self._marks.get(key)
        seen = (origin.offset, origin.index)
        if mark is not None and seen <= mark[:2]:
            if record.offset > mark[2]:
                self.dropped += 1
                return False
            return True  # read again: the reader's own bookkeeping handles it
        self._marks[key] = (origin.offset, origin.index, record.offset)
        return True


async def recall(
    settings: Settings,
    group: str,
    reroutes: RerouteFilter,
    partitions: set[TopicPartition],
    scope: Callable[[Record], Hashable],
    seconds: float = RECALL_SECONDS,
) -> int:
    """Read into ``reroutes`` the records of ``partitions`` written in the last ``seconds``
    (by record timestamp) before consumer group ``group``'s committed offset in each, as
    :meth:`RerouteFilter.first` reads records (``scope`` gives each record's scope);
    nothing is applied. A partition without a committed offset is skipped (its reader
    starts at its beginning and reads everything itself). Returns how many records were
    read. A Kafka error or no record within :data:`RECALL_FETCH_SECONDS` is logged and
    ends the recall early: the reader goes on without those marks."""
    consumer = make_consumer(settings, group_id=group)
    read = 0
    try:
        await consumer.start()
        starts: dict[TopicPartition, int] = {}
        for tp in partitions:
            committed = await consumer.committed(tp)
            if committed:
                starts[tp] = committed
        if not starts:
            return 0
        consumer.assign(list(starts))
        beginnings = await consumer.beginning_offsets(list(starts))
        found = await consumer.offsets_for_times(
            dict.fromkeys(starts, now_ms() - int(seconds * 1000))
        )
        ends: dict[TopicPartition, int] = {}
        for tp, start in starts.items():
            at = found.get(tp)  # None: every record is older than the window
            first = max(beginnings[tp], start if at is None else at.offset)
            if first < start:
                consumer.seek(tp, first)
                ends[tp] = start
        while ends:
            batches = await consumer.getmany(*ends, timeout_ms=int(RECALL_FETCH_SECONDS * 1000))
            if not batches:
                log.warning(
                    "recall of %s: no record within %s s", sorted(ends), RECALL_FETCH_SECONDS
                )
                break
            for tp, records in batches.items():
                end = ends.get(tp, 0)
                for record in records:
                    if record.offset >= end:
                        break
                    read += 1
                    with contextlib.suppress(RecordError):  # the reader logs it when it reads it
                        reroutes.first(record, scope(record))
            for tp in list(ends):
                if await consumer.position(tp) >= ends[tp]:
                    del ends[tp]
    except Exception as exc:  # a best effort: the reader goes on without the marks
        log.warning("recall of %s stopped: %r", sorted(partitions), exc)
    finally:
        await consumer.stop()
    return read
