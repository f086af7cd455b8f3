"""What the sans-IO connection asks its shell to do (the h11 model: bytes in, effects out).

The asyncio shell (:mod:`services.ingest.server`, :mod:`services.ingest.node`) carries out
each effect in order and reports the outcome of the ``Store*`` effects back with
``ServerConnection.stored(token)`` or ``ServerConnection.store_failed(token)``, and so the
outcome of :class:`CreateAppTopic`. A Will Message that must wait out a delay is stored in
Kafka (:class:`StoreWill`); the ingest node that owns its ``client.wills`` partition
publishes it when the delay has passed unless a newer connection of the client settles it
first (:mod:`services.ingest.will_rules` decides, :mod:`services.ingest.delayed_wills`
keeps the timers).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from services.common.auth.principal import AuthRequest, ScramState
from services.common.records import AckRecord, EventRecord, PublishMeta, SessionRecord, decode_meta
from services.common.subscription import Subscription
from services.ingest.limits import Refusal


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
class StoreRetained:
    """Keep a PUBLISH with RETAIN as its topic's retained message in ``msg.retained`` (key:
    the Topic Name); an empty payload deletes the topic's retained message (MQTT 3.3.1.3)."""

    token: int
    meta: PublishMeta
    payload: bytes


@dataclass(slots=True)
class StoreSubscriptions:
    """Write this client's whole subscription set to ``client.subscriptions`` ([] = tombstone;
    ``deletes``: the ``session_id`` of the session it ends, see
    :func:`~services.common.records.stale_delete`)."""

    token: int
    subscriptions: list[Subscription]
    deletes: bytes | None = None


@dataclass(slots=True)
class StoreSession:
    """Write this client's session record to ``client.sessions`` (None = tombstone;
    ``deletes``: the ``session_id`` of the session it ends, see
    :func:`~services.common.records.stale_delete`)."""

    token: int
    record: SessionRecord | None
    deletes: bytes | None = None


@dataclass(slots=True)
class StoreAcks:
    """Write this client's acknowledgements of store-assigned deliveries to ``client.acks``.

    Nothing waits for it: the outcome is only logged (a store that misses an acknowledgement
    resends the message after the next reconnect, MQTT 4.4).
    """

    token: int
    record: AckRecord


@dataclass(slots=True)
class StoreRetainedRequest:
    """Ask for the retained messages matching ``subscriptions`` (MQTT 3.3.1.3, 3.8.3.1):
    a ``msg.all`` record keyed by this client's id, empty value, header ``q``."""

    token: int
    subscriptions: list[Subscription]


@dataclass(frozen=True, slots=True)
class StoreWill:
    """Store this client's Will Message in ``client.wills``, to be published after
    ``delay_seconds`` (> 0) unless a newer connection of the client settles it first
    (:func:`services.ingest.will_rules.settled_by`). The shell writes nothing after it for this
    connection (its session's end) until Kafka has it: a waiting will outlives its node.

    ``connection_id`` and ``session_offset`` (the Kafka offset of its latest connected
    session record, if known) identify the connection the will belongs to, so that its own
    records are not taken for a newer connection's. ``meta.received_at_ms`` is when the
    network connection closed; the Will Message is stamped again when it is published
    (:func:`services.ingest.will_rules.published_after_delay`).
    """

    token: int
    delay_seconds: int
    connection_id: bytes
    session_offset: int | None
    meta: PublishMeta
    payload: bytes


@dataclass(frozen=True, slots=True)
class StoreDelayed:
    """Store a PUBLISH to ``$delayed/<seconds>/<topic>`` in ``msg.delayed``, to be
    published to its target topic (``meta.topic``) ``delay_seconds`` (> 0) after it arrived
    (``meta.received_at_ms``) by the ingest node that owns its partition
    (:mod:`services.ingest.delayed_publish`). Its PUBACK / PUBREC waits for it, as for a
    :class:`StorePublish`. ``delayed_id`` names it among the client's messages
    (:data:`~services.common.records.DELAYED_ID_SIZE` bytes: the connection id and the
    connection's sequence number of the PUBLISH)."""

    token: int
    delayed_id: bytes
    delay_seconds: int
    meta: PublishMeta
    payload: bytes


@dataclass(slots=True)
class CreateAppTopic:
    """Make sure this persistent APPLICATION client's ``msg.app.<client>`` topic exists
    (create it if not), and report back through ``token`` like a ``Store*`` effect: the
    session record that CONNACK waits for is stored only after it, so an accepted
    APPLICATION client always has its topic (TBMQ creates it at the first connect)."""

    token: int
    client_id: str


@dataclass(slots=True)
class Connected:
    """The session is established (CONNACK sent): the shell registers the client by id."""

    client_id: str


@dataclass(slots=True)
class WatchSession:
    """Until CONNACK, show this connection every ``client.sessions`` record of ``client_id``
    read from Kafka (``ServerConnection.session_record_seen``): it resumes a session
    another connection still held, and must learn whether that connection ended it first."""

    client_id: str


@dataclass(slots=True)
class SyncState:
    """Report back through ``token`` (like a ``Store*`` effect) once the state topics have
    been read up to their current end, which includes this connection's own session
    record: every record written before it has then been shown to the connection."""

    token: int


@dataclass(slots=True)
class Authenticate:
    """Check the client's credentials (a CONNECT, or an AUTH of MQTT 5 enhanced
    authentication) off the event loop's hot path, and report the outcome with
    ``ServerConnection.authenticated(outcome)``
    (:meth:`services.common.auth.authenticate.Authenticator.authenticate`). ``state`` is the
    SCRAM exchange the request answers, if any."""

    request: AuthRequest
    state: ScramState | None = None


@dataclass(slots=True)
class RecordEvent:
    """Append ``event`` to ``client.events`` for the analysts (key: ``client_id``): written
    off the hot path, nobody waits for it, a failure is only logged."""

    client_id: str
    event: EventRecord


@dataclass(frozen=True, slots=True)
class StartReplay:
    """Replay ``msg.all`` to this client for ``subscription`` (a replay subscription,
    :mod:`services.ingest.handle_replay`): every record from ``since_ms`` (Unix ms, by
    record timestamp) up to the subscription's ``LiveFrom`` cut whose message it matches,
    handed to ``ServerConnection.replayed`` while ``ServerConnection.replay_room`` says
    the client has room; then ``ServerConnection.replay_finished`` (or
    ``replay_failed``). A running replay of the same Topic Filter is stopped first."""

    subscription: Subscription
    since_ms: int


@dataclass(frozen=True, slots=True)
class StopReplay:
    """Stop this client's replay of ``topic_filter``, if one runs (UNSUBSCRIBE)."""

    topic_filter: str


@dataclass(frozen=True, slots=True)
class LimitRefused:
    """A limit refused this client something (``detail`` says what, for the log): the
    shell counts it and logs it once per client per minute (:mod:`services.ingest.refusals`).
    What the client is told travels in the effects beside it (SUBACK, PUBREC, CONNACK)."""

    refusal: Refusal
    detail: str


StoreEffect = (
    StorePublish
    | StoreRetained
    | StoreSubscriptions
    | StoreSession
    | StoreAcks
    | StoreRetainedRequest
    | StoreWill
    | StoreDelayed
)
"""The effects that write one Kafka record and report back through their ``token``."""

Effect = (
    Send
    | Close
    | StoreEffect
    | CreateAppTopic
    | Connected
    | WatchSession
    | SyncState
    | Authenticate
    | RecordEvent
    | LimitRefused
    | StartReplay
    | StopReplay
)


Publication = list[StorePublish | StoreRetained]
"""The records that publish a message (empty: discard it)."""


def publication(
    meta: PublishMeta, payload: bytes, new_token: Callable[[], int] = lambda: 0
) -> Publication:
    """The records that publish a message: its ``msg.all`` record and, with RETAIN, its
    ``msg.retained`` record (an empty payload then deletes the topic's retained message,
    MQTT 3.3.1.3). Nothing waits for them: ``new_token`` names them (0 when no connection
    is left to hear of the outcome)."""
    effects: Publication = [StorePublish(new_token(), meta, payload)]
    if meta.retain:
        effects.append(StoreRetained(new_token(), meta, payload))
    return effects


def published_now(meta_raw: bytes, payload: bytes, now_ms: int) -> Publication:
    """The records of a message that waited until now, stamped ``now_ms`` (Unix ms): its
    Message Expiry Interval runs from its publication, as a Will Message's does (MQTT 5.0
    3.1.3.2.4). Raises :class:`~services.common.records.RecordError` if ``meta_raw`` does
    not decode (a parsed waiting record's always does)."""
    meta = dataclasses.replace(decode_meta(meta_raw), received_at_ms=now_ms)
    return publication(meta, payload)
