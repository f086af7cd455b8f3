"""The ``client.events`` records of one connection (sans-IO): what happened, built from the
connection's state, as :class:`~services.ingest.effects.RecordEvent` effects.

Connects, disconnects (with the cause that ended the connection, the first one recorded
winning: a keep-alive timeout is not also a protocol error), authentication failures and
subscription changes; the analysts read them from the archive (docs/analytics.md).
"""

from __future__ import annotations

from collections.abc import Iterable

from services.common.mqtt.reason_codes import ReasonCode
from services.common.records import DisconnectCause, EventKind, EventRecord
from services.ingest.effects import RecordEvent
from services.ingest.state import ConnectionState

#: CONNACK Reason Codes that refuse a client for its credentials (MQTT 5.0 3.2.2.2).
AUTH_FAILURES = frozenset(
    (ReasonCode.BAD_USER_NAME_OR_PASSWORD, ReasonCode.NOT_AUTHORIZED, ReasonCode.BANNED,
     ReasonCode.BAD_AUTHENTICATION_METHOD)
)  # fmt: skip


def _event(
    state: ConnectionState,
    kind: EventKind,
    reason_code: int = 0,
    cause: DisconnectCause = DisconnectCause.NONE,
    topic_filters: Iterable[tuple[str, int]] = (),
) -> RecordEvent:
    return RecordEvent(
        state.client_id,
        EventRecord(
            kind=kind,
            at_ms=state.now_ms(),
            node_id=state.server.node_id,
            client_address=state.client_address,
            connection_id=state.connection_id,
            protocol_version=state.protocol_version,
            reason_code=reason_code,
            cause=cause,
            persistent=state.persistent,
            clean_start=state.clean_start,
            session_expiry_interval=state.session_expiry_interval,
            topic_filters=tuple(topic_filters),
        ),
    )


def connected(state: ConnectionState) -> RecordEvent:
    """CONNACK 0x00 is being sent."""
    return _event(state, EventKind.CONNECTED)


def refused(state: ConnectionState, reason_code: int) -> list[RecordEvent]:
    """A CONNECT refused with ``reason_code``: an AUTH_FAILED event if it names the
    credentials, nothing otherwise (a malformed CONNECT is not a client of the fleet)."""
    if reason_code not in AUTH_FAILURES:
        return []
    return [_event(state, EventKind.AUTH_FAILED, reason_code)]


def auth_failed(state: ConnectionState, reason_code: int) -> RecordEvent:
    """A re-authentication (MQTT 5.0 4.12.1) refused: AUTH_FAILED with the DISCONNECT's
    ``reason_code``."""
    return _event(state, EventKind.AUTH_FAILED, reason_code)


def ending(state: ConnectionState, cause: DisconnectCause, reason_code: int = 0) -> None:
    """Note why the connection ends (the first cause noted is kept)."""
    if state.end_cause is DisconnectCause.NONE:
        state.end_cause = cause
        state.end_reason_code = reason_code


def disconnected(state: ConnectionState) -> list[RecordEvent]:
    """The socket of an accepted connection is gone: one DISCONNECTED event with the noted
    cause (none noted: the connection was lost), at most once per connection."""
    if not state.accepted or state.disconnect_recorded:
        return []
    state.disconnect_recorded = True
    cause = state.end_cause
    if cause is DisconnectCause.NONE:
        cause = DisconnectCause.CONNECTION_LOST
    return [_event(state, EventKind.DISCONNECTED, state.end_reason_code, cause)]


def subscriptions_changed(
    state: ConnectionState, kind: EventKind, topic_filters: list[tuple[str, int]]
) -> list[RecordEvent]:
    """SUBSCRIBED / UNSUBSCRIBED for the accepted ``topic_filters`` (none: no event)."""
    return [_event(state, kind, topic_filters=topic_filters)] if topic_filters else []
