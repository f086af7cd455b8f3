"""The failure window and the hashing pool (services/common/auth/throttle.py), with a test's
clock and real threads."""

from __future__ import annotations

import asyncio
import threading

import pytest

from services.common.auth.throttle import FailureWindow, HashingPool, PoolBusy, SourceBusy


def test_failures_are_counted_in_a_sliding_window() -> None:
    window = FailureWindow(60, cap=5)
    for second in (0, 10, 20):
        window.failed("1.2.3.4", second)
    assert window.count("1.2.3.4", 20) == 3
    assert window.count("5.6.7.8", 20) == 0
    assert window.count("1.2.3.4", 60.5) == 2  # the failure at 0 has left the window
    assert window.count("1.2.3.4", 81) == 0


def test_retry_after_is_when_the_limit_th_newest_failure_leaves() -> None:
    window = FailureWindow(60, cap=5)
    for second in (0, 10, 20):
        window.failed("user", second)
    assert window.retry_after("user", 4, 25) == 0.0
    assert window.retry_after("user", 3, 25) == 35.0  # the one at 0 leaves at 60
    assert window.retry_after("user", 2, 25) == 45.0  # then 10 must leave too: at 70


def test_a_forgotten_key_starts_again() -> None:
    window = FailureWindow(60, cap=3)
    for second in range(5):
        assert window.failed("user", second) == min(second + 1, 3)
    window.forget("user")
    assert window.count("user", 5) == 0


def test_keys_are_bounded_the_least_recent_dropped_first() -> None:
    window = FailureWindow(60, cap=3, max_keys=2)
    window.failed("a", 0)
    window.failed("b", 1)
    window.failed("a", 2)
    window.failed("c", 3)
    assert len(window) == 2
    assert window.count("b", 3) == 0
    assert window.count("a", 3) == 2


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        FailureWindow(0, cap=3)


async def test_checks_run_off_the_event_loop_thread() -> None:
    pool = HashingPool(1, 4, 4, "test-hash")
    try:
        name = await pool.run("1.2.3.4", lambda: threading.current_thread().name)
    finally:
        pool.close()
    assert name.startswith("test-hash")
    assert name != threading.current_thread().name
    assert pool.pending == 0


async def test_one_source_gets_a_bounded_share_and_the_pool_a_bounded_queue() -> None:
    pool = HashingPool(1, 4, 2, "test-hash")
    release = threading.Event()
    try:
        storm = [asyncio.ensure_future(pool.run("10.0.0.66", release.wait)) for _ in range(2)]
        await asyncio.sleep(0)  # let both take their place in the pool
        with pytest.raises(SourceBusy):
            await pool.run("10.0.0.66", release.wait)
        others = [asyncio.ensure_future(pool.run(f"10.0.0.{n}", release.wait)) for n in (1, 2)]
        await asyncio.sleep(0)
        assert pool.pending == 4
        with pytest.raises(PoolBusy):
            await pool.run("10.0.0.3", release.wait)
        release.set()
        assert await asyncio.gather(*storm, *others) == [True] * 4
        assert pool.pending == 0
        assert await pool.run("10.0.0.66", lambda: "again") == "again"
    finally:
        release.set()
        pool.close()
