"""What the sans-IO connection asks its shell to do (the h11 model: bytes in, effects out).

The asyncio shell (:mod:`services.ingest.server`) carries out each effect in order and reports
the outcome of the ``Store*`` effects back with ``ServerConnection.stored(token)`` or
``ServerConnection.store_failed(token)``.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.common.records import PublishMeta, SessionRecord
from services.common.topics.trie import Subscription


@dataclass(slots=True)
class Send:
    """Write ``data`` (encoded MQTT packets) to the client's socket."""

    data: bytes


@dataclass(slots=True)
class Close:
    """Close the socket after everything sent so far; ``reason`` is for the log."""

    reason: str


@dataclass(slots=True)
class StorePublish:
    """Write an accepted PUBLISH to ``msg.all`` (key: this client's id) and wait for acks=all."""

    token: int
    meta: PublishMeta
    payload: bytes


@dataclass(slots=True)
class StoreSubscriptions:
    """Write this client's whole subscription set to ``client.subscriptions`` ([] = tombstone)."""

    token: int
    subscriptions: list[Subscription]


@dataclass(slots=True)
class StoreSession:
    """Write this client's session record to ``client.sessions`` (None = tombstone)."""

    token: int
    record: SessionRecord | None


@dataclass(slots=True)
class Connected:
    """The session is established (CONNACK sent): the shell registers the client by id."""

    client_id: str


Effect = Send | Close | StorePublish | StoreSubscriptions | StoreSession | Connected
