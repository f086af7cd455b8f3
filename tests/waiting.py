"""Waiting on a condition with a deadline: the tests' one polling helper (never a bare sleep).

:func:`wait_for` for asyncio tests (its condition may itself be a coroutine function, such as
asking Kafka for a committed offset), :func:`wait_until` for tests whose clients run on
their own threads (paho, mosquitto). Both poll every :data:`POLL_SECONDS` and raise
``AssertionError`` naming what was awaited once the deadline has passed.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

#: Polling pace of a condition with a deadline (seconds).
POLL_SECONDS = 0.02

#: Seconds a condition may take unless the caller says otherwise.
TIMEOUT = 10.0


def _timed_out(what: str, timeout: float) -> AssertionError:
    return AssertionError(f"timed out after {timeout}s waiting for {what}")


async def wait_for(
    predicate: Callable[[], object | Awaitable[object]], what: str, timeout: float = TIMEOUT
) -> None:
    """Poll ``predicate`` until it is true (awaiting it when it returns an awaitable);
    ``AssertionError`` naming ``what`` after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return
        if loop.time() > deadline:
            raise _timed_out(what, timeout)
        await asyncio.sleep(POLL_SECONDS)


def wait_until(predicate: Callable[[], object], what: str, timeout: float = TIMEOUT) -> None:
    """Poll ``predicate`` from a thread until it is true; ``AssertionError`` naming
    ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise _timed_out(what, timeout)
        time.sleep(POLL_SECONDS)
