"""Delivery at least once, for sinks that cannot join a Kafka transaction (the HTTP
webhook, :mod:`.webhook`; the MQTT bridge): what the stage runs for them instead of the
Kafka sink's transactions (:mod:`.kafka_sink`).

:func:`consume_at_least_once` reads ``msg.all`` in the integration's own consumer group,
hands the messages the integration takes (:mod:`.matching`) to the sink's
:class:`Deliverer`, and commits the records' next offsets in that group only once
:meth:`Deliverer.deliver` returned: then every message of them is delivered (or, for the
webhook, dead-lettered). One round at a time: the next records are handed over only after
the previous ones are committed, so each partition's records (each publisher's, hence each
Client Identifier's, messages in the order accepted) reach the deliverer in order, and a
deliverer keeps the order of a Client Identifier's messages within one call.

A deliverer that raises fails the round: nothing of it is committed, and the stage starts
the integration again (:class:`~.stage.IntegrationRunner`), which reads again from the
last committed offsets. So a restart, a crash or a failure re-sends at most the records of
the round in flight (up to :data:`ROUND_MAX` records), some of which may have been
delivered already: at least once, never lost.

When the group moves partitions (another stage instance joins or leaves), the round being
delivered finishes and commits before they are let go, and a round still gathering drops
its records of them: a partition's messages are never sent by two owners at once, and the
next owner starts after the last committed round. A partition assigned here is handed out
only once it has been placed at its committed offset (or its start): nothing is sent
twice, nor from before an integration's start, because aiokafka fetched first from its own
reset position (:class:`_Rounds`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata

from services.common.integrations.model import Integration
from services.common.kafka.consumer import Record
from services.common.settings import Settings
from services.integrations.matching import Matcher, Outgoing

if TYPE_CHECKING:
    from services.integrations.stage import IntegrationCounters

log = logging.getLogger(__name__)

ROUND_MAX = 2000
"""Most ``msg.all`` records read in one round (delivered, then committed, together)."""

FETCH_WAIT_SECONDS = 0.5
"""Longest wait for records when none are there (then the round ends with none)."""


@dataclass(frozen=True, slots=True)
class Gathering:
    """How a round gathers messages: it takes what is there (up to :data:`ROUND_MAX`
    records), and when that holds fewer than ``max_messages`` messages the integration
    takes, it reads more for up to ``linger_seconds`` after the first of them, until it
    holds ``max_messages`` (a fetch may bring more). With no linger, a round takes what is
    there."""

    max_messages: int = ROUND_MAX
    linger_seconds: float = 0.0


class Deliverer(Protocol):
    """A sink that delivers messages at least once. :meth:`start` before use, :meth:`close`
    after; ``gathering`` says how rounds gather messages for it."""

    gathering: Gathering

    async def start(self) -> None:
        """Get ready (connect). Raises when the sink cannot be reached: the integration is
        started again after a backoff."""

    async def deliver(self, messages: Sequence[Outgoing]) -> None:
        """Deliver ``messages`` (in ``msg.all`` order per partition: in the order their
        publisher's messages were accepted), keeping the order of each Client
        Identifier's messages; return once each is delivered (or set aside as the sink
        defines, like a webhook's dead letters). Raises when that cannot be done: none of
        them then counts as delivered, and all are delivered again."""

    async def close(self) -> None:
        """Release what :meth:`start` took."""


MakeDeliverer = Callable[[Settings, Integration, "IntegrationCounters"], Deliverer]
"""Builds a kind's :class:`Deliverer` for an integration; it keeps ``counters`` up to
date (sent, failed, retried, dead-lettered, the last error)."""


class _Rounds(ConsumerRebalanceListener):  # type: ignore[misc]
    """The rebalance listener, and where each assigned partition starts.

    A revoked partition is let go only once the round being delivered is committed (its
    next owner starts after it); records of it gathered but not delivered yet are dropped
    (:attr:`revoked`: the next owner delivers them), so the old and the new owner never
    send a partition's messages at the same time. An assigned partition is paused at once
    and stays paused until :meth:`place` has put it at its committed offset, or else at
    ``start_offset``'s: aiokafka starts fetching a new assignment at once, from the
    committed offset or else by ``auto_offset_reset``, and hands those records out before
    this listener's seek (a new integration's first round held records from before its
    start, then the seek read them again: a client's messages sent twice, issue 27).
    """

    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        start_offset: Callable[[TopicPartition], Awaitable[int]],
        done: dict[TopicPartition, int],
    ) -> None:
        self.consumer = consumer
        self.start_offset = start_offset
        self.done = done
        self.lock = asyncio.Lock()
        self.unplaced: set[TopicPartition] = set()
        self.revoked: set[TopicPartition] = set()
        self.changes = 0

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        """Wait for the round being delivered (it commits what it delivered)."""
        async with self.lock:
            self.changes += 1
            self.revoked.update(revoked)
            for tp in revoked:
                self.done.pop(tp, None)
                self.unplaced.discard(tp)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        """Pause ``assigned`` until :meth:`place` placed them. Nothing slow here: aiokafka
        sends no heartbeat while this runs."""
        self.changes += 1
        self.consumer.pause(*assigned)
        self.unplaced.update(assigned)

    async def place(self) -> None:
        """Put each partition assigned since the last call at its committed offset, or
        else at ``start_offset``'s, and resume it. Under :attr:`lock`. Raises
        ``KafkaError`` when Kafka does not answer (the runner starts again)."""
        while self.unplaced:
            changes = self.changes
            tp = min(self.unplaced)
            offset = await self.consumer.committed(tp)
            if offset is None:
                offset = await self.start_offset(tp)
            if self.changes != changes:
                continue  # the assignment changed meanwhile: ask again
            self.unplaced.discard(tp)
            self.consumer.seek(tp, offset)
            self.consumer.resume(tp)
            self.done[tp] = offset


async def _gather(
    consumer: AIOKafkaConsumer,
    matcher: Matcher,
    gathering: Gathering,
    revoked: set[TopicPartition],
) -> tuple[dict[TopicPartition, list[Record]], dict[TopicPartition, list[Outgoing]]]:
    """One round's records and the messages the integration takes of them, per partition
    (in order), gathered as ``gathering`` says: the first fetch waits up to
    :data:`FETCH_WAIT_SECONDS` and takes what is there (up to :data:`ROUND_MAX` records);
    when it brought messages, more are read until the linger is over, the round holds
    enough messages or records, or a partition is ``revoked`` (the round is cut short:
    its records of revoked partitions are dropped anyway; seen within
    :data:`FETCH_WAIT_SECONDS`)."""
    batches: dict[TopicPartition, list[Record]] = {}
    messages: dict[TopicPartition, list[Outgoing]] = {}
    taken = 0

    def add(fetched: dict[TopicPartition, list[Record]]) -> int:
        nonlocal taken
        for tp, records in fetched.items():
            batches.setdefault(tp, []).extend(records)
            outgoing = matcher.outgoing_of(records)
            messages.setdefault(tp, []).extend(outgoing)
            taken += len(outgoing)
        return sum(len(records) for records in fetched.values())

    wait_ms = int(FETCH_WAIT_SECONDS * 1000)
    read = add(await consumer.getmany(timeout_ms=wait_ms, max_records=ROUND_MAX))
    deadline = time.monotonic() + gathering.linger_seconds
    while taken and taken < gathering.max_messages and read < ROUND_MAX and not revoked:
        wait = min(deadline - time.monotonic(), FETCH_WAIT_SECONDS)
        if wait <= 0:
            break
        # In slices: a revocation is seen within one (a fetch does not end early for it).
        fetched = await consumer.getmany(
            timeout_ms=max(1, int(wait * 1000)), max_records=ROUND_MAX - read
        )
        read += add(fetched)
    return batches, messages


async def consume_at_least_once(
    consumer: AIOKafkaConsumer,
    topic: str,
    matcher: Matcher,
    deliverer: Deliverer,
    counters: IntegrationCounters,
    start_offset: Callable[[TopicPartition], Awaitable[int]],
    done: dict[TopicPartition, int],
) -> None:
    """Deliver the messages of ``topic`` (``msg.all``) that ``matcher`` takes through
    ``deliverer``, at least once (see the module), until cancelled or the deliverer raises
    (which is raised). ``consumer`` is started, in the integration's consumer group, and
    not subscribed yet; a partition without a committed offset starts at
    ``start_offset(tp)``; ``done`` is kept at each partition's committed offset (the lag).
    A failed commit is logged and left to the next round's (which covers it)."""
    rounds = _Rounds(consumer, start_offset, done)
    consumer.subscribe([topic], listener=rounds)
    while True:
        async with rounds.lock:
            await rounds.place()
            rounds.revoked.clear()
        # Not under the lock: a fetch waits while the group rebalances, and the rebalance
        # waits for the revocation callback, which takes the lock.
        batches, messages = await _gather(consumer, matcher, deliverer.gathering, rounds.revoked)
        counters.unwritable(matcher.take_unwritable())
        async with rounds.lock:
            for tp in rounds.revoked:
                batches.pop(tp, None)
                messages.pop(tp, None)
            outgoing = [message for taken in messages.values() for message in taken]
            if outgoing:
                await deliverer.deliver(outgoing)
            if not batches:
                continue
            offsets = {
                tp: OffsetAndMetadata(records[-1].offset + 1, "") for tp, records in batches.items()
            }
            try:
                await consumer.commit(offsets)
            except KafkaError as exc:
                log.warning(
                    "integration %s: offsets not committed (a restart re-sends them): %r",
                    matcher.integration.name,
                    exc,
                )
                continue
            done.update({tp: meta.offset for tp, meta in offsets.items()})
