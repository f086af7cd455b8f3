"""One client's subscription to one Topic Filter (MQTT 3.8.3.1), as every service holds it:
the ingest node per connection, ``client.subscriptions`` records, the router's trie and
app_delivery's shared groups."""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_SUBSCRIPTION_IDENTIFIER = 268_435_455
"""Largest Subscription Identifier, a Variable Byte Integer (MQTT 3.8.2.1.2)."""


@dataclass(eq=False, slots=True)
class LiveFrom:
    """Where a subscription's live stream of retained messages starts: the cut between the
    retained copies its SUBSCRIBE asks for and the messages it gets live (MQTT 3.3.1.3).

    ``offsets[p]`` is the end offset of ``msg.all`` partition ``p`` when the ingest node
    read it, after the SUBSCRIBE arrived and before the subscription was stored. A PUBLISH
    with RETAIN acknowledged before the SUBSCRIBE lies below it: its retained copy answers
    the SUBSCRIBE, so it is not sent live too. None while the ingest node has not read
    the offsets yet (they are filled in before the subscription record is written).
    Mutable on purpose: the connection's state and the store effect share one object.

    ``every_message``: the cut of a replay subscription (``$replay/<since>/<filter>``,
    :mod:`services.common.topics.replay`): every message below it, not only those with
    RETAIN, reaches the subscription through its replay instead of live, so the replay
    and the live stream meet with no gap and no duplicate.
    """

    offsets: tuple[int, ...] | None = None
    every_message: bool = False

    def includes(self, partition: int, offset: int, retain: bool = True) -> bool:
        """Whether the ``msg.all`` record at ``offset`` of ``partition`` (a PUBLISH, with
        RETAIN or not) is delivered live: at or after the cut, not covered by it, or
        without RETAIN under a cut that is not a replay's."""
        if not retain and not self.every_message:
            return True
        offsets = self.offsets
        return offsets is None or partition >= len(offsets) or offset >= offsets[partition]


@dataclass(frozen=True, slots=True)
class ReplayProgress:
    """How far a persistent session's replay subscription got (docs/concepts/replay.md,
    "Persistent sessions"): kept with the subscription in ``client.subscriptions``, so
    that it survives the connection, a reconnect to another ingest node and a kill -9 of
    the node, as the session's subscriptions do.

    Each tuple has one ``msg.all`` offset per partition:

    - ``cut``: the replay's second cut, which it reads up to (the first cut is the
      subscription's :class:`LiveFrom`);
    - ``next``: where a resumed replay reads from: every matching record below it was
      acknowledged by the client (QoS 1) or sent (QoS 0);
    - ``sent``: every record below it may have been sent already: stored *before* the
      records are sent, so a resumed replay sends those in ``[next, sent)`` with DUP=1
      (MQTT 3.3.1.1) whatever crashed;
    - ``packet_ids``: the block of Packet Identifiers the replay reserved (0..15), from
      which each message's identifier derives from its ``msg.all`` offset, so that a
      resend carries its original one (MQTT 4.4 [MQTT-4.4.0-1];
      :func:`services.ingest.handle_replay.packet_id`).
    """

    cut: tuple[int, ...]
    next: tuple[int, ...]
    sent: tuple[int, ...]
    packet_ids: int = 0


@dataclass(frozen=True, slots=True)
class Subscription:
    """One client's subscription to one Topic Filter, with its options (MQTT 3.8.3.1).

    Attributes:
        client_id: the subscribing client's identifier.
        topic_filter: the filter as the client sent it, including any ``$share/<group>/``
            prefix; ``(client_id, topic_filter)`` identifies the subscription (MQTT 3.8.4).
        qos: the granted QoS, 0..2.
        no_local: do not deliver messages this client published itself (not allowed on a
            Shared Subscription).
        retain_as_published: keep the RETAIN flag of forwarded messages.
        retain_handling: 0..2, when to send retained messages on subscribe (used by the
            router's retained store, not by matching).
        subscription_identifier: 1..268,435,455, or None when the client sent none.
        live_from: for a subscription made with retained messages, the :class:`LiveFrom`
            cut between those and its live messages; None otherwise (every message live).
            Not part of equality: a SUBSCRIBE repeating a subscription changes nothing.
        replay: a persistent session's replay subscription still replaying: its
            :class:`ReplayProgress`; None otherwise. Not part of equality either.
    """

    client_id: str
    topic_filter: str
    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    subscription_identifier: int | None = None
    live_from: LiveFrom | None = field(default=None, compare=False)
    replay: ReplayProgress | None = field(default=None, compare=False)
