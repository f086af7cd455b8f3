"""Progress of the launcher's long steps (the first Kafka download, topic creation, waiting
for each process to be ready), told to whoever listens: ``cormorant up`` prints it."""

from __future__ import annotations

from collections.abc import Callable

_listeners: list[Callable[[str], None]] = []


def listen(listener: Callable[[str], None]) -> None:
    """Have ``listener(line)`` told every progress line from now on."""
    _listeners.append(listener)


def report(line: str) -> None:
    """Tell the listeners ``line`` (nobody by default)."""
    for listener in _listeners:
        listener(line)
