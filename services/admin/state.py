"""What the admin service knows of the clients: Cormorant's own Kafka state, read in full.

No second copy: the admin service follows the topics every service follows
(:class:`~services.common.kafka.state_reader.CompactedTopicReader`), parsed with
:mod:`services.common.records`:

- ``client.sessions``: every session (connected, or persistent and waiting), its node,
  connection, protocol version, kind, Session Expiry Interval, connected since;
- ``client.subscriptions``: each client's subscriptions;
- ``msg.retained``: the retained messages, by Topic Name (as the router keeps them);
- ``msg.delayed``: the delayed publications still waiting, by their id, their count per
  publisher (for the HTTP publish API's bounds), and how the latest ones ended (their
  tombstones' outcome: what a cancel waits for);
- ``client.events``: the last connect of each client, for its address (the network peer
  its ingest node saw) and the connection it belongs to. ``client.events`` keeps
  ``msg_retention_seconds`` of history: a client connected for longer has no address.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

from services.common.kafka.names import TopicNames
from services.common.kafka.security import client_security
from services.common.kafka.state_reader import CompactedTopicReader
from services.common.records import (
    DelayedOutcome,
    DelayedRecord,
    EventKind,
    EventRecord,
    Headers,
    Message,
    SessionRecord,
    delayed_outcome,
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
from services.ingest.delayed_rules import DelayedCounts

ENDED_KEPT = 10_000
"""How many ended delayed publications :attr:`ClientState.delayed_ended` remembers."""


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
        self.delayed_counts = DelayedCounts()
        # how the latest delayed publications ended (None: their tombstone did not say),
        # and the cancels waiting to hear it
        self.delayed_ended: OrderedDict[bytes, DelayedOutcome | None] = OrderedDict()
        self._awaiting_end: dict[bytes, list[asyncio.Future[DelayedOutcome | None]]] = {}
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
            client_id, delayed_id, delayed = parse_delayed(key, value)
            if isinstance(delayed, DelayedRecord):
                self.delayed[delayed_id] = delayed
                self.delayed_counts.add(client_id, delayed_id)
            elif delayed is None and self.delayed.pop(delayed_id, None) is not None:
                # Its first tombstone: how it ended (later ones answer late cancels).
                self.delayed_counts.remove(client_id, delayed_id)
                self._ended(delayed_id, delayed_outcome(headers))
        else:
            client_id, event = parse_client_event(key, value)
            if event.kind is EventKind.CONNECTED:
                self.last_connect[client_id] = _last_connect(event)

    def _ended(self, delayed_id: bytes, outcome: DelayedOutcome | None) -> None:
        self.delayed_ended[delayed_id] = outcome
        if len(self.delayed_ended) > ENDED_KEPT:
            self.delayed_ended.popitem(last=False)
        for future in self._awaiting_end.pop(delayed_id, []):
            if not future.done():
                future.set_result(outcome)

    def delayed_end(self, delayed_id: bytes) -> asyncio.Future[DelayedOutcome | None]:
        """A future of how the waiting delayed publication ``delayed_id`` ends (its
        tombstone's :class:`~services.common.records.DelayedOutcome`; None: not said), set
        when this state reads it; cancel it to stop waiting."""
        future: asyncio.Future[DelayedOutcome | None] = asyncio.get_running_loop().create_future()
        waiters = self._awaiting_end.setdefault(delayed_id, [])
        waiters.append(future)
        future.add_done_callback(lambda done: _discard(self._awaiting_end, delayed_id, done))
        return future

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


def _discard(
    awaiting: dict[bytes, list[asyncio.Future[DelayedOutcome | None]]],
    delayed_id: bytes,
    future: asyncio.Future[DelayedOutcome | None],
) -> None:
    """Forget a future of :meth:`ClientState.delayed_end` once done (set or cancelled)."""
    waiters = awaiting.get(delayed_id)
    if waiters is not None and future in waiters:
        waiters.remove(future)
        if not waiters:
            del awaiting[delayed_id]
