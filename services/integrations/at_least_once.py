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
    """The rebalance listener: a revoked partition is let go only once the round being
    delivered is committed (the next owner starts after it); records of it gathered but
    not delivered yet are delivered and not committed (the next owner sends them again: at
    least once); an assigned partition starts at its committed offset, or without one at
    ``start_offset``'s, and is in ``done`` from then on (:func:`_gather` takes only the
    records of partitions in ``done``)."""

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

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        """Wait for the round being delivered (it commits what it delivered)."""
        async with self.lock:
            for tp in revoked:
                self.done.pop(tp, None)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        """Read each partition from its committed offset, or else from ``start_offset``.
        aiokafka starts fetching an assigned partition (from the committed offset, else
        the earliest) before this returns: the seek drops what it fetched, and
        :func:`_gather` what it handed over already."""
        for tp in assigned:
            committed = await self.consumer.committed(tp)
            if committed is None:
                committed = await self.start_offset(tp)
            self.consumer.seek(tp, committed)
            self.done[tp] = committed


async def _gather(
    consumer: AIOKafkaConsumer,
    matcher: Matcher,
    gathering: Gathering,
    done: dict[TopicPartition, int],
) -> tuple[dict[TopicPartition, list[Record]], list[Outgoing]]:
    """One round's records (per partition, in order) and the messages the integration takes
    of them, gathered as ``gathering`` says: the first fetch waits up to
    :data:`FETCH_WAIT_SECONDS` and takes what is there (up to :data:`ROUND_MAX` records);
    when it brought messages, more are read until the linger is over or the round holds
    enough messages or records. Only records at or after their partition's start in
    ``done`` are taken: those of a partition not started yet (fetched while the rebalance
    listener looks for the start, which then seeks back) or before its start are left
    out."""
    batches: dict[TopicPartition, list[Record]] = {}
    messages: list[Outgoing] = []

    def add(fetched: dict[TopicPartition, list[Record]]) -> int:
        for tp, fetched_records in fetched.items():
            start = done.get(tp)
            if start is None:
                continue
            records = fetched_records
            if records and records[0].offset < start:
                records = [record for record in records if record.offset >= start]
            if not records:
                continue
            batches.setdefault(tp, []).extend(records)
            messages.extend(matcher.outgoing_of(records))
        return sum(len(records) for records in fetched.values())

    wait_ms = int(FETCH_WAIT_SECONDS * 1000)
    read = add(await consumer.getmany(timeout_ms=wait_ms, max_records=ROUND_MAX))
    deadline = time.monotonic() + gathering.linger_seconds
    while messages and len(messages) < gathering.max_messages and read < ROUND_MAX:
        wait = deadline - time.monotonic()
        if wait <= 0:
            break
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
        # Not under the lock: a fetch waits while the group rebalances, and the rebalance
        # waits for the revocation callback, which takes the lock.
        batches, messages = await _gather(consumer, matcher, deliverer.gathering, done)
        counters.unwritable(matcher.take_unwritable())
        async with rounds.lock:
            if messages:
                await deliverer.deliver(messages)
            if not batches:
                continue
            assigned = consumer.assignment()
            offsets = {
                tp: OffsetAndMetadata(records[-1].offset + 1, "")
                for tp, records in batches.items()
                if tp in assigned
            }
            if not offsets:
                continue  # every partition read was revoked meanwhile: its next owner rereads
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
