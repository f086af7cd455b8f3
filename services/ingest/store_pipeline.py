"""The ingest node's Kafka writes: each connection's ``Store*`` effects, in order, with
backpressure.

Every connection's store effects go to Kafka one by one in the order the connection asked
for them (a Will Message behind the client's last PUBLISHes, MQTT 4.6); their
acknowledgements come back concurrently and are handed to the node (``on_stored`` with
the record's metadata, or ``on_failed``) when Kafka answers, or as failed after
``request_timeout`` seconds. A Will Message that waits out its delay
(:class:`~services.ingest.effects.StoreWill`) is the exception: nothing after it (the end
of the connection's session) is sent until Kafka has it or the timeout passed, so a session
never reads as ended while its waiting will could still die with this node.

The producer is idempotent and retries until Kafka answers, so a record the node stopped
waiting for may still be stored later, in its place among the connection's records: a
PUBLISH refused for a timeout (PUBACK 0x80, or a closed v3.1.1 connection) can still be
delivered once Kafka is back (docs/guarantees/index.md). Records nobody
waits for (the end records of a previous process's sessions) are written with
:meth:`StorePipeline.write_logged`: a failure is only logged.

A PUBLISH that Kafka did not store (the producer refused it, failed it, or did not answer
in time) fails the connection's PUBLISHes still queued behind it, instead of handing them
to the producer: written, they would be stored ahead of the failed one, which the client
sends again later (v3.1.1, after reconnecting) — a reordering (MQTT 4.6). The producer
keeps the order of what it was handed (idempotence), so only what was not handed yet needs
this.

A subscription record whose new subscriptions carry an empty
:class:`~services.common.subscription.LiveFrom` cut waits, in its place in the queue, for the
``msg.all`` end offsets (``read_live_from``), read after the SUBSCRIBE arrived: every
PUBLISH with RETAIN acknowledged before it lies below them. If they cannot be read, the
record fails as a store Kafka refused.

Backpressure: when ``max_pending`` records wait to be sent or answered, a client whose
PUBLISH adds one more stops being read (its sends back up in TCP) until the pending records
fall to half, so a flood slows its senders instead of making Kafka time out everyone's
records.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from functools import partial

from services.common.faust_app import SendRecord
from services.common.kafka.names import TopicNames
from services.common.metrics import MQTT
from services.common.records import (
    KafkaRecord,
    client_acks_record,
    client_session_record,
    client_subscriptions_record,
    delayed_record,
    publish_record,
    retained_record,
    retained_request_record,
    will_record,
)
from services.ingest import delayed_rules
from services.ingest.effects import (
    StoreAcks,
    StoreDelayed,
    StoreEffect,
    StorePublish,
    StoreRetained,
    StoreSession,
    StoreSubscriptions,
    StoreWill,
)
from services.ingest.registry import Client
from services.ingest.will_rules import waiting_record

log = logging.getLogger(__name__)

#: Seconds between two looks for records Kafka has not answered in time (timeouts are
#: seconds long).
SWEEP_SECONDS = 0.5


def record_of(names: TopicNames, client_id: str, effect: StoreEffect) -> KafkaRecord:
    """The Kafka record a store effect of ``client_id``'s connection writes."""
    if isinstance(effect, StorePublish):
        return publish_record(names, client_id, effect.meta, effect.payload)
    if isinstance(effect, StoreRetained):
        return retained_record(names, effect.meta, effect.payload)
    if isinstance(effect, StoreSubscriptions):
        return client_subscriptions_record(names, client_id, effect.subscriptions, effect.deletes)
    if isinstance(effect, StoreSession):
        return client_session_record(names, client_id, effect.record, effect.deletes)
    if isinstance(effect, StoreAcks):
        return client_acks_record(names, client_id, effect.record)
    if isinstance(effect, StoreWill):
        return will_record(names, waiting_record(client_id, effect))
    if isinstance(effect, StoreDelayed):
        return delayed_record(names, delayed_rules.waiting_record(client_id, effect))
    return retained_request_record(names, client_id, effect.subscriptions)


@dataclass
class _Queue:
    """Store effects of one connection not yet handed to the producer, and its sender."""

    items: deque[StoreEffect] = field(default_factory=deque)
    task: asyncio.Task[None] | None = None
    #: A PUBLISH of the connection was not stored: the PUBLISHes queued behind it fail too.
    refusing: bool = False


Stored = Callable[[Client, StoreEffect, object], None]
"""Told that Kafka stored a client's effect, with the record's metadata (it has an
``offset``)."""

Failed = Callable[[Client, StoreEffect], None]
"""Told that a client's effect was not stored (refused, or not answered in time)."""

ReadLiveFrom = Callable[[], Awaitable[tuple[int, ...]]]
"""The end offsets of ``msg.all``, one per partition, read from Kafka after the call."""


class StorePipeline:
    """The Kafka writes of this node's connections (see the module's docstring).

    ``send`` produces a record; ``names`` gives topic names; ``request_timeout`` (seconds)
    bounds the wait for each answer; ``max_pending`` is the backpressure threshold
    (``ingest_max_pending_records``); ``read_live_from`` fills the subscriptions'
    :class:`~services.common.subscription.LiveFrom` cuts (None: they are stored without).
    """

    def __init__(
        self,
        send: SendRecord,
        names: TopicNames,
        request_timeout: float,
        max_pending: int,
        on_stored: Stored,
        on_failed: Failed,
        read_live_from: ReadLiveFrom | None = None,
    ) -> None:
        self.names = names
        self._read_live_from = read_live_from
        self.request_timeout = request_timeout
        self.max_pending = max_pending
        self._send = send
        self._on_stored = on_stored
        self._on_failed = on_failed
        self._queues: dict[Client, _Queue] = {}
        self._background: set[asyncio.Task[None]] = set()
        # Records sent and not yet answered: key → (deadline on the loop clock, client, effect).
        self._watched: dict[int, tuple[float, Client, StoreEffect]] = {}
        self._next_watch = 0
        self._sweeper: asyncio.Task[None] | None = None
        # Store effects queued and not yet handed to the producer, and the publishing
        # clients whose reading is paused until the pending records fall to half.
        self._unsent = 0
        self._paused: set[Client] = set()

    @property
    def pending_records(self) -> int:
        """Store effects waiting to be sent to Kafka or for its answer."""
        return self._unsent + len(self._watched)

    def enqueue(self, client: Client, effect: StoreEffect) -> None:
        """Write ``effect`` of ``client``'s connection after its earlier ones; a PUBLISH
        past the backpressure threshold pauses the client's reading."""
        queue = self._queues.get(client)
        if queue is None:
            queue = self._queues[client] = _Queue()
        queue.items.append(effect)
        self._unsent += 1
        if queue.task is None:
            queue.task = asyncio.create_task(self._drain(client, queue))
        if (
            isinstance(effect, StorePublish | StoreDelayed)
            and client not in self._paused
            and self.pending_records >= self.max_pending
        ):
            # Every byte read would become one more record to wait for: let TCP hold the
            # client's PUBLISHes instead of the producer's buffer, which times out.
            client.pause_reading()
            self._paused.add(client)
            if len(self._paused) == 1:
                MQTT.backpressure_pauses += 1
                log.info("%d records wait for Kafka: pausing reads", self.pending_records)

    def forget(self, client: Client) -> None:
        """``client``'s socket closed: it is not paused any more (its queued effects are
        still written)."""
        self._paused.discard(client)

    def background(self, coroutine: Coroutine[object, object, None]) -> None:
        """Run ``coroutine`` as a task that :meth:`in_flight` reports until it ends."""
        task = asyncio.create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def write_logged(self, record: KafkaRecord) -> None:
        """Write one record nobody waits for, in the background; a failure is logged."""
        self.background(self._write_logged(record))

    async def write_all_logged(self, records: list[KafkaRecord]) -> None:
        """Write ``records`` nobody waits for and return once each is stored or failed
        (failures are logged)."""
        await asyncio.gather(*(self._write_logged(record) for record in records))

    async def _write_logged(self, record: KafkaRecord) -> None:
        try:
            pending = await self._send(*record)
            await asyncio.wait_for(pending, self.request_timeout)
        except Exception as exc:
            log.warning("could not write a record of %r to %s: %r", record.key, record.topic, exc)

    def in_flight(self) -> set[asyncio.Task[None]]:
        """Tasks still writing records: the queues' senders, background writes, and the
        sweeper, which runs until every watched record is answered or timed out."""
        tasks = {q.task for q in self._queues.values() if q.task is not None} | self._background
        if self._sweeper is not None and not self._sweeper.done():
            tasks.add(self._sweeper)
        return tasks

    # ------------------------------------------------------------------------------ sending

    def _resume_if_drained(self) -> None:
        if self._paused and self.pending_records <= self.max_pending // 2:
            paused, self._paused = self._paused, set()
            for client in paused:
                client.resume_reading()

    async def _drain(self, client: Client, queue: _Queue) -> None:
        """Send queued store effects in order; their acknowledgements complete concurrently."""
        try:
            while queue.items:
                effect = queue.items[0]
                if queue.refusing and isinstance(effect, StorePublish):
                    self._sent(queue)
                    self._failed(client, effect)
                    continue
                try:
                    if isinstance(effect, StoreSubscriptions):
                        await self._cut(effect)
                    record = record_of(self.names, client.connection.client_id, effect)
                    pending = await self._send(*record)
                except Exception as exc:  # Kafka unreachable or the record refused
                    log.warning("could not queue a %s record: %r", type(effect).__name__, exc)
                    self._sent(queue)
                    self._failed(client, effect)
                    continue
                self._sent(queue)
                answered = self._watch(client, effect, pending)
                if isinstance(effect, StoreWill):
                    # Stored before the session's end is written (or given up on).
                    await asyncio.wait([answered], timeout=self.request_timeout)
        finally:
            queue.task = None
            self._unsent -= len(queue.items)  # cancelled at shutdown: never to be sent
            queue.items.clear()
            self._queues.pop(client, None)
            self._resume_if_drained()

    async def _cut(self, effect: StoreSubscriptions) -> None:
        """Fill the empty :class:`~services.common.subscription.LiveFrom` cuts of
        ``effect``'s subscriptions with ``msg.all``'s end offsets, read now. Raises
        ``TimeoutError`` after ``request_timeout`` seconds, or what Kafka raised."""
        cuts = [
            sub.live_from
            for sub in effect.subscriptions
            if sub.live_from is not None and sub.live_from.offsets is None
        ]
        if cuts and self._read_live_from is not None:
            offsets = await asyncio.wait_for(self._read_live_from(), self.request_timeout)
            for cut in cuts:
                cut.offsets = offsets

    def _sent(self, queue: _Queue) -> None:
        queue.items.popleft()
        self._unsent -= 1

    def _failed(self, client: Client, effect: StoreEffect) -> None:
        """Tell the node that ``effect`` was not stored; after a PUBLISH, refuse the
        client's PUBLISHes queued behind it (the module's docstring)."""
        if isinstance(effect, StorePublish) and (queue := self._queues.get(client)) is not None:
            queue.refusing = True
        self._on_failed(client, effect)
        self._resume_if_drained()

    def _watch(
        self, client: Client, effect: StoreEffect, pending: Awaitable[object]
    ) -> asyncio.Future[object]:
        """Hand Kafka's answer for ``effect`` to the node when it comes, or a failure after
        ``request_timeout``; returns the answer's future. A done-callback and one sweeper
        for all, not a task with a timeout per record: those cost more than the send
        itself."""
        future = asyncio.ensure_future(pending)
        key = self._next_watch
        self._next_watch += 1
        # time.monotonic, not the loop's clock: asking for the running loop per record
        # showed in the profile (bench/NOTES.md, "issue 30 part 1: CPU per message").
        deadline = time.monotonic() + self.request_timeout
        self._watched[key] = (deadline, client, effect)
        future.add_done_callback(partial(self._answered, key))
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.create_task(self._sweep())
        return future

    def _answered(self, key: int, future: asyncio.Future[object]) -> None:
        watched = self._watched.pop(key, None)
        if watched is None:
            return  # timed out already
        self._resume_if_drained()
        _, client, effect = watched
        error = future.exception() if not future.cancelled() else asyncio.CancelledError()
        if error is not None:
            log.warning(
                "Kafka did not store a record of %r: %r", client.connection.client_id, error
            )
            self._failed(client, effect)
        else:
            self._on_stored(client, effect, future.result())

    async def _sweep(self) -> None:
        """Fail the watched records Kafka has not answered in time, until none is left.

        Every record gets the same timeout, so deadlines grow in insertion order and the
        sweep stops at the first one still running."""
        while self._watched:
            now = time.monotonic()
            for key, (deadline, client, effect) in list(self._watched.items()):
                if deadline > now:
                    break
                del self._watched[key]
                log.warning("Kafka did not answer for a record of %r", client.connection.client_id)
                self._failed(client, effect)
            self._resume_if_drained()
            await asyncio.sleep(SWEEP_SECONDS)
