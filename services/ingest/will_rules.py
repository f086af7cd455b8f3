"""Will Messages (MQTT 3.1.1 3.1.2.5; MQTT 5.0 3.1.2.5, 3.1.3.2, 3.14.2.1, 3.14.4).

A CONNECT's Will Message is armed once CONNACK accepted the connection. It is published, as
a PUBLISH from that client with the Will QoS, RETAIN and the forwardable Will Properties,
when the network connection closes without a normal DISCONNECT: socket loss, keep-alive
timeout, a protocol error or malformed packet, a server shutdown, or a v5 DISCONNECT with
any Reason Code other than 0x00 (0x04 Disconnect with Will Message asks for it). A v3.1.1
DISCONNECT or a v5 DISCONNECT 0x00 discards it [MQTT-3.14.4-3].

Publication waits min(Will Delay Interval, Session Expiry Interval) seconds: the Will
Message goes out when the delay has passed or the session ends, whichever comes first
[MQTT-3.1.2-8], so a session that ends at disconnect (expiry 0) publishes at once. A will
that waits is stored in Kafka (:class:`~services.ingest.effects.StoreWill`, a
``client.wills`` record: :func:`waiting_record`) before the connection's end is, so it
survives its node; the node that owns its partition waits it out
(:mod:`services.ingest.delayed_wills`). A new network connection of the client settles a will still
waiting (:func:`settled_by`, :func:`on_new_connection`), and so does the end of the session
(:func:`on_session`). With Will Retain it is also the topic's retained message, since a Will
Message with Will Retain is published as a retained message [MQTT-3.1.2-17]
(:func:`~services.ingest.effects.publication`).
"""

from __future__ import annotations

import dataclasses

from services.common.mqtt.packets import PacketType
from services.common.mqtt.properties import Properties, encode_properties
from services.common.records import (
    PublishMeta,
    SessionRecord,
    WillRecord,
    decode_meta,
    encode_meta,
)
from services.ingest.effects import (
    Effect,
    Publication,
    StoreWill,
    publication,
    published_now,
)
from services.ingest.state import ConnectionState


def will_delay(state: ConnectionState) -> int:
    """Seconds between the close of the connection and the Will Message's publication.

    min(Will Delay Interval, Session Expiry Interval) in MQTT 5.0 (3.1.3.2.2, 3.1.2.11.2);
    0 in MQTT 3.1.1, which has no delay. The Session Expiry Interval is the one in force at
    the close (a v5 DISCONNECT may have changed it).
    """
    if state.will is None or state.protocol_version < 5:
        return 0
    delay = state.will.properties.will_delay_interval or 0
    return min(delay, state.session_expiry_interval)


def discard(state: ConnectionState) -> None:
    """Delete the Will Message without publishing it (normal DISCONNECT, MQTT-3.14.4-3)."""
    state.will = None


def on_close(state: ConnectionState) -> list[Effect]:
    """The network connection closed without a normal DISCONNECT: publish the Will Message
    now (its records go behind the client's last PUBLISHes, MQTT 4.6) or, after
    :func:`will_delay` seconds, store it to wait (:class:`StoreWill`). Returns [] if there
    is none, the connection was never accepted, or it was published or discarded already
    (once only, MQTT-3.1.2-10)."""
    if state.will is None or not state.accepted:
        return []
    delay = will_delay(state)
    meta, payload = _take(state)
    if delay == 0:
        return list(publication(meta, payload, state.new_token))
    return [
        StoreWill(
            state.new_token(), delay, state.connection_id, state.session_offset, meta, payload
        )
    ]


def waiting_record(client_id: str, will: StoreWill) -> WillRecord:
    """The ``client.wills`` record of ``client_id``'s Will Message that waits out its
    delay: due ``delay_seconds`` after the close (``meta.received_at_ms``)."""
    return WillRecord(
        client_id,
        will.connection_id,
        will.meta.received_at_ms + will.delay_seconds * 1000,
        will.session_offset,
        encode_meta(will.meta),
        will.payload,
    )


def on_taken_over(state: ConnectionState, new_clean_start: bool) -> list[Effect]:
    """A newer connection of the client took the session over (MQTT 3.1.4-3).

    The old connection's Will Message is published at once when its delay is 0 or when the
    new connection starts a clean session, which ends the old one (MQTT 5.0 3.1.2.4,
    3.1.3.2.2); otherwise the new connection continues the session before the delay has
    passed, which cancels the Will Message [MQTT-3.1.3-9].
    """
    if state.will is None or not state.accepted:
        return []
    if will_delay(state) == 0 or new_clean_start:
        return list(publication(*_take(state), state.new_token))
    discard(state)
    return []


def published_after_delay(will: WillRecord, now_ms: int) -> Publication:
    """The records of a Will Message that waited out its delay, stamped ``now_ms`` (Unix
    ms): its Message Expiry Interval runs from its publication (MQTT 5.0 3.1.3.2.4), and
    with Will Retain it is published as a retained message [MQTT-3.1.2-17]
    (:func:`~services.ingest.effects.published_now`). Raises
    :class:`~services.common.records.RecordError` if its metadata does not decode (a parsed
    ``client.wills`` record's always does)."""
    return published_now(will.meta_raw, will.payload, now_ms)


def settled_by(will: WillRecord, record: SessionRecord | None, offset: int) -> bool:
    """Whether a ``client.sessions`` record (at ``offset``) of the will's client, read while
    the will waits, is a newer connection of the client, which settles the will
    (:func:`on_new_connection`): a connected record of another connection, written after
    the will's own connection's records."""
    if record is None or not record.connected or record.connection_id == will.connection_id:
        return False
    return will.session_offset is None or offset > will.session_offset


def on_new_connection(will: WillRecord, new_clean_start: bool, now_ms: int) -> Publication:
    """A new connection with the same Client Identifier was made while ``will`` waits out
    its delay: the records that publish it now, or [] when it is discarded.

    A new connection with Clean Start 0 continues the session before the delay has passed,
    so the Will Message must not be sent [MQTT-3.1.3-9]; with Clean Start 1 the old session
    ends (MQTT 5.0 3.1.2.4), and a session's end publishes its Will Message [MQTT-3.1.2-8].
    """
    return published_after_delay(will, now_ms) if new_clean_start else []


def on_session(
    will: WillRecord, record: SessionRecord | None, offset: int, now_ms: int
) -> Publication | None:
    """What a ``client.sessions`` record of the will's client (``record`` at ``offset``;
    None: a tombstone, the session is gone) makes of the waiting ``will``: the records that
    publish it now (the session ended, MQTT-3.1.2-8, or a newer connection with Clean
    Start 1 ended it), [] to discard it (a newer connection continued the session,
    MQTT-3.1.3-9), or None: it still waits.

    A newer connection is a connected record of another connection after the will's own
    (:func:`settled_by`), or, when only the latest record is known (the owner of the will
    took it over), a record of another connection that connected after the will's
    connection closed.
    """
    if record is None:
        return published_after_delay(will, now_ms)
    closed_at_ms = decode_meta(will.meta_raw).received_at_ms
    newer = record.connection_id != will.connection_id and record.connected_at_ms >= closed_at_ms
    if settled_by(will, record, offset) or newer:
        return on_new_connection(will, record.clean_start, now_ms)
    return None


def _take(state: ConnectionState) -> tuple[PublishMeta, bytes]:
    """The Will Message as a message stamped now, removed from the connection: a Will
    Message is published once at most (MQTT-3.1.2-10)."""
    will = state.will
    assert will is not None
    state.will = None
    meta = PublishMeta(
        topic=will.topic,
        qos=will.qos,
        retain=will.retain,
        received_at_ms=state.now_ms(),
        protocol_version=state.protocol_version,
        properties=forwarded_will_properties(will.properties),
    )
    return meta, will.payload


def forwarded_will_properties(props: Properties) -> bytes:
    """The Will Properties sent on with the Will Message, as PUBLISH properties (MQTT 5.0
    3.1.3.2): all of them but the Will Delay Interval, which only the server uses. b"" when
    none are left."""
    kept = dataclasses.replace(props, will_delay_interval=None)
    if kept == Properties():
        return b""
    return encode_properties(kept, PacketType.PUBLISH)
