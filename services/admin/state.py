"""What the admin service knows of the clients: Cormorant's own Kafka state, read in full.

No second copy: the admin service follows the topics every service follows
(:class:`~services.common.kafka.state_reader.CompactedTopicReader`), parsed with
:mod:`services.common.records`:

- ``client.sessions``: every session (connected, or persistent and waiting), its node,
  connection, protocol version, kind, Session Expiry Interval, connected since;
- ``client.subscriptions``: each client's subscriptions;
- ``msg.retained``: the retained messages, by Topic Name (as the router keeps them);
- ``msg.delayed``: the delayed publications still waiting, by their id;
- ``client.events``: the last connect of each client, for its address (the network peer
  its ingest node saw) and the connection it belongs to. ``client.events`` keeps
  ``msg_retention_seconds`` of history: a client connected for longer has no address.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from services.common.kafka.names import TopicNames
from services.common.kafka.security import client_security
from services.common.kafka.state_reader import CompactedTopicReader
from services.common.records import (
    DelayedRecord,
    EventKind,
    EventRecord,
    Headers,
    Message,
    SessionRecord,
    parse_client_event,
    parse_client_session,
    parse_client_subscriptions,
    parse_delayed,
    parse_retained,
    stale_delete,
)
from services.common.settings import Settings
from services.common.subscription import Subscription
from services.common.topics.retained import RetainedStore


@dataclass(frozen=True, slots=True)
class LastConnect:
    """A client's latest CONNECTED event: when, where from, which connection."""

    at_ms: int
    client_address: str
    connection_id: bytes
    node_id: str


class ClientState:
    """Sessions, subscriptions, retained messages, waiting delayed publications (by id)
    and last connects, kept up to date.

    Call :meth:`start` (replays the topics; raises what
    :meth:`CompactedTopicReader.start` raises) and :meth:`stop`.
    """

    def __init__(self, settings: Settings) -> None:
        self.names = TopicNames.from_settings(settings)
        self.sessions: dict[str, SessionRecord] = {}
        self.subscriptions: dict[str, list[Subscription]] = {}
        self.retained: RetainedStore[Message] = RetainedStore()
        self.last_connect: dict[str, LastConnect] = {}
        self.delayed: dict[bytes, DelayedRecord] = {}
        self.reader = CompactedTopicReader(
            settings.kafka_bootstrap,
            [
                self.names.client_sessions,
                self.names.client_subscriptions,
                self.names.msg_retained,
                self.names.msg_delayed,
                self.names.client_events,
            ],
            self.apply,
            security=client_security(settings),
        )

    async def start(self, timeout: float = 120.0) -> None:
        """Replay the topics up to their end, then follow them."""
        await self.reader.start(timeout)

    async def stop(self) -> None:
        """Stop following."""
        await self.reader.stop()

    async def sync(self) -> None:
        """Return once everything in the topics now has been applied (read your writes)."""
        await self.reader.barrier()

    def apply(
        self, topic: str, key: bytes, value: bytes | None, offset: int, headers: Headers
    ) -> None:
        """Apply one record (the reader's handler). Raises ``RecordError`` on garbage."""
        names = self.names
        if topic == names.client_sessions:
            client_id, session = parse_client_session(key, value)
            if stale_delete(self.sessions.get(client_id), value, headers):
                return  # a late delete of an older session
            if session is None:
                self.sessions.pop(client_id, None)
            else:
                self.sessions[client_id] = session
        elif topic == names.client_subscriptions:
            client_id, subscriptions = parse_client_subscriptions(key, value)
            if stale_delete(self.sessions.get(client_id), value, headers):
                return
            if subscriptions:
                self.subscriptions[client_id] = subscriptions
            else:
                self.subscriptions.pop(client_id, None)
        elif topic == names.msg_retained:
            name, message = parse_retained(key, value, headers)
            if message is None:
                self.retained.delete(name)
            else:
                self.retained.set(name, message)
        elif topic == names.msg_delayed:
            _, delayed_id, delayed = parse_delayed(key, value)
            if delayed is None:
                self.delayed.pop(delayed_id, None)
            else:
                self.delayed[delayed_id] = delayed
        else:
            client_id, event = parse_client_event(key, value)
            if event.kind is EventKind.CONNECTED:
                self.last_connect[client_id] = _last_connect(event)

    def address_of(self, client_id: str, session: SessionRecord) -> str | None:
        """The network peer of ``session``'s connection, if its connect event is known."""
        connect = self.last_connect.get(client_id)
        if connect is None or connect.connection_id != session.connection_id:
            return None
        return connect.client_address or None

    def all_subscriptions(self) -> Iterator[Subscription]:
        """Every client's subscriptions, by client id."""
        for client_id in sorted(self.subscriptions):
            yield from self.subscriptions[client_id]


def _last_connect(event: EventRecord) -> LastConnect:
    return LastConnect(event.at_ms, event.client_address, event.connection_id, event.node_id)
