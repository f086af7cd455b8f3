"""One client's subscription to one Topic Filter (MQTT 3.8.3.1), as every service holds it:
the ingest node per connection, ``client.subscriptions`` records, the router's trie and
app_delivery's shared groups."""

from __future__ import annotations

from dataclasses import dataclass

MAX_SUBSCRIPTION_IDENTIFIER = 268_435_455
"""Largest Subscription Identifier, a Variable Byte Integer (MQTT 3.8.2.1.2)."""


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
    """

    client_id: str
    topic_filter: str
    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    subscription_identifier: int | None = None
