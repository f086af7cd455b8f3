"""Topic Aliases both ways (MQTT 5.0 3.3.2.3.4, 3.1.2.11.5, 3.2.2.3.8), per network connection.

Inbound, a client may set up to the server's Topic Alias Maximum aliases
(``topic_alias_maximum``, sent in CONNACK) and then publish with the alias alone
(:func:`resolve_inbound`). Outbound, when the client's CONNECT allows aliases (its Topic
Alias Maximum > 0) and ``assign_topic_aliases`` is on, the server assigns its own
(:class:`OutboundAliases`): the first PUBLISH of a topic carries the Topic Name and a new
alias, the next ones an empty Topic Name and the alias. When the client's maximum is
reached, the least recently used alias is given to the new topic (sending the Topic Name
with it replaces the mapping at the client, 3.3.2.3.4). Mappings live as long as the
connection: a new connection starts with none.
"""

from __future__ import annotations

from collections import OrderedDict

from services.common.mqtt.errors import MQTTError, ProtocolError
from services.common.mqtt.reason_codes import ReasonCode


def resolve_inbound(aliases: dict[int, str], maximum: int, topic: str, alias: int | None) -> str:
    """The Topic Name of an inbound PUBLISH with ``topic`` and Topic Alias ``alias``, as the
    connection's ``aliases`` (alias → Topic Name, updated here) map it; ``maximum`` is the
    server's Topic Alias Maximum.

    Raises :class:`MQTTError` 0x94 Topic Alias invalid for 0 or an alias over ``maximum``
    (3.3.2.3.4), :class:`ProtocolError` for neither a Topic Name nor an alias, or an alias
    never set.
    """
    if alias is None:
        if not topic:
            raise ProtocolError("PUBLISH without a Topic Name or Topic Alias")
        return topic
    if alias == 0 or alias > maximum:
        raise MQTTError(f"Topic Alias {alias} out of range", ReasonCode.TOPIC_ALIAS_INVALID)
    if topic:
        aliases[alias] = topic
        return topic
    try:
        return aliases[alias]
    except KeyError:
        raise ProtocolError(f"Topic Alias {alias} was never set") from None


class OutboundAliases:
    """The Topic Aliases the server assigned on one connection, least recently used first.

    ``maximum`` is the client's Topic Alias Maximum (1..65,535): no alias above it is ever
    used [MQTT-3.3.2-9]. Aliases are handed out from 1 up; once all are taken, the least
    recently used one is reassigned.
    """

    __slots__ = ("_by_topic", "_free", "_next", "maximum")

    def __init__(self, maximum: int) -> None:
        self.maximum = maximum
        self._by_topic: OrderedDict[str, int] = OrderedDict()
        self._free: list[int] = []
        self._next = 1

    def __len__(self) -> int:
        return len(self._by_topic)

    def choose(self, topic: str) -> tuple[int, bool]:
        """The alias for a PUBLISH to ``topic`` and whether the client knows it already
        (then the Topic Name is left out); a new one is recorded as sent with the Topic
        Name (:meth:`forget` it if the packet is not sent after all)."""
        alias = self._by_topic.get(topic)
        if alias is not None:
            self._by_topic.move_to_end(topic)
            return alias, True
        if self._free:
            alias = self._free.pop()
        elif self._next <= self.maximum:
            alias = self._next
            self._next += 1
        else:
            _, alias = self._by_topic.popitem(last=False)
        self._by_topic[topic] = alias
        return alias, False

    def forget(self, topic: str) -> None:
        """``topic``'s new alias did not reach the client (its PUBLISH was dropped): free it."""
        alias = self._by_topic.pop(topic, None)
        if alias is not None:
            self._free.append(alias)
