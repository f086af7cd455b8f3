"""How an ingest node's connections end when the node does: a clean shutdown, and at start
the sessions a crashed predecessor could not end.

At shutdown (:func:`shut_down`) every connection is closed (v5: DISCONNECT 0x8B Server
shutting down) as if its socket were lost, so its Will Message (stored to wait out its
delay, if it has one: another node publishes it then) and end records are written, and the
node waits (at most :data:`SHUTDOWN_FLUSH_SECONDS`) until Kafka has them, before the
producer stops.

A process that crashed wrote none of that. At the next start, before the listener opens,
:func:`end_orphaned_sessions` writes the end records of the sessions the state topics still
show connected to this node, as their connections would have.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from services.common.kafka.names import TopicNames
from services.common.records import (
    KafkaRecord,
    SessionRecord,
    client_session_record,
    client_subscriptions_record,
)
from services.common.subscription import Subscription
from services.ingest.effects import Effect
from services.ingest.handle_connect import orphaned_session_end
from services.ingest.registry import Client, ClientRegistry
from services.ingest.store_pipeline import StorePipeline

log = logging.getLogger(__name__)

#: Seconds a node's shutdown waits for its last records (end records, wills) to be stored.
SHUTDOWN_FLUSH_SECONDS = 10.0


def orphaned_records(
    names: TopicNames,
    node_id: str,
    sessions: Mapping[str, SessionRecord],
    subscriptions: Mapping[str, list[Subscription]],
    now_ms: int,
) -> list[KafkaRecord]:
    """The end records of the sessions ``sessions`` show connected to ``node_id``: their
    connections died with the node's previous process. A persistent session is marked
    disconnected as of ``now_ms`` (Unix ms); a non-persistent one is deleted with its
    subscriptions (tombstones), as a closed connection does."""
    records: list[KafkaRecord] = []
    for client_id, record in sessions.items():
        if record.node_id != node_id or not record.connected:
            continue
        end = orphaned_session_end(record, now_ms)
        if end is None and subscriptions.get(client_id):
            records.append(client_subscriptions_record(names, client_id, [], record.session_id))
        records.append(client_session_record(names, client_id, end, record.session_id))
    return records


async def end_orphaned_sessions(
    node_id: str,
    sessions: Mapping[str, SessionRecord],
    subscriptions: Mapping[str, list[Subscription]],
    pipeline: StorePipeline,
    now_ms: int,
) -> int:
    """Write the end records of :func:`orphaned_records` (so routers stop sending to this
    node for them and other services see them offline) and return how many sessions were
    ended; write failures are logged. Call it once the state topics are read, before the
    listener opens."""
    orphans = sum(
        1 for record in sessions.values() if record.node_id == node_id and record.connected
    )
    await pipeline.write_all_logged(
        orphaned_records(pipeline.names, node_id, sessions, subscriptions, now_ms)
    )
    if orphans:
        log.info("node %s: ended %d sessions of its previous process", node_id, orphans)
    return orphans


async def shut_down(
    registry: ClientRegistry,
    run: Callable[[Client, list[Effect]], None],
    pipeline: StorePipeline,
) -> None:
    """Close every connection (``run`` carries out their effects) and wait until Kafka
    has every record or the flush time is up."""
    for client in registry.clients():
        connection = client.connection
        run(client, connection.shutting_down())
        run(client, connection.connection_lost())
    try:
        async with asyncio.timeout(SHUTDOWN_FLUSH_SECONDS):
            while pending := pipeline.in_flight():
                await asyncio.wait(pending)
    except TimeoutError:
        log.warning("shutdown: some records may not be stored")
