"""The failure window, the MQTT authentication throttle and the hashing pool
(services/common/auth/throttle.py), alone and in the authenticator, with a test's clock and
real threads."""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import pytest

from services.common.auth.authenticate import Authenticator
from services.common.auth.credentials import Credential, CredentialType
from services.common.auth.passwords import hash_password
from services.common.auth.principal import Accepted, AuthRequest, Refused
from services.common.auth.throttle import (
    AuthThrottle,
    FailureWindow,
    HashingPool,
    PoolBusy,
    SourceBusy,
    Verdict,
)
from tests.unit.test_auth_authenticate import Memory


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


def throttle(**overrides: Any) -> AuthThrottle:
    values: dict[str, Any] = {
        "window": 60, "delay_after": 2, "delay": 0.5, "max_delay": 3, "limit": 6,
        "ban_after": 10, "ban_seconds": 600, **overrides,
    }  # fmt: skip
    return AuthThrottle(**values)


def test_failures_bring_a_growing_delay_then_rate_exceeded_then_a_ban() -> None:
    found = throttle()
    verdicts = []
    for second in range(12):
        verdict = found.verdict("10.0.0.66", f"guess-{second}", second)
        verdicts.append((verdict.refuse, verdict.delay))
        if verdict.refuse is None:
            found.failed("10.0.0.66", f"guess-{second}", second)
    assert verdicts[:6] == [(None, 0), (None, 0), (None, 0.5), (None, 1), (None, 2), (None, 3)]
    assert verdicts[6:10] == [(0x9F, 0)] * 4  # refused attempts count as failures...
    assert verdicts[10:] == [(0x8A, 0)] * 2  # ...until the ban
    # Someone else is not held up; the ban ends after ban_seconds.
    assert found.verdict("10.0.0.1", "alice", 12) == Verdict()
    assert found.verdict("10.0.0.66", "alice", 9 + 600.5) == Verdict()


def test_a_user_name_is_throttled_from_any_address_and_forgiven_on_success() -> None:
    found = throttle()
    for second in range(6):
        found.failed(f"10.0.1.{second}", "alice", second)
    assert found.verdict("10.0.2.1", "alice", 6).refuse == 0x9F
    assert found.verdict("10.0.2.1", "bob", 6).refuse is None
    found.succeeded("alice")
    assert found.verdict("10.0.2.1", "alice", 6) == Verdict()


def test_exempt_networks_are_not_counted_but_their_user_names_are() -> None:
    found = throttle(exempt=["127.0.0.1/32"])
    for second in range(20):
        found.failed("127.0.0.1", None, second)
    assert found.verdict("127.0.0.1", None, 20) == Verdict()
    for second in range(6):
        found.failed("127.0.0.1", "alice", second)
    assert found.verdict("127.0.0.1", "alice", 6).refuse == 0x9F


def test_failures_leave_the_window() -> None:
    found = throttle()
    for second in range(6):
        found.failed("10.0.0.66", None, second)
    assert found.verdict("10.0.0.66", None, 30).refuse == 0x9F
    assert found.verdict("10.0.0.66", None, 200) == Verdict()


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_the_authenticator_counts_wrong_passwords_and_refuses_past_the_limit() -> None:
    user = Credential(uuid.uuid4(), "dev", CredentialType.MQTT_BASIC, username="dev",
                      password_hash=hash_password(b"right"))  # fmt: skip
    auth = Authenticator(Memory(user), throttle=throttle(delay_after=100), clock=Clock())
    try:
        for attempt in range(6):
            request = AuthRequest("c", "dev", b"wrong %d" % attempt, address="10.0.0.66")
            outcome = await auth.authenticate(request)
            assert isinstance(outcome, Refused) and outcome.reason_code == 0x86
        throttled = await auth.authenticate(AuthRequest("c", "dev", b"right", address="10.0.0.9"))
        assert isinstance(throttled, Refused) and throttled.reason_code == 0x9F  # the user name
        assert auth.pending_hashes == 0
    finally:
        auth.close()


async def test_one_address_holds_only_its_share_of_the_password_checks() -> None:
    user = Credential(uuid.uuid4(), "dev", CredentialType.MQTT_BASIC, username="dev",
                      password_hash=hash_password(b"right"))  # fmt: skip
    auth = Authenticator(Memory(user), max_pending_hashes=100, max_pending_per_address=2)
    try:
        storm = [
            auth.authenticate(AuthRequest("c", "dev", b"guess %d" % n, address="10.0.0.66"))
            for n in range(6)
        ]
        legit = auth.authenticate(AuthRequest("d", "dev", b"right", address="10.0.0.9"))
        *outcomes, accepted = await asyncio.gather(*storm, legit)
        codes = sorted(o.reason_code for o in outcomes if isinstance(o, Refused))
        assert codes == [0x86, 0x86, 0x9F, 0x9F, 0x9F, 0x9F]
        assert isinstance(accepted, Accepted)
    finally:
        auth.close()
