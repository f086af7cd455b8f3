"""Waiting on a condition with a deadline, for asyncio tests (never a bare sleep)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def wait_for(predicate: Callable[[], object], what: str, timeout: float = 10.0) -> None:
    """Poll ``predicate`` until it is true; ``AssertionError`` naming ``what`` after
    ``timeout`` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)  # polling pace of a condition with a deadline
