"""Per-connection protocol state, shared by :mod:`services.ingest.connection` and the
``handle_*`` modules, and what every connection of a node shares (:class:`ServerContext`)."""

from __future__ import annotations

import enum
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from services.common.auth.authorize import DENY_ALL, Authorizer
from services.common.auth.blocked import Verdict
from services.common.auth.certificates import CertificateIdentity
from services.common.auth.principal import Principal, ScramState
from services.common.mqtt.codec import encode
from services.common.mqtt.errors import MQTTError
from services.common.mqtt.packets import ConnAck, Packet, Publish, Will
from services.common.mqtt.properties import Properties
from services.common.records import AckKind, ClientKind, DisconnectCause, SessionRecord, Target
from services.common.subscription import Subscription
from services.ingest.delayed_rules import DelayedCounts
from services.ingest.fan_out import FanOut
from services.ingest.limits import Limits
from services.ingest.topic_alias import OutboundAliases

W = TypeVar("W")

PreviousSession = Callable[[str], tuple[SessionRecord | None, list[Subscription]]]
"""Looks up a client id's latest session record and subscriptions (from the state topics)."""

CheckBlocked = Callable[[str, str | None, str], Verdict | None]
"""``check(client_id, username, client_address)``: the verdict on a CONNECT before its
credentials are checked (:meth:`~services.common.auth.blocked.ConnectGate.check`), None
when it may go on."""


def _nothing_blocked(client_id: str, username: str | None, address: str) -> Verdict | None:
    return None


class OncePerInterval:
    """Says yes to a key at most once per ``interval_ms`` (milliseconds): what a node logs
    per client id (a refused session takeover) without a flood from a client retrying in a
    loop. Keys older than the interval are forgotten as new ones come, so memory stays
    bounded by the keys seen within one interval."""

    def __init__(self, interval_ms: int) -> None:
        self.interval_ms = interval_ms
        self._last: dict[str, int] = {}

    def allow(self, key: str, now_ms: int) -> bool:
        """Whether ``key`` may be acted on at ``now_ms`` (Unix ms); if so, it is noted."""
        last = self._last.get(key)
        if last is not None and now_ms - last < self.interval_ms:
            return False
        if last is None and len(self._last) >= 1024:
            self._last = {k: t for k, t in self._last.items() if now_ms - t < self.interval_ms}
        self._last[key] = now_ms
        return True


@dataclass(frozen=True, slots=True)
class ServerContext:
    """What every connection of one ingest node shares.

    ``limits`` are the server's; ``node_id`` names the node in session records;
    ``previous_session`` is consulted on CONNECT; ``now_ms`` returns Unix time in
    milliseconds; ``new_client_id`` makes the Assigned Client Identifier of a v5 client that
    sent none (MQTT 5.0 3.1.3.1); ``monotonic`` returns seconds on a clock that never steps
    back (the keep-alive clock: :attr:`ServerConnection.keep_alive_deadline`); ``blocked``
    judges each CONNECT against the blocked clients (:data:`CheckBlocked`; none by
    default). The shell passes the real clocks and generator, tests their own.
    ``owner_refusals_logged`` says which refused session takeovers (another principal's
    CONNECT for a Client Identifier whose session is not its own) are logged: once per
    client id and minute. ``delayed`` counts the delayed messages waiting in the cluster,
    as the node follows ``msg.delayed``, for their bounds.
    """

    limits: Limits
    node_id: str
    previous_session: PreviousSession
    now_ms: Callable[[], int]
    new_client_id: Callable[[], str]
    monotonic: Callable[[], float] = time.monotonic
    owner_refusals_logged: OncePerInterval = field(default_factory=lambda: OncePerInterval(60_000))
    blocked: CheckBlocked = _nothing_blocked
    delayed: DelayedCounts = field(default_factory=DelayedCounts)


class Phase(enum.Enum):
    """Where a connection is in its life (MQTT 3.1.4 / 4.1)."""

    AWAIT_CONNECT = "await-connect"
    AUTHENTICATING = "authenticating"  # CONNECT valid, its credentials being checked
    CONNECTING = "connecting"  # CONNECT accepted, session record being stored
    CONNECTED = "connected"
    CLOSED = "closed"


@dataclass(slots=True)
class PendingAck:
    """An inbound QoS 1/2 PUBLISH waiting for Kafka; answered in arrival order (MQTT 4.6).

    ``outstanding`` counts the stores it still waits for: its ``msg.all`` record and, for a
    QoS 2 PUBLISH of a persistent session, a session record listing its Packet Identifier.
    ``refused``: the Reason Code of a refused PUBLISH (nothing stored; 0: none): 0x87 Not
    authorized by the client's rules, 0x97 Quota exceeded by ``max_inflight_qos2`` or the
    delayed messages' bounds (v5); ``reason_string`` says why to a v5 client that asked for
    them (None: the Reason Code's usual one).
    """

    packet_id: int
    qos: int
    outstanding: int = 1
    failed: bool = False
    refused: int = 0
    reason_string: str | None = None

    @property
    def done(self) -> bool:
        """True once every store it waited for has answered."""
        return self.outstanding == 0

    @property
    def unreleased_qos2(self) -> bool:
        """A QoS 2 PUBLISH neither failed nor refused: its Packet Identifier is unreleased
        once acknowledged (MQTT 4.3.3)."""
        return self.qos == 2 and not self.failed and not self.refused


@dataclass(slots=True)
class RecordWaiters:
    """What waits for one session record of a persistent session (MQTT 4.3.3).

    ``acks``: QoS 2 PUBLISHes whose PUBREC needs their Packet Identifier recorded as
    unreleased; ``releases``: Packet Identifiers whose PUBCOMP needs them recorded as released.
    """

    acks: list[PendingAck] = field(default_factory=list)
    releases: list[int] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.acks or self.releases)


@dataclass(slots=True)
class PendingSubAck:
    """A SUBACK/UNSUBACK waiting for ``outstanding`` stores (subscriptions, retained request);
    ``replays``: (subscription, since in Unix ms) of the replays that start once it is
    sent (their cuts are then filled in)."""

    packet: Packet
    outstanding: int
    replays: list[tuple[Subscription, int]] = field(default_factory=list)


@dataclass(slots=True)
class PendingReplayMark:
    """A persistent session's replay progress (``topic_filter``'s subscription record)
    being stored: its reader sends nothing past its old ``sent`` marks until it is
    (:func:`services.ingest.handle_replay.mark`)."""

    topic_filter: str


@dataclass(slots=True)
class AwaitingConnAck:
    """CONNACK, waiting for the session record it answers to be stored (MQTT 3.2: a client
    is told it is connected once every node can see its session)."""

    connack: ConnAck


@dataclass(slots=True)
class AwaitingAppTopic:
    """A persistent APPLICATION client's ``msg.app`` topic, made sure of before its session
    record is stored (an accepted APPLICATION client always has its topic); then the
    session record, and ``connack`` once it is stored."""

    connack: ConnAck


@dataclass(slots=True)
class AwaitingStateSync:
    """CONNACK of a session resumed from a connection that still held it, waiting until
    the records written before this connection's own have been read (did that connection
    end the session first?)."""

    connack: ConnAck


Waiter = (
    PendingAck
    | RecordWaiters
    | PendingSubAck
    | PendingReplayMark
    | AwaitingConnAck
    | AwaitingAppTopic
    | AwaitingStateSync
)
"""What waits for the outcome of one store (a ``Store*`` effect or
:class:`~services.ingest.effects.CreateAppTopic`) of a connection, by its token."""


@dataclass(slots=True)
class Outbound:
    """A QoS 1/2 PUBLISH sent to the client and not yet completed (MQTT 4.3.2, 4.3.3).

    ``store_assigned``: its Packet Identifier came from a message store, which must hear of
    every acknowledgement; ``released``: (QoS 2) PUBREC received and PUBREL sent, PUBCOMP due.
    """

    qos: int
    store_assigned: bool = False
    released: bool = False


@dataclass(slots=True)
class Queued:
    """A QoS 1/2 message waiting for a free slot of the client's Receive Maximum.

    ``expires_at_ms``: Unix ms when its Message Expiry Interval ends, None if it never does;
    ``packet_id``: the Packet Identifier it asks for (:func:`services.ingest.delivery.deliver`),
    0 for any.
    """

    packet: Publish
    expires_at_ms: int | None
    packet_id: int = 0


EarlyDelivery = tuple[FanOut, Target] | int
"""A message routed to a connection before its CONNACK, sent after it: a routed message
and its target, or the Packet Identifier of a PUBREL."""


@dataclass(slots=True)
class ConnectionState:
    """Mutable per-connection state shared by the ``handle_*`` modules.

    Slotted, and its queues small until used: an idle connection's state is about 1 KiB
    (bench/NOTES.md, "memory per idle connection").
    """

    server: ServerContext
    connection_id: bytes
    phase: Phase = Phase.AWAIT_CONNECT
    session_id: bytes = bytes(16)
    client_id: str = ""
    protocol_version: int = 4
    clean_start: bool = True
    persistent: bool = False
    kind: ClientKind = ClientKind.DEVICE
    session_expiry_interval: int = 0
    keep_alive: int = 0
    # when the client was last heard from (bytes read, or the CONNACK sent: Keep Alive
    # counts from there), on the server's monotonic clock, in seconds; set at creation
    heard_at: float = 0.0
    connected_at_ms: int = 0
    request_problem_information: bool = True
    subscriptions: dict[str, Subscription] = field(default_factory=dict)
    # authentication (services/common/auth): the verified TLS client certificate (mutual
    # TLS; set by the transport when the socket opens, None without one), who the client
    # is once authenticated and its compiled rules; the Authentication Method of enhanced
    # authentication (MQTT 5.0 4.12), the SCRAM exchange waiting for the client's answer,
    # and whether a re-authentication is under way
    certificate: CertificateIdentity | None = None
    principal: Principal | None = None
    authorizer: Authorizer = DENY_ALL
    auth_method: str | None = None
    auth_state: ScramState | None = None
    reauthenticating: bool = False
    # CONNACK's properties, worked out at CONNECT and sent once authentication accepts it
    connack_properties: Properties | None = None
    # the connection whose session record was the latest at CONNECT: its late records are
    # not a takeover (MQTT 3.1.4-3 is about newer connections only)
    previous_connection_id: bytes | None = None
    # the Will Message (MQTT 3.1.2.5), armed once CONNACK has accepted the connection
    will: Will | None = None
    accepted: bool = False
    # every store whose outcome something waits for, by token (the token of a Store* effect)
    waiting: dict[int, Waiter] = field(default_factory=dict)
    next_token: int = 1
    # a session record was asked for (CONNECT accepted): the session's end must be recorded
    session_requested: bool = False
    session_ended: bool = False
    # the store after which the socket closes (a DISCONNECT's end of session)
    close_after: int | None = None
    # Kafka offset of this connection's latest connected session record: a record of the
    # client at a higher offset is newer than this connection's (session takeover)
    session_offset: int | None = None
    # resuming a session another connection still held: Session Present is confirmed once
    # the records before this connection's own are read; the client's records (offset,
    # record or tombstone) seen meanwhile, and what was routed to it before CONNACK
    confirm_previous: bool = False
    seen_while_connecting: list[tuple[int, SessionRecord | None]] | None = None
    early_deliveries: list[EarlyDelivery] | None = None
    # inbound (client → server)
    # in arrival order; acknowledged from the front (a list: an empty deque costs 760 bytes)
    pending_acks: list[PendingAck] = field(default_factory=list)
    unreleased_qos2: set[int] = field(default_factory=set)
    inbound_qos2_seen: bool = False  # a QoS 2 PUBLISH or PUBREL came on this connection
    unsaved: RecordWaiters = field(default_factory=RecordWaiters)
    session_dirty: bool = False
    topic_aliases: dict[int, str] = field(default_factory=dict)
    early_packets: list[Packet] = field(default_factory=list)
    # outbound (server → client)
    client_receive_maximum: int = 65535
    client_maximum_packet_size: int = 268_435_460
    client_topic_alias_maximum: int = 0
    outbound: dict[int, Outbound] = field(default_factory=dict)
    # over the client's Receive Maximum; created when first needed (an empty deque is 760 B)
    outbound_queue: deque[Queued] | None = None
    last_packet_id: int = 0
    acks_out: list[tuple[AckKind, int]] = field(default_factory=list)
    # server-assigned Topic Aliases; created at the first PUBLISH that may use one
    outbound_aliases: OutboundAliases | None = None
    # replay subscriptions (services/ingest/handle_replay.py): the Topic Filters whose
    # history is being replayed, and the live messages held until every replay is done
    replaying: set[str] | None = None
    held: deque[tuple[FanOut, Target]] | None = None
    # each replay's switch window, its two msg.all cuts (first, second) by Topic Filter,
    # and the msg.all (partition, offset) of the messages replayed from inside a window:
    # their live copies are dropped
    replay_windows: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] | None = None
    replayed_origins: set[tuple[int, int]] | None = None
    # a persistent session's replays: the msg.all (Topic Filter, partition, offset) of
    # each QoS 1 replayed message in flight by Packet Identifier, the progress records
    # being stored by Topic Filter, and whether held live messages wait for those in flight
    # (a message store's Packet Identifiers and the node's share one space)
    replay_inflight: dict[int, tuple[str, int, int]] | None = None
    replay_marks: dict[str, int] | None = None
    replay_draining: bool = False
    # client.events (services/ingest/events.py): the peer, and why the connection ends
    client_address: str = ""
    # the listener the connection came through (its metrics' label)
    listener: str = "mqtt"
    # set by the shell before CONNECT: the CONNACK Reason Code that refuses it (a limit)
    refusal: MQTTError | None = None
    end_cause: DisconnectCause = DisconnectCause.NONE
    end_reason_code: int = 0
    disconnect_recorded: bool = False

    @property
    def limits(self) -> Limits:
        """The server's limits."""
        return self.server.limits

    def now_ms(self) -> int:
        """Unix time in milliseconds."""
        return self.server.now_ms()

    def new_token(self, waiter: Waiter | None = None) -> int:
        """A fresh token naming one ``Store*`` effect of this connection; ``waiter`` (if
        any) waits for its outcome."""
        token = self.next_token
        self.next_token += 1
        if waiter is not None:
            self.waiting[token] = waiter
        return token

    def waiters(self, kind: type[W]) -> list[W]:
        """The waiters of one kind, oldest first."""
        return [w for w in self.waiting.values() if isinstance(w, kind)]

    def encode(self, packet: Packet) -> bytes:
        """Encode ``packet`` for this connection's protocol version."""
        return encode(packet, self.protocol_version)
