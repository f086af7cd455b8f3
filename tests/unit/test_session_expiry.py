"""How long a disconnected session is kept (MQTT 5.0 3.1.2.11.2; v3.1.1 Clean Session 0),
with and without the server's maximum: what expiry enforces and the admin API shows."""

from __future__ import annotations

import dataclasses

import pytest

from services.common.records import SessionRecord
from services.common.sessions import NEVER_EXPIRES, kept_seconds, session_expired


def away(version: int, clean_start: bool, interval: int, persistent: bool) -> SessionRecord:
    """A disconnected session, last marked at t = 1,000 ms."""
    return SessionRecord(
        "node1",
        bytes(16),
        False,
        version,
        clean_start,
        persistent,
        session_expiry_interval=interval,
        updated_at_ms=1_000,
    )


@pytest.mark.parametrize(
    ("session", "cap", "kept"),
    [
        (away(5, True, 60, True), None, 60),
        (away(5, False, NEVER_EXPIRES, True), None, None),
        (away(4, False, 0, True), None, None),  # v3.1.1 Clean Session 0: for ever
        (away(4, False, 0, True), 3600, 3600),
        (away(5, True, 7200, True), 3600, 3600),
        (away(5, True, 60, True), 3600, 60),
    ],
)
def test_kept_seconds(session: SessionRecord, cap: int | None, kept: int | None) -> None:
    assert kept_seconds(session, cap) == kept
    if kept is None:
        assert not session_expired(session, now_ms=10**15, max_seconds=cap)
    else:
        at = 1_000 + kept * 1000
        assert not session_expired(session, at - 1, cap)
        assert session_expired(session, at, cap)


def test_a_connected_session_never_expired() -> None:
    connected = dataclasses.replace(away(5, True, 60, True), connected=True)
    assert not session_expired(connected, now_ms=10**15)
