"""How an ingest node's connections end when the node does: a drain, a clean shutdown, and
at start the sessions a crashed predecessor could not end.

Each connection ends the same way (:func:`end_connection`): closed (v5: DISCONNECT 0x8B
Server shutting down, or 0x9C Use another server for a drain by hand) as if its socket
were lost, so its Will Message (stored to wait out its delay, if it has one: another node
publishes it then) and end records are written. A drain (:func:`drain`) ends them in
paced batches (:class:`~services.common.drain.DrainPace`) after the load balancer's notice;
at shutdown (:func:`shut_down`) those left are ended together, and the node waits (at most
:data:`~services.common.drain.SHUTDOWN_FLUSH_SECONDS`) until Kafka has every record, before
the producer stops.

A process that crashed wrote none of that. At the next start, before the listener opens,
:func:`end_orphaned_sessions` writes the end records of the sessions the state topics still
show connected to this node, as their connections would have.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from services.common.drain import BATCH_INTERVAL_SECONDS, SHUTDOWN_FLUSH_SECONDS, DrainPace
from services.common.kafka.names import TopicNames
from services.common.mqtt.reason_codes import ReasonCode
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

Run = Callable[[Client, list[Effect]], None]
"""Carries out the effects of a client's connection (:meth:`IngestNode.run`)."""


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


def end_connection(
    client: Client, run: Run, reason_code: int = ReasonCode.SERVER_SHUTTING_DOWN
) -> None:
    """End ``client``'s connection because the node leaves: v5 DISCONNECT ``reason_code``
    (MQTT 5.0 3.14.2.1: 0x8B Server shutting down, or 0x9C Use another server; a 3.1.1
    client's socket is closed), then what a lost socket leaves behind (the Will Message,
    the session's end records), each at most once (the socket's own close later adds
    nothing)."""
    connection = client.connection
    run(client, connection.shutting_down(reason_code))
    run(client, connection.connection_lost())


async def drain(
    registry: ClientRegistry,
    run: Run,
    notice: float,
    rate: float,
    window: float,
    reason_code: int = ReasonCode.SERVER_SHUTTING_DOWN,
) -> int:
    """End the connections of ``registry`` (:func:`end_connection`) in paced batches and
    return how many were ended: none before ``notice`` seconds (the load balancer takes the
    node out of rotation meanwhile; no wait without a client), then ``rate`` per second at
    least, all within ``window`` seconds (:class:`~services.common.drain.DrainPace`). The
    caller has stopped accepting connections first."""
    if not len(registry):
        return 0
    await asyncio.sleep(notice)
    clients = registry.clients()  # those that left during the notice are gone
    pace = DrainPace(len(clients), rate, window)
    log.info("draining %d clients in %.1f s", len(clients), pace.seconds)
    loop = asyncio.get_running_loop()
    started = loop.time()
    done = 0
    while True:
        due = pace.due(loop.time() - started)
        for client in clients[done:due]:
            if not client.connection.closed:
                end_connection(client, run, reason_code)
        done = due
        if done == len(clients):
            break
        await asyncio.sleep(BATCH_INTERVAL_SECONDS)
    # A CONNECT that was under way when the listeners closed may have been accepted since.
    drained = set(clients)
    late = [client for client in registry.clients() if client not in drained]
    for client in late:
        end_connection(client, run, reason_code)
    return done + len(late)


async def shut_down(registry: ClientRegistry, run: Run, pipeline: StorePipeline) -> None:
    """End every connection left (:func:`end_connection`) and wait until Kafka has every
    record or the flush time is up."""
    for client in registry.clients():
        end_connection(client, run)
    try:
        async with asyncio.timeout(SHUTDOWN_FLUSH_SECONDS):
            while pending := pipeline.in_flight():
                await asyncio.wait(pending)
    except TimeoutError:
        log.warning("shutdown: some records may not be stored")
