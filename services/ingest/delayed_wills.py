"""Will Messages waiting out their Will Delay Interval: kept in Kafka, timed and published
by the ingest node that owns their partition.

A connection that closes with a delayed Will Message stores it in ``client.wills``
(:class:`~services.ingest.effects.StoreWill`, before anything says its session has ended)
and is done with it. The ingest nodes read ``client.wills`` in one consumer group
(:attr:`~services.common.kafka.names.TopicNames.wills_group`, each node a static member
named by its node id): the node given a partition replays it from its beginning and keeps
its waiting wills with a timer each (:class:`WillTimers`), and publishes or discards each
one in a Kafka transaction of that partition, with the will's tombstone. How that gives
exactly one publication through any single crash is
:mod:`services.ingest.timed_records`' (shared with delayed publications).

What is the wills' own: a waiting will is also settled by the client's ``client.sessions``
records (a newer connection: discarded, or published at once with Clean Start 1; the
session's end: published), read through the node's session state.

Why the ingest nodes, rather than the router or device_persist: they already decide
everything about Will Messages (:mod:`services.ingest.will_rules`), write the client's other
``msg.all`` records, and follow every client's ``client.sessions`` records with their
offsets, which is what settles a waiting will; every deployment runs them, and no other
service need import the will rules.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from services.common.kafka.names import TopicNames
from services.common.records import (
    DelayedOutcome,
    KafkaRecord,
    SessionRecord,
    WillRecord,
    will_tombstone,
)
from services.ingest import will_rules
from services.ingest.effects import Publication
from services.ingest.timed_records import Commit, Key, TimedRecords

LatestSession = Callable[[str], tuple[SessionRecord | None, int]]
"""The latest ``client.sessions`` record of a client known to the node (None: none, or a
tombstone) and its offset (-1 when none was seen)."""


class WillTimers(TimedRecords[WillRecord]):
    """The waiting Will Messages of the ``client.wills`` partitions this node owns, keyed
    by (client id, connection id).

    ``commit`` writes records in a partition's transaction; ``sync_state`` returns once
    the node has applied every ``client.sessions`` record written before the call;
    ``latest_session`` looks a client's session up (:data:`LatestSession`); ``clock``
    is Unix time in ms. A partition goes live (:meth:`go_live`) once the node's session
    state is current.
    """

    what = "Will Message"

    def __init__(
        self,
        names: TopicNames,
        commit: Commit,
        sync_state: Callable[[], Awaitable[None]],
        latest_session: LatestSession,
        clock: Callable[[], int],
    ) -> None:
        super().__init__(names, commit, clock)
        self._sync_state = sync_state
        self._latest_session = latest_session
        self._by_client: dict[str, set[bytes]] = {}

    def __contains__(self, client_id: str) -> bool:
        return client_id in self._by_client

    def due_at_ms(self, value: WillRecord) -> int:
        """The will's due time (its close plus its delay)."""
        return value.due_at_ms

    def tombstone(self, key: Key, outcome: DelayedOutcome) -> KafkaRecord:
        """The will's ``client.wills`` tombstone (``outcome`` is not recorded: nothing
        cancels a Will Message but its session's records)."""
        return will_tombstone(self.names, *key)

    def settled(self, key: Key, value: WillRecord) -> Publication | None:
        """What the client's latest session record makes of the will
        (:func:`will_rules.on_session`)."""
        record, offset = self._latest_session(key[0])
        return will_rules.on_session(value, record, offset, self._clock())

    async def at_due(self, key: Key, value: WillRecord) -> Publication:
        """The delay has passed: once the session records written until now are applied
        (a reconnect just before it settles the will), its publication or discard. Raises
        ``KafkaError`` if the session state cannot be read."""
        await self._sync_state()
        now = self._clock()
        record, offset = self._latest_session(key[0])
        records = will_rules.on_session(value, record, offset, now)
        return will_rules.published_after_delay(value, now) if records is None else records

    async def before_live(self) -> None:
        """The node's session state is made current first (it settles wills)."""
        await self._sync_state()

    def added(self, key: Key) -> None:
        """Index the will by its client."""
        self._by_client.setdefault(key[0], set()).add(key[1])

    def forgotten(self, key: Key) -> None:
        """Drop the will from its client's index."""
        connections = self._by_client.get(key[0])
        if connections is not None:
            connections.discard(key[1])
            if not connections:
                del self._by_client[key[0]]

    def session_record(self, client_id: str, record: SessionRecord | None, offset: int) -> None:
        """A ``client.sessions`` record of ``client_id`` at ``offset``: a newer connection,
        or the session's end, settles its waiting wills (:func:`will_rules.on_session`)."""
        for connection_id in list(self._by_client.get(client_id, ())):
            key = (client_id, connection_id)
            waiting = self._waiting[key]
            if waiting.partition not in self._live or waiting.settling:
                continue
            records = will_rules.on_session(waiting.value, record, offset, self._clock())
            if records is not None:
                self._settle(key, records)
