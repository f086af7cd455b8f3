"""Per-connection protocol state, shared by :mod:`services.ingest.connection` and the
``handle_*`` modules."""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from services.common.mqtt.codec import encode
from services.common.mqtt.packets import Packet, Publish
from services.common.records import SessionRecord
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
    """An inbound QoS 1/2 PUBLISH waiting for Kafka; answered in arrival order (MQTT 4.6)."""

    packet_id: int
    qos: int
    done: bool = False
    failed: bool = False


@dataclass(slots=True)
class Outbound:
    """A QoS 1 PUBLISH sent to the client and not yet acknowledged (MQTT 4.4)."""

    packet: Publish


@dataclass
class ConnectionState:
    """Mutable per-connection state shared by the ``handle_*`` modules."""

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
    session_expiry_interval: int = 0
    keep_alive: int = 0
    connected_at_ms: int = 0
    request_problem_information: bool = True
    subscriptions: dict[str, Subscription] = field(default_factory=dict)
    # inbound (client → server)
    next_token: int = 1
    pending_acks: deque[PendingAck] = field(default_factory=deque)
    token_to_ack: dict[int, PendingAck] = field(default_factory=dict)
    unreleased_qos2: set[int] = field(default_factory=set)
    topic_aliases: dict[int, str] = field(default_factory=dict)
    pending_subacks: dict[int, Packet] = field(default_factory=dict)
    early_packets: list[Packet] = field(default_factory=list)
    connack_token: int | None = None
    connack: Packet | None = None
    session_ended: bool = False
    # outbound (server → client)
    client_receive_maximum: int = 65535
    client_maximum_packet_size: int = 268_435_460
    client_topic_alias_maximum: int = 0
    outbound: dict[int, Outbound] = field(default_factory=dict)
    outbound_queue: deque[Publish] = field(default_factory=deque)
    last_packet_id: int = 0

    def new_token(self) -> int:
        """A fresh token naming one ``Store*`` effect of this connection."""
        token = self.next_token
        self.next_token += 1
        return token

    def encode(self, packet: Packet) -> bytes:
        """Encode ``packet`` for this connection's protocol version."""
        return encode(packet, self.protocol_version)
