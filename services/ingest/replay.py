"""The replay readers of an ingest node: a replay subscription's history, from ``msg.all``.

Where replays run, and why here: on the ingest node that holds the subscriber's connection,
each with a Kafka consumer of its own (no consumer group; ``msg.all``'s partitions
assigned, read from the replay's ``<since>`` up to its cut). Not in the router: the router
routes every client's live messages in one loop, and a replay of a million messages there
would either stall that loop or write a million downlink records (and back through Kafka)
to reach one connection; its crash would also cut replays short. Not in a worker of its
own: the flow control a replay must respect (the client's Receive Maximum, its in-flight
window, its socket's send buffer) lives with the connection, here, so the reader waits on
it directly instead of through another Kafka topic. The cost stays on the subscriber's own
node and is bounded: at most ``max_concurrent_replays`` read at once (the others wait their
turn), each reads at most ``max_replay_messages`` records and hands its client at most
``replay_max_messages_per_second``, and each gives the event loop back every
:data:`YIELD_EVERY` records: the bounds on what a replay takes from the node's live
deliveries (what one cost them on the shared development machine: bench/NOTES.md, "issue
28 part 1").

Each reader first reads ``msg.all``'s end offsets again, now that the subscription is
stored, and reads the history up to that second cut, not only up to the first one stored
with the subscription: why that closes the gap at the switch, and how the live copies of
what lies between the two cuts are dropped, is in :mod:`services.ingest.handle_replay`.
What a reader does with what it reads (history, then held live messages, exactly once at
the switch) is the connection core's business there too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import ConsumerRecord

from services.common.kafka.consumer import make_consumer
from services.common.kafka.names import TopicNames
from services.common.records import Origin, Published, RecordError, Target, parse_msg_all
from services.common.settings import Settings
from services.common.subscription import Subscription
from services.common.topics.trie import SubscriptionTrie
from services.ingest.effects import Effect, StartReplay
from services.ingest.fan_out import FanOut
from services.ingest.registry import Client
from services.ingest.store_pipeline import ReadLiveFrom

log = logging.getLogger(__name__)

#: Records handed to the connection before the reader gives the event loop back: live
#: deliveries of the node's other clients wait at most this long behind a replay.
YIELD_EVERY = 64

#: Messages a persistent session's replay hands over between two stores of how far the
#: client's acknowledgements got (besides the one before each fetch is sent): after a
#: reconnect, about this many acknowledged messages are sent again, with DUP=1.
MARK_EVERY = 32

#: Records one fetch returns at most.
FETCH_RECORDS = 500

#: Bytes the client's socket may hold unsent before the reader waits (QoS 0 messages use no
#: in-flight slot, so this is what paces them).
MAX_UNSENT_BYTES = 256 * 1024

#: Seconds the reader waits for the client's window before it looks again (the socket's
#: send buffer drains without an event the node sees).
ROOM_WAIT_SECONDS = 0.05

Run = Callable[[Client, list[Effect]], None]
"""Carries out a connection's effects (:meth:`services.ingest.node.IngestNode.run`)."""


def truncated_starts(
    starts: Sequence[int], cut: Sequence[int], max_records: int, first: Sequence[int] | None = None
) -> list[int]:
    """Where each ``msg.all`` partition's replay starts so that at most ``max_records``
    records are read in all (``max_replay_messages``), besides the switch's window.

    ``starts[p]`` is where ``<since>`` begins in partition ``p``, ``cut[p]`` the replay's
    (second) cut there, ``first[p]`` its first cut (None: the same). Within the bound the
    starts stay as they are; beyond it every partition keeps its share (rounded down) of the
    newest records before its cut: the replay is truncated at its old end and still meets
    the live messages with no gap. A start never lies after the first cut: the window
    between the cuts may have been routed to nobody, so it is always read, even past the
    bound.
    """
    spans = [max(0, end - start) for start, end in zip(starts, cut, strict=True)]
    total = sum(spans)
    if total <= max_records:
        truncated = list(starts)
    else:
        truncated = [
            end - span * max_records // total for end, span in zip(cut, spans, strict=True)
        ]
    if first is None:
        return truncated
    return [min(start, low) for start, low in zip(truncated, first, strict=True)]


@dataclass(eq=False)
class _Marks:
    """A persistent session's replay, per ``msg.all`` partition: ``known``, below it the
    client acknowledged everything on an earlier connection (read again only for the
    switch's window); ``resend``, below it a record may have been sent before (DUP=1);
    ``sent``, the marks stored (the reader sends nothing at or past them before storing
    new ones); ``positions``, below it the reader handed everything over."""

    known: list[int]
    resend: list[int]
    positions: list[int]
    sent: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.sent:
            self.sent = list(self.resend)


@dataclass(eq=False)
class _Replay:
    """One running replay: its task, and the event that says its client may have room."""

    subscription: Subscription
    task: asyncio.Task[None] | None = None
    room: asyncio.Event = field(default_factory=asyncio.Event)


class Replays:
    """The replays of this node's clients (see the module's docstring).

    ``settings`` give the Kafka connection, ``msg.all``'s name, ``max_replay_messages``,
    ``max_concurrent_replays`` and the Kafka request timeout; ``run`` carries out the
    connections' effects; ``clock`` gives Unix ms (message expiry); ``read_ends`` reads
    ``msg.all``'s end offsets for each replay's second cut (None: the first cut is used,
    with the gap it leaves at the switch; for tests without Kafka).
    """

    def __init__(
        self,
        settings: Settings,
        run: Run,
        clock: Callable[[], int],
        read_ends: ReadLiveFrom | None = None,
    ) -> None:
        self._settings = settings
        self._read_ends = read_ends
        self._msg_all = TopicNames.from_settings(settings).msg_all
        self._run = run
        self._clock = clock
        self._slots = asyncio.Semaphore(settings.max_concurrent_replays)
        self._replays: dict[Client, dict[str, _Replay]] = {}

    def __len__(self) -> int:
        """Replays running or waiting for their turn."""
        return sum(len(replays) for replays in self._replays.values())

    def __bool__(self) -> bool:
        return bool(self._replays)

    def start(self, client: Client, effect: StartReplay) -> None:
        """Start ``effect``'s replay for ``client``, replacing one of the same filter."""
        topic_filter = effect.subscription.topic_filter
        self._cancel(client, topic_filter)
        replay = _Replay(effect.subscription)
        self._replays.setdefault(client, {})[topic_filter] = replay
        replay.task = asyncio.create_task(self._replay(client, replay, effect.since_ms))

    def stop(self, client: Client, topic_filter: str) -> None:
        """Stop ``client``'s replay of ``topic_filter`` (UNSUBSCRIBE), if one runs."""
        self._cancel(client, topic_filter)

    def stop_all(self, client: Client) -> None:
        """Stop every replay of ``client`` (its socket closed)."""
        for topic_filter in list(self._replays.get(client, ())):
            self._cancel(client, topic_filter)

    def wake(self, client: Client) -> None:
        """Something happened on ``client``'s connection (an acknowledgement freed a slot,
        perhaps): its replays look at its window again."""
        for replay in self._replays.get(client, {}).values():
            replay.room.set()

    def _cancel(self, client: Client, topic_filter: str) -> None:
        replays = self._replays.get(client)
        replay = None if replays is None else replays.pop(topic_filter, None)
        if replay is not None and replay.task is not None:
            replay.task.cancel()
        if replays is not None and not replays:
            del self._replays[client]

    def _done(self, client: Client, replay: _Replay) -> None:
        replays = self._replays.get(client)
        topic_filter = replay.subscription.topic_filter
        if replays is not None and replays.get(topic_filter) is replay:
            del replays[topic_filter]
            if not replays:
                del self._replays[client]

    async def _replay(self, client: Client, replay: _Replay, since_ms: int) -> None:
        """Read the history of ``replay`` in turn with the node's other replays, then tell
        the connection it is finished (or failed)."""
        topic_filter = replay.subscription.topic_filter
        progress = replay.subscription.replay
        try:
            if progress is None:
                # The second cut is read at once, not after waiting for a turn: the window
                # between the cuts, whose live copies are remembered, stays a round trip.
                cut = await self._switch(client, replay)
            else:  # resumed: the second cut was stored with the progress
                cut = client.connection.replay_switch(replay.subscription, progress.cut)
            async with self._slots:
                count = await self._read(client, replay, since_ms, cut)
        except asyncio.CancelledError:
            self._done(client, replay)
            raise
        except Exception as exc:  # Kafka unreachable or gone: the client must not miss it
            self._done(client, replay)
            self._run(client, client.connection.replay_failed(topic_filter, repr(exc)))
            return
        self._done(client, replay)
        log.info("client %r: replayed %d messages of %r", client.connection.client_id, count,
                 topic_filter)  # fmt: skip
        self._run(client, client.connection.replay_finished(topic_filter))

    async def _switch(self, client: Client, replay: _Replay) -> tuple[int, ...]:
        """Read ``msg.all``'s end offsets now (the subscription is stored: its SUBACK was
        sent) and tell the connection: returns the second cut the replay reads up to.
        Raises ``TimeoutError`` after the Kafka request timeout, or what Kafka raised."""
        subscription = replay.subscription
        assert subscription.live_from is not None and subscription.live_from.offsets is not None
        ends = subscription.live_from.offsets
        if self._read_ends is not None:
            timeout = self._settings.kafka_request_timeout_seconds
            ends = await asyncio.wait_for(self._read_ends(), timeout)
        return client.connection.replay_switch(subscription, ends)

    async def _read(
        self, client: Client, replay: _Replay, since_ms: int, cut: tuple[int, ...]
    ) -> int:
        """Hand every ``msg.all`` record from ``since_ms`` up to ``cut`` (the second cut)
        that the subscription matches to the connection; returns how many were handed
        over."""
        subscription = replay.subscription
        assert subscription.live_from is not None and subscription.live_from.offsets is not None
        first = subscription.live_from.offsets
        settings = self._settings
        progress = subscription.replay
        consumer = make_consumer(settings, group_id=None, max_poll_records=FETCH_RECORDS)
        await consumer.start()
        try:
            partitions = [TopicPartition(self._msg_all, p) for p in range(len(cut))]
            consumer.assign(partitions)
            marks: _Marks | None = None
            if progress is not None:
                # Resumed: from where the client's acknowledgements got, and the switch's
                # window again, to know the live copies of what it acknowledged there.
                starts = [min(n, f) for n, f in zip(progress.next, first, strict=True)]
                marks = _Marks(list(progress.next), list(progress.sent), list(progress.next))
            else:
                found = await consumer.offsets_for_times({tp: since_ms for tp in partitions})
                starts = [cut[p] if found[tp] is None else found[tp].offset
                          for p, tp in enumerate(partitions)]  # fmt: skip
                starts = truncated_starts(starts, cut, settings.max_replay_messages, first)
                if client.connection.state.persistent:
                    marks = _Marks(list(starts), list(starts), list(starts))
            ends: dict[TopicPartition, int] = {}
            for tp, start in zip(partitions, starts, strict=True):
                if start < cut[tp.partition]:
                    consumer.seek(tp, start)
                    ends[tp] = cut[tp.partition]
            consumer.pause(*(tp for tp in partitions if tp not in ends))
            handed = await self._follow(client, replay, consumer, ends, marks)
            if marks is not None:
                # Everything read: next is where acknowledgements got, and the progress
                # stays with the subscription (its window, for live copies sent again).
                sent = [max(s, c) for s, c in zip(marks.sent, cut, strict=True)]
                await self._mark(client, replay, list(cut), sent)
            return handed
        finally:
            await consumer.stop()

    async def _follow(
        self,
        client: Client,
        replay: _Replay,
        consumer: AIOKafkaConsumer,
        ends: dict[TopicPartition, int],
        marks: _Marks | None = None,
    ) -> int:
        """Read the assigned partitions up to their ``ends`` (each in order: one
        publisher's messages keep their order), handing each matching record over. A
        persistent session's replay (``marks``) stores its progress before it sends
        past its stored ``sent`` marks, once per fetch; a record below ``marks.known``
        (acknowledged on an earlier connection) is only shown to the connection, one
        below ``marks.sent`` goes with DUP=1."""
        subscription = replay.subscription
        topic_filter = subscription.topic_filter
        matcher = SubscriptionTrie()
        matcher.add(subscription)
        ids = (
            ()
            if subscription.subscription_identifier is None
            else (subscription.subscription_identifier,)
        )
        handed = 0
        since_yield = 0
        rate = self._settings.replay_max_messages_per_second
        loop = asyncio.get_running_loop()
        started = loop.time()
        while ends:
            batches = await consumer.getmany(*ends, timeout_ms=500, max_records=FETCH_RECORDS)
            if marks is not None:
                await self._mark_batch(client, replay, marks, batches, ends)
            for tp, records in batches.items():
                end = ends.get(tp)
                for record in records:
                    if end is None or record.offset >= end:
                        break
                    if marks is not None:  # never below what was acknowledged before
                        p = tp.partition
                        marks.positions[p] = max(marks.positions[p], record.offset + 1)
                    published = _published(record)
                    if published is None:
                        continue
                    meta = published.message.meta
                    if not matcher.match(meta.topic, published.client_id).clients:
                        continue
                    try:
                        message = FanOut(
                            meta,
                            published.message.payload,
                            self._clock(),
                            Origin(record.partition, record.offset, 0),
                        )
                    except RecordError as exc:
                        log.warning("replay: skipping a message of %r: %r",
                                    published.client_id, exc)  # fmt: skip
                        continue
                    if marks is not None and record.offset < marks.known[tp.partition]:
                        client.connection.replay_seen(message)
                        continue
                    target = Target(
                        subscription.client_id,
                        min(meta.qos, subscription.qos),
                        subscription.retain_as_published,
                        ids,
                        dup=marks is not None and record.offset < marks.resend[tp.partition],
                    )
                    # A persistent session's message waits for its own Packet Identifier
                    # (the one it had before a reconnect, MQTT 4.4) to be free.
                    packet_id = client.connection.replay_packet_id(topic_filter, message, target)
                    await self._room(client, replay, packet_id)
                    handing = client.connection.replayed(message, target, topic_filter)
                    self._run(client, handing)
                    handed += 1
                    since_yield += 1
                    if marks is not None and handed % MARK_EVERY == 0:
                        # Where the acknowledgements got, without waiting: its sent marks
                        # are the stored ones.
                        mark = client.connection.replay_mark(topic_filter, marks.positions,
                                                             marks.sent)  # fmt: skip
                        self._run(client, mark)
                    if since_yield >= YIELD_EVERY:
                        since_yield = 0
                        # The node's live deliveries go first, and the replay keeps to its
                        # rate (replay_max_messages_per_second).
                        await asyncio.sleep(max(0.0, started + handed / rate - loop.time()))
            for tp in list(ends):
                # Past the cut, or at it with what lies between only transaction markers
                # or aborted records (read_committed skips them).
                if await consumer.position(tp) >= ends[tp]:
                    consumer.pause(tp)
                    del ends[tp]
        return handed

    async def _mark_batch(
        self,
        client: Client,
        replay: _Replay,
        marks: _Marks,
        batches: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]],
        ends: dict[TopicPartition, int],
    ) -> None:
        """Store the progress before ``batches`` go, if they reach past the stored
        ``sent`` marks: those become the batches' last offsets (one write per fetch)."""
        sent = list(marks.sent)
        for tp, records in batches.items():
            below = [r.offset for r in records if r.offset < ends.get(tp, 0)]
            if below:
                sent[tp.partition] = max(sent[tp.partition], below[-1] + 1)
        if sent != marks.sent:
            await self._mark(client, replay, list(marks.positions), sent)
            marks.sent = sent

    async def _mark(
        self, client: Client, replay: _Replay, positions: list[int], sent: list[int]
    ) -> None:
        """Store a persistent replay's progress (:meth:`ServerConnection.replay_mark`) and
        return once Kafka has it. Raises ``CancelledError`` when the client goes."""
        connection = client.connection
        topic_filter = replay.subscription.topic_filter
        self._run(client, connection.replay_mark(topic_filter, positions, sent))
        while not connection.replay_marked(topic_filter):
            if connection.closed:
                raise asyncio.CancelledError
            replay.room.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(replay.room.wait(), ROOM_WAIT_SECONDS)

    async def _room(self, client: Client, replay: _Replay, packet_id: int = 0) -> None:
        """Return once the client can take a replayed message: a free in-flight slot,
        its Packet Identifier ``packet_id`` (0: any) not in flight, and at most
        :data:`MAX_UNSENT_BYTES` unsent on its socket. Raises ``CancelledError`` (through
        the task's cancellation) when the client goes."""
        connection = client.connection
        while (
            not connection.replay_room(packet_id) or client.write_buffer_size() > MAX_UNSENT_BYTES
        ):
            if connection.closed:
                raise asyncio.CancelledError
            replay.room.clear()
            try:
                await asyncio.wait_for(replay.room.wait(), ROOM_WAIT_SECONDS)
            except TimeoutError:
                continue


def _published(record: ConsumerRecord[bytes, bytes]) -> Published | None:
    """The PUBLISH a ``msg.all`` record holds; None for a retained message request or an
    undecodable record (logged)."""
    try:
        parsed = parse_msg_all(record.key, record.value, record.headers)
    except RecordError as exc:
        log.warning("replay: skipping undecodable msg.all record at %d: %r", record.offset, exc)
        return None
    return parsed if isinstance(parsed, Published) else None
