"""The server's MQTT limits and choices, as one connection applies them.

The sans-IO core reads these few values rather than the whole
:class:`~services.common.settings.Settings`, so what a connection depends on is visible
here, and a test sets them without the rest. :meth:`Limits.from_settings` is their one
source: the values and their meaning are the settings' of the same names.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.common.settings import Settings


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
    ``application_client_ids`` the client id patterns of APPLICATION clients.
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
        )
