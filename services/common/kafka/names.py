"""The one place where Cormorant's Kafka topic names are spelled (DESIGN.md, "The data path").

All names are prefixed by ``Settings.topic_prefix`` so that several Cormorant clusters (or
test runs) can share one Kafka cluster.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.common.settings import Settings

MSG_ALL = "msg.all"
MSG_PERSISTED = "msg.persisted"
MSG_RETAINED = "msg.retained"
CLIENT_SESSIONS = "client.sessions"
CLIENT_SUBSCRIPTIONS = "client.subscriptions"
CLIENT_ACKS = "client.acks"
DOWNLINK_PREFIX = "msg.downlink."


@dataclass(frozen=True, slots=True)
class TopicNames:
    """Resolved topic names for one deployment (one ``topic_prefix``)."""

    prefix: str = ""

    @classmethod
    def from_settings(cls, settings: Settings) -> TopicNames:
        """Build the names for ``settings.topic_prefix``."""
        return cls(prefix=settings.topic_prefix)

    @property
    def msg_all(self) -> str:
        """Every accepted PUBLISH, keyed by the publisher's client id."""
        return self.prefix + MSG_ALL

    @property
    def msg_persisted(self) -> str:
        """Messages for persistent DEVICE sessions, keyed by the subscriber's client id."""
        return self.prefix + MSG_PERSISTED

    @property
    def msg_retained(self) -> str:
        """Retained messages (compacted), keyed by topic name."""
        return self.prefix + MSG_RETAINED

    @property
    def client_sessions(self) -> str:
        """Session records (compacted), keyed by client id."""
        return self.prefix + CLIENT_SESSIONS

    @property
    def client_subscriptions(self) -> str:
        """A client's whole subscription set (compacted), keyed by client id."""
        return self.prefix + CLIENT_SUBSCRIPTIONS

    @property
    def client_acks(self) -> str:
        """Subscribers' PUBACK/PUBCOMP of delivered messages, keyed by client id."""
        return self.prefix + CLIENT_ACKS

    def downlink(self, node_id: str) -> str:
        """The downlink topic read by ingest node ``node_id``."""
        return f"{self.prefix}{DOWNLINK_PREFIX}{node_id}"
