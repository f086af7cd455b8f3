"""One routed message on its way to the targets connected to this node (docs/design.md: the
router writes one downlink record per node; the node encodes each PUBLISH variant once).

A :class:`FanOut` is made once per downlink record. It decodes the publisher's forwarded
MQTT 5 properties once, works out when the message expires and the Message Expiry Interval
left now (MQTT 5.0 3.3.2.3.3), and builds each target's PUBLISH: QoS as granted, RETAIN
kept only with Retain As Published (MQTT 5.0 3.3.1.3), the target's Subscription
Identifiers (3.3.4). A QoS 0 PUBLISH has no Packet Identifier, so every target whose packet
is the same byte for byte shares one encoding: a variant is (protocol version, RETAIN,
Subscription Identifiers, Topic Alias, whether the alias is already known to the client).
v3.1.1 clients and v5 clients without server-assigned Topic Aliases all share theirs;
connections whose aliases for the topic coincide share theirs too.
"""

from __future__ import annotations

import dataclasses

from services.common.mqtt.codec import encode
from services.common.mqtt.packets import Publish
from services.common.mqtt.properties import Properties
from services.common.records import (
    Origin,
    PublishMeta,
    Target,
    decode_forwarded_properties,
    expiry_deadline,
)

Variant = tuple[int, bool, tuple[int, ...], int, bool]
"""A QoS 0 encoding: protocol version, RETAIN, Subscription Identifiers, Topic Alias (0:
none), and whether the Topic Name is left out (the client knows the alias)."""


def remaining_interval(expires_at_ms: int, now_ms: int) -> int | None:
    """The Message Expiry Interval to send at ``now_ms``: the seconds left, rounded up (so a
    live message never says 0), or None once it has expired [MQTT-3.3.2-6]."""
    left_ms = expires_at_ms - now_ms
    return None if left_ms <= 0 else -(-left_ms // 1000)


class FanOut:
    """A message (``meta``, ``payload``) being sent to this node's targets at ``now_ms``.

    ``expires_at_ms`` is when it expires (Unix ms; None: never). ``origin`` is where the
    message lies in ``msg.all``: the router's :class:`~services.common.records.Origin` of
    its downlink record, or the record a replay read (index 0); a replay's switch drops the
    live copies of what it replayed by it (:mod:`services.ingest.handle_replay`). None
    only for a message store's delivery, which a replay never meets. Raises
    :class:`~services.common.records.RecordError` if the forwarded properties do not decode.
    """

    __slots__ = ("_encoded", "expires_at_ms", "meta", "origin", "payload", "properties")

    def __init__(
        self, meta: PublishMeta, payload: bytes, now_ms: int, origin: Origin | None = None
    ) -> None:
        self.meta = meta
        self.payload = payload
        self.origin = origin
        self.properties: Properties = decode_forwarded_properties(meta)
        self.expires_at_ms = expiry_deadline(self.properties, meta.received_at_ms)
        if self.expires_at_ms is not None:
            # What the QoS 0 encodings say; a connection that sends later (a QoS 1/2
            # message behind its Receive Maximum) puts its own time left in.
            left = remaining_interval(self.expires_at_ms, now_ms)
            if left is not None:
                self.properties.message_expiry_interval = left
        self._encoded: dict[Variant, bytes] = {}

    def retain_for(self, target: Target) -> bool:
        """RETAIN of the target's copy: as published only with Retain As Published (a
        live message is otherwise sent with RETAIN 0, MQTT 3.3.1.3)."""
        return self.meta.retain and target.retain_as_published

    def publish(
        self,
        target: Target,
        version: int,
        *,
        topic_alias: int = 0,
        alias_known: bool = False,
    ) -> Publish:
        """A fresh PUBLISH of the message for ``target`` on a connection of protocol
        ``version``, with the target's QoS, Packet Identifier and DUP as they are (the
        shell's own Packet Identifiers are picked at sending time) and, in v5, the
        target's Subscription Identifiers and the given Topic Alias (the Topic Name left
        out when the client knows it)."""
        props = Properties()
        if version == 5:
            props = dataclasses.replace(
                self.properties,
                subscription_identifiers=list(target.subscription_identifiers),
                topic_alias=topic_alias or None,
            )
        qos = target.qos
        return Publish(
            "" if alias_known else self.meta.topic,
            self.payload,
            qos,
            self.retain_for(target),
            target.dup and qos > 0,  # DUP and a Packet Identifier only exist for QoS 1/2
            (target.packet_id or None) if qos else None,
            props,
        )

    def qos0_bytes(
        self, target: Target, version: int, topic_alias: int, alias_known: bool
    ) -> bytes:
        """The encoded QoS 0 PUBLISH for ``target``, shared with every target of the same
        :data:`Variant`."""
        ids = target.subscription_identifiers if version == 5 else ()
        variant = (version, self.retain_for(target), ids, topic_alias, alias_known)
        data = self._encoded.get(variant)
        if data is None:
            packet = self.publish(target, version, topic_alias=topic_alias, alias_known=alias_known)
            data = self._encoded[variant] = encode(packet, version)
        return data

    @property
    def encodings(self) -> int:
        """How many distinct QoS 0 encodings were made so far."""
        return len(self._encoded)
