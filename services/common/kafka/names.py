"""The one place where Cormorant's Kafka topic names are spelled (docs/design.md, "The data path").

All names are prefixed by ``Settings.topic_prefix`` so that several Cormorant clusters (or
test runs) can share one Kafka cluster.

APPLICATION clients have topics (and consumer groups) of their own, named after a client id
or a Shared Subscription (TBMQ's ``tbmq.msg.app.$CLIENT_ID``). MQTT allows any UTF-8 there,
Kafka only ``[A-Za-z0-9._-]`` and 249 characters, and Kafka refuses a topic whose name equals
an existing one once ``.`` and ``_`` are taken as the same character. :func:`escape` maps
every string into the charset injectively and without ``.``, and :func:`fitted` keeps names
within the length limit, so two clients (or groups) never share a topic.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from services.common.settings import Settings

MSG_ALL = "msg.all"
MSG_PERSISTED = "msg.persisted"
MSG_RETAINED = "msg.retained"
CLIENT_SESSIONS = "client.sessions"
CLIENT_SUBSCRIPTIONS = "client.subscriptions"
CLIENT_ACKS = "client.acks"
CLIENT_EVENTS = "client.events"
CLIENT_WILLS = "client.wills"
MSG_DELAYED = "msg.delayed"
INTEGRATIONS_DEAD_LETTER = "integrations.dead-letter"
DOWNLINK_PREFIX = "msg.downlink."
APP_PREFIX = "msg.app."
APP_SHARED_PREFIX = "msg.app-shared."
APP_GROUP_PREFIX = "cormorant-app."
APP_SHARED_GROUP_PREFIX = "cormorant-app-shared."
SERVICE_GROUP_PREFIX = "cormorant-"

KAFKA_TOPIC_MAX = 249
"""The longest topic name Kafka accepts (``Topic.MAX_NAME_LENGTH``)."""

_KEPT = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-")
_DIGEST_MARK = "__"  # never produced by escape(): there "_" is always followed by hex digits


def escape(text: str) -> str:
    """``text`` in Kafka's topic charset, injectively, without ``.``.

    Each UTF-8 byte of ``text`` in ``[A-Za-z0-9-]`` is kept; every other byte (``.`` and
    ``_`` included) becomes ``_`` and its two lowercase hex digits: ``"a.b_c"`` →
    ``"a_2eb_5fc"``. Distinct strings give distinct results, also when Kafka equates ``.``
    and ``_`` (the result has no ``.``).
    """
    return "".join(chr(byte) if byte in _KEPT else f"_{byte:02x}" for byte in text.encode("utf-8"))


def fitted(head: str, escaped: str) -> str:
    """``head + escaped`` if it fits in :data:`KAFKA_TOPIC_MAX` characters, else a shortened
    form: ``head``, a prefix of ``escaped`` (not cut inside an escape), ``__`` and the
    SHA-256 of ``escaped`` in hex. ``escaped`` must come from :func:`escape`; the result is
    then injective in it (``__`` never occurs in an escaped string, so a shortened name never
    equals a full one, and two shortened names differ by their digest).

    Raises ``ValueError`` if ``head`` leaves no room for the digest.
    """
    name = head + escaped
    if len(name) <= KAFKA_TOPIC_MAX:
        return name
    digest = hashlib.sha256(escaped.encode("ascii")).hexdigest()
    keep = KAFKA_TOPIC_MAX - len(head) - len(_DIGEST_MARK) - len(digest)
    if keep < 0:
        raise ValueError(f"topic name head {head!r} is too long")
    cut = escaped[:keep]
    escape_at = cut.rfind("_", max(0, len(cut) - 2))
    if escape_at >= 0:
        cut = cut[:escape_at]  # do not end inside an escape
    return head + cut + _DIGEST_MARK + digest


def kind_of_topic(topic: str) -> str:
    """The kind of a Cormorant topic, whatever its prefix: ``msg.all``, ``client.sessions``...,
    and ``msg.downlink``, ``msg.app`` or ``msg.app-shared`` for the topics named after a
    node, client or group; ``other`` for a topic that is none of Cormorant's."""
    for kind in (MSG_ALL, MSG_PERSISTED, MSG_RETAINED, CLIENT_SESSIONS, CLIENT_SUBSCRIPTIONS,
                 CLIENT_ACKS, CLIENT_EVENTS):  # fmt: skip
        if topic.endswith(kind):
            return kind
    for head in (DOWNLINK_PREFIX, APP_SHARED_PREFIX, APP_PREFIX):
        if head in topic:
            return head[:-1]
    return "other"


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

    @property
    def client_events(self) -> str:
        """Append-only history of connects, disconnects, authentication failures,
        subscription changes and session expiries, keyed by client id (for the analysts)."""
        return self.prefix + CLIENT_EVENTS

    @property
    def client_wills(self) -> str:
        """Will Messages waiting out their Will Delay Interval (compacted), one key per
        network connection (:func:`~services.common.records.will_key`), in the client
        id's partition; read in the ingest nodes' group :meth:`wills_group`, whose member
        owning a partition publishes its wills."""
        return self.prefix + CLIENT_WILLS

    @property
    def wills_group(self) -> str:
        """The consumer group the ingest nodes share ``client.wills`` in: the owner of a
        partition keeps its waiting Will Messages and publishes them."""
        return self.service_group("ingest-wills")

    @property
    def msg_delayed(self) -> str:
        """Messages published to ``$delayed/<seconds>/<topic>`` waiting out their delay
        (compacted), one key per message (:func:`~services.common.records.delayed_key`), in
        the publisher's partition; read in the ingest nodes' group :meth:`delayed_group`,
        whose member owning a partition publishes its messages when they are due."""
        return self.prefix + MSG_DELAYED

    @property
    def integrations_dead_letter(self) -> str:
        """The messages an integration gave up on (a webhook, after its attempts), keyed
        by the publisher's Client Identifier; the record format is
        :mod:`services.common.integrations.dead_letter`'s."""
        return self.prefix + INTEGRATIONS_DEAD_LETTER

    @property
    def delayed_group(self) -> str:
        """The consumer group the ingest nodes share ``msg.delayed`` in: the owner of a
        partition keeps its waiting delayed messages and publishes them."""
        return self.service_group("ingest-delayed")

    def service_group(self, service: str) -> str:
        """The consumer group (and Faust app id) of service ``service`` (``"router"``,
        ``"device-persist"``...): ``<prefix>cormorant-<service>``. Its committed offsets are
        the service's position in the topics it consumes, and its lag is the service's
        backlog (what autoscaling and alarms in ``infra/`` watch)."""
        return f"{self.prefix}{SERVICE_GROUP_PREFIX}{service}"

    def downlink(self, node_id: str) -> str:
        """The downlink topic read by ingest node ``node_id``."""
        return f"{self.prefix}{DOWNLINK_PREFIX}{node_id}"

    @property
    def app_prefixes(self) -> tuple[str, str]:
        """How every APPLICATION topic's name begins: ``msg.app.``, ``msg.app-shared.``
        (with the prefix), for ``str.startswith``."""
        return (self.prefix + APP_PREFIX, self.prefix + APP_SHARED_PREFIX)

    def app(self, client_id: str) -> str:
        """``msg.app.<client>``: the messages of one persistent APPLICATION client, keyed
        by publisher client id. Raises ``ValueError`` if the prefix is over 170 characters."""
        return fitted(self.prefix + APP_PREFIX, escape(client_id))

    def app_group(self, client_id: str) -> str:
        """The consumer group whose committed offsets are an APPLICATION client's position
        in its ``msg.app`` topic (app_delivery commits them once the client acknowledged)."""
        return fitted(self.prefix + APP_GROUP_PREFIX, escape(client_id))

    def app_shared(self, share_name: str, topic_filter: str) -> str:
        """``msg.app-shared.<group>``: the messages of Shared Subscription
        ``$share/<share_name>/<topic_filter>`` (MQTT 5.0 4.8.2) for its APPLICATION members.

        The ShareName cannot hold ``/``, so ``<share_name>/<topic_filter>`` names the pair
        injectively before it is escaped. (``msg.app-shared.`` rather than a name under
        ``msg.app.``: no client's topic can then collide with a group's, ``.``/``_`` rule
        included.)
        """
        return fitted(self.prefix + APP_SHARED_PREFIX, escape(f"{share_name}/{topic_filter}"))

    def app_shared_group(self, share_name: str, topic_filter: str) -> str:
        """The one consumer group that all APPLICATION members of a Shared Subscription
        read :meth:`app_shared` in, so Kafka balances its partitions over them."""
        return fitted(self.prefix + APP_SHARED_GROUP_PREFIX, escape(f"{share_name}/{topic_filter}"))
