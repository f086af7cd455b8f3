"""Retained messages by Topic Name, matched against Topic Filters (MQTT 5.0 3.3.1.3, 4.7).

The reverse of the subscription trie: here the trie holds Topic Names (one node per level,
a message at the node of its full name) and the query is a Topic Filter, whose ``+`` takes
every child of a level and ``#`` every descendant. A Topic Filter starting with a wildcard
does not match Topic Names starting with ``$`` (MQTT 4.7.2).

The router fills it from the compacted ``msg.retained`` topic and reads it when a client
subscribes; the value kept per topic is opaque to this module. Not thread-safe.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

V = TypeVar("V")


class _Level(Generic[V]):
    __slots__ = ("children", "value")

    def __init__(self) -> None:
        self.children: dict[str, _Level[V]] = {}
        self.value: V | None = None


class RetainedStore(Generic[V]):
    """The latest retained message of every Topic Name (a value of type ``V`` each).

    ``set``/``delete`` cost O(topic levels); ``match`` costs the number of trie nodes the
    filter reaches (all of them below a ``#``).
    """

    __slots__ = ("_count", "_root")

    def __init__(self) -> None:
        self._root: _Level[V] = _Level()
        self._count = 0

    def __len__(self) -> int:
        """How many topics hold a retained message."""
        return self._count

    def set(self, topic: str, value: V) -> None:
        """Keep ``value`` as the retained message of ``topic`` (a valid Topic Name),
        replacing the previous one (MQTT 3.3.1.3: one retained message per topic)."""
        node = self._root
        for level in topic.split("/"):
            child = node.children.get(level)
            if child is None:
                child = node.children[level] = _Level()
            node = child
        if node.value is None:
            self._count += 1
        node.value = value

    def get(self, topic: str) -> V | None:
        """The retained message of ``topic``, or None."""
        node: _Level[V] | None = self._root
        for level in topic.split("/"):
            assert node is not None
            node = node.children.get(level)
            if node is None:
                return None
        return node.value if node is not None else None

    def delete(self, topic: str) -> bool:
        """Forget the retained message of ``topic`` (a PUBLISH with an empty payload,
        MQTT 3.3.1.3); prunes the emptied branch. Returns whether there was one."""
        path: list[tuple[_Level[V], str]] = []
        node = self._root
        for level in topic.split("/"):
            child = node.children.get(level)
            if child is None:
                return False
            path.append((node, level))
            node = child
        if node.value is None:
            return False
        node.value = None
        self._count -= 1
        for parent, level in reversed(path):
            child = parent.children[level]
            if child.value is not None or child.children:
                break
            del parent.children[level]
        return True

    def match(self, topic_filter: str) -> Iterator[tuple[str, V]]:
        """Every ``(topic, value)`` whose Topic Name matches ``topic_filter`` (a valid,
        non-shared Topic Filter), in no particular order."""
        levels = topic_filter.split("/")
        # (node, index of the next filter level, topic levels so far): an explicit stack,
        # not recursion, since a filter may have thousands of levels.
        stack: list[tuple[_Level[V], int, list[str]]] = [(self._root, 0, [])]
        while stack:
            node, index, path = stack.pop()
            if index == len(levels):
                if node.value is not None:
                    yield "/".join(path), node.value
                continue
            level = levels[index]
            if level == "#":
                yield from self._below(node, path, skip_dollar=index == 0)
            elif level == "+":
                for name, child in node.children.items():
                    if index == 0 and name.startswith("$"):
                        continue  # MQTT 4.7.2: a leading wildcard does not match "$..."
                    stack.append((child, index + 1, [*path, name]))
            else:
                found = node.children.get(level)
                if found is not None:
                    stack.append((found, index + 1, [*path, level]))

    @staticmethod
    def _below(start: _Level[V], path: list[str], *, skip_dollar: bool) -> Iterator[tuple[str, V]]:
        """``start`` itself (``#`` matches the parent level, MQTT 4.7.1.2) and every node
        below it; with ``skip_dollar``, top-level names starting with ``$`` are left out."""
        if start.value is not None and path:
            yield "/".join(path), start.value
        stack = [
            (child, [*path, name])
            for name, child in start.children.items()
            if not (skip_dollar and name.startswith("$"))
        ]
        while stack:
            node, names = stack.pop()
            if node.value is not None:
                yield "/".join(names), node.value
            stack.extend((child, [*names, name]) for name, child in node.children.items())
