"""End offsets asked of Kafka in shared rounds: a burst of callers costs about two round
trips, not one request each.

A caller joins the next request to be sent, never one already sent: the answer to a
request sent after the call was made reflects every record Kafka acknowledged before it
(what :meth:`~services.common.kafka.state_reader.CompactedTopicReader.barrier` and the
ingest node's :class:`~services.common.subscription.LiveFrom` cuts rely on).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from aiokafka import AIOKafkaConsumer, TopicPartition


class EndOffsets:
    """The end offsets of a fixed set of partitions, from a consumer of its own (no group).

    ``isolation_level`` ``read_committed`` gives last stable offsets (what a
    ``read_committed`` reader reaches), ``read_uncommitted`` high watermarks (beyond every
    record acknowledged with ``acks=all``). ``bootstrap`` and ``security`` as for any
    client (:func:`services.common.kafka.security.client_security`). Its own connection
    matters: Kafka answers the requests of one connection in order, so on a follower's
    connection a ListOffsets would wait behind its long-polling fetch every time.
    """

    def __init__(
        self,
        bootstrap: str,
        isolation_level: Literal["read_committed", "read_uncommitted"],
        *,
        security: Mapping[str, Any] | None = None,
    ) -> None:
        self._options: dict[str, Any] = {
            "bootstrap_servers": bootstrap,
            "group_id": None,
            "isolation_level": isolation_level,
            **dict(security or {}),
        }
        self._consumer: AIOKafkaConsumer | None = None
        self._partitions: list[TopicPartition] = []
        self._next_round: asyncio.Future[dict[TopicPartition, int]] | None = None
        self._rounds: asyncio.Task[None] | None = None

    async def start(self, partitions: Sequence[TopicPartition]) -> None:
        """Connect; later rounds ask for ``partitions``. Raises
        ``aiokafka.errors.KafkaError`` if Kafka cannot be reached."""
        self._partitions = list(partitions)
        self._consumer = AIOKafkaConsumer(**self._options)  # needs the running loop
        await self._consumer.start()

    async def stop(self) -> None:
        """Stop asking and close the consumer (idempotent)."""
        if self._rounds is not None:
            self._rounds.cancel()
            await asyncio.gather(self._rounds, return_exceptions=True)
            self._rounds = None
        if self._consumer is not None:
            await self._consumer.stop()

    async def get(self) -> dict[TopicPartition, int]:
        """The partitions' end offsets from a request sent after this call (shared with
        the callers of the same round). Raises ``aiokafka.errors.KafkaError`` if Kafka
        does not answer."""
        if self._next_round is None:
            self._next_round = asyncio.get_running_loop().create_future()
            if self._rounds is None or self._rounds.done():
                self._rounds = asyncio.create_task(self._send_rounds())
        return await asyncio.shield(self._next_round)

    async def _send_rounds(self) -> None:
        """Answer each round of callers with one end-offsets request."""
        assert self._consumer is not None, "start() first"
        while self._next_round is not None:
            round_, self._next_round = self._next_round, None
            try:
                round_.set_result(await self._consumer.end_offsets(self._partitions))
            except Exception as exc:
                round_.set_exception(exc)
                round_.exception()  # retrieved here: a round nobody awaits any more is fine
