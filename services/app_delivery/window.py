"""The in-flight window of one APPLICATION client over its Kafka partitions (pure, no I/O).

An APPLICATION client reads Kafka partitions: those of its own ``msg.app.<client>`` topic and,
for each Shared Subscription it is a member of, those of the group's topic that Kafka gave
it. Per partition (a :class:`Source`), offsets move through three marks:

- ``low``: every offset below is complete (acknowledged, or never to be sent). It is the
  offset app_delivery commits for the client's consumer group: Kafka holds the client's
  durable position (TBMQ: commit only once the client acknowledged).
- ``sent_upto``: every offset below was sent to the client on some connection. It is
  committed as the offset's metadata *before* the deliveries are sent, so that after any
  crash they are resent with DUP=1 (MQTT 3.3.1.1); so are the offsets of QoS 2 deliveries
  the client answered with PUBREC, which then get PUBREL (MQTT 4.4).
- ``cursor``: every offset below was sent on the current connection (or skipped).

A new connection (MQTT 4.4) moves every cursor back to ``low``: what is unacknowledged goes
again, DUP=1, with its original Packet Identifier, and a QoS 2 delivery already answered by
PUBREC gets PUBREL instead. At most ``limit`` QoS 1/2 deliveries are in flight at once
(MQTT 5.0 3.3.4: the client's Receive Maximum, capped by ``app_inflight_max``).

Packet Identifiers of the client's own topic derive from offsets, so they are the same after
any restart of app_delivery (:func:`packet_id_of`): the own topic's partitions split the
identifiers ``1..OWN_PACKET_IDS`` into equal spans, and a partition never has more than its
span of offsets between ``low`` and its last delivery, so identifiers in flight are unique.
Deliveries from shared topics take the identifiers above (:data:`SHARED_PACKET_IDS`) one by
one, as they are sent: a group's partitions move between members, so their offsets cannot
own identifiers of one client.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from aiokafka import TopicPartition

from services.common.records import AckKind, Origin, Target

log = logging.getLogger(__name__)

OWN_PACKET_IDS = 49_151
"""Packet Identifiers 1..49,151 derive from the offsets of the client's own topic."""

SHARED_PACKET_IDS = range(OWN_PACKET_IDS + 1, 65_536)
"""Packet Identifiers 49,152..65,535 are handed out to deliveries from shared topics."""


def span_of(partitions: int) -> int:
    """Packet Identifiers each partition of a client's own topic of ``partitions`` gets."""
    return OWN_PACKET_IDS // partitions


def packet_id_of(partition: int, offset: int, partitions: int) -> int:
    """The Packet Identifier (1..:data:`OWN_PACKET_IDS`) of the record at ``offset`` in
    ``partition`` of a client's own topic of ``partitions`` partitions.

    ``(offset mod span) + 1``, shifted by the partition's span: unique among the offsets of
    all partitions as long as each partition has fewer than its span in flight."""
    span = span_of(partitions)
    return partition * span + offset % span + 1


@dataclass(slots=True)
class Entry:
    """One fetched record waiting to be delivered or acknowledged.

    ``target`` carries the granted QoS, Retain As Published and Subscription Identifiers;
    ``meta_raw`` and ``payload`` are the record's ``m`` header and value, ``key`` its key;
    ``expires_at_ms`` is when its Message Expiry Interval ends (Unix ms, None: never).
    ``packet_id`` is its Packet Identifier once known (0 until a shared one is assigned);
    ``sent_here``: sent on the current connection; ``released``: PUBREC received (QoS 2).
    ``origin``: where the router found the message in ``msg.all`` (the record's ``o``
    header), sent on with the delivery for a replay's switch (None: the record has none).
    """

    target: Target
    meta_raw: bytes
    payload: bytes
    key: bytes | None
    expires_at_ms: int | None = None
    packet_id: int = 0
    sent_here: bool = False
    released: bool = False
    origin: Origin | None = None


@dataclass(slots=True)
class Delivery:
    """A PUBLISH to send now: ``entry`` with its Packet Identifier (0 for QoS 0) and DUP."""

    tp: TopicPartition
    offset: int
    entry: Entry
    packet_id: int
    dup: bool


@dataclass(slots=True)
class Sendable:
    """What :meth:`ClientWindow.sendable` found to send: ``publishes`` in order, PUBREL for
    ``releases`` (QoS 2 deliveries the client answered with PUBREC on an earlier
    connection), and the new ``sent_upto`` of partitions (``marks``) that must be committed
    before any of it is sent."""

    publishes: list[Delivery] = field(default_factory=list)
    releases: list[Delivery] = field(default_factory=list)
    marks: dict[TopicPartition, int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.publishes or self.releases)


@dataclass(slots=True)
class Source:
    """One Kafka partition the client reads (see the module docstring for the marks).

    ``span`` and ``base``: the Packet Identifiers ``base+1..base+span`` of an own-topic
    partition (``span`` 0: a shared one). ``fetched``: the next offset expected from Kafka.
    ``done``: complete offsets above ``low``; ``gaps``: start → end of offsets Kafka no longer
    has (retention); ``early_releases``: offsets PUBREC'd before they were fetched again.
    """

    low: int
    sent_upto: int
    span: int = 0
    base: int = 0
    cursor: int = 0
    fetched: int = 0
    entries: dict[int, Entry] = field(default_factory=dict)
    done: set[int] = field(default_factory=set)
    gaps: dict[int, int] = field(default_factory=dict)
    early_releases: set[int] = field(default_factory=set)

    def offset_of(self, packet_id: int) -> int | None:
        """The offset an own-topic Packet Identifier stands for: the one offset in
        ``[low, low + span)`` that maps to it, if it was sent; None otherwise."""
        index = packet_id - 1 - self.base
        if not self.span or not 0 <= index < self.span:
            return None
        offset = self.low + (index - self.low) % self.span
        return offset if offset < self.sent_upto else None


class ClientWindow:
    """Deliveries of one client across its partitions, at most ``limit`` QoS 1/2 in flight.

    The caller (:class:`~services.app_delivery.feed.ClientFeed`) adds partitions as it reads
    them, hands in fetched records, asks what to send, commits :meth:`commit_points`, and
    reports acknowledgements and new connections.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.sources: dict[TopicPartition, Source] = {}
        self.in_flight = 0
        # Shared Packet Identifiers in use: by an entry, or by a delivery of a partition that
        # moved to another member and that the connection may still hold (an orphan).
        self._shared_ids: dict[int, tuple[TopicPartition, int] | None] = {}
        self._next_shared = SHARED_PACKET_IDS.start - 1

    # ------------------------------------------------------------------ partitions

    def add_source(
        self,
        tp: TopicPartition,
        low: int,
        sent_upto: int,
        partitions: int | None,
        released: Iterable[int] = (),
    ) -> None:
        """Start reading ``tp`` at ``low`` (its committed offset); ``sent_upto`` and the
        ``released`` offsets (QoS 2 deliveries answered with PUBREC) from the commit's
        metadata. ``partitions``: the own topic's partition count, so that the partition's
        Packet Identifiers derive from offsets; None for a shared topic."""
        span = base = 0
        if partitions is not None:
            span = span_of(partitions)
            base = tp.partition * span
        self.sources[tp] = Source(
            low,
            max(low, sent_upto),
            span,
            base,
            cursor=low,
            fetched=low,
            early_releases={o for o in released if low <= o < sent_upto} if span else set(),
        )

    def remove_source(self, tp: TopicPartition) -> None:
        """Stop reading ``tp`` (it moved to another member of its group). Its deliveries
        still in flight keep their Packet Identifiers, and their place in the window, until
        the client acknowledges them or connects again."""
        source = self.sources.pop(tp, None)
        if source is None:
            return
        for offset, entry in source.entries.items():
            if entry.sent_here and entry.target.qos:
                self._shared_ids[entry.packet_id] = None  # an orphan, still counted
            elif entry.packet_id in self._shared_ids:
                del self._shared_ids[entry.packet_id]
            log.debug("dropped %s@%d with the partition", tp, offset)

    # ------------------------------------------------------------------ records

    def fetched(self, tp: TopicPartition) -> int:
        """The next offset of ``tp`` expected from Kafka (every one below was handed in)."""
        return self.sources[tp].fetched

    def backlog(self) -> int:
        """Fetched records not complete yet (in flight included)."""
        return sum(len(s.entries) for s in self.sources.values())

    def add(self, tp: TopicPartition, offset: int, entry: Entry | None) -> None:
        """A record fetched from ``tp``; ``entry`` None: it is not for this client (another
        session's, undecodable), complete at once. Records of unknown partitions and
        offsets already handed in are ignored."""
        source = self.sources.get(tp)
        if source is None or offset < source.fetched:
            return
        if offset > source.fetched:
            source.gaps[source.fetched] = offset  # deleted by retention before it was read
        source.fetched = offset + 1
        if entry is None or offset in source.done or offset < source.low:
            self._complete(source, offset)
            return
        if source.span:
            entry.packet_id = source.base + offset % source.span + 1
        if offset in source.early_releases:
            source.early_releases.discard(offset)
            entry.released = True
        source.entries[offset] = entry
        self._advance(source)

    # ------------------------------------------------------------------ sending

    def sendable(self, now_ms: int) -> Sendable:
        """What to send now, round robin over the partitions, within the window.

        Marks the deliveries as sent on this connection and raises ``sent_upto``; the
        caller commits the new marks before it sends. QoS 0 records are complete once
        sent, and never sent twice (MQTT 4.3.1); expired records (MQTT 5.0 3.3.2.3.3) are
        complete without being sent, unless they were sent before (DUP).
        """
        out = Sendable()
        progress = True
        while progress:
            progress = False
            for tp, source in self.sources.items():
                if self._step(tp, source, now_ms, out):
                    progress = True
        return out

    def _step(self, tp: TopicPartition, source: Source, now_ms: int, out: Sendable) -> bool:
        """Move ``source``'s cursor past what needs no sending and send at most one record;
        True if something was sent."""
        source.cursor = max(source.cursor, source.low)
        while source.cursor < source.fetched:
            offset = source.cursor
            if offset in source.gaps:
                source.cursor = source.gaps[offset]
                continue
            entry = source.entries.get(offset)
            if entry is None or entry.sent_here:  # complete, or sent on this connection
                source.cursor += 1
                continue
            dup = offset < source.sent_upto
            if entry.target.qos == 0:
                source.cursor += 1
                self._complete(source, offset)
                if dup or (entry.expires_at_ms is not None and entry.expires_at_ms <= now_ms):
                    continue
                out.publishes.append(Delivery(tp, offset, entry, 0, False))
                self._mark(source, tp, offset, out)
                return True
            if self.in_flight >= self.limit:
                return False
            if source.span and offset - source.low >= source.span:
                return False  # its Packet Identifier is still in use
            if entry.released:
                entry.sent_here = True
                self.in_flight += 1
                source.cursor += 1
                out.releases.append(Delivery(tp, offset, entry, entry.packet_id, True))
                return True
            if not dup and entry.expires_at_ms is not None and entry.expires_at_ms <= now_ms:
                source.cursor += 1
                self._complete(source, offset)
                continue
            if not entry.packet_id:
                packet_id = self._allocate()
                if packet_id is None:
                    return False
                entry.packet_id = packet_id
                self._shared_ids[packet_id] = (tp, offset)
            entry.sent_here = True
            self.in_flight += 1
            source.cursor += 1
            out.publishes.append(Delivery(tp, offset, entry, entry.packet_id, dup))
            self._mark(source, tp, offset, out)
            return True
        return False

    @staticmethod
    def _mark(source: Source, tp: TopicPartition, offset: int, out: Sendable) -> None:
        if offset >= source.sent_upto:
            source.sent_upto = offset + 1
            out.marks[tp] = offset + 1

    def _allocate(self) -> int | None:
        """A shared Packet Identifier not in use, or None when all are."""
        if len(self._shared_ids) >= len(SHARED_PACKET_IDS):
            return None
        candidate = self._next_shared
        while True:
            candidate += 1
            if candidate >= SHARED_PACKET_IDS.stop:
                candidate = SHARED_PACKET_IDS.start
            if candidate not in self._shared_ids:
                self._next_shared = candidate
                return candidate

    def unsend(self, deliveries: Iterable[Delivery]) -> None:
        """The downlink records of ``deliveries`` (PUBLISHes or PUBRELs) were not stored:
        send them again on this connection (their ``sent_upto`` mark stays: DUP=1)."""
        for delivery in deliveries:
            source = self.sources.get(delivery.tp)
            entry = None if source is None else source.entries.get(delivery.offset)
            if source is None or entry is None or not entry.sent_here:
                continue
            entry.sent_here = False
            self.in_flight -= 1
            source.cursor = min(source.cursor, delivery.offset)

    def new_connection(self) -> None:
        """The client connected again (MQTT 4.4): everything unacknowledged goes again."""
        for source in self.sources.values():
            source.cursor = source.low
            for entry in source.entries.values():
                entry.sent_here = False
        self._shared_ids = {pid: at for pid, at in self._shared_ids.items() if at is not None}
        self.in_flight = 0

    # ------------------------------------------------------------------ acknowledgements

    def acknowledge(self, kind: AckKind, packet_id: int) -> bool:
        """Apply one acknowledgement from ``client.acks``; True if it changed anything.

        PUBACK (QoS 1) and PUBCOMP (QoS 2) complete a delivery; PUBREC marks a QoS 2 one
        released (MQTT 4.3.2, 4.3.3). An own-topic identifier stands for an offset sent
        before even if its record was not fetched again since a restart; a kind that does
        not fit the delivery's QoS, or an unknown identifier, is ignored.
        """
        if packet_id in self._shared_ids:
            at = self._shared_ids[packet_id]
            if at is None:  # an orphan of a partition that moved
                if kind is not AckKind.PUBREC:
                    del self._shared_ids[packet_id]
                    self.in_flight -= 1
                return True
            tp, offset = at
            return self._apply(self.sources[tp], offset, kind)
        for source in self.sources.values():
            derived = source.offset_of(packet_id)
            if derived is not None:
                return self._apply(source, derived, kind)
        return False

    def _apply(self, source: Source, offset: int, kind: AckKind) -> bool:
        entry = source.entries.get(offset)
        if entry is None:
            if offset < source.low or offset in source.done:
                return False
            if offset >= source.fetched:  # sent before a restart, not fetched again yet
                if kind is AckKind.PUBREC:
                    source.early_releases.add(offset)
                else:
                    source.done.add(offset)
                    source.early_releases.discard(offset)
                    self._advance(source)
                return True
            return False
        expected = {1: (AckKind.PUBACK,), 2: (AckKind.PUBREC, AckKind.PUBCOMP)}
        if kind not in expected.get(entry.target.qos, ()):
            log.info("%r for a QoS %d delivery ignored", kind, entry.target.qos)
            return False
        if kind is AckKind.PUBREC:
            changed = not entry.released
            entry.released = True
            return changed
        self._complete(source, offset)
        return True

    def _complete(self, source: Source, offset: int) -> None:
        entry = source.entries.pop(offset, None)
        if entry is not None:
            if entry.sent_here and entry.target.qos:
                self.in_flight -= 1
            if not source.span and entry.packet_id:
                self._shared_ids.pop(entry.packet_id, None)
        if offset >= source.low:
            source.done.add(offset)
        self._advance(source)

    @staticmethod
    def _advance(source: Source) -> None:
        """Raise ``low`` over complete offsets and gaps."""
        while True:
            if source.low in source.done:
                source.done.discard(source.low)
                source.low += 1
            elif source.low in source.gaps:
                source.low = source.gaps.pop(source.low)
            else:
                return

    # ------------------------------------------------------------------ commits

    def commit_points(self) -> dict[TopicPartition, CommitPoint]:
        """Per partition, what to commit: the offset and what its metadata records."""
        points = {}
        for tp, source in self.sources.items():
            released: tuple[int, ...] = ()
            if source.span:  # a shared identifier means nothing to a restarted instance
                ids = {o for o, e in source.entries.items() if e.released}
                released = tuple(sorted(ids | source.early_releases))
            points[tp] = CommitPoint(source.low, max(source.low, source.sent_upto), released)
        return points


class CommitPoint(NamedTuple):
    """A partition's committed offset (``low``) and its metadata: ``sent_upto`` and the
    offsets answered with PUBREC (``released``: after a restart they get PUBREL, MQTT 4.4)."""

    low: int
    sent_upto: int
    released: tuple[int, ...] = ()


METADATA_MAX = 4000
"""Characters of commit metadata written at most (Kafka's ``offset.metadata.max.bytes`` is
4,096 by default); released offsets that do not fit are left out (they get their PUBLISH
again, DUP=1, which the client answers with PUBREC without delivering it twice)."""


def encode_mark(point: CommitPoint) -> str:
    """The commit metadata of ``point``: ``sent:<sent_upto>`` and, if any, ``;rel:`` and
    the released offsets as distances from ``low``, comma-separated."""
    text = f"sent:{point.sent_upto}"
    if point.released:
        text += ";rel:" + ",".join(str(o - point.low) for o in point.released)
        if len(text) > METADATA_MAX:
            text = text[: text.rindex(",", 0, METADATA_MAX)]
    return text


def decode_mark(metadata: str | None, low: int) -> tuple[int, tuple[int, ...]]:
    """(``sent_upto``, released offsets) from :func:`encode_mark`'s metadata of a commit
    at ``low``; (0, ()) for none or anything else."""
    try:
        sent, _, released = (metadata or "").partition(";rel:")
        if not sent.startswith("sent:"):
            return 0, ()
        offsets = tuple(low + int(d) for d in released.split(",")) if released else ()
        return max(0, int(sent[5:])), offsets
    except ValueError:
        return 0, ()
