"""Per-connection protocol state, shared by :mod:`services.ingest.connection` and the
``handle_*`` modules."""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from services.common.mqtt.codec import encode
from services.common.mqtt.packets import Packet, Publish, Will
from services.common.records import AckKind, ClientKind, DisconnectCause, SessionRecord
from services.common.settings import Settings
from services.common.topics.trie import Subscription

PreviousSession = Callable[[str], tuple[SessionRecord | None, list[Subscription]]]
"""Looks up a client id's latest session record and subscriptions (from the state topics)."""


class Phase(enum.Enum):
    """Where a connection is in its life (MQTT 3.1.4 / 4.1)."""

    AWAIT_CONNECT = "await-connect"
    CONNECTING = "connecting"  # CONNECT accepted, session record being stored
    CONNECTED = "connected"
    CLOSED = "closed"


@dataclass(slots=True)
class PendingAck:
    """An inbound QoS 1/2 PUBLISH waiting for Kafka; answered in arrival order (MQTT 4.6).

    ``outstanding`` counts the stores it still waits for: its ``msg.all`` record and, for a
    QoS 2 PUBLISH of a persistent session, a session record listing its Packet Identifier.
    """

    packet_id: int
    qos: int
    outstanding: int = 1
    failed: bool = False

    @property
    def done(self) -> bool:
        """True once every store it waited for has answered."""
        return self.outstanding == 0


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
    """A SUBACK/UNSUBACK waiting for ``outstanding`` stores (subscriptions, retained request)."""

    packet: Packet
    outstanding: int


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

    ``expires_at_ms``: Unix ms when its Message Expiry Interval ends, None if it never does.
    """

    packet: Publish
    expires_at_ms: int | None


@dataclass(slots=True)
class ConnectionState:
    """Mutable per-connection state shared by the ``handle_*`` modules.

    Slotted, and its queues small until used: an idle connection's state is about 1 KiB
    (bench/NOTES.md, "memory per idle connection").
    """

    settings: Settings
    node_id: str
    connection_id: bytes
    now_ms: Callable[[], int]
    phase: Phase = Phase.AWAIT_CONNECT
    session_id: bytes = bytes(16)
    client_id: str = ""
    protocol_version: int = 4
    clean_start: bool = True
    persistent: bool = False
    kind: ClientKind = ClientKind.DEVICE
    session_expiry_interval: int = 0
    keep_alive: int = 0
    connected_at_ms: int = 0
    request_problem_information: bool = True
    subscriptions: dict[str, Subscription] = field(default_factory=dict)
    # the connection whose session record was the latest at CONNECT: its late records are
    # not a takeover (MQTT 3.1.4-3 is about newer connections only)
    previous_connection_id: bytes | None = None
    # the Will Message (MQTT 3.1.2.5), armed once CONNACK has accepted the connection
    will: Will | None = None
    accepted: bool = False
    # inbound (client → server)
    next_token: int = 1
    # in arrival order; acknowledged from the front (a list: an empty deque costs 760 bytes)
    pending_acks: list[PendingAck] = field(default_factory=list)
    token_to_ack: dict[int, PendingAck] = field(default_factory=dict)
    unreleased_qos2: set[int] = field(default_factory=set)
    inbound_qos2_seen: bool = False  # a QoS 2 PUBLISH or PUBREL came on this connection
    unsaved: RecordWaiters = field(default_factory=RecordWaiters)
    session_dirty: bool = False
    record_waiters: dict[int, RecordWaiters] = field(default_factory=dict)
    topic_aliases: dict[int, str] = field(default_factory=dict)
    pending_subacks: dict[int, PendingSubAck] = field(default_factory=dict)
    early_packets: list[Packet] = field(default_factory=list)
    connack_token: int | None = None
    connack: Packet | None = None
    # a persistent APPLICATION client's topic being made sure of before its session record
    app_topic_token: int | None = None
    session_ended: bool = False
    # outbound (server → client)
    client_receive_maximum: int = 65535
    client_maximum_packet_size: int = 268_435_460
    client_topic_alias_maximum: int = 0
    outbound: dict[int, Outbound] = field(default_factory=dict)
    # over the client's Receive Maximum; created when first needed (an empty deque is 760 B)
    outbound_queue: deque[Queued] | None = None
    last_packet_id: int = 0
    acks_out: list[tuple[AckKind, int]] = field(default_factory=list)
    # client.events (services/ingest/events.py): the peer, and why the connection ends
    client_address: str = ""
    end_cause: DisconnectCause = DisconnectCause.NONE
    end_reason_code: int = 0
    disconnect_recorded: bool = False

    def new_token(self) -> int:
        """A fresh token naming one ``Store*`` effect of this connection."""
        token = self.next_token
        self.next_token += 1
        return token

    def encode(self, packet: Packet) -> bytes:
        """Encode ``packet`` for this connection's protocol version."""
        return encode(packet, self.protocol_version)
