"""device_persist's delivery logic (services/device_persist/persister.py) on real stores.

The persister runs against real Redis and PostgreSQL; its Kafka side is its ``send``
callable (it only ever produces records), which here keeps the records it is given and
acknowledges them at once, so each test reads exactly what would reach the client's node.
The end-to-end behaviour through Kafka is in tests/e2e/test_persistent.py.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio
from aiokafka.structs import ConsumerRecord

from services.common.kafka.names import TopicNames
from services.common.kafka.partitioner import partition_of
from services.common.records import (
    HEADER_BUNDLE,
    HEADER_META,
    HEADER_ORIGIN,
    HEADER_RELEASES,
    HEADER_STORED_ORIGIN,
    HEADER_TARGETS,
    AckKind,
    AckRecord,
    EventKind,
    Origin,
    PublishMeta,
    SessionRecord,
    Target,
    decode_bundle,
    decode_event,
    decode_releases,
    decode_targets,
    encode_ack,
    encode_meta,
    encode_origin,
    encode_session,
    encode_targets,
)
from services.common.settings import Settings
from services.common.stores import open_store
from services.common.stores.base import StoreStats
from services.device_persist.persister import DevicePersister, StoreMetrics

NOW = 1_800_000_000_000
PARTITIONS = 12

#: The per-client cap of the :func:`capped` store (messages).
CAP = 3


@dataclass
class Sent:
    """A record the persister produced."""

    topic: str
    key: bytes
    value: bytes | None
    headers: dict[str, bytes]

    @property
    def target(self) -> Target:
        """The one target of a downlink record."""
        [target] = decode_targets(self.headers[HEADER_TARGETS])
        return target


@dataclass
class Harness:
    """A persister owning every partition, the records it sent, and record builders."""

    persister: DevicePersister
    names: TopicNames
    sent: list[Sent] = field(default_factory=list)
    offsets: itertools.count[int] = field(default_factory=itertools.count)

    def take(self) -> list[Sent]:
        """The records sent since the last call."""
        out, self.sent[:] = list(self.sent), []
        return out

    def session(self, client: str, node: str = "n1", **changes: object) -> SessionRecord:
        """Apply and return a connected persistent session record of ``client``."""
        fields: dict[str, object] = {
            "node_id": node,
            "connection_id": b"conn-0000000000a",
            "connected": True,
            "protocol_version": 5,
            "clean_start": False,
            "persistent": True,
            "session_expiry_interval": 3600,
            "session_id": b"session-00000001",
            "updated_at_ms": NOW,
        }
        fields.update(changes)
        record = SessionRecord(**fields)  # type: ignore[arg-type]
        self.persister.apply_session(client.encode(), encode_session(record))
        return record

    def message(self, client: str, payload: bytes, qos: int = 1) -> ConsumerRecord:
        """A ``msg.persisted`` record for ``client`` at the next offset."""
        meta = encode_meta(PublishMeta("t/x", qos, False, NOW, 5))
        return self._record(
            self.names.msg_persisted,
            client,
            payload,
            [(HEADER_META, meta), (HEADER_TARGETS, _targets(client, qos))],
        )

    def acks(self, client: str, *acks: tuple[AckKind, int], session: bytes | None = None) -> object:
        """A ``client.acks`` record."""
        value = encode_ack(AckRecord(session or b"session-00000001", list(acks)))
        return self._record(self.names.client_acks, client, value, [])

    def _record(
        self, topic: str, client: str, value: bytes, headers: list[tuple[str, bytes]]
    ) -> ConsumerRecord:
        partition = partition_of(client, PARTITIONS)
        return ConsumerRecord(
            topic, partition, next(self.offsets), NOW, 0, client.encode(), value, None, 0, 0,
            headers,
        )  # fmt: skip

    async def batch(self, *records: object) -> None:
        """Hand ``records`` to the persister as one batch and wait for what it produced."""
        acks = await self.persister.handle_batch(list(records), NOW)  # type: ignore[arg-type]
        await asyncio.gather(*acks)

    async def serve_dirty(self) -> None:
        """Serve the clients whose session changed (the background task's work, once)."""
        dirty, self.persister._dirty = self.persister._dirty, set()
        await asyncio.gather(*await self.persister.serve(dirty, NOW))


def _targets(client: str, qos: int) -> bytes:
    return encode_targets([Target(client, qos)])


@asynccontextmanager
async def _harness(
    backend: str, redis_server: str, postgres_server: str, **overrides: Any
) -> AsyncIterator[Harness]:
    """A :class:`Harness` on the ``backend`` store (``redis`` or ``postgres``), opened from
    the settings as device_persist opens it; ``overrides`` (setting name → value) last."""
    settings = Settings(
        **{
            "topic_prefix": f"t{uuid.uuid4().hex[:6]}.",
            "state_topic_partitions": PARTITIONS,
            "persisted_inflight_max": 3,
            "store_backend": backend,
            "redis_url": redis_server,
            "redis_key_prefix": f"dp-{uuid.uuid4().hex[:8]}:",
            "postgres_dsn": postgres_server,
            **overrides,
        }
    )
    store = open_store(settings)
    names = TopicNames.from_settings(settings)
    box: list[Harness] = []

    async def send(
        topic: str, key: bytes, value: bytes | None, headers: list[tuple[str, bytes]]
    ) -> Awaitable[object]:
        fields = dict(headers)
        if HEADER_BUNDLE in fields:  # a window: one Sent per message, as the node reads it
            for message in decode_bundle(fields[HEADER_BUNDLE], value or b"").messages:
                by_message = {HEADER_TARGETS: encode_targets(message.targets)}
                if message.origin is not None:  # what header a carries for one message
                    by_message[HEADER_STORED_ORIGIN] = encode_origin(message.origin)
                box[0].sent.append(Sent(topic, key, message.payload, by_message))
        else:
            box[0].sent.append(Sent(topic, key, value, fields))
        done: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    persister = DevicePersister(settings, store, send)
    persister.go_live()
    persister.assign(range(PARTITIONS))
    # A new key prefix is a store nothing was applied to: nothing to re-apply.
    state = await store.failover_state(range(PARTITIONS))
    if state is not None:
        assert await store.adopt(range(PARTITIONS), state.replication_id)
    box.append(Harness(persister, names))
    try:
        yield box[0]
    finally:
        await store.close()


@pytest_asyncio.fixture(params=["redis", "postgres"], loop_scope="function")
async def h(
    request: pytest.FixtureRequest, redis_server: str, postgres_server: str
) -> AsyncIterator[Harness]:
    async with _harness(request.param, redis_server, postgres_server) as harness:
        yield harness


@pytest_asyncio.fixture(params=["redis", "postgres"], loop_scope="function")
async def capped(
    request: pytest.FixtureRequest, redis_server: str, postgres_server: str
) -> AsyncIterator[Harness]:
    """A harness whose store keeps :data:`CAP` messages per client."""
    async with _harness(
        request.param, redis_server, postgres_server, persisted_max_messages=CAP
    ) as harness:
        yield harness


def _client() -> str:
    return f"dev-{uuid.uuid4().hex[:10]}"


#: Messages a 500 msg/s publisher leaves behind a 4 s outage (a Redis failover, a broker
#: fenced): the backlog a persistent subscriber has to catch up on.
BACKLOG = 2000


async def test_a_failover_backlog_goes_out_in_one_window_with_the_default_settings(
    redis_server: str, postgres_server: str
) -> None:
    # The backlog drains at most one window per acknowledgement round trip (three Kafka
    # hops); with a window smaller than what the publishers add meanwhile it never drains,
    # and grows until persisted_max_messages drops the oldest (issue 29's losses).
    default = Settings.model_fields["persisted_inflight_max"].default
    async with _harness(
        "redis", redis_server, postgres_server, persisted_inflight_max=default
    ) as h:
        client = _client()
        h.session(client, connected=False)
        await h.batch(*(h.message(client, b"m%d" % i) for i in range(BACKLOG)))
        h.session(client, connection_id=b"conn-0000000000f")
        await h.serve_dirty()
        sent = h.take()
    assert [s.value for s in sent] == [b"m%d" % i for i in range(BACKLOG)]


async def test_offline_messages_wait_then_flow_in_order_within_the_window(h: Harness) -> None:
    client = _client()
    h.session(client, connected=False)
    await h.batch(*(h.message(client, f"m{i}".encode()) for i in range(5)))
    assert h.take() == []  # offline: stored only
    h.session(client, node="n2", connection_id=b"conn-0000000000b")
    await h.serve_dirty()
    first = h.take()
    # In order, on the client's node, with store-assigned ids, at most 3 in flight.
    assert [s.value for s in first] == [b"m0", b"m1", b"m2"]
    assert {s.topic for s in first} == {h.names.downlink("n2")}
    assert [(s.target.packet_id, s.target.dup) for s in first] == [
        (1, False),
        (2, False),
        (3, False),
    ]
    await h.batch(h.acks(client, (AckKind.PUBACK, 1), (AckKind.PUBACK, 2)))
    assert [s.value for s in h.take()] == [b"m3", b"m4"]
    await h.batch(h.message(client, b"m5"))
    assert h.take() == []  # m2, m3 and m4 fill the window of 3: m5 waits
    await h.batch(h.acks(client, (AckKind.PUBACK, 3)))
    assert [s.value for s in h.take()] == [b"m5"]


async def test_a_new_connection_gets_in_flight_messages_again_with_dup(h: Harness) -> None:
    client = _client()
    h.session(client)
    await h.batch(h.message(client, b"one"), h.message(client, b"two", qos=2))
    assert [s.target.dup for s in h.take()] == [False, False]
    await h.batch(h.acks(client, (AckKind.PUBREC, 2)))  # two is released, one in flight
    h.session(client, node="n2", connection_id=b"conn-0000000000c")
    await h.serve_dirty()
    resent = h.take()
    publish = [s for s in resent if HEADER_RELEASES not in s.headers]
    release = [s for s in resent if HEADER_RELEASES in s.headers]
    assert [(s.value, s.target.packet_id, s.target.dup) for s in publish] == [(b"one", 1, True)]
    assert decode_releases(release[0].headers[HEADER_RELEASES]) == [(client, 2)]
    await h.batch(h.acks(client, (AckKind.PUBACK, 1), (AckKind.PUBCOMP, 2)))
    assert await h.persister.store.count(client) == 0


async def test_a_replayed_batch_stores_nothing_twice(h: Harness) -> None:
    client = _client()
    h.session(client, connected=False)
    records = [h.message(client, b"a"), h.message(client, b"b")]
    await h.batch(*records)
    await h.batch(*records)  # read again after a crash
    assert await h.persister.store.count(client) == 2


async def test_a_clean_start_drops_the_old_sessions_messages(h: Harness) -> None:
    client = _client()
    h.session(client, connected=False)
    await h.batch(h.message(client, b"old"))
    h.session(client, session_id=b"session-00000002", connection_id=b"conn-0000000000d")
    await h.serve_dirty()
    assert h.take() == []
    await h.batch(h.message(client, b"new"))
    assert [s.value for s in h.take()] == [b"new"]
    # An acknowledgement from the earlier session changes nothing.
    await h.batch(h.acks(client, (AckKind.PUBACK, 1), session=b"session-00000001"))
    assert await h.persister.store.count(client) == 1


async def test_qos0_is_forwarded_when_connected_and_dropped_when_offline(h: Harness) -> None:
    client = _client()
    h.session(client, connected=False)
    await h.batch(h.message(client, b"lost", qos=0))
    h.session(client, connection_id=b"conn-0000000000e")
    await h.serve_dirty()
    await h.batch(h.message(client, b"live", qos=0))
    [sent] = h.take()
    assert (sent.value, sent.target.packet_id, sent.target.qos) == (b"live", 0, 0)
    assert await h.persister.store.count(client) == 0


async def test_an_expired_session_is_deleted_with_its_messages(h: Harness) -> None:
    client = _client()
    h.session(client, connected=False, session_expiry_interval=10)
    await h.batch(h.message(client, b"m"))
    acks = await h.persister.expire_sessions(NOW + 9_999)
    assert acks == [] and await h.persister.store.count(client) == 1
    await asyncio.gather(*await h.persister.expire_sessions(NOW + 10_000))
    written = h.take()
    tombstones = {(s.topic, s.value) for s in written if s.topic != h.names.client_events}
    assert tombstones == {
        (h.names.client_sessions, None),
        (h.names.client_subscriptions, None),
    }
    [event] = [decode_event(s.value) for s in written if s.topic == h.names.client_events]
    assert (event.kind, event.at_ms) == (EventKind.SESSION_EXPIRED, NOW + 10_000)
    assert await h.persister.store.count(client) == 0


async def test_messages_of_unowned_clients_are_not_served(h: Harness) -> None:
    client = _client()
    h.session(client)
    h.persister.assign(p for p in range(PARTITIONS) if p != partition_of(client, PARTITIONS))
    assert await h.persister.serve([client], NOW) == []


async def test_drops_past_the_cap_are_counted_and_logged_once_per_client_and_batch(
    capped: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    full, at_cap = _client(), _client()
    for client in (full, at_cap):
        capped.session(client, connected=False)
    with caplog.at_level(logging.WARNING, logger="services.device_persist.persister"):
        await capped.batch(
            *(capped.message(full, b"a%d" % i) for i in range(10)),
            *(capped.message(at_cap, b"b%d" % i) for i in range(CAP)),  # reaches it: no drop
        )
        await capped.batch(*(capped.message(full, b"c%d" % i) for i in range(2)))
    # One line per client and batch, however many appends dropped a message.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [
        f"client {full!r}: store full ({CAP} messages), dropped its 7 oldest",
        f"client {full!r}: store full ({CAP} messages), dropped its 2 oldest",
    ]
    assert capped.persister.dropped_messages == 9
    store = capped.persister.store
    assert await store.stats(full) == StoreStats(stored=CAP, dropped=9)
    assert await store.stats(at_cap) == StoreStats(stored=CAP, dropped=0)
    # What /metrics serves: the process's total, one series without a client label.
    [counter] = [
        f
        for f in StoreMetrics(capped.persister).families()
        if f.name == "cormorant_device_store_dropped_messages"
    ]
    assert (counter.type, [(s.name, s.labels, s.value) for s in counter.samples]) == (
        "counter",
        [("cormorant_device_store_dropped_messages_total", {}, 9.0)],
    )
    # The newest CAP messages are what the client gets when it comes back.
    capped.session(full, connection_id=b"conn-0000000000f")
    await capped.serve_dirty()
    assert [s.value for s in capped.take()] == [b"a9", b"c0", b"c1"]


async def test_the_msg_all_origin_goes_with_the_stored_message(h: Harness) -> None:
    """A replay subscription's switch recognizes device_persist's live copies by it
    (docs/concepts/replay.md, "Persistent sessions"): stored with the message, sent on as
    header ``a``, never as the router's ``o``."""
    client = _client()
    h.session(client, connected=False)
    origin = encode_origin(Origin(3, 77, 0))
    stored = h.message(client, b"m")
    stored.headers.append((HEADER_ORIGIN, origin))
    await h.batch(stored)
    h.session(client, node="n2", connection_id=b"conn-0000000000b")
    await h.serve_dirty()
    [sent] = h.take()
    assert (sent.headers.get(HEADER_STORED_ORIGIN), HEADER_ORIGIN in sent.headers) == (
        origin,
        False,
    )
