"""Follow compacted state topics in full, in every process that needs the whole state.

Every router needs every client's subscriptions and every ingest node needs every session
record (session takeover), whatever partitions of ``msg.all`` a consumer group gave it. So
this reader is not in a consumer group: it is assigned all partitions, replays them from the
beginning on start, then keeps following. :meth:`CompactedTopicReader.barrier` gives
read-your-writes: it returns once every record that was in the topics when it was called has
been applied.

Why the barrier keeps "a subscription acknowledged (SUBACK) before a PUBLISH applies to
it", and why it asks Kafka for end offsets rather than trusting its own fetches:

1. The ingest node sends SUBACK only after Kafka acknowledged the subscription record S
   with ``acks=all`` (at time t1). From then on S is below the partition's high watermark
   and last stable offset, which never move back.
2. The PUBLISH is sent by a client after it saw the SUBACK, so the ingest node writes its
   ``msg.all`` record M after t1, and the router fetches M at some t3 > t1.
3. A request *sent* after t3 is answered by Kafka after t1, so the end offsets it returns
   (the last stable offsets: ``read_committed``) are beyond S. Once the reader has applied
   everything below them, S is applied. That is :meth:`barrier` called after M was fetched.

The high watermarks and last stable offsets in the reader's own fetch responses
(``consumer.highwater``, ``last_stable_offset``) prove nothing here: a response tells
where the partition stood when Kafka *built* it, and the reader only knows when it
*received* it. A long poll that timed out just before S was written can sit in a socket
while the event loop is busy and be read after M's batch, so only the answer to a
request sent after t3 counts. The reader's fetch requests to quiet state topics are long
polls, though: the first one sent after t3 comes back up to ``fetch_max_wait_ms`` (100 ms)
later, where an end-offsets request comes back in a round trip. So the request stays, and
the router takes it off its critical path instead: it routes first and confirms before
its Kafka transaction commits, one request for every partition committing at that moment
(services/router/main.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from services.common.kafka.consumer import assign_whole_topics, log_undecodable
from services.common.kafka.end_offsets import EndOffsets
from services.common.records import Headers, RecordError

log = logging.getLogger(__name__)

RecordHandler = Callable[[str, bytes, bytes | None, int, Headers], None]
"""Called as ``handler(topic, key, value, offset, headers)``; ``value`` None is a tombstone.
Records of one key share a partition (keyed topics), so offsets order them. Must not block;
raises :class:`~services.common.records.RecordError` for a record that does not decode."""


class CompactedTopicReader:
    """Replays and follows whole topics (all partitions) outside any consumer group.

    ``bootstrap`` is Kafka's ``host:port`` list and ``security`` its client security options
    (:func:`services.common.kafka.security.client_security`; none: PLAINTEXT); ``handler`` is
    called once per record in partition order. A record that does not decode (or whose
    handling fails otherwise) is logged and skipped, never retried, so a poisoned record
    cannot block the partition.
    """

    def __init__(
        self,
        bootstrap: str,
        topics: Sequence[str],
        handler: RecordHandler,
        *,
        security: Mapping[str, Any] | None = None,
    ) -> None:
        self._bootstrap = bootstrap
        self._security = dict(security or {})
        self._topics = list(topics)
        self._handler = handler
        self._consumer: AIOKafkaConsumer | None = None
        self._probe: EndOffsets | None = None
        self._positions: dict[TopicPartition, int] = {}
        self._progress = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    async def start(self, timeout: float = 60.0) -> None:
        """Assign all partitions, replay them to their current end, then follow in the background.

        ``timeout`` (seconds) bounds the replay. Raises ``TimeoutError`` if it takes longer,
        ``RuntimeError`` if a topic does not exist, ``aiokafka.errors.KafkaError`` if Kafka
        cannot be reached. On failure nothing is left running.
        """
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap,
            group_id=None,  # no group: every partition of the topics is assigned
            # Records of aborted transactions (a Will Message's retained record whose
            # publication was aborted) are never applied.
            isolation_level="read_committed",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=100,
            **self._security,
        )
        # Last stable offsets (read_committed): what the reader reaches.
        probe = EndOffsets(self._bootstrap, "read_committed", security=self._security)
        try:
            async with asyncio.timeout(timeout):
                await consumer.start()
                partitions = await assign_whole_topics(consumer, self._topics, from_end=False)
                await probe.start(partitions)
                self._probe = probe
                self._consumer = consumer
                self._positions = {tp: 0 for tp in partitions}
                self._task = asyncio.create_task(self._follow(), name="compacted-topic-reader")
                await self.barrier()
        except BaseException:
            await self.stop()
            await consumer.stop()  # idempotent: also when stop() closed it already
            await probe.stop()
            raise

    async def stop(self) -> None:
        """Stop following and close the consumer."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._consumer is not None:
            await self._consumer.stop()
        if self._probe is not None:
            await self._probe.stop()
        self._task = None
        self._consumer = None
        self._probe = None

    async def barrier(self) -> None:
        """Return once every record present in the topics at call time has been handled.

        Concurrent callers share end-offset requests: a caller joins the next request to be
        sent (never one already sent, which may predate its call), so a burst of callers
        costs about two round trips to Kafka, not one each. Raises
        ``aiokafka.errors.KafkaError`` if Kafka does not answer.
        """
        ends = await self.end_offsets()
        async with self._progress:
            await self._progress.wait_for(
                lambda: all(self._positions[tp] >= end for tp, end in ends.items())
            )

    async def end_offsets(self) -> dict[TopicPartition, int]:
        """The topics' end offsets, asked of Kafka now (shared with concurrent callers and
        :meth:`barrier`, as it says): a service's readiness check that Kafka answers.
        Raises ``aiokafka.errors.KafkaError`` if Kafka does not answer."""
        assert self._probe is not None, "start() first"
        return await self._probe.get()

    async def _follow(self) -> None:
        assert self._consumer is not None
        consumer = self._consumer
        while True:
            batches = await consumer.getmany(timeout_ms=200)
            for records in batches.values():
                for record in records:
                    self._apply(record)
            async with self._progress:
                for tp in self._positions:
                    # position() is cheap (local); it also moves past compacted gaps.
                    self._positions[tp] = await consumer.position(tp)
                self._progress.notify_all()

    def _apply(self, record: ConsumerRecord[bytes, bytes]) -> None:
        try:
            if record.key is None:
                raise RecordError("record without a key")
            self._handler(
                record.topic, record.key, record.value, record.offset, record.headers or ()
            )
        except RecordError as exc:
            log_undecodable(log, record, exc)
        except Exception:  # a bug, not garbage: logged with its traceback, and skipped
            log.exception(
                "skipping record %s[%d]@%d that could not be applied",
                record.topic,
                record.partition,
                record.offset,
            )
