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

The marks live in the reader's memory: a reader that restarts (or an APPLICATION client's
feed that starts again on a reconnect) between a router's crash and the copies it routes
again does not know the originals it read before its committed offset. Two failures in a
row, one in each stage, are needed for a copy to pass (docs/guarantees/index.md).
"""

from __future__ import annotations

from collections.abc import Hashable

from services.common.kafka.consumer import Record
from services.common.records import origin_of


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
