"""Session rules shared by every service (DESIGN.md, "Key choices"; TBMQ's persistent client)."""

from __future__ import annotations

import uuid


def is_persistent(protocol_version: int, clean_start: bool, session_expiry_interval: int) -> bool:
    """Whether a session outlives its network connection.

    TBMQ's rule: a v3.1/3.1.1 client with Clean Session = 0; a v5 client with a Session
    Expiry Interval (seconds) > 0, or with Clean Start = 0 and no/zero expiry.
    """
    if protocol_version < 5:
        return not clean_start
    return session_expiry_interval > 0 or not clean_start


def new_connection_id() -> bytes:
    """A fresh 16-byte identifier for one network connection (``SessionRecord.connection_id``)."""
    return uuid.uuid4().bytes
