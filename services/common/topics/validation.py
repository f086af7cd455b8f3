"""Topic Name and Topic Filter validation (MQTT 5.0 sections 1.5.4, 4.7 and 4.8.2).

These checks run on every PUBLISH (topic names) and every SUBSCRIBE / UNSUBSCRIBE entry
(topic filters) at the ingest node, so the common case (a short ASCII string without
wildcards) is kept to a few C-level string operations.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.common.mqtt.errors import MQTTError, TopicFilterInvalid, TopicNameInvalid

MAX_TOPIC_BYTES = 65_535
"""Largest UTF-8 encoded length of a Topic Name or Topic Filter (MQTT 1.5.4, 4.7.3)."""

SHARE_PREFIX = "$share/"
"""Prefix that marks a Shared Subscription's Topic Filter (MQTT 4.8.2); case-sensitive."""


@dataclass(frozen=True, slots=True)
class SharedFilter:
    """The parts of a ``$share/{ShareName}/{filter}`` Topic Filter (MQTT 4.8.2).

    Attributes:
        group: the ShareName: at least one character, without ``/``, ``+`` or ``#``.
        topic_filter: the Topic Filter after the ShareName, without the ``$share/<group>/``
            prefix; it is a valid non-shared Topic Filter (it may hold wildcards).
    """

    group: str
    topic_filter: str


def _check_string(value: str, error: type[MQTTError], what: str) -> None:
    """Raise ``error`` if ``value`` is empty, holds U+0000, is not encodable or is too long.

    MQTT 4.7.3: Topic Names and Filters are at least one character long, must not hold
    U+0000 and are UTF-8 Encoded Strings (1.5.4: at most 65,535 bytes, no surrogates).
    """
    if not value:
        raise error(f"{what} is empty (MQTT 4.7.3)")
    if "\x00" in value:
        raise error(f"{what} contains U+0000 (MQTT 4.7.3)")
    if value.isascii():
        # ASCII is one byte per character: skip the encode on the common path.
        size = len(value)
    else:
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError:
            # Only lone surrogates fail to encode; 1.5.4 forbids them in UTF-8 strings.
            raise error(f"{what} is not valid UTF-8 (MQTT 1.5.4)") from None
    if size > MAX_TOPIC_BYTES:
        raise error(f"{what} is {size} bytes, over the {MAX_TOPIC_BYTES}-byte limit (MQTT 1.5.4)")


def _check_wildcards(topic_filter: str) -> None:
    """Raise TopicFilterInvalid if a ``+`` or ``#`` is not placed as MQTT 4.7.1 requires."""
    if "+" not in topic_filter and "#" not in topic_filter:
        return
    levels = topic_filter.split("/")
    last = len(levels) - 1
    for index, level in enumerate(levels):
        if "#" in level and (level != "#" or index != last):
            raise TopicFilterInvalid(
                f"'#' must be a whole level and the last one (MQTT 4.7.1.2): {topic_filter!r}"
            )
        if "+" in level and level != "+":
            raise TopicFilterInvalid(
                f"'+' must occupy a whole level (MQTT 4.7.1.3): {topic_filter!r}"
            )


def validate_topic_name(name: str) -> None:
    """Check a PUBLISH Topic Name (MQTT 4.7.3, 1.5.4).

    Args:
        name: the Topic Name as decoded from the packet.

    Raises:
        TopicNameInvalid (reason 0x90): ``name`` is empty, holds ``+`` or ``#`` (wildcards are
            for filters only, 4.7.1), holds U+0000, holds a lone surrogate, or is over 65,535
            UTF-8 bytes.
    """
    _check_string(name, TopicNameInvalid, "Topic Name")
    if "+" in name or "#" in name:
        raise TopicNameInvalid(f"Topic Name holds a wildcard (MQTT 4.7.1): {name!r}")


def parse_shared(topic_filter: str) -> SharedFilter | None:
    """Split and validate a Shared Subscription filter ``$share/{ShareName}/{filter}``.

    Args:
        topic_filter: a Topic Filter as sent in SUBSCRIBE / UNSUBSCRIBE.

    Returns:
        None if ``topic_filter`` does not start with ``$share/`` (a plain filter, which this
        function does not check; use :func:`validate_topic_filter`), else the
        :class:`SharedFilter` with the ShareName and the inner filter.

    Raises:
        TopicFilterInvalid (reason 0x8F), MQTT 4.8.2: the ShareName is empty or holds ``+`` or
            ``#``; no ``/`` and filter follow the ShareName; the inner filter is empty or has
            misplaced wildcards; or the whole filter holds U+0000, a lone surrogate, or is
            over 65,535 UTF-8 bytes.
    """
    if not topic_filter.startswith(SHARE_PREFIX):
        return None
    _check_string(topic_filter, TopicFilterInvalid, "Topic Filter")
    group, slash, inner = topic_filter[len(SHARE_PREFIX) :].partition("/")
    if not group:
        raise TopicFilterInvalid(f"empty ShareName (MQTT 4.8.2): {topic_filter!r}")
    if "+" in group or "#" in group:
        raise TopicFilterInvalid(f"ShareName holds a wildcard (MQTT 4.8.2): {topic_filter!r}")
    if not slash or not inner:
        raise TopicFilterInvalid(
            f"no Topic Filter after the ShareName (MQTT 4.8.2): {topic_filter!r}"
        )
    _check_wildcards(inner)
    return SharedFilter(group, inner)


def validate_topic_filter(topic_filter: str) -> None:
    """Check a SUBSCRIBE / UNSUBSCRIBE Topic Filter (MQTT 4.7.1, 4.7.3, 4.8.2).

    A filter starting with ``$share/`` is checked as a Shared Subscription (see
    :func:`parse_shared`); any other filter, including one starting with ``$``, by the
    plain rules.

    Args:
        topic_filter: the Topic Filter as decoded from the packet.

    Raises:
        TopicFilterInvalid (reason 0x8F): ``topic_filter`` is empty; a ``#`` is not a whole
            level or not the last level; a ``+`` is not a whole level; it holds U+0000 or a
            lone surrogate; it is over 65,535 UTF-8 bytes; or it is a malformed
            ``$share/`` filter.
    """
    if parse_shared(topic_filter) is not None:
        return
    _check_string(topic_filter, TopicFilterInvalid, "Topic Filter")
    _check_wildcards(topic_filter)
