"""The passwords an ingest node verified lately (services/common/auth/verified.py), alone and
in the authenticator: what is remembered, when it matches, when it is forgotten.

The same through the cluster (a changed password on every node): tests/e2e/test_auth.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common.auth import authenticate as authenticate_module
from services.common.auth.authenticate import Authenticator
from services.common.auth.credentials import Credential, CredentialType
from services.common.auth.passwords import hash_password, verify_password
from services.common.auth.principal import Accepted, AuthRequest, Refused
from services.common.auth.verified import VerifiedPasswords
from services.common.mqtt.reason_codes import ReasonCode
from tests.unit.test_auth_authenticate import Memory

HASH_A = hash_password(b"right")
HASH_B = hash_password(b"right")  # the same password set again: a new salt, a new hash


class Clock:
    """A monotonic clock the test moves (seconds)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# ------------------------------------------------------------------ the memory alone

IDS = [uuid.UUID(int=i) for i in range(4)]
HASHES = ["$argon2id$h1", "$argon2id$h2"]
PASSWORDS = [b"secret-one", b"secret-two", b"\x00secret-one", b""]

operation = st.one_of(
    st.tuples(
        st.just("remember"),
        st.sampled_from(IDS),
        st.sampled_from(HASHES),
        st.sampled_from(PASSWORDS),
    ),
    st.tuples(st.just("forget"), st.sampled_from(IDS)),
    st.tuples(st.just("clear")),
    st.tuples(st.just("wait"), st.floats(min_value=0, max_value=40)),
    st.tuples(
        st.just("check"), st.sampled_from(IDS), st.sampled_from(HASHES), st.sampled_from(PASSWORDS)
    ),
)


@given(
    ops=st.lists(operation, max_size=60),
    max_entries=st.integers(min_value=0, max_value=3),
    ttl=st.sampled_from([0.0, 10.0, 100.0]),
)
def test_it_matches_exactly_what_a_model_remembers(
    ops: list[tuple[object, ...]], max_entries: int, ttl: float
) -> None:
    """Against a model (a list of live entries in least-recently-used order): a pair matches
    only if it was remembered for that credential, not forgotten, cleared, expired or
    evicted since; the size never passes ``max_entries``; no password is kept."""
    clock = Clock()
    memory = VerifiedPasswords(max_entries, ttl, clock)
    model: list[tuple[uuid.UUID, str, bytes, float]] = []  # (id, hash, password, expires)
    for op in ops:
        if op[0] == "remember":
            _, cid, pw_hash, password = op
            assert isinstance(cid, uuid.UUID) and isinstance(pw_hash, str)
            assert isinstance(password, bytes)
            memory.remember(cid, memory.digest(pw_hash, password), memory.generation)
            model = [e for e in model if e[0] != cid]
            if max_entries and ttl:
                model.append((cid, pw_hash, password, clock.now + ttl))
                model = model[-max_entries:]
        elif op[0] == "forget":
            memory.forget(op[1])  # type: ignore[arg-type]
            model = [e for e in model if e[0] != op[1]]
        elif op[0] == "clear":
            memory.clear()
            model = []
        elif op[0] == "wait":
            clock.now += op[1]  # type: ignore[operator]
        else:
            _, cid, pw_hash, password = op
            assert isinstance(cid, uuid.UUID) and isinstance(pw_hash, str)
            assert isinstance(password, bytes)
            live = [e for e in model if e[0] == cid and clock.now < e[3]]
            expected = bool(live) and live[0][1:3] == (pw_hash, password)
            model = [e for e in model if e[0] != cid or clock.now < e[3]]  # expired: dropped
            if expected:  # a hit is the most recently used
                model = [e for e in model if e[0] != cid] + live
            assert memory.matches(cid, memory.digest(pw_hash, password)) is expected
        assert len(memory) <= max_entries
        kept = repr(vars(memory)).encode()
        assert not any(p in kept for p in PASSWORDS[:2])


@given(password=st.binary(min_size=8, max_size=64), other=st.binary(max_size=64))
def test_a_digest_is_keyed_per_process_and_binds_hash_and_password(
    password: bytes, other: bytes
) -> None:
    one, two = VerifiedPasswords(10, 10), VerifiedPasswords(10, 10)
    digest = one.digest(HASH_A, password)
    assert len(digest) == 32 and password not in digest
    assert digest != two.digest(HASH_A, password)  # another process, another key
    assert digest != one.digest(HASH_B, password)  # another hash of the same password
    if other != password:
        assert digest != one.digest(HASH_A, other)
    # the hash and the password do not run into each other (length-prefixed)
    assert one.digest("ab", b"c") != one.digest("a", b"bc")


def test_a_change_during_a_verification_keeps_it_from_being_remembered() -> None:
    memory = VerifiedPasswords(10, 10)
    cid = uuid.uuid4()
    digest = memory.digest(HASH_A, b"right")
    started = memory.generation
    memory.forget(uuid.uuid4())  # any change announced meanwhile
    memory.remember(cid, digest, started)
    assert not memory.matches(cid, digest)
    memory.remember(cid, digest, memory.generation)
    assert memory.matches(cid, digest)


# ------------------------------------------------------------------ in the authenticator


@pytest.fixture
def argon2_calls(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every argon2id verification the authenticator runs (the password it checked)."""
    calls: list[bytes] = []

    def counted(encoded: str, password: bytes) -> bool:
        calls.append(password)
        return verify_password(encoded, password)

    monkeypatch.setattr(authenticate_module, "verify_password", counted)
    return calls


def _basic(password_hash: str = HASH_A, **fields: object) -> Credential:
    return Credential(uuid.uuid4(), "dev", CredentialType.MQTT_BASIC, username="dev",
                      password_hash=password_hash, **fields)  # type: ignore[arg-type]  # fmt: skip


def _authenticator(source: Memory, clock: Callable[[], float] | None = None) -> Authenticator:
    memory = VerifiedPasswords(100, 60, clock or Clock())
    return Authenticator(source, verified=memory)


async def _code(auth: Authenticator, password: bytes) -> int:
    outcome = await auth.authenticate(AuthRequest("c", "dev", password))
    return outcome.reason_code if isinstance(outcome, Refused) else 0


async def test_a_verified_password_is_matched_from_memory_and_a_wrong_one_still_refused(
    argon2_calls: list[bytes],
) -> None:
    auth = _authenticator(Memory(_basic()))
    assert await _code(auth, b"right") == 0
    assert await _code(auth, b"right") == 0
    assert argon2_calls == [b"right"]  # the second CONNECT cost no argon2id
    assert await _code(auth, b"wrong") == ReasonCode.BAD_USER_NAME_OR_PASSWORD
    assert await _code(auth, b"") == ReasonCode.BAD_USER_NAME_OR_PASSWORD
    assert argon2_calls == [b"right", b"wrong", b""]  # each wrong one verified, none kept
    assert await _code(auth, b"right") == 0
    assert len(argon2_calls) == 3


async def test_a_failed_verification_is_never_remembered(argon2_calls: list[bytes]) -> None:
    auth = _authenticator(Memory(_basic()))
    for _ in range(3):
        assert await _code(auth, b"wrong") == ReasonCode.BAD_USER_NAME_OR_PASSWORD
    assert len(argon2_calls) == 3 and len(auth.verified) == 0


async def test_a_changed_password_or_state_is_not_served_from_memory(
    argon2_calls: list[bytes],
) -> None:
    credential = _basic()
    source = Memory(credential)
    auth = _authenticator(source)
    assert await _code(auth, b"right") == 0
    # The password changed (another hash), even before the node is told: the old one fails.
    source.credentials = [dataclasses.replace(credential, password_hash=hash_password(b"new"))]
    assert await _code(auth, b"right") == ReasonCode.BAD_USER_NAME_OR_PASSWORD
    assert await _code(auth, b"new") == 0
    # Disabled: banned, whatever is remembered.
    disabled = dataclasses.replace(source.credentials[0], enabled=False)
    source.credentials = [disabled]
    assert await _code(auth, b"new") == ReasonCode.BANNED
    # Told of a change, the node verifies again.
    source.credentials = [dataclasses.replace(disabled, enabled=True)]
    calls = len(argon2_calls)
    auth.verified.forget(credential.id)
    assert await _code(auth, b"new") == 0
    assert len(argon2_calls) == calls + 1


async def test_an_entry_expires_after_its_time_to_live(argon2_calls: list[bytes]) -> None:
    clock = Clock()
    auth = _authenticator(Memory(_basic()), clock)
    assert await _code(auth, b"right") == 0
    clock.now = 59.0
    assert await _code(auth, b"right") == 0
    clock.now = 60.0
    assert await _code(auth, b"right") == 0
    assert len(argon2_calls) == 2


async def test_concurrent_connects_with_the_same_password_share_one_verification(
    argon2_calls: list[bytes],
) -> None:
    auth = _authenticator(Memory(_basic()))
    codes = await asyncio.gather(*(_code(auth, b"right") for _ in range(20)))
    assert codes == [0] * 20 and argon2_calls == [b"right"]
    wrong = await asyncio.gather(*(_code(auth, b"nope") for _ in range(5)))
    assert wrong == [ReasonCode.BAD_USER_NAME_OR_PASSWORD] * 5
    assert argon2_calls == [b"right", b"nope"]
    assert auth.pending_hashes == 0


async def test_without_memory_every_connect_verifies(argon2_calls: list[bytes]) -> None:
    auth = Authenticator(Memory(_basic()))
    for _ in range(2):
        outcome = await auth.authenticate(AuthRequest("c", "dev", b"right"))
        assert isinstance(outcome, Accepted)
    assert len(argon2_calls) == 2
