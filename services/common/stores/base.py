"""The message store of persistent DEVICE sessions: the interface both backends implement.

device_persist keeps, per subscriber client, the QoS 1/2 messages the client has not
acknowledged yet (docs/design.md, "The data path"). Every message gets from the store a
per-client sequence number (its order) and a Packet Identifier that stays the same until the
message is deleted, so that a resend after a reconnect carries the original identifier with
DUP=1 (MQTT 5.0 section 4.4). A message moves QUEUED → SENT → (QoS 2: RELEASED) → deleted
(MQTT 5.0 4.3.2, 4.3.3).

Every method is one atomic step on the server: it is applied entirely or not at all. Backend
failures raise :class:`StoreUnavailable`; after one (a timeout in particular) the caller
cannot know whether the step was applied, so every method is safe to call again: ``append``
is idempotent by source offset, ``mark_sent`` and ``clear`` are idempotent, and a repeated
``acknowledge`` returns False without changing anything.
"""

from __future__ import annotations

import abc
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum

from services.common.records import AckKind as AckKind  # re-exported: part of the interface

#: The largest Packet Identifier (MQTT 5.0 2.2.1): identifiers are 1..65535.
MAX_PACKET_ID = 65535

#: Source offsets and expiry times are compared as IEEE doubles in Redis' Lua: below 2**53
#: they are exact.
MAX_EXACT_INT = 2**53


class StoreError(Exception):
    """A message store operation failed for a reason other than the backend's availability."""


class StoreUnavailable(StoreError):
    """The store's backend cannot be reached, refused the call, or did not answer in time.

    The message names the backend and its address (never credentials). The call may or may
    not have been applied; calling again is safe (see the module docstring).
    """


class StoreFailedOver(StoreError):
    """The store's primary has changed since the records of some partitions were last
    applied to it (a Redis failover, or a restart): writes confirmed on the previous
    primary may be missing. Nothing of the refused call was written.

    ``replication_id``: the primary's replication id now (Redis ``master_replid``). The
    caller re-applies those partitions' records from :meth:`MessageStore.failover_state`'s
    offsets, with ``replaying`` set to this id, and then calls :meth:`MessageStore.adopt`.
    """

    def __init__(self, message: str, replication_id: str) -> None:
        super().__init__(message)
        self.replication_id = replication_id


@dataclass(frozen=True, slots=True)
class FailoverState:
    """What :meth:`MessageStore.failover_state` found on the primary.

    ``replication_id``: the primary's replication id. ``applied``: per ``msg.persisted``
    partition, the offset below which every record was applied to the data this primary
    holds (partitions without one are absent): re-applying from there recovers whatever a
    failover dropped. ``current``: the partitions whose records were last applied on this
    primary (nothing to re-apply for them).
    """

    replication_id: str
    applied: Mapping[int, int]
    current: frozenset[int] = frozenset()


class MessageState(IntEnum):
    """Where a stored message is in its delivery flow (MQTT 5.0 4.3.2, 4.3.3)."""

    QUEUED = 0
    """Never sent to the client."""
    SENT = 1
    """Sent, awaiting PUBACK (QoS 1) or PUBREC (QoS 2): a resend carries DUP=1."""
    RELEASED = 2
    """QoS 2 only: PUBREC received; only PUBREL is resent, until PUBCOMP."""


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """One stored message of ``client_id``.

    ``seq``: per-client, strictly increasing order assigned by the store (it starts again
    after :meth:`MessageStore.clear`). ``packet_id``: 1..65535, assigned at append, unique
    among the client's stored messages. ``qos``: 1 or 2. ``expires_at_ms``: Unix time in
    milliseconds after which a message not yet sent is dead (MQTT 5.0 3.3.2.3.3). ``data``:
    opaque bytes (device_persist's encoded record); the store never looks inside.
    """

    client_id: str
    seq: int
    packet_id: int
    qos: int
    state: MessageState
    expires_at_ms: int
    data: bytes


@dataclass(frozen=True, slots=True)
class AppendResult:
    """What :meth:`MessageStore.append` did.

    ``packet_id``: the new message's Packet Identifier, or None when the append was a
    duplicate (source offset not above the highest already appended) and was ignored.
    ``dropped``: how many of the client's oldest messages this call dropped to stay within
    the cap.
    """

    packet_id: int | None
    dropped: int


@dataclass(frozen=True, slots=True)
class AppendRequest:
    """The arguments of one :meth:`MessageStore.append`, for :meth:`MessageStore.append_many`."""

    client_id: str
    source_offset: int
    qos: int
    expires_at_ms: int
    data: bytes
    #: The ``msg.persisted`` partition of the record (every record of one client is in the
    #: same one): which partition's failover epoch guards the append
    #: (:class:`StoreFailedOver`). None: unguarded (a caller that never re-applies).
    source_partition: int | None = None


@dataclass(frozen=True, slots=True)
class AckRequest:
    """The arguments of one :meth:`MessageStore.acknowledge`, for
    :meth:`MessageStore.acknowledge_many`."""

    client_id: str
    packet_id: int
    kind: AckKind


@dataclass(frozen=True, slots=True)
class WindowRequest:
    """The arguments of one :meth:`MessageStore.window`, for :meth:`MessageStore.windows`."""

    client_id: str
    limit: int
    after_seq: int = 0


@dataclass(frozen=True, slots=True)
class BatchResult:
    """What :meth:`MessageStore.apply_batch` did: ``appended``, one
    :class:`AppendResult` per append request, in order; ``windows``, one list of messages
    per window request, in order (states as before the call marked them SENT)."""

    appended: list[AppendResult]
    windows: list[list[StoredMessage]]


@dataclass(frozen=True, slots=True)
class StoreStats:
    """A client's counters: ``stored`` messages now, ``dropped`` by the cap since ``clear``."""

    stored: int
    dropped: int


def check_max_messages(max_messages: int) -> int:
    """Return ``max_messages`` if it is a valid per-client cap, else raise ``ValueError``.

    The cap must leave a free Packet Identifier for every append (at most 65,534 messages
    are stored when a new one arrives), so it is 1..65534.
    """
    if not 1 <= max_messages < MAX_PACKET_ID:
        raise ValueError(f"max_messages must be 1..{MAX_PACKET_ID - 1}, got {max_messages}")
    return max_messages


def check_append(source_offset: int, qos: int, expires_at_ms: int) -> None:
    """Raise ``ValueError`` unless the arguments of an append are in range.

    ``source_offset`` and ``expires_at_ms`` are 0..2**53-1 (a Kafka offset; a Unix time in
    milliseconds), ``qos`` is 1 or 2.
    """
    if not 0 <= source_offset < MAX_EXACT_INT:
        raise ValueError(f"source_offset must be 0..2**53-1, got {source_offset}")
    if qos not in (1, 2):
        raise ValueError(f"qos must be 1 or 2, got {qos}")
    if not 0 <= expires_at_ms < MAX_EXACT_INT:
        raise ValueError(f"expires_at_ms must be 0..2**53-1, got {expires_at_ms}")


class MessageStore(abc.ABC):
    """Per-client store of unacknowledged QoS 1/2 messages (Redis or PostgreSQL).

    Safe for concurrent use by many asyncio tasks; calls about one client are serialised on
    the server. Every method raises :class:`StoreUnavailable` when the backend fails, and
    :class:`StoreError` on any other backend error.
    """

    @abc.abstractmethod
    async def append(
        self, client_id: str, source_offset: int, qos: int, expires_at_ms: int, data: bytes
    ) -> AppendResult:
        """Store a new QUEUED message at the end of ``client_id``'s queue.

        ``source_offset``: the msg.persisted offset of the record (0..2**53-1); an append
        whose offset is not above the highest one appended for the client since ``clear`` is
        ignored (``packet_id`` None), so a replay after a crash stores nothing twice.
        ``qos``: 1 or 2. ``expires_at_ms``: Unix ms after which the message is dead if not
        yet sent. ``data``: opaque bytes.

        When the client already has ``max_messages`` messages, the oldest ones (whatever
        their state) are dropped first and counted. The Packet Identifier is the one after
        the client's last assigned (1..65535, wrapping), skipping identifiers of stored
        messages. Raises ``ValueError`` for arguments out of range.
        """

    @abc.abstractmethod
    async def window(
        self, client_id: str, limit: int, now_ms: int, after_seq: int = 0
    ) -> list[StoredMessage]:
        """The oldest ``limit`` live messages of ``client_id``, in ``seq`` order, without
        those whose ``seq`` is ``after_seq`` or less: they count toward ``limit`` but are
        neither returned nor checked for expiry (the caller has sent them already, so their
        delivery has started and they do not expire).

        Messages in every state are returned: RELEASED ones need their PUBREL resent, SENT
        ones their PUBLISH with DUP=1 (MQTT 5.0 4.4). A QUEUED message whose
        ``expires_at_ms`` <= ``now_ms`` (Unix ms) met on the way is deleted and not returned
        (MQTT 5.0 3.3.2.3.3: only a message whose delivery has not started expires; a SENT
        or RELEASED one stays until acknowledged). Raises ``ValueError`` if ``limit`` < 0.
        """

    async def append_many(
        self,
        requests: Sequence[AppendRequest],
        applied: Mapping[int, int] | None = None,
        replaying: str = "",
    ) -> list[AppendResult]:
        """:meth:`append` for each request, in order; one result per request.

        Each append is atomic by itself, not the whole batch: after a failure
        (:class:`StoreUnavailable`) some may have been applied, and calling again is safe
        (appends are idempotent by source offset). Backends override this to save round
        trips; this default calls :meth:`append` one by one.

        ``applied`` (``msg.persisted`` partition → offset): every record of the partition
        below the offset has been handled once these appends are in; a backend whose
        primary can fail over and drop writes (Redis) records it after the appends, for
        :meth:`failover_state`. ``replaying``: a replication id a failover changed to (from
        :class:`StoreFailedOver`), while its partitions' records are re-applied. A backend
        that can lose writes to a failover raises :class:`StoreFailedOver` (writing
        nothing) when a partition's records were last applied on another primary; this
        default never does.
        """
        return [
            await self.append(r.client_id, r.source_offset, r.qos, r.expires_at_ms, r.data)
            for r in requests
        ]

    async def failover_state(self, partitions: Collection[int]) -> FailoverState | None:
        """The primary's replication id and how far each of ``partitions`` (of
        ``msg.persisted``) was applied to its data; None for a backend without failovers
        that drop writes (this default)."""
        return None

    async def adopt(self, partitions: Collection[int], replication_id: str) -> bool:
        """Mark ``partitions`` as re-applied on the primary whose replication id is
        ``replication_id``: their appends are accepted again. False (nothing marked) when
        the primary's id is another one by now (it failed over again). This default has
        nothing to mark."""
        return True

    async def acknowledge_many(self, requests: Sequence[AckRequest]) -> list[bool]:
        """:meth:`acknowledge` for each request, in order; one result per request (each
        atomic by itself, safe to call again after a failure)."""
        return [await self.acknowledge(r.client_id, r.packet_id, r.kind) for r in requests]

    async def windows(
        self, requests: Sequence[WindowRequest], now_ms: int
    ) -> list[list[StoredMessage]]:
        """:meth:`window` for each request; one list per request."""
        return [await self.window(r.client_id, r.limit, now_ms, r.after_seq) for r in requests]

    async def mark_sent_many(self, sent: Sequence[tuple[str, Sequence[int]]]) -> None:
        """:meth:`mark_sent` for each (client id, Packet Identifiers) pair."""
        for client_id, packet_ids in sent:
            await self.mark_sent(client_id, packet_ids)

    async def apply_batch(
        self,
        appends: Sequence[AppendRequest],
        applied: Mapping[int, int] | None,
        replaying: str,
        acknowledgements: Sequence[AckRequest],
        starts: Sequence[WindowRequest],
        now_ms: int,
    ) -> BatchResult:
        """device_persist's whole store step for one batch of records, in this order:
        :meth:`append_many` (``appends``, ``applied``, ``replaying`` as there), then
        :meth:`acknowledge_many` (``acknowledgements``), then :meth:`windows` for
        ``starts`` at ``now_ms``, whose QUEUED messages are marked SENT: the caller sends
        them now. The windows report each message's state from before that mark (QUEUED:
        a first delivery, DUP=0).

        Marking before the caller's send is in Kafka means a send that then fails (or a
        process that dies before it) leaves a message SENT that the client never got; its
        later resend carries DUP=1, which MQTT allows: DUP=1 says the PUBLISH "might be"
        a re-delivery, and its receiver cannot assume it saw an earlier copy (MQTT 3.1.1
        and 5.0, 3.3.1.1).

        Each step is atomic by itself, not the whole call: after a failure some may have
        been applied, and calling again is safe (every step is idempotent). Raises
        :class:`StoreFailedOver` as :meth:`append_many` does, ``ValueError`` for
        arguments out of range. Backends override this to make it one round trip; this
        default makes the calls one after another.
        """
        appended = await self.append_many(appends, applied, replaying)
        await self.acknowledge_many(acknowledgements)
        windows = await self.windows(starts, now_ms)
        queued = [
            (r.client_id, [m.packet_id for m in window if m.state is MessageState.QUEUED])
            for r, window in zip(starts, windows, strict=True)
        ]
        await self.mark_sent_many([(client_id, ids) for client_id, ids in queued if ids])
        return BatchResult(appended, windows)

    @abc.abstractmethod
    async def mark_sent(self, client_id: str, packet_ids: Sequence[int]) -> None:
        """Turn the QUEUED messages with these Packet Identifiers to SENT.

        Messages in other states, and identifiers of no stored message, are left alone.
        """

    @abc.abstractmethod
    async def acknowledge(self, client_id: str, packet_id: int, kind: AckKind) -> bool:
        """Apply the client's PUBACK, PUBREC or PUBCOMP for ``packet_id``.

        PUBACK deletes a QoS 1 message; PUBREC turns a QoS 2 message (QUEUED or SENT) to
        RELEASED; PUBCOMP deletes a RELEASED QoS 2 message (MQTT 5.0 4.3.2, 4.3.3). A
        QUEUED message is accepted like a SENT one: it may have been sent by a process that
        stopped before its ``mark_sent``. Returns whether something changed: an unknown
        identifier, or an acknowledgement of the wrong kind for the message's QoS and state,
        returns False and changes nothing.
        """

    @abc.abstractmethod
    async def clear(self, client_id: str) -> int:
        """Delete everything about ``client_id``: messages, counters, source offset.

        Used on Clean Start and session expiry. Returns how many messages were deleted.
        """

    @abc.abstractmethod
    async def count(self, client_id: str) -> int:
        """How many messages ``client_id`` has stored (expired ones not yet removed included)."""

    @abc.abstractmethod
    async def stats(self, client_id: str) -> StoreStats:
        """``client_id``'s stored count and the number of messages the cap dropped."""

    async def counts(self, client_ids: Sequence[str]) -> list[int]:
        """:meth:`count` of each client, in order (the device_persist metrics and the admin
        API). Backends override this to ask once; this default asks one by one."""
        return [await self.count(client_id) for client_id in client_ids]

    @abc.abstractmethod
    async def ping(self) -> None:
        """Return once the backend answers a trivial request (a readiness check);
        :class:`StoreUnavailable` if it does not."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release the store's connections. The store is unusable afterwards."""
