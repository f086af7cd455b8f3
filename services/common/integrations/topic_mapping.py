"""The MQTT bridge's topic mapping: a prefix of topic LEVELS replaced by another
(docs/integrations/mqtt-bridge.md, "Topic mapping").

A prefix is a Topic Name without wildcards, split at ``/`` into levels (MQTT 5.0 4.7.1.1);
the empty prefix has no levels. Mapping ``topic`` from prefix ``A`` to prefix ``B`` takes
the topic's levels, checks that the first ones are exactly ``A``'s, and puts ``B``'s levels
in their place: ``sensors/line-1/temp`` from ``sensors`` to ``site1/sensors`` is
``site1/sensors/line-1/temp``; from ``""`` to ``site1`` it is ``site1/sensors/line-1/temp``;
from ``sensors`` to ``""`` it is ``line-1/temp``. Levels, not characters: the prefix
``sensors`` does not take ``sensors-old/x``, and ``sensors`` itself (which ``sensors/#``
matches, 4.7.1.2) maps to ``B`` alone.

The same rule maps Topic Filters (their first levels must be the prefix, literally), which is
how the bridge decides whether its two directions could feed each other
(:func:`filters_overlap`).
"""

from __future__ import annotations

from collections.abc import Sequence

from services.common.mqtt.errors import MQTTError
from services.common.topics.validation import validate_topic_name


def prefix_levels(prefix: str) -> list[str]:
    """The levels of ``prefix`` (``""``: none)."""
    return prefix.split("/") if prefix else []


def check_prefix(prefix: str, what: str) -> None:
    """Raise ``ValueError`` (naming ``what``) unless ``prefix`` is empty or a Topic Name
    without wildcards (MQTT 5.0 4.7.3) that does not start with ``$`` (topics the broker
    reserves, 4.7.2) nor end with ``/`` (an empty last level that is rarely meant)."""
    if not prefix:
        return
    try:
        validate_topic_name(prefix)
    except MQTTError:
        raise ValueError(f"the {what} {prefix!r} is not a topic name without wildcards") from None
    if prefix.startswith("$"):
        raise ValueError(f"the {what} {prefix!r} starts with '$' (reserved topics)")
    if prefix.endswith("/"):
        raise ValueError(f"the {what} {prefix!r} ends with '/': leave the '/' out")


def under_prefix(topic_filter: str, prefix: str) -> bool:
    """Whether ``topic_filter`` (or Topic Name) begins with exactly the levels of
    ``prefix`` (wildcards in those levels do not count: ``+/x`` is not under ``a``)."""
    levels = prefix_levels(prefix)
    return topic_filter.split("/")[: len(levels)] == levels


def map_topic(topic: str, from_prefix: str, to_prefix: str) -> str | None:
    """``topic`` (a Topic Name or Filter) with the levels of ``from_prefix`` replaced by
    those of ``to_prefix``; None when it is not under ``from_prefix``
    (:func:`under_prefix`) or when nothing is left (``sensors`` from ``sensors`` to ``""``:
    a Topic Name has at least one character, MQTT 5.0 4.7.3)."""
    if not under_prefix(topic, from_prefix):
        return None
    rest = topic.split("/")[len(prefix_levels(from_prefix)) :]
    mapped = "/".join(prefix_levels(to_prefix) + rest)
    return mapped or None


def _levels_overlap(a: Sequence[str], b: Sequence[str]) -> bool:
    for i in range(max(len(a), len(b)) + 1):
        if (i < len(a) and a[i] == "#") or (i < len(b) and b[i] == "#"):
            # '#' matches the rest, none included (4.7.1.2); but not a '$' first level.
            other = b if i < len(a) and a[i] == "#" else a
            return not (i == 0 and other and other[0].startswith("$"))
        if i == len(a) or i == len(b):
            return len(a) == len(b)
        if a[i] == "+" or b[i] == "+":
            other_level = b[i] if a[i] == "+" else a[i]
            if i == 0 and other_level.startswith("$"):
                return False  # 4.7.2: a wildcard first level does not match '$' topics
            continue
        if a[i] != b[i]:
            return False
    return True


def filters_overlap(a: str, b: str) -> bool:
    """Whether some Topic Name matches both Topic Filters ``a`` and ``b`` (valid filters,
    MQTT 5.0 4.7: ``+`` one level, ``#`` the rest including none, no wildcard match of a
    first level starting with ``$``)."""
    return _levels_overlap(a.split("/"), b.split("/"))
