"""The ingest core's signatures in older checkouts, for the benchmarks that also run there.

``bench/bench_ingest_publish.py`` and ``bench/bench_fan_out.py`` compare two commits on one
machine, so they keep a branch for code from before a signature changed; these Protocols
say what that code takes, and those branches ``cast`` to them. Imported for type checking
only: an older checkout's ``bench/`` may not have this module.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from services.common.faust_app import SendRecord
from services.common.settings import Settings
from services.ingest.connection import ServerConnection
from services.ingest.node import EnsureAppTopic, IngestNode
from services.ingest.registry import Client
from services.ingest.state import PreviousSession


class ServerConnectionBeforeContext(Protocol):
    """``ServerConnection``'s constructor before the core took a ServerContext:
    settings, node id, connection id (16 bytes), session lookup, clock (Unix ms)."""

    def __call__(
        self,
        settings: Settings,
        node_id: str,
        connection_id: bytes,
        previous_session: PreviousSession,
        now_ms: Callable[[], int],
        /,
    ) -> ServerConnection: ...


class IngestNodeBeforeAuthentication(Protocol):
    """``IngestNode``'s constructor before authentication and durable wills: settings,
    Kafka send, state sync, application topic creation."""

    def __call__(
        self,
        settings: Settings,
        send: SendRecord,
        sync_state: Callable[[], Awaitable[None]],
        ensure_app_topic: EnsureAppTopic,
        /,
    ) -> IngestNode: ...


class IngestNodeBeforeRegistry(Protocol):
    """An ingest node from before its ClientRegistry: its connected clients by client id."""

    clients: dict[str, Client]
