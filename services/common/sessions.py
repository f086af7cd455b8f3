"""Session rules shared by every service (docs/design.md, "Key choices"; TBMQ's persistent
client)."""

from __future__ import annotations

import enum
import uuid
from collections.abc import Iterable
from fnmatch import fnmatchcase

from services.common.records import ClientKind, SessionRecord


def is_persistent(protocol_version: int, clean_start: bool, session_expiry_interval: int) -> bool:
    """Whether a session outlives its network connection.

    TBMQ's rule: a v3.1/3.1.1 client with Clean Session = 0; a v5 client with a Session
    Expiry Interval (seconds) > 0, or with Clean Start = 0 and no/zero expiry.
    """
    if protocol_version < 5:
        return not clean_start
    return session_expiry_interval > 0 or not clean_start


def client_kind(client_id: str, application_patterns: Iterable[str]) -> ClientKind:
    """A client's kind (docs/design.md, TBMQ's DEVICE/APPLICATION split).

    Until authentication gives it with the credentials, the setting
    ``application_client_ids`` does: a client whose identifier matches one of its
    shell-style patterns (case-sensitive :func:`fnmatch.fnmatchcase`) is an APPLICATION
    client, any other a DEVICE.
    """
    if any(fnmatchcase(client_id, pattern) for pattern in application_patterns):
        return ClientKind.APPLICATION
    return ClientKind.DEVICE


class DeliveryPath(enum.Enum):
    """Which way the messages routed for a session travel (docs/design.md, "The data path";
    TBMQ's DEVICE/APPLICATION split), by the topic they are routed to."""

    NONE = "none"
    """No session, or a non-persistent one that is not connected: nothing is routed."""
    DOWNLINK = "downlink"
    """A connected non-persistent session (either kind): ``msg.downlink.<node_id>`` of its
    node, which sends it at once."""
    PERSISTED = "persisted"
    """A persistent DEVICE session, connected or not: ``msg.persisted``, stored by
    device_persist until acknowledged."""
    APPLICATION = "application"
    """A persistent APPLICATION session, connected or not: its own ``msg.app.<client>``
    topic, read by app_delivery."""


def delivery_path(record: SessionRecord | None) -> DeliveryPath:
    """The :class:`DeliveryPath` of a client's messages, from its latest session record."""
    if record is None:
        return DeliveryPath.NONE
    if record.persistent:
        if record.kind is ClientKind.APPLICATION:
            return DeliveryPath.APPLICATION
        return DeliveryPath.PERSISTED
    return DeliveryPath.DOWNLINK if record.connected else DeliveryPath.NONE


NEVER_EXPIRES = 0xFFFF_FFFF
"""The Session Expiry Interval that means the session does not expire (MQTT 5.0 3.1.2.11.2)."""


def kept_seconds(record: SessionRecord, max_seconds: int | None = None) -> int | None:
    """How long a persistent session is kept once disconnected, in seconds; None: for ever.

    An interval between 1 and 0xFFFFFFFE seconds is kept that long (MQTT 5.0 3.1.2.11.2);
    an interval of 0 (v3.1.1 and TBMQ's Clean Start 0 rule) or of 0xFFFFFFFF for ever,
    unless ``max_seconds`` (the server's maximum, ``session_expiry_max_seconds``) is set: a
    persistent session is then kept at most that many seconds.
    """
    expiry = record.session_expiry_interval
    capped = not 0 < expiry < NEVER_EXPIRES or (max_seconds is not None and expiry > max_seconds)
    if max_seconds is not None and record.persistent and capped:
        expiry = max_seconds
    return expiry if 0 < expiry < NEVER_EXPIRES else None


def session_expired(record: SessionRecord, now_ms: int, max_seconds: int | None = None) -> bool:
    """Whether a disconnected session outlived :func:`kept_seconds`, counted from the
    record's ``updated_at_ms`` (when the session was last marked disconnected); a connected
    session never did."""
    kept = kept_seconds(record, max_seconds)
    if record.connected or kept is None:
        return False
    return now_ms >= record.updated_at_ms + kept * 1000


def new_connection_id() -> bytes:
    """A fresh 16-byte identifier for one network connection (``SessionRecord.connection_id``)."""
    return uuid.uuid4().bytes


def assigned_client_id() -> str:
    """A fresh Assigned Client Identifier for a v5 client that sent none (MQTT 5.0
    3.1.3.1): ``cormorant-`` and 32 hex digits, unique without coordination."""
    return "cormorant-" + uuid.uuid4().hex


ANONYMOUS_OWNER = "anonymous"
"""The owner of the sessions of clients that connected without credentials: one principal
of its own, so neither a credential can take over an anonymous session nor the reverse."""


def owner_of(credential_id: uuid.UUID | None) -> str:
    """The owner a session of a client authenticated with ``credential_id`` records
    (``SessionRecord.owner``): the credential's id as text, or :data:`ANONYMOUS_OWNER`
    for None (anonymous access)."""
    return ANONYMOUS_OWNER if credential_id is None else str(credential_id)


def owned_by_another(
    record: SessionRecord | None, owner: str, now_ms: int, max_seconds: int | None = None
) -> bool:
    """Whether ``record`` is a session another principal than ``owner`` holds, so that a
    CONNECT of ``owner`` with its Client Identifier must be refused (0x87 Not authorized),
    whether that session is connected or kept for its owner while disconnected.

    Not so when there is no session, when it is a disconnected session that has expired
    (:func:`session_expired`, ``now_ms`` Unix ms, ``max_seconds`` the server's maximum) or
    not persistent, or when the record names no owner (written before owners were recorded:
    the session goes to whoever connects next, and its record then names that principal).
    """
    if record is None or record.owner is None or record.owner == owner:
        return False
    if record.connected:
        return True
    return record.persistent and not session_expired(record, now_ms, max_seconds)
