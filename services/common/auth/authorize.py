"""Authorization rules: ordered allow/deny rules over MQTT Topic Filters, and their matcher.

A credential carries a list of :class:`Rule`, written ``<allow|deny> <publish|subscribe|all>
<topic filter>`` (``allow publish devices/${client_id}/#``), the style EMQX and Mosquitto
users know. The filter may use the placeholders ``${client_id}`` and ``${username}`` as whole
topic levels; they are replaced once per connection, at CONNECT (:class:`Authorizer`).

Decisions (first matching rule wins; what no rule allows is denied, so a credential without
rules may do nothing: "everything" is the explicit rule :data:`ALLOW_ALL_RULE`,
``allow all #``, what ``cormorant credentials add --allow-all`` stores):

- a PUBLISH to Topic Name ``T`` (also the Will Topic, and a retained PUBLISH) is decided
  by the first ``publish``/``all`` rule whose filter matches ``T`` (MQTT 4.7 matching);
- a message on Topic Name ``T`` reaches a subscriber only if the first ``subscribe``/``all``
  rule whose filter matches ``T`` allows it (:meth:`Authorizer.may_receive`, checked by the
  ingest node before every delivery: live, retained, shared, stored for a persistent
  session, or an APPLICATION client's);
- a SUBSCRIBE to Topic Filter ``F`` (a Shared Subscription is checked on the filter after
  ``$share/<group>/``, MQTT 4.8.2) is decided by :meth:`Authorizer.subscribe_grant`, going
  through the ``subscribe``/``all`` rules in order: :attr:`Grant.FULL` when an allow rule
  covers ``F`` before any deny rule overlaps it (every topic ``F`` matches may be read);
  :attr:`Grant.REFUSED` when ``F`` lies wholly inside one deny rule's filter before any
  allow rule could grant part of it, or when no allow rule reaches ``F`` at all; otherwise
  :attr:`Grant.FILTERED`: granted, and the topics the rules deny are withheld message by
  message. So with ``deny subscribe admin/#`` and ``allow all #``, ``#`` is granted without
  ``admin/...`` messages and ``admin/users/#`` is refused. An allow rule counts as granting
  part of ``F`` unless the part it shares with ``F`` lies inside one earlier deny rule: a
  filter denied only by several deny rules together is granted and receives nothing.
  A credential may ask for the strict behaviour instead (``strict=True``): a filter that is
  not :attr:`Grant.FULL` is refused.

A value that cannot stand for a placeholder (no user name, an empty one, or one holding
``/``, ``+`` or ``#``) makes an allow rule match nothing and a deny rule match any value of
that level: a client never gains access from its identifier's shape.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from services.common.mqtt.errors import MQTTError
from services.common.topics.validation import SHARE_PREFIX, parse_shared, validate_topic_filter

CLIENT_ID = "${client_id}"
"""Placeholder of the connection's Client Identifier (a whole topic level)."""

USERNAME = "${username}"
"""Placeholder of the connection's user name (a whole topic level)."""

PLACEHOLDERS = (CLIENT_ID, USERNAME)

DECISION_CACHE_SIZE = 1024
"""Topic Names whose PUBLISH decision one connection remembers; the cache is emptied when
full (a device publishes to a handful of topics)."""


class RuleError(ValueError):
    """A rule that cannot be parsed or whose Topic Filter is invalid; the message says why."""


class Permission(enum.Enum):
    """What a matching rule decides."""

    ALLOW = "allow"
    DENY = "deny"


class Action(enum.Enum):
    """Which operations a rule is about: PUBLISH (Will and retained included), SUBSCRIBE,
    or both."""

    PUBLISH = "publish"
    SUBSCRIBE = "subscribe"
    ALL = "all"


@dataclass(frozen=True, slots=True)
class Rule:
    """One authorization rule: ``permission`` for ``action`` on topics ``topic_filter``
    matches (a valid MQTT Topic Filter once placeholders are replaced; never ``$share/``)."""

    permission: Permission
    action: Action
    topic_filter: str

    def __str__(self) -> str:
        return f"{self.permission.value} {self.action.value} {self.topic_filter}"

    def to_json(self) -> dict[str, str]:
        """The rule as JSON: ``{"permission": ..., "action": ..., "topic": ...}``."""
        return {
            "permission": self.permission.value,
            "action": self.action.value,
            "topic": self.topic_filter,
        }

    @classmethod
    def from_json(cls, value: object) -> Rule:
        """The rule of :meth:`to_json`'s form, or its text form (:func:`parse_rule`).

        Raises :class:`RuleError`.
        """
        if isinstance(value, str):
            return parse_rule(value)
        if not isinstance(value, dict):
            raise RuleError(f"a rule is a string or an object, not {type(value).__name__}")
        try:
            return make_rule(str(value["permission"]), str(value["action"]), str(value["topic"]))
        except KeyError as exc:
            raise RuleError(f"a rule object needs permission, action and topic: {exc}") from None


def make_rule(permission: str, action: str, topic_filter: str) -> Rule:
    """A validated rule from its three parts (case-insensitive words). Raises
    :class:`RuleError` naming what is wrong."""
    try:
        perm = Permission(permission.lower())
    except ValueError:
        raise RuleError(f"permission must be allow or deny, not {permission!r}") from None
    try:
        act = Action(action.lower())
    except ValueError:
        raise RuleError(f"action must be publish, subscribe or all, not {action!r}") from None
    _check_filter(topic_filter)
    return Rule(perm, act, topic_filter)


def parse_rule(text: str) -> Rule:
    """A rule from its text form ``<allow|deny> <publish|subscribe|all> <topic filter>``
    (the filter is the rest of the line: it may hold spaces). Raises :class:`RuleError`."""
    parts = text.strip().split(None, 2)
    if len(parts) != 3:
        raise RuleError(
            f"rule {text!r} is not '<allow|deny> <publish|subscribe|all> <topic filter>'"
        )
    return make_rule(*parts)


def parse_rules(values: Iterable[object]) -> tuple[Rule, ...]:
    """Rules from their text or JSON forms, in order. Raises :class:`RuleError`."""
    return tuple(Rule.from_json(value) for value in values)


def _check_filter(topic_filter: str) -> None:
    if topic_filter.startswith(SHARE_PREFIX):
        raise RuleError(
            f"rule filter {topic_filter!r}: write the filter a Shared Subscription uses, "
            "without $share/<group>/ (MQTT 4.8.2)"
        )
    levels = topic_filter.split("/")
    for level in levels:
        if ("${" in level or "}" in level) and level not in PLACEHOLDERS:
            raise RuleError(
                f"rule filter {topic_filter!r}: a placeholder ({', '.join(PLACEHOLDERS)}) "
                "must be a whole topic level"
            )
    concrete = "/".join("x" if level in PLACEHOLDERS else level for level in levels)
    try:
        validate_topic_filter(concrete)
    except MQTTError as exc:
        raise RuleError(f"rule filter {topic_filter!r}: {exc.message}") from None


# ---------------------------------------------------------------------------- filter algebra


def _dollar_excluded(wild: Sequence[str], other: Sequence[str]) -> bool:
    """True if ``wild`` starts with a wildcard and ``other`` with a literal ``$`` level:
    no topic matched by ``other`` is matched by ``wild`` (MQTT 4.7.2)."""
    return wild[0] in ("+", "#") and other[0] not in ("+", "#") and other[0].startswith("$")


def matches(filter_levels: Sequence[str], topic_levels: Sequence[str]) -> bool:
    """Whether a Topic Filter matches a Topic Name, both split on ``/`` (MQTT 4.7: ``#``
    also matches the parent level, wildcards at the start never match ``$`` topics)."""
    if _dollar_excluded(filter_levels, topic_levels):
        return False
    for i, level in enumerate(filter_levels):
        if level == "#":
            return True
        if i >= len(topic_levels):
            return False
        if level != "+" and level != topic_levels[i]:
            return False
    return len(filter_levels) == len(topic_levels)


def covers(outer: Sequence[str], inner: Sequence[str]) -> bool:
    """Whether every Topic Name filter ``inner`` matches is matched by filter ``outer``
    (both split on ``/``)."""
    if _dollar_excluded(outer, inner):
        return False
    for i, level in enumerate(outer):
        if level == "#":
            return True
        if i >= len(inner) or inner[i] == "#":
            return False
        if level != "+" and level != inner[i]:
            return False
    return len(outer) == len(inner)


def overlaps(a: Sequence[str], b: Sequence[str]) -> bool:
    """Whether some Topic Name is matched by both filters ``a`` and ``b`` (split on ``/``)."""
    if _dollar_excluded(a, b) or _dollar_excluded(b, a):
        return False
    for i in range(max(len(a), len(b))):
        x = a[i] if i < len(a) else None
        y = b[i] if i < len(b) else None
        if x == "#" or y == "#":
            return True
        if x is None or y is None:
            return False
        if x != "+" and y != "+" and x != y:
            return False
    return True


def intersection(a: Sequence[str], b: Sequence[str]) -> tuple[str, ...] | None:
    """The Topic Filter (split on ``/``) matching exactly the Topic Names both filters ``a``
    and ``b`` match, or None if they share none (MQTT 4.7 matching)."""
    if _dollar_excluded(a, b) or _dollar_excluded(b, a):
        return None
    out: list[str] = []
    for i in range(max(len(a), len(b))):
        x = a[i] if i < len(a) else None
        y = b[i] if i < len(b) else None
        if x == "#":
            return (*out, *b[i:])
        if y == "#":
            return (*out, *a[i:])
        if x is None or y is None:
            return None
        if x == "+":
            out.append(y)
        elif y == "+" or x == y:
            out.append(x)
        else:
            return None
    return tuple(out)


class Grant(enum.Enum):
    """What a SUBSCRIBE to one Topic Filter is granted (see the module)."""

    REFUSED = "refused"
    """Not granted: 0x87 Not authorized (v5), 0x80 Failure (v3.1.1)."""
    FULL = "full"
    """Granted; every topic the filter matches may be read."""
    FILTERED = "filtered"
    """Granted; some topics the filter matches are denied and withheld at delivery."""


# ---------------------------------------------------------------------------- per connection


def _usable(value: str | None) -> bool:
    return value is not None and value != "" and not any(c in value for c in "/+#")


def _substitute(rule: Rule, client_id: str, username: str | None) -> tuple[str, ...] | None:
    """The rule's filter levels with the placeholders replaced, or None if the rule can
    match nothing (an allow rule whose placeholder has no usable value)."""
    levels = rule.topic_filter.split("/")
    if CLIENT_ID not in levels and USERNAME not in levels:
        return tuple(levels)
    values = {CLIENT_ID: client_id, USERNAME: username}
    out = []
    for level in levels:
        if level not in values:
            out.append(level)
            continue
        value = values[level]
        if _usable(value):
            assert value is not None
            out.append(value)
        elif rule.permission is Permission.DENY:
            out.append("+")  # deny whatever value it could have stood for
        else:
            return None
    return tuple(out)


_EXACT, _PREFIX, _LEVELS = 0, 1, 2


@dataclass(frozen=True, slots=True)
class _Compiled:
    """A rule ready for one connection: its decision, its filter's levels, and how a Topic
    Name is tested against it: equal to ``text`` (no wildcard), under ``text`` (``a/b/#``:
    ``text`` = ``a/b/``), or level by level (any ``+``, or ``#`` alone)."""

    allow: bool
    levels: tuple[str, ...]
    kind: int
    text: str

    @classmethod
    def of(cls, allow: bool, levels: tuple[str, ...]) -> _Compiled:
        if "+" not in levels and "#" not in levels:
            return cls(allow, levels, _EXACT, "/".join(levels))
        if "+" not in levels and len(levels) > 1:  # ends with "#" (a valid filter)
            return cls(allow, levels, _PREFIX, "/".join(levels[:-1]) + "/")
        return cls(allow, levels, _LEVELS, "")

    def matches(self, topic: str) -> bool:
        """Whether the filter matches Topic Name ``topic`` (MQTT 4.7)."""
        if self.kind == _EXACT:
            return topic == self.text
        if self.kind == _PREFIX:
            return topic.startswith(self.text) or topic == self.text[:-1]
        return matches(self.levels, topic.split("/"))


class Authorizer:
    """One connection's rules, compiled at CONNECT (placeholders replaced by ``client_id``
    and ``username``), with its PUBLISH and delivery decisions cached per Topic Name.

    ``rules`` empty allows nothing (deny by default); :data:`ALLOW_ALL` is the shared
    instance of ``allow all #`` alone. ``strict`` refuses a SUBSCRIBE that would be
    :attr:`Grant.FILTERED`. Each check costs a dict lookup once a Topic Name was seen; a
    miss walks the rules that can match it.
    """

    __slots__ = (
        "_by_first_level",
        "_decisions",
        "_publish",
        "_received",
        "_subscribe",
        "_subscribe_by_first_level",
        "rules",
        "strict",
    )

    def __init__(
        self,
        rules: Sequence[Rule],
        client_id: str = "",
        username: str | None = None,
        *,
        strict: bool = False,
    ):
        self.rules = tuple(rules)
        self.strict = strict
        self._publish: list[_Compiled] = []
        self._subscribe: list[_Compiled] = []
        for rule in self.rules:
            levels = _substitute(rule, client_id, username)
            if levels is None:
                continue
            compiled = _Compiled.of(rule.permission is Permission.ALLOW, levels)
            if rule.action is not Action.SUBSCRIBE:
                self._publish.append(compiled)
            if rule.action is not Action.PUBLISH:
                self._subscribe.append(compiled)
        self._decisions: dict[str, bool] = {}
        self._received: dict[str, bool] = {}
        # the rules that can match a topic, by the topic's first level, in order
        self._by_first_level: dict[str, list[_Compiled]] = {}
        self._subscribe_by_first_level: dict[str, list[_Compiled]] = {}

    def may_publish(self, topic: str) -> bool:
        """Whether a PUBLISH (or Will Message) to Topic Name ``topic`` is allowed."""
        decision = self._decisions.get(topic)
        if decision is None:
            if len(self._decisions) >= DECISION_CACHE_SIZE:
                self._decisions.clear()
            decision = self._decisions[topic] = _first_match(
                self._publish, self._by_first_level, topic
            )
        return decision

    def may_receive(self, topic: str) -> bool:
        """Whether a message on Topic Name ``topic`` may be delivered to this subscriber:
        the first ``subscribe``/``all`` rule matching it allows it. The ingest node asks
        before every delivery; a topic seen before costs one dict lookup."""
        decision = self._received.get(topic)
        if decision is None:
            if len(self._received) >= DECISION_CACHE_SIZE:
                self._received.clear()
            decision = self._received[topic] = _first_match(
                self._subscribe, self._subscribe_by_first_level, topic
            )
        return decision

    def may_subscribe(self, topic_filter: str) -> bool:
        """Whether a SUBSCRIBE to ``topic_filter`` (a valid Topic Filter, shared or not)
        is granted at all (:meth:`subscribe_grant` is not :attr:`Grant.REFUSED`)."""
        return self.subscribe_grant(topic_filter) is not Grant.REFUSED

    def subscribe_grant(self, topic_filter: str) -> Grant:
        """What a SUBSCRIBE to ``topic_filter`` (a valid Topic Filter, shared or not) is
        granted: see the module's rules."""
        shared = parse_shared(topic_filter)
        levels = (shared.topic_filter if shared is not None else topic_filter).split("/")
        denied: list[tuple[str, ...]] = []  # the earlier deny rules overlapping the filter
        partial = False  # an earlier allow rule grants part of the filter
        for rule in self._subscribe:
            if rule.allow:
                if not denied and covers(rule.levels, levels):
                    return Grant.FULL
                common = intersection(rule.levels, levels)
                if common is not None and not any(covers(d, common) for d in denied):
                    partial = True
            elif overlaps(rule.levels, levels):
                if self.strict or (not partial and covers(rule.levels, levels)):
                    return Grant.REFUSED
                denied.append(rule.levels)
        return Grant.FILTERED if partial and not self.strict else Grant.REFUSED


def _first_match(
    rules: Sequence[_Compiled], by_first_level: dict[str, list[_Compiled]], topic: str
) -> bool:
    """The decision of the first of ``rules`` matching Topic Name ``topic`` (none: denied).
    ``by_first_level`` remembers, per first topic level, the rules that can match."""
    first = topic.split("/", 1)[0]
    candidates = by_first_level.get(first)
    if candidates is None:
        if len(by_first_level) >= DECISION_CACHE_SIZE:
            by_first_level.clear()
        candidates = by_first_level[first] = [
            rule for rule in rules if rule.levels[0] in (first, "+", "#")
        ]
    for rule in candidates:
        if rule.matches(topic):
            return rule.allow
    return False


ALLOW_ALL_RULE = Rule(Permission.ALLOW, Action.ALL, "#")
"""``allow all #``: every topic (but ``$`` topics, MQTT 4.7.2), both ways. What
``--allow-all`` stores, and the local cluster's anonymous rule."""

ALLOW_ALL = Authorizer((ALLOW_ALL_RULE,))
"""The authorizer of ``allow all #`` alone, shared by every connection with those rules."""

DENY_ALL = Authorizer(())
"""The authorizer of a client without rules, and of a connection not authenticated yet:
nothing allowed."""

SHARED_AUTHORIZERS = 256
"""Rule lists without placeholders whose :class:`Authorizer` is kept for sharing."""


@functools.lru_cache(maxsize=SHARED_AUTHORIZERS)
def _shared(rules: tuple[Rule, ...], strict: bool) -> Authorizer:
    return Authorizer(rules, strict=strict)


def authorizer_for(
    rules: Sequence[Rule], client_id: str, username: str | None, *, strict: bool = False
) -> Authorizer:
    """The :class:`Authorizer` of a connection with ``rules``, Client Identifier
    ``client_id`` and user name ``username``. Rules without placeholders decide the same
    for every connection, so those connections share one authorizer and its decision
    caches (the anonymous clients, the many devices of one credential, a fan-out to many
    ``#`` subscribers): a topic's decision is made once, not once per connection."""
    if any("${" in rule.topic_filter for rule in rules):
        return Authorizer(rules, client_id, username, strict=strict)
    return _shared(tuple(rules), strict)
