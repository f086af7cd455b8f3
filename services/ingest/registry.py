"""The clients connected to this ingest node, by client id (at most one connection each).

A :class:`Client` is the transport shell of one connection as the node sees it (the asyncio
protocol of :mod:`services.ingest.server`, or a test's stand-in): the sans-IO connection
plus the few socket operations its effects need.
"""

from __future__ import annotations

from typing import Protocol

from services.ingest.connection import ServerConnection


class Client(Protocol):
    """What the node needs of a connected client's transport shell."""

    connection: ServerConnection

    def write(self, data: bytes) -> None:
        """Queue ``data`` on the socket."""

    def close(self) -> None:
        """Close the socket after the queued data."""

    def pause_reading(self) -> None:
        """Stop reading from the socket (the client's sends back up in TCP)."""

    def resume_reading(self) -> None:
        """Read from the socket again."""

    def keep_alive_changed(self) -> None:
        """The connection sent its CONNACK: set the keep-alive timer to its deadline."""

    def write_buffer_size(self) -> int:
        """Bytes written to the socket and not sent yet (a replay waits while there are
        many)."""


class ClientRegistry:
    """The connected clients of this node by client id (after CONNACK, until the socket
    closes or another connection takes the client over), and the connections waiting for
    CONNACK that watch their client's session records (a resumed session being confirmed)."""

    def __init__(self) -> None:
        self._clients: dict[str, Client] = {}
        self._watching: dict[str, Client] = {}

    def __len__(self) -> int:
        return len(self._clients)

    def get(self, client_id: str) -> Client | None:
        """The connection of ``client_id`` here, if any."""
        return self._clients.get(client_id)

    def clients(self) -> list[Client]:
        """Every registered client (a copy: safe to change the registry while iterating)."""
        return list(self._clients.values())

    def watching(self, client_id: str) -> Client | None:
        """The connection of ``client_id`` that watches its session records before CONNACK."""
        return self._watching.get(client_id)

    def watch(self, client: Client, client_id: str) -> None:
        """``client`` (not registered yet) watches ``client_id``'s session records."""
        self._watching[client_id] = client

    def register(self, client: Client, client_id: str) -> Client | None:
        """Register ``client`` as ``client_id``'s connection; returns the connection it
        replaces (a session takeover on this node, MQTT 3.1.4-3), if any."""
        if self._watching.get(client_id) is client:
            del self._watching[client_id]
        old = self._clients.get(client_id)
        self._clients[client_id] = client
        return old if old is not client else None

    def unregister(self, client: Client) -> None:
        """Forget ``client`` unless a newer connection of its client id replaced it."""
        client_id = client.connection.client_id
        if self._clients.get(client_id) is client:
            del self._clients[client_id]
        if self._watching.get(client_id) is client:
            del self._watching[client_id]
