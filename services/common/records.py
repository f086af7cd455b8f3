"""Kafka record formats: the one place where what travels on each topic is encoded.

Binary and compact on purpose (docs/design.md "Key choices"): the MQTT payload is the Kafka record
value, untouched; MQTT metadata travels in a small big-endian envelope in a Kafka header. Every
format starts with a version byte so it can evolve. Decoding garbage raises
:class:`RecordError`; consumers log and skip such records instead of blocking a partition.

Topic → key / value / headers:

- ``msg.all``: key = publisher client id (UTF-8); value = payload; header ``m`` =
  :class:`PublishMeta`. A record with header ``q`` instead (value empty) is a retained
  message request: key = the subscribing client's id, ``q`` = the new subscriptions whose
  matching retained messages that client must get (:func:`encode_subscriptions`).
- ``msg.downlink.<node_id>``: key = publisher client id; value = payload; header ``m`` =
  :class:`PublishMeta`, header ``t`` = the node's targets (:func:`encode_targets`). A record
  with header ``r`` instead (value empty) asks the node to send PUBREL for each
  (client id, Packet Identifier) of :func:`encode_releases` (QoS 2 resumed, MQTT 4.4). A
  record with header ``c`` instead (value empty, key = the client id) is an administrator's
  command to the node: disconnect one connection of a client (:class:`AdminDisconnect`). A
  record with header ``b`` instead (key = the subscriber's client id) carries several
  messages for one client in order, device_persist's window (:func:`downlink_bundle_record`).
- ``msg.persisted``: key = subscriber client id; value = payload; headers ``m`` and ``t``
  as in a downlink record, ``t`` holding that one subscriber.
- ``msg.app.<client>`` (one topic per persistent APPLICATION client,
  :meth:`~services.common.kafka.names.TopicNames.app`): key = publisher client id (so
  per-publisher order holds in a partition); value = payload; headers ``m`` and ``t`` as in
  ``msg.persisted`` (``t`` holding that client), header ``s`` = the 16-byte
  ``SessionRecord.session_id`` the message was routed for (a message of an earlier session
  is not delivered to a newer one, MQTT 3.1.2.4).
- ``msg.app-shared.<group>`` (one topic per Shared Subscription with APPLICATION members):
  key = publisher client id; value = payload; header ``m`` only: the member that reads it
  is chosen by Kafka, and its own subscription gives QoS, Retain As Published and
  Subscription Identifier.
- Every record the router writes to the four topics above that carry messages also has
  header ``o`` = its :class:`Origin` (the ``msg.all`` partition and offset it was routed
  from), by which readers drop what a crashed router routed a second time.
- ``msg.retained`` (compacted): key = Topic Name (UTF-8); value = payload; header ``m``;
  a tombstone = no retained message on that topic (MQTT 3.3.1.3).
- ``client.subscriptions`` (compacted): key = client id; value = the client's whole
  subscription set (:func:`encode_subscriptions`); a tombstone (None) = no subscriptions.
- ``client.sessions`` (compacted): key = client id; value = :class:`SessionRecord`;
  a tombstone = session removed.
- ``client.acks``: key = subscriber client id; value = :class:`AckRecord`: the client's
  PUBACK / PUBREC / PUBCOMP of messages a store (device_persist, app_delivery) delivered.
- ``client.events`` (append-only, for the analysts): key = client id; value =
  :class:`EventRecord`: connects, disconnects with their cause, authentication failures,
  subscription changes and session expiries.
- ``client.wills`` (compacted): key = client id, NUL, connection id; value =
  :class:`WillRecord` (:func:`will_record`); a tombstone = published or discarded.
- ``msg.delayed`` (compacted): key = publisher client id, NUL, the message's id; value =
  :class:`DelayedRecord` (:func:`delayed_record`), or :class:`DelayedCancel`, an
  administrator's request to cancel it (:func:`delayed_cancel_record`); a tombstone, only
  ever written by the ingest node owning the partition, = published or cancelled, which its
  ``o`` header says (:class:`DelayedOutcome`).

Each record kind has one builder (``*_record``, returning a :class:`KafkaRecord`) and one
parser (``parse_*``), and every parser raises only :class:`RecordError`: the one test of
"undecodable" every consumer applies before it logs and skips a record
(:func:`services.common.kafka.consumer.log_undecodable`).

Not a Kafka topic but kept here with its siblings: :class:`StoredRecord`, what device_persist
keeps per message in its store (Redis or PostgreSQL).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import NamedTuple

from services.common.kafka.names import TopicNames
from services.common.mqtt.errors import MQTTError
from services.common.mqtt.packets import PacketType
from services.common.mqtt.properties import Properties, decode_properties
from services.common.subscription import LiveFrom, ReplayProgress, Subscription

HEADER_META = "m"
HEADER_TARGETS = "t"
HEADER_RELEASES = "r"
HEADER_RETAINED_REQUEST = "q"
HEADER_SESSION = "s"
HEADER_COMMAND = "c"
HEADER_ORIGIN = "o"
HEADER_STORED_ORIGIN = "a"
HEADER_BUNDLE = "b"

_VERSION = 1


class RecordError(ValueError):
    """A Kafka record that does not decode as the format its topic requires."""


class ClientKind(IntEnum):
    """TBMQ's client kinds (docs/design.md): chooses the delivery path of a client's messages."""

    DEVICE = 0
    APPLICATION = 1


def _check_version(data: bytes, what: str) -> None:
    if not data:
        raise RecordError(f"empty {what} record")
    if data[0] != _VERSION:
        raise RecordError(f"{what} record version {data[0]} is not supported")


def _read_str(data: bytes, offset: int, size_fmt: str) -> tuple[str, int]:
    """Read a length-prefixed UTF-8 string; ``size_fmt`` is the struct code of the length."""
    width = struct.calcsize(size_fmt)
    if offset + width > len(data):
        raise RecordError("truncated string length")
    (length,) = struct.unpack_from(size_fmt, data, offset)
    offset += width
    end = offset + length
    if end > len(data):
        raise RecordError("truncated string")
    try:
        return data[offset:end].decode("utf-8"), end
    except UnicodeDecodeError as exc:
        raise RecordError(f"invalid UTF-8: {exc}") from exc


_U16 = struct.Struct(">H")
_COUNT = struct.Struct(">BI")  # version, item count
_FLAGS_COUNT = struct.Struct(">BB")  # a target's flags, its identifier count


def _str16(text: str) -> bytes:
    raw = text.encode("utf-8")
    return struct.pack(">H", len(raw)) + raw


# --------------------------------------------------------------------------------------------
# PUBLISH metadata (msg.all and downlink)

_META = struct.Struct(">BBBQH")  # version, flags, protocol version, received_at_ms, topic length


@dataclass(slots=True)
class PublishMeta:
    """MQTT metadata of an accepted PUBLISH.

    ``qos`` 0..2; ``retain`` the RETAIN flag as published; ``received_at_ms`` the Unix time in
    milliseconds the ingest node accepted it; ``protocol_version`` of the publisher (4 or 5);
    ``properties`` the MQTT 5 PUBLISH properties forwarded to subscribers, as their wire
    encoding (MQTT 5.0 2.2.2, length prefix included), or ``b""`` when there are none.
    """

    topic: str
    qos: int
    retain: bool
    received_at_ms: int
    protocol_version: int = 4
    properties: bytes = b""


def decode_forwarded_properties(meta: PublishMeta) -> Properties:
    """The publisher's forwarded MQTT 5 PUBLISH properties, decoded (empty when none).

    Raises :class:`RecordError` if they do not decode (a garbage record).
    """
    if not meta.properties:
        return Properties()
    try:
        props, _ = decode_properties(meta.properties, 0, PacketType.PUBLISH)
    except MQTTError as exc:
        raise RecordError(f"undecodable PUBLISH properties: {exc!r}") from exc
    return props


def expires_at_ms(meta: PublishMeta) -> int | None:
    """When the message's Message Expiry Interval ends (Unix ms), or None if it has none.

    The interval (MQTT 5.0 3.3.2.3.3, seconds) runs from ``received_at_ms``. Raises
    :class:`RecordError` if the forwarded properties do not decode (a garbage record).
    """
    if not meta.properties:
        return None
    return expiry_deadline(decode_forwarded_properties(meta), meta.received_at_ms)


def expiry_deadline(properties: Properties, received_at_ms: int) -> int | None:
    """When a message received at ``received_at_ms`` (Unix ms) expires, in Unix ms, from its
    Message Expiry Interval (seconds, MQTT 5.0 3.3.2.3.3); None if it has none."""
    interval = properties.message_expiry_interval
    return None if interval is None else received_at_ms + interval * 1000


def encode_meta(meta: PublishMeta) -> bytes:
    """Encode ``meta`` as the ``m`` header value (bytes)."""
    topic = meta.topic.encode("utf-8")
    flags = meta.qos | (0x04 if meta.retain else 0)
    head = _META.pack(_VERSION, flags, meta.protocol_version, meta.received_at_ms, len(topic))
    return head + topic + meta.properties


def decode_meta(data: bytes) -> PublishMeta:
    """Decode an ``m`` header value. Raises :class:`RecordError` on garbage."""
    _check_version(data, "publish meta")
    if len(data) < _META.size:
        raise RecordError("truncated publish meta")
    _, flags, version, received_at, topic_len = _META.unpack_from(data, 0)
    end = _META.size + topic_len
    if end > len(data) or flags & 0x03 == 3:
        raise RecordError("malformed publish meta")
    try:
        topic = data[_META.size : end].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecordError(f"topic is not UTF-8: {exc}") from exc
    return PublishMeta(topic, flags & 0x03, bool(flags & 0x04), received_at, version, data[end:])


# --------------------------------------------------------------------------------------------
# downlink targets


@dataclass(frozen=True, slots=True)
class Target:
    """One subscriber of a downlink record.

    ``qos`` is the granted QoS (min of publish and subscription QoS, MQTT 3.8.4);
    ``retain_as_published`` keeps the RETAIN flag (MQTT 5 3.8.3.1), otherwise it is cleared;
    ``subscription_identifiers`` are the matching subscriptions' identifiers (MQTT 5 3.3.4).
    ``packet_id`` (1..65,535) is the Packet Identifier a message store assigned to this
    delivery, to be used as is, or 0 when the ingest node picks one; ``dup`` marks a resend
    of a delivery made before (MQTT 3.3.1.1: DUP=1, same Packet Identifier).
    """

    client_id: str
    qos: int
    retain_as_published: bool = False
    subscription_identifiers: tuple[int, ...] = ()
    packet_id: int = 0
    dup: bool = False


MAX_TARGET_IDENTIFIERS = 255
"""Subscription Identifiers one target can carry (a one-byte count); any beyond are dropped."""


def encode_targets(targets: Sequence[Target]) -> bytes:
    """Encode the subscribers of one downlink record as the ``t`` header value.

    A target keeps its first :data:`MAX_TARGET_IDENTIFIERS` Subscription Identifiers (a
    client would need that many overlapping subscriptions matching one topic); the rest are
    left out rather than failing the whole record.
    """
    parts = [_COUNT.pack(_VERSION, len(targets))]
    append = parts.append  # the router's hot path: no work a target does not need
    for t in targets:
        ids = t.subscription_identifiers[:MAX_TARGET_IDENTIFIERS]
        raw = t.client_id.encode("utf-8")
        flags = (
            t.qos
            | (0x04 if t.retain_as_published else 0)
            | (0x08 if t.packet_id else 0)
            | (0x10 if t.dup else 0)
        )
        append(_U16.pack(len(raw)))
        append(raw)
        append(_FLAGS_COUNT.pack(flags, len(ids)))
        if ids:
            append(struct.pack(f">{len(ids)}I", *ids))
        if t.packet_id:
            append(_U16.pack(t.packet_id))
    return b"".join(parts)


def decode_targets(data: bytes) -> list[Target]:
    """Decode a ``t`` header value. Raises :class:`RecordError` on garbage."""
    _check_version(data, "targets")
    try:
        (count,) = struct.unpack_from(">I", data, 1)
        offset = 5
        targets: list[Target] = []
        for _ in range(count):
            client_id, offset = _read_str(data, offset, ">H")
            flags, n_ids = struct.unpack_from(">BB", data, offset)
            offset += 2
            ids = struct.unpack_from(f">{n_ids}I", data, offset)
            offset += 4 * n_ids
            packet_id = 0
            if flags & 0x08:
                (packet_id,) = struct.unpack_from(">H", data, offset)
                offset += 2
            if flags & 0x03 == 3 or flags & 0xE0 or (flags & 0x08 and not packet_id):
                raise RecordError("invalid target flags")
            targets.append(
                Target(
                    client_id, flags & 0x03, bool(flags & 0x04), ids, packet_id, bool(flags & 0x10)
                )
            )
    except struct.error as exc:
        raise RecordError(f"truncated targets: {exc}") from exc
    if offset != len(data):
        raise RecordError("trailing bytes after targets")
    return targets


def encode_releases(releases: Sequence[tuple[str, int]]) -> bytes:
    """Encode the ``r`` header: (client id, Packet Identifier) pairs to send PUBREL for."""
    parts = [struct.pack(">BI", _VERSION, len(releases))]
    for client_id, packet_id in releases:
        parts.append(_str16(client_id))
        parts.append(struct.pack(">H", packet_id))
    return b"".join(parts)


def decode_releases(data: bytes) -> list[tuple[str, int]]:
    """Decode an ``r`` header value. Raises :class:`RecordError` on garbage."""
    _check_version(data, "releases")
    try:
        (count,) = struct.unpack_from(">I", data, 1)
        offset = 5
        releases: list[tuple[str, int]] = []
        for _ in range(count):
            client_id, offset = _read_str(data, offset, ">H")
            (packet_id,) = struct.unpack_from(">H", data, offset)
            offset += 2
            if not packet_id:
                raise RecordError("Packet Identifier 0")
            releases.append((client_id, packet_id))
    except struct.error as exc:
        raise RecordError(f"truncated releases: {exc}") from exc
    if offset != len(data):
        raise RecordError("trailing bytes after releases")
    return releases


# --------------------------------------------------------------------------------------------
# client.acks


class AckKind(IntEnum):
    """The acknowledgement a subscriber sent, by MQTT Control Packet type (MQTT 4.3)."""

    PUBACK = 4
    PUBREC = 5
    PUBCOMP = 7


_ACK_HEAD = struct.Struct(">B16sI")  # version, session id, count


@dataclass(slots=True)
class AckRecord:
    """Acknowledgements one client sent for deliveries that carried store-assigned Packet
    Identifiers (``Target.packet_id``), oldest first.

    ``session_id`` (16 bytes) is the session they belong to (``SessionRecord.session_id``):
    an acknowledgement from before a Clean Start must not touch the new session's messages.
    ``acks`` are ``(AckKind, Packet Identifier)`` pairs. A delivery that ends without the
    usual acknowledgements (a PUBREC with a failure Reason Code, MQTT 4.3.3; a message the
    ingest node discarded as over the client's Maximum Packet Size, MQTT 5.0 3.1.2.11.4, or
    as expired before it was sent, 3.3.2.3.3) is reported as complete all the same: PUBACK
    for QoS 1, PUBREC followed by PUBCOMP for QoS 2.
    """

    session_id: bytes
    acks: list[tuple[AckKind, int]]


def encode_ack(record: AckRecord) -> bytes:
    """Encode a ``client.acks`` value. Raises ``ValueError`` if ``session_id`` is not 16 bytes."""
    if len(record.session_id) != 16:
        raise ValueError(f"session_id must be 16 bytes, got {len(record.session_id)}")
    head = _ACK_HEAD.pack(_VERSION, record.session_id, len(record.acks))
    return head + b"".join(struct.pack(">BH", int(kind), pid) for kind, pid in record.acks)


def decode_ack(data: bytes) -> AckRecord:
    """Decode a ``client.acks`` value. Raises :class:`RecordError` on garbage."""
    _check_version(data, "ack")
    if len(data) < _ACK_HEAD.size:
        raise RecordError("truncated ack record")
    _, session_id, count = _ACK_HEAD.unpack_from(data, 0)
    if len(data) != _ACK_HEAD.size + 3 * count:
        raise RecordError("ack record length does not match its count")
    acks: list[tuple[AckKind, int]] = []
    for kind, packet_id in struct.iter_unpack(">BH", data[_ACK_HEAD.size :]):
        try:
            acks.append((AckKind(kind), packet_id))
        except ValueError as exc:
            raise RecordError(f"unknown acknowledgement kind {kind}") from exc
        if not packet_id:
            raise RecordError("Packet Identifier 0")
    return AckRecord(session_id, acks)


# --------------------------------------------------------------------------------------------
# client.subscriptions


_LIVE_FROM = 0x40
"""Subscription options bit (reserved in MQTT 3.8.3.1) of an entry with a live_from cut."""

_EVERY_MESSAGE = 0x80
"""Subscription options bit (reserved in MQTT 3.8.3.1), with :data:`_LIVE_FROM`: the cut is
a replay's (``LiveFrom.every_message``)."""

_REPLAY_PROGRESS = 0x8000_0000
"""Bit of the entry's 32-bit Subscription Identifier field (an identifier has 28 bits at
most, MQTT 3.8.2.1.2), with :data:`_EVERY_MESSAGE`: a
:class:`~services.common.subscription.ReplayProgress` follows the cut."""

_REPLAY_PACKET_IDS = 0x4000_0000
"""Bit of the same field, with :data:`_REPLAY_PROGRESS`: the progress ends with the 16-bit
index of the replay's block of Packet Identifiers (a record written without it: block 0)."""


def encode_subscriptions(subs: Iterable[Subscription]) -> bytes:
    """Encode a client's whole subscription set (the client id is the record key).

    Each entry: Topic Filter, the MQTT 5 subscription options byte (3.8.3.1) and the
    Subscription Identifier (0 = none). Bit 0x40 of the options byte (reserved in MQTT)
    says a :class:`~services.common.subscription.LiveFrom` cut follows: a 16-bit count of
    ``msg.all`` partitions, then one 64-bit offset each; bit 0x80 (reserved too, only with
    0x40) says the cut is a replay subscription's, which covers every message. The top bit
    of the identifier field (only with 0x80) says a persistent session's replay progress
    follows the cut: its ``cut``, ``next`` and ``sent`` offsets, as many 64-bit ones each
    as the cut has partitions, then (the identifier field's bit 30) the 16-bit index of
    its block of Packet Identifiers.
    """
    items = list(subs)
    parts = [struct.pack(">BI", _VERSION, len(items))]
    for s in items:
        live_from = s.live_from
        cut = None if live_from is None else live_from.offsets
        every_message = cut is not None and live_from is not None and live_from.every_message
        options = (
            s.qos
            | (0x04 if s.no_local else 0)
            | (0x08 if s.retain_as_published else 0)
            | (s.retain_handling << 4)
            | (_LIVE_FROM if cut is not None else 0)
            | (_EVERY_MESSAGE if every_message else 0)
        )
        progress = s.replay if every_message else None
        ident = (s.subscription_identifier or 0) | (
            _REPLAY_PROGRESS | _REPLAY_PACKET_IDS if progress else 0
        )
        parts.append(_str16(s.topic_filter))
        parts.append(struct.pack(">BI", options, ident))
        if cut is not None:
            parts.append(struct.pack(f">H{len(cut)}Q", len(cut), *cut))
        if progress is not None:
            assert cut is not None
            n = len(cut)
            if not len(progress.cut) == len(progress.next) == len(progress.sent) == n:
                raise ValueError("a replay's progress needs one offset per partition of its cut")
            parts.append(struct.pack(f">{3 * n}Q", *progress.cut, *progress.next, *progress.sent))
            parts.append(struct.pack(">H", progress.packet_ids))
    return b"".join(parts)


def decode_subscriptions(client_id: str, data: bytes) -> list[Subscription]:
    """Decode a ``client.subscriptions`` value for ``client_id``. Raises :class:`RecordError`."""
    _check_version(data, "subscriptions")
    try:
        (count,) = struct.unpack_from(">I", data, 1)
        offset = 5
        subs: list[Subscription] = []
        for _ in range(count):
            topic_filter, offset = _read_str(data, offset, ">H")
            options, ident = struct.unpack_from(">BI", data, offset)
            offset += 5
            if (
                options & 0x03 == 3
                or (options >> 4) & 0x03 == 3
                or options & (_LIVE_FROM | _EVERY_MESSAGE) == _EVERY_MESSAGE
            ):
                raise RecordError("invalid subscription options")
            if ident & _REPLAY_PROGRESS and not options & _EVERY_MESSAGE:
                raise RecordError("replay progress without a replay cut")
            if ident & _REPLAY_PACKET_IDS and not ident & _REPLAY_PROGRESS:
                raise RecordError("replay Packet Identifiers without a replay progress")
            live_from = None
            progress = None
            if options & _LIVE_FROM:
                (partitions,) = struct.unpack_from(">H", data, offset)
                cut = struct.unpack_from(f">{partitions}Q", data, offset + 2)
                offset += 2 + 8 * partitions
                live_from = LiveFrom(cut, every_message=bool(options & _EVERY_MESSAGE))
                if ident & _REPLAY_PROGRESS:
                    marks = struct.unpack_from(f">{3 * partitions}Q", data, offset)
                    offset += 24 * partitions
                    block = 0
                    if ident & _REPLAY_PACKET_IDS:
                        (block,) = struct.unpack_from(">H", data, offset)
                        offset += 2
                    progress = ReplayProgress(
                        marks[:partitions],
                        marks[partitions : 2 * partitions],
                        marks[2 * partitions :],
                        block,
                    )
                    ident &= ~(_REPLAY_PROGRESS | _REPLAY_PACKET_IDS)
            subs.append(
                Subscription(
                    client_id=client_id,
                    topic_filter=topic_filter,
                    qos=options & 0x03,
                    no_local=bool(options & 0x04),
                    retain_as_published=bool(options & 0x08),
                    retain_handling=(options >> 4) & 0x03,
                    subscription_identifier=ident or None,
                    live_from=live_from,
                    replay=progress,
                )
            )
    except struct.error as exc:
        raise RecordError(f"truncated subscriptions: {exc}") from exc
    if offset != len(data):
        raise RecordError("trailing bytes after subscriptions")
    return subs


# --------------------------------------------------------------------------------------------
# client.sessions

_SESSION = struct.Struct(">BBBBBIQQ16s")


@dataclass(slots=True)
class SessionRecord:
    """The state of one client's session, as the latest ``client.sessions`` record says.

    ``node_id`` is the ingest node holding (or that last held) the connection;
    ``connection_id`` (16 bytes) identifies one network connection, so that a node can tell
    its own connection from a newer one elsewhere; ``connected_at_ms`` (Unix ms) orders
    connections of the same client for session takeover (MQTT 3.1.4-3);
    ``session_expiry_interval`` in seconds as the client asked (v5 3.1.2.11; 0 for v3);
    ``persistent`` follows the rule of docs/design.md
    (:func:`services.common.sessions.is_persistent`).
    ``session_id`` (16 bytes) names the session: the ``connection_id`` of the connection that
    started it, kept by every connection that resumes it; a new value means the old session
    and everything stored for it are gone (Clean Start, MQTT 3.1.2.4). ``receive_maximum`` is
    the client's Receive Maximum (MQTT 5.0 3.1.2.11.3; 65,535 when it sent none): stores keep
    at most that many deliveries in flight. ``unreleased`` are the Packet Identifiers of
    inbound QoS 2 PUBLISHes stored but not yet released by PUBREL (MQTT 4.3.3), so that a
    resend after a reconnect, on any node, is not published twice. ``owner`` is the principal
    the session belongs to (:func:`services.common.sessions.owner_of`: a credential's id, or
    ``anonymous``); None in a record written before owners were recorded (such a session
    belongs to the next principal that connects with its Client Identifier, and its record
    then names that one).
    """

    node_id: str
    connection_id: bytes
    connected: bool
    protocol_version: int
    clean_start: bool
    persistent: bool
    kind: ClientKind = ClientKind.DEVICE
    session_expiry_interval: int = 0
    connected_at_ms: int = 0
    updated_at_ms: int = field(default=0)
    session_id: bytes = bytes(16)
    receive_maximum: int = 65535
    unreleased: tuple[int, ...] = ()
    owner: str | None = None


def encode_session(rec: SessionRecord) -> bytes:
    """Encode a ``client.sessions`` value.

    The owner, when known, follows the unreleased Packet Identifiers (a record without it
    is one of an older version: :func:`decode_session` reads both).

    Raises:
        ValueError: ``connection_id`` is not 16 bytes (it would not come back unchanged).
    """
    if len(rec.connection_id) != 16 or len(rec.session_id) != 16:
        raise ValueError("connection_id and session_id must be 16 bytes")
    flags = (
        (0x01 if rec.connected else 0)
        | (0x02 if rec.clean_start else 0)
        | (0x04 if rec.persistent else 0)
    )
    head = _SESSION.pack(
        _VERSION,
        flags,
        rec.protocol_version,
        int(rec.kind),
        0,
        rec.session_expiry_interval,
        rec.connected_at_ms,
        rec.updated_at_ms,
        rec.connection_id,
    )
    tail = struct.pack(
        f">16sHH{len(rec.unreleased)}H",
        rec.session_id,
        rec.receive_maximum,
        len(rec.unreleased),
        *rec.unreleased,
    )
    owner = b"" if rec.owner is None else _str16(rec.owner)
    return head + _str16(rec.node_id) + tail + owner


def decode_session(data: bytes) -> SessionRecord:
    """Decode a ``client.sessions`` value. Raises :class:`RecordError` on garbage."""
    _check_version(data, "session")
    if len(data) < _SESSION.size:
        raise RecordError("truncated session record")
    _, flags, version, kind, _, expiry, connected_at, updated_at, conn_id = _SESSION.unpack_from(
        data, 0
    )
    node_id, end = _read_str(data, _SESSION.size, ">H")
    try:
        session_id, receive_maximum, count = struct.unpack_from(">16sHH", data, end)
        end += 20
        unreleased = struct.unpack_from(f">{count}H", data, end)
        end += 2 * count
    except struct.error as exc:
        raise RecordError(f"truncated session record: {exc}") from exc
    owner = None
    if end < len(data):
        owner, end = _read_str(data, end, ">H")
    if end != len(data):
        raise RecordError("trailing bytes after session record")
    try:
        client_kind = ClientKind(kind)
    except ValueError as exc:
        raise RecordError(f"unknown client kind {kind}") from exc
    return SessionRecord(
        node_id=node_id,
        connection_id=conn_id,
        connected=bool(flags & 0x01),
        protocol_version=version,
        clean_start=bool(flags & 0x02),
        persistent=bool(flags & 0x04),
        kind=client_kind,
        session_expiry_interval=expiry,
        connected_at_ms=connected_at,
        updated_at_ms=updated_at,
        session_id=session_id,
        receive_maximum=receive_maximum,
        unreleased=unreleased,
        owner=owner,
    )


# --------------------------------------------------------------------------------------------
# device_persist's stored messages

_STORED = struct.Struct(">B16sII")  # version, session id, meta length, targets length

_STORED_ORIGIN = 0x8000_0000
"""Bit of the stored message's meta length (a meta is far shorter): the ``msg.all``
:class:`Origin` of the message (the ``o`` format) follows the fixed head."""


@dataclass(slots=True)
class StoredRecord:
    """A ``msg.persisted`` record as device_persist stores it for later delivery.

    ``session_id`` is the subscriber's session when the message was stored: a message of an
    earlier session is never delivered to a newer one (MQTT 3.1.2.4, Clean Start).
    ``meta_raw`` and ``target`` are the record's ``m`` and ``t`` headers (one target),
    ``payload`` its value; ``origin`` its ``o`` header, where the router found the message
    in ``msg.all`` (None: the record had none), sent on with its delivery for a replay
    subscription's switch.
    """

    session_id: bytes
    meta_raw: bytes
    target: Target
    payload: bytes
    origin: Origin | None = None


def encode_stored(record: StoredRecord) -> bytes:
    """Encode ``record`` for a message store: version u8 · session id 16 bytes · meta
    length u32 (top bit: an origin follows) · targets length u32 · [origin] · meta ·
    targets · payload. Raises ``ValueError`` for a bad session id."""
    if len(record.session_id) != 16:
        raise ValueError("session_id must be 16 bytes")
    targets = encode_targets([record.target])
    origin = b"" if record.origin is None else encode_origin(record.origin)
    meta_len = len(record.meta_raw) | (_STORED_ORIGIN if origin else 0)
    head = _STORED.pack(_VERSION, record.session_id, meta_len, len(targets))
    return b"".join((head, origin, record.meta_raw, targets, record.payload))


def decode_stored(data: bytes) -> StoredRecord:
    """Decode :func:`encode_stored`'s bytes. Raises :class:`RecordError` on garbage."""
    _check_version(data, "stored message")
    if len(data) < _STORED.size:
        raise RecordError("truncated stored message")
    _, session_id, meta_len, targets_len = _STORED.unpack_from(data, 0)
    start = _STORED.size
    origin = None
    if meta_len & _STORED_ORIGIN:
        meta_len &= ~_STORED_ORIGIN
        start += _ORIGIN.size
        origin = origin_of(((HEADER_ORIGIN, data[_STORED.size : start]),))
    meta_end = start + meta_len
    targets_end = meta_end + targets_len
    if targets_end > len(data):
        raise RecordError("truncated stored message")
    targets = decode_targets(data[meta_end:targets_end])
    if len(targets) != 1:
        raise RecordError("a stored message has exactly one target")
    meta_raw, payload = data[start:meta_end], data[targets_end:]
    return StoredRecord(session_id, meta_raw, targets[0], payload, origin)


# --------------------------------------------------------------------------------------------
# client.events


class EventKind(IntEnum):
    """What happened to a client, as one ``client.events`` record tells."""

    CONNECTED = 1
    """CONNACK with Reason Code 0 sent: a network connection became an MQTT session."""
    DISCONNECTED = 2
    """The network connection of a connected client ended (``cause`` says why)."""
    AUTH_FAILED = 3
    """CONNECT refused for its credentials (CONNACK 0x86/0x87/0x8C, v3.1.1 0x04/0x05)."""
    SUBSCRIBED = 4
    """SUBACK sent: ``topic_filters`` with their granted QoS (failures left out)."""
    UNSUBSCRIBED = 5
    """UNSUBACK sent: ``topic_filters`` removed (QoS 0)."""
    SESSION_EXPIRED = 6
    """A disconnected persistent session ended: its Session Expiry Interval passed."""


class DisconnectCause(IntEnum):
    """Why a connection ended (``EventRecord.cause`` of a DISCONNECTED event)."""

    NONE = 0
    """Not a disconnect."""
    CLIENT_DISCONNECT = 1
    """The client sent DISCONNECT (``reason_code`` is its Reason Code; 0 on v3.1.1)."""
    CONNECTION_LOST = 2
    """The socket closed or failed without DISCONNECT."""
    KEEP_ALIVE_TIMEOUT = 3
    """Nothing arrived within 1.5 times the Keep Alive (MQTT 3.1.2.10)."""
    TAKEOVER = 4
    """The same Client Identifier connected again (MQTT 3.1.4-3, Reason Code 0x8E)."""
    PROTOCOL_ERROR = 5
    """The server closed the connection for a malformed packet or a protocol violation."""
    SERVER_SHUTDOWN = 6
    """The ingest node stopped (Reason Code 0x8B) or was drained by an operator (0x9C)."""
    ADMINISTRATIVE_ACTION = 7
    """An administrator acted on the client: disconnected it through the admin API, or
    disabled or deleted its credential (Reason Code 0x98)."""
    NOT_AUTHORIZED = 8
    """A re-authentication (MQTT 5.0 4.12.1) failed (Reason Code 0x87)."""


_EVENT = struct.Struct(">BBBBBBQI16s")
# version, kind, flags, protocol version, reason code, cause, at_ms, session expiry interval,
# connection id; then node id (str16), client address (str16), topic filter count (u16) and
# each topic filter (str16) with its QoS (u8).


@dataclass(slots=True)
class EventRecord:
    """One ``client.events`` record (the client id is the record key).

    ``at_ms`` is when it happened (Unix ms, the writer's clock: the ingest node's, or for
    SESSION_EXPIRED device_persist's or app_delivery's); ``node_id`` the ingest node of the
    connection (for SESSION_EXPIRED the node that held the session last);
    ``client_address`` the peer as ``host:port`` (``""`` when unknown);
    ``connection_id`` (16 bytes) pairs a CONNECTED event with the DISCONNECTED event of the
    same network connection (``SessionRecord.connection_id``; zeros when none);
    ``protocol_version`` 3, 4 or 5 (0 when the CONNECT did not say); ``reason_code`` the MQTT
    5 Reason Code of the CONNACK (CONNECTED, AUTH_FAILED) or DISCONNECT (DISCONNECTED) sent or
    received, MQTT 5.0 2.4; ``cause`` a :class:`DisconnectCause`; ``persistent`` and
    ``clean_start`` describe the session (the rule of docs/design.md),
    ``session_expiry_interval`` in seconds; ``topic_filters`` are (Topic Filter, QoS) pairs of
    SUBSCRIBED / UNSUBSCRIBED.
    """

    kind: EventKind
    at_ms: int
    node_id: str
    client_address: str = ""
    connection_id: bytes = bytes(16)
    protocol_version: int = 0
    reason_code: int = 0
    cause: DisconnectCause = DisconnectCause.NONE
    persistent: bool = False
    clean_start: bool = False
    session_expiry_interval: int = 0
    topic_filters: tuple[tuple[str, int], ...] = ()


def encode_event(event: EventRecord) -> bytes:
    """Encode a ``client.events`` value.

    Raises ``ValueError`` if ``connection_id`` is not 16 bytes or a field is out of range.
    """
    if len(event.connection_id) != 16:
        raise ValueError("connection_id must be 16 bytes")
    flags = (0x01 if event.persistent else 0) | (0x02 if event.clean_start else 0)
    parts = [
        _EVENT.pack(
            _VERSION,
            int(event.kind),
            flags,
            event.protocol_version,
            event.reason_code,
            int(event.cause),
            event.at_ms,
            event.session_expiry_interval,
            event.connection_id,
        ),
        _str16(event.node_id),
        _str16(event.client_address),
        struct.pack(">H", len(event.topic_filters)),
    ]
    for topic_filter, qos in event.topic_filters:
        parts.append(_str16(topic_filter))
        parts.append(struct.pack(">B", qos))
    return b"".join(parts)


def session_expired_event(session: SessionRecord, at_ms: int) -> EventRecord:
    """The SESSION_EXPIRED event of ``session`` (its last connection's node, connection
    and protocol), ended at ``at_ms`` (Unix ms) by the store that owned it."""
    return EventRecord(
        kind=EventKind.SESSION_EXPIRED,
        at_ms=at_ms,
        node_id=session.node_id,
        connection_id=session.connection_id,
        protocol_version=session.protocol_version,
        persistent=session.persistent,
        clean_start=session.clean_start,
        session_expiry_interval=session.session_expiry_interval,
    )


def decode_event(data: bytes) -> EventRecord:
    """Decode a ``client.events`` value. Raises :class:`RecordError` on garbage."""
    _check_version(data, "event")
    if len(data) < _EVENT.size:
        raise RecordError("truncated event record")
    _, kind, flags, version, reason, cause, at_ms, expiry, conn_id = _EVENT.unpack_from(data, 0)
    node_id, offset = _read_str(data, _EVENT.size, ">H")
    address, offset = _read_str(data, offset, ">H")
    try:
        (count,) = struct.unpack_from(">H", data, offset)
        offset += 2
        filters: list[tuple[str, int]] = []
        for _ in range(count):
            topic_filter, offset = _read_str(data, offset, ">H")
            (qos,) = struct.unpack_from(">B", data, offset)
            offset += 1
            filters.append((topic_filter, qos))
    except struct.error as exc:
        raise RecordError(f"truncated event record: {exc}") from exc
    if offset != len(data):
        raise RecordError("trailing bytes after event record")
    try:
        event_kind, event_cause = EventKind(kind), DisconnectCause(cause)
    except ValueError as exc:
        raise RecordError(f"unknown event kind or cause: {exc}") from exc
    return EventRecord(
        kind=event_kind,
        at_ms=at_ms,
        node_id=node_id,
        client_address=address,
        connection_id=conn_id,
        protocol_version=version,
        reason_code=reason,
        cause=event_cause,
        persistent=bool(flags & 0x01),
        clean_start=bool(flags & 0x02),
        session_expiry_interval=expiry,
        topic_filters=tuple(filters),
    )


# --------------------------------------------------------------------------------------------
# Kafka records: one builder and one parser per record kind

Headers = Sequence[tuple[str, bytes]]
"""Kafka record headers: (name, value) pairs."""


class KafkaRecord(NamedTuple):
    """One record to produce: ``topic``, ``key``, ``value`` (None: a tombstone) and
    ``headers``; ``send(*record)`` hands it to a
    :data:`~services.common.faust_app.SendRecord`."""

    topic: str
    key: bytes
    value: bytes | None
    headers: Headers = ()


@dataclass(slots=True)
class Message:
    """A PUBLISH as it travels between topics: metadata decoded and as its raw ``m``
    header (passed on unchanged), and the payload (the record value, untouched)."""

    meta: PublishMeta
    meta_raw: bytes
    payload: bytes


def client_id_of(key: bytes | None) -> str:
    """A record key that names a client (or a Topic Name) as text.

    Raises :class:`RecordError` for a missing key or one that is not UTF-8.
    """
    if key is None:
        raise RecordError("record without a key")
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecordError(f"record key is not UTF-8: {exc}") from exc


def _header(headers: Headers | None, name: str) -> bytes:
    for key, value in headers or ():
        if key == name:
            return value
    raise RecordError(f"record without its {name!r} header")


def _message(headers: Headers | None, value: bytes | None) -> Message:
    meta_raw = _header(headers, HEADER_META)
    return Message(decode_meta(meta_raw), meta_raw, value or b"")


# msg.all --------------------------------------------------------------------------------


@dataclass(slots=True)
class Published:
    """A ``msg.all`` record of an accepted PUBLISH: its publisher and the message."""

    client_id: str
    message: Message


@dataclass(slots=True)
class RetainedRequest:
    """A ``msg.all`` record asking for the retained messages that ``subscriptions`` (new
    subscriptions of ``client_id``) must get (MQTT 3.3.1.3)."""

    client_id: str
    subscriptions: list[Subscription]


def publish_record(
    names: TopicNames, client_id: str, meta: PublishMeta, payload: bytes
) -> KafkaRecord:
    """The ``msg.all`` record of an accepted PUBLISH (a Will Message included)."""
    return KafkaRecord(
        names.msg_all, client_id.encode("utf-8"), payload, [(HEADER_META, encode_meta(meta))]
    )


def retained_request_record(
    names: TopicNames, client_id: str, subscriptions: Iterable[Subscription]
) -> KafkaRecord:
    """The ``msg.all`` record asking for the retained messages of new ``subscriptions``."""
    header = (HEADER_RETAINED_REQUEST, encode_subscriptions(subscriptions))
    return KafkaRecord(names.msg_all, client_id.encode("utf-8"), b"", [header])


def parse_msg_all(
    key: bytes | None, value: bytes | None, headers: Headers | None
) -> Published | RetainedRequest:
    """Parse a ``msg.all`` record. Raises :class:`RecordError`."""
    client_id = client_id_of(key)
    meta_raw = None
    for name, data in headers or ():  # one pass: this is the router's hot path
        if name == HEADER_META:
            meta_raw = data
        elif name == HEADER_RETAINED_REQUEST:
            return RetainedRequest(client_id, decode_subscriptions(client_id, data))
    if meta_raw is None:
        raise RecordError("msg.all record without its m header")
    return Published(client_id, Message(decode_meta(meta_raw), meta_raw, value or b""))


# Origins of routed records ------------------------------------------------------------------


_ORIGIN = struct.Struct(">BIQI")  # version, msg.all partition, offset, index


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a record the router wrote comes from (header ``o``): the ``msg.all``
    ``partition`` and ``offset`` of the record it routed, and ``index``, how many records
    with the same topic and key the router wrote for that record before this one (several
    only when it answers a retained message request). A router that crashes routes the
    records after its last committed offset again and writes the same origins again; the
    readers drop them (:class:`~services.common.kafka.reroutes.RerouteFilter`)."""

    partition: int
    offset: int
    index: int


def encode_origin(origin: Origin) -> bytes:
    """The ``o`` header of ``origin``: version u8 · partition u32 · offset u64 · index u32."""
    return _ORIGIN.pack(_VERSION, origin.partition, origin.offset, origin.index)


def origin_of(headers: Headers | None, header: str = HEADER_ORIGIN) -> Origin | None:
    """The :class:`Origin` in ``headers`` (None when there is none: a record written by an
    older router, or one the router did not route); ``header`` names the header to read
    (:data:`HEADER_STORED_ORIGIN`: a message store's). Raises :class:`RecordError` for a
    malformed one."""
    for name, data in headers or ():
        if name == header:
            return decode_origin(data)
    return None


def decode_origin(data: bytes) -> Origin:
    """The :class:`Origin` encoded in ``data`` (:func:`encode_origin`'s layout). Raises
    :class:`RecordError` for a malformed one."""
    if len(data) != _ORIGIN.size:
        raise RecordError(f"origin header of {len(data)} bytes, not {_ORIGIN.size}")
    _check_version(data, "origin")
    _, partition, offset, index = _ORIGIN.unpack(data)
    return Origin(partition, offset, index)


def with_origins(records: Sequence[KafkaRecord], partition: int, offset: int) -> list[KafkaRecord]:
    """``records`` (what the router wrote for the ``msg.all`` record at ``partition`` and
    ``offset``, in order) with their ``o`` headers: the index counts the earlier records
    of the same topic and key."""
    counts: dict[tuple[str, bytes], int] = {}
    out: list[KafkaRecord] = []
    for topic, key, value, headers in records:
        index = counts.get((topic, key), 0)
        counts[(topic, key)] = index + 1
        origin = _ORIGIN.pack(_VERSION, partition, offset, index)
        out.append(KafkaRecord(topic, key, value, [*headers, (HEADER_ORIGIN, origin)]))
    return out


# msg.retained -----------------------------------------------------------------------------


def retained_record(names: TopicNames, meta: PublishMeta, payload: bytes) -> KafkaRecord:
    """The ``msg.retained`` record of a PUBLISH with RETAIN, keyed by its Topic Name; an
    empty payload gives a tombstone, which deletes the topic's retained message (3.3.1.3)."""
    return KafkaRecord(
        names.msg_retained,
        meta.topic.encode("utf-8"),
        payload or None,
        [(HEADER_META, encode_meta(meta))],
    )


def parse_retained(
    key: bytes | None, value: bytes | None, headers: Headers | None
) -> tuple[str, Message | None]:
    """Parse a ``msg.retained`` record: its Topic Name and message (None: a tombstone).
    Raises :class:`RecordError`."""
    topic = client_id_of(key)
    if value is None:
        return topic, None
    return topic, _message(headers, value)


# msg.downlink.<node> -------------------------------------------------------------------------


@dataclass(slots=True)
class Downlink:
    """A downlink record of a message: the message, this node's targets for it, and the
    ``msg.all`` :class:`Origin` of its message: the router's ``o`` header, or the ``a``
    header of a message store's (device_persist's, app_delivery's) delivery of a record
    the router routed (None in a record of an older router or store)."""

    meta: PublishMeta
    payload: bytes
    targets: list[Target]
    origin: Origin | None = None


@dataclass(slots=True)
class Releases:
    """A downlink record asking for PUBREL of each (client id, Packet Identifier)."""

    releases: list[tuple[str, int]]


def downlink_record(
    names: TopicNames,
    node_id: str,
    key: bytes,
    meta_raw: bytes,
    payload: bytes,
    targets: Sequence[Target],
    origin: Origin | None = None,
) -> KafkaRecord:
    """The record sending a message (its raw ``m`` header and payload) to ``targets``
    connected to node ``node_id``; ``key`` is the publisher's client id (its order is kept,
    MQTT 4.6). A message store's delivery of a routed message gives its ``msg.all``
    ``origin``: header ``a`` (:data:`HEADER_STORED_ORIGIN`, the ``o`` format), which a
    replay's switch reads (:mod:`services.ingest.handle_replay`). Not ``o``: the node's
    :class:`~services.common.kafka.reroutes.RerouteFilter` reads that one as the router's,
    and a store's resends and its lag behind the router would look routed twice."""
    headers = [(HEADER_META, meta_raw), (HEADER_TARGETS, encode_targets(targets))]
    if origin is not None:
        headers.append((HEADER_STORED_ORIGIN, encode_origin(origin)))
    return KafkaRecord(names.downlink(node_id), key, payload, headers)


@dataclass(slots=True)
class Bundle:
    """A downlink record of several messages, in order (:func:`downlink_bundle_record`)."""

    messages: list[Downlink]


_BUNDLE_HEAD = struct.Struct(">BI")  # version, message count
#: meta, targets, payload and origin lengths of one message (origin: 0 bytes, or the ``o``
#: format's)
_BUNDLE_ENTRY = struct.Struct(">IIII")


def downlink_bundle_record(
    names: TopicNames,
    node_id: str,
    client_id: str,
    messages: Sequence[tuple[bytes, bytes, Target]],
    origins: Sequence[Origin | None] = (),
) -> KafkaRecord:
    """The record sending ``messages`` (raw ``m`` header, payload, the one target each),
    in order, to ``client_id`` connected to node ``node_id``: one Kafka record for a
    stored window instead of one per message. ``origins``: the ``msg.all``
    :class:`Origin` of each message where known (what :func:`downlink_record`'s header
    ``a`` carries for one message; empty: none known). Key: the client id; value: each
    message's ``m`` header, encoded target (:func:`encode_targets`), payload and origin
    (:func:`encode_origin`, or nothing), concatenated; header ``b``: version u8 · count u32
    · per message its four lengths (u32 each). Raises ``ValueError`` if ``origins`` is
    neither empty nor one per message."""
    if origins and len(origins) != len(messages):
        raise ValueError(f"{len(origins)} origins for {len(messages)} messages")
    head = [_BUNDLE_HEAD.pack(_VERSION, len(messages))]
    body: list[bytes] = []
    for i, (meta_raw, payload, target) in enumerate(messages):
        targets = encode_targets([target])
        origin = origins[i] if origins else None
        encoded = b"" if origin is None else encode_origin(origin)
        head.append(_BUNDLE_ENTRY.pack(len(meta_raw), len(targets), len(payload), len(encoded)))
        body += (meta_raw, targets, payload, encoded)
    return KafkaRecord(
        names.downlink(node_id),
        client_id.encode("utf-8"),
        b"".join(body),
        [(HEADER_BUNDLE, b"".join(head))],
    )


def split_bundle(head: bytes, value: bytes) -> list[tuple[bytes, bytes, bytes, bytes]]:
    """The messages of a bundle record (its ``b`` header and value), undecoded, in order:
    one (``m`` header, encoded target list, payload, origin or ``b""``) tuple of bytes each, as
    :func:`downlink_bundle_record` laid them out. The one reader of the layout: the ingest
    node (through :func:`decode_bundle`) and the analytics archive (``spark_emr.decode``)
    both split a bundle here. Raises :class:`RecordError` on garbage: an unknown version,
    a header whose length does not match its count, lengths that do not add up to the
    value."""
    _check_version(head, "bundle")
    if len(head) < _BUNDLE_HEAD.size:
        raise RecordError("truncated bundle header")
    _, count = _BUNDLE_HEAD.unpack_from(head, 0)
    if len(head) != _BUNDLE_HEAD.size + count * _BUNDLE_ENTRY.size:
        raise RecordError("bundle header does not match its message count")
    parts: list[tuple[bytes, bytes, bytes, bytes]] = []
    offset = 0
    for lengths in _BUNDLE_ENTRY.iter_unpack(head[_BUNDLE_HEAD.size :]):
        fields = []
        for length in lengths:
            end = offset + length
            if end > len(value):
                raise RecordError("truncated bundle")
            fields.append(value[offset:end])
            offset = end
        meta_raw, targets, payload, origin = fields
        parts.append((meta_raw, targets, payload, origin))
    if offset != len(value):
        raise RecordError("trailing bytes after the bundled messages")
    return parts


def decode_bundle(head: bytes, value: bytes) -> Bundle:
    """The messages of a bundle record (its ``b`` header and value), decoded. Raises
    :class:`RecordError` on garbage: what :func:`split_bundle` refuses, or an undecodable
    ``m`` header, target list or origin of any message (the whole record is refused: a node
    delivers none of it, and the store sends the messages again, MQTT 4.4)."""
    return Bundle(
        [
            Downlink(
                decode_meta(meta_raw),
                payload,
                decode_targets(targets),
                decode_origin(origin) if origin else None,
            )
            for meta_raw, targets, payload, origin in split_bundle(head, value)
        ]
    )


def release_record(
    names: TopicNames, node_id: str, client_id: str, releases: Sequence[tuple[str, int]]
) -> KafkaRecord:
    """The record asking node ``node_id`` for PUBREL of ``releases`` (MQTT 4.4)."""
    headers = [(HEADER_RELEASES, encode_releases(releases))]
    return KafkaRecord(names.downlink(node_id), client_id.encode("utf-8"), b"", headers)


@dataclass(frozen=True, slots=True)
class AdminDisconnect:
    """An administrator's command to an ingest node: disconnect ``client_id``'s connection
    ``connection_id`` (16 bytes; a newer connection of the client is left alone) with
    Reason Code 0x98 Administrative action, and with ``end_session`` end its session too
    (as a v5 DISCONNECT with Session Expiry Interval 0 would)."""

    client_id: str
    connection_id: bytes
    end_session: bool = False


_COMMAND = struct.Struct(">BBB16s")  # version, kind (1: disconnect), flags, connection id


def admin_disconnect_record(
    names: TopicNames, node_id: str, command: AdminDisconnect
) -> KafkaRecord:
    """The downlink record carrying ``command`` to node ``node_id`` (key: the client id;
    header ``c``: version u8 · kind u8 (1) · flags u8 (bit 0 end session) · connection id
    16 bytes · client id str16). Raises ``ValueError`` if the connection id is not 16
    bytes."""
    if len(command.connection_id) != 16:
        raise ValueError("connection_id must be 16 bytes")
    header = _COMMAND.pack(_VERSION, 1, int(command.end_session), command.connection_id)
    key = command.client_id.encode("utf-8")
    return KafkaRecord(
        names.downlink(node_id), key, b"", [(HEADER_COMMAND, header + _str16(command.client_id))]
    )


@dataclass(frozen=True, slots=True)
class AdminDrain:
    """An administrator's command to an ingest node: drain (leave the load balancer's
    rotation, stop accepting, disconnect every client with Reason Code 0x9C Use another
    server, paced over at most ``window_ms`` milliseconds) and stay up, out of rotation,
    until restarted (docs/operations/drain.md)."""

    window_ms: int


_DRAIN = struct.Struct(">BBI")  # version, kind (2: drain), window in ms


def admin_drain_record(names: TopicNames, node_id: str, command: AdminDrain) -> KafkaRecord:
    """The downlink record carrying ``command`` to node ``node_id`` (key: the node id;
    header ``c``: version u8 · kind u8 (2) · window u32 ms). Raises ``ValueError`` if
    the window is not a u32."""
    if not 0 <= command.window_ms < 2**32:
        raise ValueError("window_ms must fit 32 bits")
    header = _DRAIN.pack(_VERSION, 2, command.window_ms)
    return KafkaRecord(
        names.downlink(node_id), node_id.encode("utf-8"), b"", [(HEADER_COMMAND, header)]
    )


def _decode_command(data: bytes) -> AdminDisconnect | AdminDrain:
    _check_version(data, "command")
    if len(data) >= 2 and data[1] == 2:
        if len(data) != _DRAIN.size:
            raise RecordError("drain command of the wrong size")
        return AdminDrain(_DRAIN.unpack(data)[2])
    if len(data) < _COMMAND.size:
        raise RecordError("truncated command")
    _, kind, flags, connection_id = _COMMAND.unpack_from(data, 0)
    if kind != 1:
        raise RecordError(f"unknown command kind {kind}")
    client_id, end = _read_str(data, _COMMAND.size, ">H")
    if end != len(data):
        raise RecordError("trailing bytes after command")
    return AdminDisconnect(client_id, connection_id, bool(flags & 0x01))


def parse_downlink(
    value: bytes | None, headers: Headers | None
) -> Downlink | Bundle | Releases | AdminDisconnect | AdminDrain:
    """Parse a downlink record. Raises :class:`RecordError`."""
    meta_raw = targets = None
    origin: Headers = ()
    for name, data in headers or ():
        if name == HEADER_BUNDLE:
            return decode_bundle(data, value or b"")
        if name == HEADER_RELEASES:
            return Releases(decode_releases(data))
        if name == HEADER_COMMAND:
            return _decode_command(data)
        if name == HEADER_META:
            meta_raw = data
        elif name == HEADER_TARGETS:
            targets = data
        elif name == HEADER_ORIGIN or (name == HEADER_STORED_ORIGIN and not origin):
            origin = ((HEADER_ORIGIN, data),)
    if meta_raw is None or targets is None:
        raise RecordError("downlink record without its m and t headers")
    return Downlink(decode_meta(meta_raw), value or b"", decode_targets(targets), origin_of(origin))


# msg.persisted ----------------------------------------------------------------------------


@dataclass(slots=True)
class Persisted:
    """A ``msg.persisted`` record: a message for one persistent DEVICE subscriber."""

    client_id: str
    message: Message
    target: Target


def persisted_record(names: TopicNames, message: Message, target: Target) -> KafkaRecord:
    """The ``msg.persisted`` record of ``message`` for ``target`` (keyed by its client id)."""
    headers = [(HEADER_META, message.meta_raw), (HEADER_TARGETS, encode_targets([target]))]
    return KafkaRecord(
        names.msg_persisted, target.client_id.encode("utf-8"), message.payload, headers
    )


def parse_persisted(key: bytes | None, value: bytes | None, headers: Headers | None) -> Persisted:
    """Parse a ``msg.persisted`` record. Raises :class:`RecordError`."""
    client_id = client_id_of(key)
    targets = decode_targets(_header(headers, HEADER_TARGETS))
    if len(targets) != 1:
        raise RecordError("a msg.persisted record has exactly one target")
    return Persisted(client_id, _message(headers, value), targets[0])


# msg.app.<client> and msg.app-shared.<group> ---------------------------------------------------


@dataclass(slots=True)
class AppMessage:
    """A ``msg.app.<client>`` record: the message, its one target and the session id it
    was routed for."""

    message: Message
    target: Target
    session_id: bytes


def app_record(
    names: TopicNames, key: bytes, message: Message, target: Target, session_id: bytes
) -> KafkaRecord:
    """The ``msg.app.<client>`` record of ``message`` for the persistent APPLICATION
    session ``session_id`` of ``target``; ``key`` is the publisher's client id."""
    headers = [
        (HEADER_META, message.meta_raw),
        (HEADER_TARGETS, encode_targets([target])),
        (HEADER_SESSION, session_id),
    ]
    return KafkaRecord(names.app(target.client_id), key, message.payload, headers)


def parse_app(value: bytes | None, headers: Headers | None) -> AppMessage:
    """Parse a ``msg.app.<client>`` record. Raises :class:`RecordError`."""
    targets = decode_targets(_header(headers, HEADER_TARGETS))
    if len(targets) != 1:
        raise RecordError("a msg.app record has exactly one target")
    return AppMessage(_message(headers, value), targets[0], _header(headers, HEADER_SESSION))


def app_shared_record(
    names: TopicNames, share_name: str, topic_filter: str, key: bytes, message: Message
) -> KafkaRecord:
    """The ``msg.app-shared.<group>`` record of ``message`` for Shared Subscription
    ``$share/<share_name>/<topic_filter>``; ``key`` is the publisher's client id."""
    topic = names.app_shared(share_name, topic_filter)
    return KafkaRecord(topic, key, message.payload, [(HEADER_META, message.meta_raw)])


def parse_app_shared(value: bytes | None, headers: Headers | None) -> Message:
    """Parse a ``msg.app-shared.<group>`` record. Raises :class:`RecordError`."""
    return _message(headers, value)


# client.sessions, client.subscriptions, client.acks, client.events -------------------------


HEADER_DELETES = "s"
"""Header of a ``client.sessions`` / ``client.subscriptions`` tombstone written when a
session ends: the 16-byte ``session_id`` of the session it deletes (its generation)."""


def _deletes(session_id: bytes | None) -> Headers:
    return () if session_id is None else ((HEADER_DELETES, session_id),)


def client_session_record(
    names: TopicNames,
    client_id: str,
    record: SessionRecord | None,
    deletes: bytes | None = None,
) -> KafkaRecord:
    """The ``client.sessions`` record of ``client_id`` (None: a tombstone, session gone).

    ``deletes``: the ``session_id`` a tombstone deletes, carried in its
    :data:`HEADER_DELETES` header so that readers can tell a late delete of an older
    session from the end of the current one (:func:`stale_delete`).
    """
    value = None if record is None else encode_session(record)
    headers = _deletes(deletes) if record is None else ()
    return KafkaRecord(names.client_sessions, client_id.encode("utf-8"), value, headers)


def stale_delete(current: SessionRecord | None, value: bytes | None, headers: Headers) -> bool:
    """Whether a ``client.sessions`` / ``client.subscriptions`` record (``value``,
    ``headers``) is a late delete of an older session, to be ignored.

    True only for a tombstone that names the session it deletes (:data:`HEADER_DELETES`)
    while the latest session record read, ``current``, is of another session (a new
    session started on another node while the delete was on its way). A tombstone that
    names no session (written by the admin API, or by an older version) deletes whatever
    is there, as before.
    """
    if value is not None or current is None:
        return False
    for name, session_id in headers:
        if name == HEADER_DELETES:
            return session_id != current.session_id
    return False


def parse_client_session(
    key: bytes | None, value: bytes | None
) -> tuple[str, SessionRecord | None]:
    """Parse a ``client.sessions`` record: client id and record (None: a tombstone).
    Raises :class:`RecordError`."""
    return client_id_of(key), None if value is None else decode_session(value)


def client_subscriptions_record(
    names: TopicNames,
    client_id: str,
    subscriptions: Iterable[Subscription],
    deletes: bytes | None = None,
) -> KafkaRecord:
    """The ``client.subscriptions`` record of ``client_id``'s whole set (none: a
    tombstone; ``deletes`` as for :func:`client_session_record`)."""
    items = list(subscriptions)
    value = encode_subscriptions(items) if items else None
    headers = _deletes(deletes) if value is None else ()
    return KafkaRecord(names.client_subscriptions, client_id.encode("utf-8"), value, headers)


def parse_client_subscriptions(
    key: bytes | None, value: bytes | None
) -> tuple[str, list[Subscription]]:
    """Parse a ``client.subscriptions`` record: client id and its whole subscription set
    ([] for a tombstone). Raises :class:`RecordError`."""
    client_id = client_id_of(key)
    return client_id, [] if value is None else decode_subscriptions(client_id, value)


def client_acks_record(names: TopicNames, client_id: str, record: AckRecord) -> KafkaRecord:
    """The ``client.acks`` record of ``client_id``'s acknowledgements."""
    return KafkaRecord(names.client_acks, client_id.encode("utf-8"), encode_ack(record))


def parse_client_acks(key: bytes | None, value: bytes | None) -> tuple[str, AckRecord]:
    """Parse a ``client.acks`` record. Raises :class:`RecordError` (a tombstone too)."""
    return client_id_of(key), decode_ack(value or b"")


def client_event_record(names: TopicNames, client_id: str, event: EventRecord) -> KafkaRecord:
    """The ``client.events`` record of what happened to ``client_id``."""
    return KafkaRecord(names.client_events, client_id.encode("utf-8"), encode_event(event))


def parse_client_event(key: bytes | None, value: bytes | None) -> tuple[str, EventRecord]:
    """Parse a ``client.events`` record. Raises :class:`RecordError` (a tombstone too)."""
    return client_id_of(key), decode_event(value or b"")


# client.wills ---------------------------------------------------------------------------------

#: Separates the client id from the connection id in a ``client.wills`` key, and from the
#: message's id in a ``msg.delayed`` key (MQTT forbids
#: U+0000 in a Client Identifier, MQTT-1.5.4-2; the partitioner hashes what comes before it).
WILL_KEY_SEPARATOR = b"\x00"

_WILL = struct.Struct(">BQqI")  # version, due_at_ms, session offset (-1: none), meta length


@dataclass(frozen=True, slots=True)
class WillRecord:
    """A Will Message waiting out its Will Delay Interval (a ``client.wills`` record).

    ``client_id`` and ``connection_id`` (16 bytes) name the network connection whose close
    armed it; ``due_at_ms`` is when it is to be published (Unix ms: the close plus
    min(Will Delay Interval, Session Expiry Interval)); ``session_offset`` is the
    ``client.sessions`` offset of that connection's latest connected record (None:
    unknown), so that only newer connections settle it; ``meta_raw`` (an ``m`` header) and
    ``payload`` are the message as it will be published.
    """

    client_id: str
    connection_id: bytes
    due_at_ms: int
    session_offset: int | None
    meta_raw: bytes
    payload: bytes


def will_key(client_id: str, connection_id: bytes) -> bytes:
    """The ``client.wills`` key of a connection's Will Message: the client id (UTF-8),
    :data:`WILL_KEY_SEPARATOR` and the 16-byte connection id. One key per connection, so a
    will settled late never deletes a newer connection's; the partition is the client id's
    (:func:`services.common.kafka.partitioner.key_hash`)."""
    return client_id.encode("utf-8") + WILL_KEY_SEPARATOR + connection_id


def will_record(names: TopicNames, will: WillRecord) -> KafkaRecord:
    """The ``client.wills`` record of a Will Message waiting out its delay. Raises
    ``ValueError`` for a connection id that is not 16 bytes."""
    if len(will.connection_id) != 16:
        raise ValueError("connection_id must be 16 bytes")
    offset = -1 if will.session_offset is None else will.session_offset
    head = _WILL.pack(_VERSION, will.due_at_ms, offset, len(will.meta_raw))
    value = b"".join((head, will.meta_raw, will.payload))
    return KafkaRecord(names.client_wills, will_key(will.client_id, will.connection_id), value)


def will_tombstone(names: TopicNames, client_id: str, connection_id: bytes) -> KafkaRecord:
    """The tombstone that deletes a connection's waiting Will Message (published or
    settled)."""
    return KafkaRecord(names.client_wills, will_key(client_id, connection_id), None)


def _split_key(key: bytes | None, id_size: int, what: str) -> tuple[str, bytes]:
    """A ``client.wills`` or ``msg.delayed`` key: the client id and the ``id_size``-byte id
    after :data:`WILL_KEY_SEPARATOR`. Raises :class:`RecordError`."""
    if key is None:
        raise RecordError("record without a key")
    client_part, separator, ident = key.partition(WILL_KEY_SEPARATOR)
    if not separator or len(ident) != id_size:
        raise RecordError(f"{what} key is not <client id> NUL <{id_size}-byte id>")
    return client_id_of(client_part), ident


def _meta_and_payload(
    value: bytes, head_size: int, meta_len: int, what: str
) -> tuple[bytes, bytes]:
    """The ``m`` header and the payload that follow a record's fixed head of
    ``head_size`` bytes; the metadata is decoded once here, so that a parsed record can
    always be published. Raises :class:`RecordError`."""
    meta_end = head_size + meta_len
    if meta_end > len(value):
        raise RecordError(f"truncated {what} record")
    meta_raw = value[head_size:meta_end]
    decode_meta(meta_raw)
    return meta_raw, value[meta_end:]


def parse_will(key: bytes | None, value: bytes | None) -> tuple[str, bytes, WillRecord | None]:
    """Parse a ``client.wills`` record: client id, connection id and the waiting Will
    Message (None: a tombstone). Raises :class:`RecordError`."""
    client_id, connection_id = _split_key(key, 16, "client.wills")
    if value is None:
        return client_id, connection_id, None
    _check_version(value, "client.wills record")
    if len(value) < _WILL.size:
        raise RecordError("truncated client.wills record")
    _, due_at_ms, offset, meta_len = _WILL.unpack_from(value, 0)
    meta_raw, payload = _meta_and_payload(value, _WILL.size, meta_len, "client.wills")
    will = WillRecord(
        client_id, connection_id, due_at_ms, None if offset < 0 else offset, meta_raw, payload
    )
    return client_id, connection_id, will


# msg.delayed ----------------------------------------------------------------------------------

DELAYED_ID_SIZE = 24
"""Bytes of a delayed message's id: the 16-byte connection id of the connection that
published it and that connection's 8-byte sequence number of the PUBLISH."""

_DELAYED = struct.Struct(">BQI")  # version, due_at_ms, meta length


@dataclass(frozen=True, slots=True)
class DelayedRecord:
    """A message published to ``$delayed/<seconds>/<topic>`` that waits to be published
    (a ``msg.delayed`` record).

    ``client_id`` is its publisher, ``delayed_id`` (:data:`DELAYED_ID_SIZE` bytes) names it
    among the publisher's; ``due_at_ms`` is when it is to be published (Unix ms: its
    arrival plus the delay); ``meta_raw`` (an ``m`` header, its Topic Name the target
    topic, ``received_at_ms`` its arrival) and ``payload`` are the message as published.
    """

    client_id: str
    delayed_id: bytes
    due_at_ms: int
    meta_raw: bytes
    payload: bytes


def delayed_key(client_id: str, delayed_id: bytes) -> bytes:
    """The ``msg.delayed`` key of a delayed message: the publisher's client id (UTF-8),
    :data:`WILL_KEY_SEPARATOR` and its id, in the client id's partition
    (:func:`services.common.kafka.partitioner.key_hash`). Raises ``ValueError`` for an id
    that is not :data:`DELAYED_ID_SIZE` bytes."""
    if len(delayed_id) != DELAYED_ID_SIZE:
        raise ValueError(f"a delayed message's id is {DELAYED_ID_SIZE} bytes")
    return client_id.encode("utf-8") + WILL_KEY_SEPARATOR + delayed_id


def delayed_record(names: TopicNames, delayed: DelayedRecord) -> KafkaRecord:
    """The ``msg.delayed`` record of a message waiting out its delay. Raises ``ValueError``
    for an id that is not :data:`DELAYED_ID_SIZE` bytes."""
    head = _DELAYED.pack(_VERSION, delayed.due_at_ms, len(delayed.meta_raw))
    value = b"".join((head, delayed.meta_raw, delayed.payload))
    return KafkaRecord(names.msg_delayed, delayed_key(delayed.client_id, delayed.delayed_id), value)


@dataclass(frozen=True, slots=True)
class DelayedCancel:
    """An administrator's request to cancel a waiting delayed message (a ``msg.delayed``
    record under the message's own key). Only the ingest node owning the partition
    decides: it cancels the message if its publication is not under way, and either way
    writes the tombstone that says what happened (:class:`DelayedOutcome`)."""

    client_id: str
    delayed_id: bytes


class DelayedOutcome(StrEnum):
    """How a delayed message ended, as its ``msg.delayed`` tombstone's ``o`` header says:
    ``published`` (with its ``msg.all`` record, in one transaction), ``cancelled`` (never
    published), or ``gone``: the answer to a cancel request for a message that did not
    wait any more (its earlier tombstone said how it ended)."""

    PUBLISHED = "published"
    CANCELLED = "cancelled"
    GONE = "gone"


DELAYED_OUTCOME_HEADER = "o"
"""The header of a ``msg.delayed`` tombstone that holds its :class:`DelayedOutcome`."""

_DELAYED_CANCEL = bytes((_VERSION,)) + b"C"
"""The value of a cancel request: shorter than any waiting message's (13 bytes at least)."""


def delayed_cancel_record(names: TopicNames, client_id: str, delayed_id: bytes) -> KafkaRecord:
    """The ``msg.delayed`` record asking the owner of the partition to cancel
    ``client_id``'s delayed message ``delayed_id`` (:class:`DelayedCancel`). Raises
    ``ValueError`` for an id that is not :data:`DELAYED_ID_SIZE` bytes."""
    return KafkaRecord(names.msg_delayed, delayed_key(client_id, delayed_id), _DELAYED_CANCEL)


def delayed_tombstone(
    names: TopicNames, client_id: str, delayed_id: bytes, outcome: DelayedOutcome
) -> KafkaRecord:
    """The tombstone that deletes a delayed message, saying how it ended (``outcome``, in
    its ``o`` header)."""
    key = delayed_key(client_id, delayed_id)
    return KafkaRecord(
        names.msg_delayed, key, None, ((DELAYED_OUTCOME_HEADER, outcome.value.encode()),)
    )


def delayed_outcome(headers: Headers) -> DelayedOutcome | None:
    """The :class:`DelayedOutcome` a ``msg.delayed`` tombstone's headers say (None: none
    said, or one this version does not know)."""
    for name, value in headers:
        if name == DELAYED_OUTCOME_HEADER:
            try:
                return DelayedOutcome(value.decode("ascii", "replace"))
            except ValueError:
                return None
    return None


def parse_delayed(
    key: bytes | None, value: bytes | None
) -> tuple[str, bytes, DelayedRecord | DelayedCancel | None]:
    """Parse a ``msg.delayed`` record: client id, the message's id and the waiting message,
    a request to cancel it, or None (a tombstone). Raises :class:`RecordError`."""
    client_id, delayed_id = _split_key(key, DELAYED_ID_SIZE, "msg.delayed")
    if value is None:
        return client_id, delayed_id, None
    if value == _DELAYED_CANCEL:
        return client_id, delayed_id, DelayedCancel(client_id, delayed_id)
    _check_version(value, "msg.delayed record")
    if len(value) < _DELAYED.size:
        raise RecordError("truncated msg.delayed record")
    _, due_at_ms, meta_len = _DELAYED.unpack_from(value, 0)
    meta_raw, payload = _meta_and_payload(value, _DELAYED.size, meta_len, "msg.delayed")
    return client_id, delayed_id, DelayedRecord(client_id, delayed_id, due_at_ms, meta_raw, payload)


def session_expired_records(
    names: TopicNames, client_id: str, session: SessionRecord, at_ms: int
) -> list[KafkaRecord]:
    """What the store that owns ``client_id``'s ``session`` (device_persist or app_delivery)
    writes when it ends it as expired at ``at_ms`` (Unix ms): tombstones of its
    subscriptions and session records (naming the session: :func:`stale_delete`), and its
    SESSION_EXPIRED event."""
    return [
        client_subscriptions_record(names, client_id, [], session.session_id),
        client_session_record(names, client_id, None, session.session_id),
        client_event_record(names, client_id, session_expired_event(session, at_ms)),
    ]
