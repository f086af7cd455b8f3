"""The server's MQTT limits and choices, as one connection applies them.

The sans-IO core reads these few values rather than the whole
:class:`~services.common.settings.Settings`, so what a connection depends on is visible
here, and a test sets them without the rest. :meth:`Limits.from_settings` is their one
source: the values and their meaning are the settings' of the same names.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from services.common.settings import Settings


class Refusal(enum.StrEnum):
    """What a node refused a client, by the limit or check that refused it.

    Each refusal is counted per node and logged once per client per minute
    (:mod:`services.ingest.refusals`); the names are the counters' and the metrics' (their
    ``limit`` label). The sans-IO core reports its own with a
    :class:`~services.ingest.effects.LimitRefused` effect; the shell counts the transport's.
    """

    CONNECTIONS = "connections"  # max_connections: CONNACK 0x97
    CONNECTION_RATE = "connection_rate"  # max_connection_rate: CONNACK 0x9F
    ADDRESS_CONNECTION_RATE = "address_connection_rate"  # ...per_address: CONNACK 0x9F
    MESSAGE_RATE = "message_rate"  # client_max_messages_per_second: reading paused
    BYTE_RATE = "byte_rate"  # client_max_bytes_per_second: reading paused
    INFLIGHT_QOS2 = "inflight_qos2"  # max_inflight_qos2: PUBREC 0x97 (v3.1.1: close)
    # max_delayed_messages(_per_client): PUBACK/PUBREC 0x97 (v3.1.1: close; QoS 0: dropped)
    DELAYED_MESSAGES = "delayed_messages"
    SUBSCRIPTIONS = "subscriptions"  # max_subscriptions: SUBACK 0x97 (v3.1.1: 0x80)
    TOPIC_LEVELS = "topic_levels"  # max_topic_levels: SUBACK 0x97 (v3.1.1: 0x80)
    REPLAY_AGE = "replay_age"  # max_replay_age_seconds: SUBACK 0x97 (v3.1.1: 0x80)
    PROXY_HEADER = "proxy_header"  # no valid PROXY header where required: closed
    TLS_HANDSHAKE = "tls_handshake"  # failed TLS handshake (a refused client certificate)
    WEBSOCKET_HANDSHAKE = "websocket_handshake"  # not a WebSocket upgrade on /mqtt
    BLOCKED = "blocked"  # a blocked client id, user name, address or flapping: CONNACK 0x8A


@dataclass(frozen=True, slots=True)
class Limits:
    """What the protocol core needs of the settings (each field is the setting of its name).

    ``max_packet_size`` (bytes) bounds packets both ways (MQTT 3.2.2.3.6);
    ``receive_maximum`` inbound QoS 1/2 PUBLISHes in flight (3.2.2.3.3);
    ``topic_alias_maximum`` the client's aliases (3.2.2.3.8); ``assign_topic_aliases`` the
    server's own on outgoing PUBLISHes (3.3.2.3.4); ``server_keep_alive`` and
    ``max_keep_alive`` (seconds) the keep alive granted (3.2.2.3.14);
    ``connect_timeout_seconds`` how long a socket may stay silent before CONNECT;
    ``session_expiry_max_seconds`` the longest a disconnected session is kept;
    ``application_client_ids`` the client id patterns of APPLICATION clients;
    ``max_inflight_qos2`` inbound QoS 2 messages not yet released per client;
    ``max_delay_seconds`` the longest delay of a ``$delayed/<seconds>/<topic>`` PUBLISH;
    ``max_delayed_messages`` delayed messages waiting in the cluster,
    ``max_delayed_messages_per_client`` those of one publisher;
    ``max_subscriptions`` subscriptions per client; ``max_topic_levels`` levels of one
    Topic Filter; ``max_replay_age_seconds`` how far back a replay subscription may start,
    ``msg_retention_seconds`` how far back ``msg.all`` keeps messages.
    """

    max_packet_size: int
    receive_maximum: int
    topic_alias_maximum: int
    assign_topic_aliases: bool
    server_keep_alive: int | None
    max_keep_alive: int
    connect_timeout_seconds: float
    session_expiry_max_seconds: int | None
    application_client_ids: tuple[str, ...]
    max_inflight_qos2: int = 65535
    max_delay_seconds: int = 4_294_967
    max_delayed_messages: int = 100_000
    max_delayed_messages_per_client: int = 1000
    max_subscriptions: int = 1_000_000
    max_topic_levels: int = 65535
    max_replay_age_seconds: int = 30 * 24 * 3600
    msg_retention_seconds: int = 7 * 24 * 3600

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        """The limits ``settings`` give."""
        return cls(
            max_packet_size=settings.max_packet_size,
            receive_maximum=settings.receive_maximum,
            topic_alias_maximum=settings.topic_alias_maximum,
            assign_topic_aliases=settings.assign_topic_aliases,
            server_keep_alive=settings.server_keep_alive,
            max_keep_alive=settings.max_keep_alive,
            connect_timeout_seconds=settings.connect_timeout_seconds,
            session_expiry_max_seconds=settings.session_expiry_max_seconds,
            application_client_ids=tuple(settings.application_client_ids),
            max_inflight_qos2=settings.max_inflight_qos2,
            max_delay_seconds=settings.max_delay_seconds,
            max_delayed_messages=settings.max_delayed_messages,
            max_delayed_messages_per_client=settings.max_delayed_messages_per_client,
            max_subscriptions=settings.max_subscriptions,
            max_topic_levels=settings.max_topic_levels,
            max_replay_age_seconds=settings.max_replay_age_seconds,
            msg_retention_seconds=settings.msg_retention_seconds,
        )
