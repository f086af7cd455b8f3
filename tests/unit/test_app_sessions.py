"""app_delivery's view of its APPLICATION clients' session records (``client.sessions``),
fed as Kafka records, bytes alone: a record of an older connection that lands after the
newer connection took the session over is stale, and changes nothing (the feed of the
newer connection keeps going; restarting it would send PUBLISH and PUBREL packets twice
on one connection, against MQTT 4.4)."""

from __future__ import annotations

import dataclasses

from services.app_delivery.clients import AppClients
from services.common.records import ClientKind, SessionRecord, client_session_record
from services.common.settings import Settings

SETTINGS = Settings(_env_file=None, application_client_ids=["app-*"])  # type: ignore[call-arg]
CLIENT = "app-1"
SESSION = bytes([7]) * 16


def record(connection: int, connected: bool, node: str) -> SessionRecord:
    """A persistent APPLICATION session record of connection number ``connection``."""
    return SessionRecord(
        node,
        bytes([connection]) * 16,
        connected,
        5,
        False,
        True,
        kind=ClientKind.APPLICATION,
        session_expiry_interval=3600,
        session_id=SESSION,
    )


def fed(clients: AppClients, *records: SessionRecord) -> SessionRecord | None:
    """Apply ``records`` in order (a partition being replayed); the session kept."""
    for each in records:
        kafka = client_session_record(clients.names, CLIENT, each)
        clients.apply(kafka.topic, 0, kafka.key, kafka.value)
    return clients.sessions.get(CLIENT)


def test_an_older_connections_record_after_the_takeover_is_stale() -> None:
    first, second = record(1, True, "node1"), record(2, True, "node2")
    ended_first = dataclasses.replace(first, connected=False)
    restated = dataclasses.replace(second, updated_at_ms=5)
    clients = AppClients(SETTINGS, send=None)  # type: ignore[arg-type]
    assert fed(clients, first, second, ended_first) == second
    assert fed(clients, restated) == restated


def test_a_reconnection_and_its_end_still_count() -> None:
    first, second = record(1, True, "node1"), record(2, True, "node2")
    ended_second = dataclasses.replace(second, connected=False)
    clients = AppClients(SETTINGS, send=None)  # type: ignore[arg-type]
    assert fed(clients, first, dataclasses.replace(first, connected=False)) is not None
    assert fed(clients, second) == second
    assert fed(clients, ended_second) == ended_second
    # A new session (Clean Start) forgets the old connections.
    fresh = dataclasses.replace(record(1, True, "node1"), session_id=bytes(16))
    assert fed(clients, fresh) == fresh
