"""Follow compacted state topics in full, in every process that needs the whole state.

Every router needs every client's subscriptions and every ingest node needs every session
record (session takeover), whatever partitions of ``msg.all`` a consumer group gave it. So
this reader is not in a consumer group: it is assigned all partitions, replays them from the
beginning on start, then keeps following. :meth:`CompactedTopicReader.barrier` gives
read-your-writes: it returns once every record that was in the topics when it was called has
been applied.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

log = logging.getLogger(__name__)

RecordHandler = Callable[[str, bytes, bytes | None, int], None]
"""Called as ``handler(topic, key, value, offset)``; ``value`` None is a tombstone. Records of
one key share a partition (keyed topics), so offsets order them. Must not block."""


class CompactedTopicReader:
    """Replays and follows whole topics (all partitions) outside any consumer group.

    ``bootstrap`` is Kafka's ``host:port`` list; ``handler`` is called once per record in
    partition order. A record whose handling raises is logged and skipped, never retried, so
    a poisoned record cannot block the partition.
    """

    def __init__(self, bootstrap: str, topics: Sequence[str], handler: RecordHandler) -> None:
        self._bootstrap = bootstrap
        self._topics = list(topics)
        self._handler = handler
        self._consumer: AIOKafkaConsumer | None = None
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
            group_id=None,  # no group: every partition of the subscribed topics is assigned
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=100,
        )
        try:
            async with asyncio.timeout(timeout):
                await consumer.start()
                # Checked first: subscribing to a missing topic would wait for it for the
                # whole request timeout and then fail without naming it.
                missing = set(self._topics) - await consumer.topics()
                if missing:
                    raise RuntimeError(f"Kafka topics {sorted(missing)} do not exist")
                consumer.subscribe(self._topics)
                while {tp.topic for tp in consumer.assignment()} != set(self._topics):
                    await asyncio.sleep(0.05)  # assignment follows the next metadata answer
                partitions = sorted(consumer.assignment())
                await consumer.seek_to_beginning(*partitions)
                self._consumer = consumer
                self._positions = {tp: 0 for tp in partitions}
                self._task = asyncio.create_task(self._follow(), name="compacted-topic-reader")
                await self.barrier()
        except BaseException:
            await self.stop()
            await consumer.stop()  # idempotent: also when stop() closed it already
            raise

    async def stop(self) -> None:
        """Stop following and close the consumer."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._consumer is not None:
            await self._consumer.stop()
        self._task = None
        self._consumer = None

    async def barrier(self) -> None:
        """Return once every record present in the topics at call time has been handled."""
        assert self._consumer is not None, "start() first"
        ends = await self._consumer.end_offsets(list(self._positions))
        async with self._progress:
            await self._progress.wait_for(
                lambda: all(self._positions[tp] >= end for tp, end in ends.items())
            )

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
        if record.key is None:
            log.warning(
                "skipping keyless record at %s[%d]@%d",
                record.topic,
                record.partition,
                record.offset,
            )
            return
        try:
            self._handler(record.topic, record.key, record.value, record.offset)
        except Exception:
            log.exception(
                "skipping record %s[%d]@%d that could not be applied",
                record.topic,
                record.partition,
                record.offset,
            )
