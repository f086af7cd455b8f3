"""aiokafka on uvloop against a real broker: a connection that closed under a writer
(:mod:`services.common.kafka.uvloop_writes`).

The broker is the session's Kafka. A connection's transport is aborted and written to
before aiokafka's reader has seen the close: the moment a Kafka restart creates, made
deterministic. uvloop then raises ``RuntimeError``; with the patch, aiokafka's request
fails with ``KafkaConnectionError``, which every caller of it handles (a metadata refresh
tries again), instead of ending the client's metadata synchronizer (which left a
device_persist instance waiting forever for its group coordinator).
"""

from __future__ import annotations

import asyncio

import pytest
import uvloop
from aiokafka import AIOKafkaClient
from aiokafka.errors import KafkaConnectionError
from aiokafka.protocol.metadata import MetadataRequest

from services.common.kafka import uvloop_writes

pytestmark = pytest.mark.kafka

#: Seconds the client may take to have fresh metadata again.
TIMEOUT = 20.0


def test_a_request_on_a_closed_transport_fails_as_a_connection_error(
    kafka_bootstrap: str,
) -> None:
    async def scenario() -> None:
        client = AIOKafkaClient(bootstrap_servers=kafka_bootstrap)
        await client.bootstrap()
        try:
            conn = await client._get_conn(client.get_random_node())
            assert conn is not None and conn._writer is not None
            transport = conn._writer.transport
            transport.abort()
            await asyncio.sleep(0)  # uvloop closes the handle; aiokafka's reader is next
            with pytest.raises(RuntimeError, match="handler is closed"):
                transport.write(b"\0")  # uvloop's answer, which aiokafka does not expect
            with pytest.raises(KafkaConnectionError, match="broken"):
                conn.send(MetadataRequest([]))
            assert conn._writer is None  # closed: the next request opens another
            # The metadata synchronizer, which met this first, lives on.
            assert await asyncio.wait_for(client.force_metadata_update(), TIMEOUT)
        finally:
            await client.close()

    uvloop_writes.install()
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(scenario())
