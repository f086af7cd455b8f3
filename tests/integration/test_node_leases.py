"""Pooled ingest node ids (services/ingest/node_lease.py) on the real PostgreSQL and Kafka:
however often ingest tasks are replaced, their downlink topics stay as few as the pool's ids
(issue 24, finding 5)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from aiokafka.admin import AIOKafkaAdminClient

from services.common.kafka.admin import downlink_topic_spec, ensure_topics
from services.common.kafka.names import DOWNLINK_PREFIX
from services.common.settings import Settings
from services.common.stores.postgres_pool import MigratedPool
from services.ingest.node_lease import HeldLease, LeaseLost, NodeLeases

pytestmark = [pytest.mark.kafka]


@pytest_asyncio.fixture(loop_scope="function")
async def pool(postgres_server: str) -> AsyncIterator[MigratedPool]:
    """A connection pool to the session's PostgreSQL (the schema migrated on first use)."""
    migrated = MigratedPool(postgres_server, name="node id leases", timeout=5.0, pool_size=2)
    yield migrated
    await migrated.close()


async def _downlink_topics(bootstrap: str, prefix: str) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return {t for t in await admin.list_topics() if t.startswith(prefix + DOWNLINK_PREFIX)}
    finally:
        await admin.close()


async def test_thirty_replaced_ingest_nodes_leave_at_most_a_pool_of_downlink_topics(
    pool: MigratedPool, kafka_bootstrap: str
) -> None:
    prefix = f"nl-{uuid.uuid4().hex[:8]}."
    settings = Settings(topic_prefix=prefix, kafka_bootstrap=kafka_bootstrap)
    size = 4
    leases = NodeLeases(pool, prefix, size=size, seconds=3.0)
    live: list[tuple[HeldLease, asyncio.Task[None]]] = []
    started: list[str] = []

    async def start_node(task: str) -> None:
        """What `cormorant ingest --node-id-from-pool` does: claim a node id, then renew
        the lease while running."""
        lease = await leases.claim(task, wait=10.0)
        assert lease.node_id not in {held.node_id for held, _ in live}
        live.append((lease, asyncio.create_task(lease.hold())))
        started.append(lease.node_id)

    try:
        for task in ("task-a", "task-b"):
            await start_node(task)
        for replacement in range(30):
            # A rolling replacement: the new task starts, then the oldest one leaves,
            # stopping cleanly (its lease released) or dying (its lease left to expire).
            await start_node(f"task-{replacement}")
            old, holding = live.pop(0)
            holding.cancel()
            if replacement % 10 != 9:
                await old.release()
        # Each start's downlink topic, as `cormorant ingest` creates it before it serves
        # (one request for all 32 starts: the test's time goes to what it proves).
        specs = {node: downlink_topic_spec(settings, node) for node in started}
        await ensure_topics(kafka_bootstrap, list(specs.values()))
        topics = await _downlink_topics(kafka_bootstrap, prefix)
    finally:
        for _, holding in live:
            holding.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*(holding for _, holding in live))
    assert topics <= {f"{prefix}{DOWNLINK_PREFIX}ingest-{slot}" for slot in range(1, size + 1)}
    assert len(started) == 32 and len(topics) >= 3  # two live and one starting, at least


async def test_a_node_whose_lease_expired_and_was_taken_loses_its_id(pool: MigratedPool) -> None:
    prefix = f"nl-{uuid.uuid4().hex[:8]}."
    leases = NodeLeases(pool, prefix, size=1, seconds=0.5)
    first = await leases.claim("stalled-task")
    # The only id comes free once the stalled task's lease expires, not before.
    second = await leases.claim("new-task", wait=5.0)
    assert second.node_id == first.node_id == "ingest-1"
    with pytest.raises(LeaseLost, match="ingest-1 is no longer held by stalled-task"):
        await first.hold()
    await second.release()
