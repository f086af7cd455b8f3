"""The message store of persistent DEVICE sessions, on real Redis and real PostgreSQL.

Every test taking ``backend`` or ``store`` runs once per backend. Each test gets its own
Redis key prefix and its own client ids, so tests sharing the session's servers never see
each other's data.
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from redis.asyncio.connection import AbstractConnection

from services.common.settings import Settings
from services.common.stores import (
    AckKind,
    AckRequest,
    AppendRequest,
    AppendResult,
    MessageState,
    MessageStore,
    PostgresMessageStore,
    RedisMessageStore,
    StoreStats,
    StoreUnavailable,
    WindowRequest,
    open_store,
)
from services.common.stores.base import FailoverState, StoreFailedOver
from services.common.stores.migrate import load_migrations, migrate
from services.common.stores.postgres_store import CHUNK, client_key
from services.local import redis as local_redis
from tests.waiting import wait_until

BACKENDS = ["redis", "postgres"]

#: An expiry far in the future (Unix ms, year 2100): the message stays live.
FAR = 4_102_444_800_000


def free_port() -> int:
    """A TCP port nothing listens on now (the kernel's choice, released at once)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def new_client() -> str:
    """A client id no other test uses."""
    return f"client-{uuid.uuid4().hex}"


@dataclass
class Backend:
    """One backend of this test: its ``name`` (redis, postgres), server ``url``, and the
    stores made on it, which share one fresh Redis key prefix."""

    name: str
    url: str
    prefix: str = field(default_factory=lambda: f"test-{uuid.uuid4().hex[:12]}:")
    made: list[MessageStore] = field(default_factory=list)

    def make(self, max_messages: int = 100, timeout: float = 5.0) -> MessageStore:
        """A new store on this backend (closed by the fixture at the end of the test)."""
        store: MessageStore
        if self.name == "redis":
            store = RedisMessageStore(
                self.url, key_prefix=self.prefix, max_messages=max_messages, timeout=timeout
            )
        else:
            store = PostgresMessageStore(self.url, max_messages=max_messages, timeout=timeout)
        self.made.append(store)
        return store


@pytest_asyncio.fixture(loop_scope="function", params=BACKENDS)
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    """This test's backend on the session's real server; closes every store made on it."""
    name: str = request.param
    value = Backend(name, request.getfixturevalue(f"{name}_server"))
    yield value
    for store in value.made:
        await store.close()


@pytest_asyncio.fixture(loop_scope="function")
async def store(backend: Backend) -> MessageStore:
    """A store with a cap of 100 messages per client on this test's backend."""
    return backend.make()


async def append_many(
    store: MessageStore, client: str, count: int, *, qos: int = 1, first_offset: int = 0
) -> list[AppendResult]:
    """Append ``count`` messages one after the other; data = b"m<offset>"."""
    results = []
    for offset in range(first_offset, first_offset + count):
        results.append(await store.append(client, offset, qos, FAR, b"m%d" % offset))
    return results


# --- append and window -----------------------------------------------------------------------


async def test_window_returns_the_oldest_messages_in_append_order(store: MessageStore) -> None:
    client = new_client()
    results = await append_many(store, client, 5, qos=2)
    assert results == [AppendResult(pid, 0) for pid in (1, 2, 3, 4, 5)]

    window = await store.window(client, 3, now_ms=0)

    assert [m.data for m in window] == [b"m0", b"m1", b"m2"]
    assert [m.packet_id for m in window] == [1, 2, 3]
    assert window[0].seq < window[1].seq < window[2].seq
    assert {(m.client_id, m.qos, m.state, m.expires_at_ms) for m in window} == {
        (client, 2, MessageState.QUEUED, FAR)
    }
    assert [m.data for m in await store.window(client, 100, now_ms=0)] == [
        b"m0", b"m1", b"m2", b"m3", b"m4"
    ]  # fmt: skip
    assert await store.window(client, 0, now_ms=0) == []
    assert await store.window(new_client(), 10, now_ms=0) == []


async def test_data_is_kept_byte_for_byte(store: MessageStore) -> None:
    client = new_client()
    data = bytes(range(256)) * 4096  # 1 MiB, every byte value, NULs included
    await store.append(client, 0, 1, FAR, data)
    await store.append(client, 1, 1, FAR, b"")
    assert [m.data for m in await store.window(client, 10, now_ms=0)] == [data, b""]


async def test_clients_are_kept_apart_whatever_their_ids(store: MessageStore) -> None:
    tag = uuid.uuid4().hex
    # Braces and percent signs would make naive Redis keys collide or split hash tags; a
    # 65,535-byte id is longer than any PostgreSQL index entry.
    ids = [f"{tag}a}}b", f"{tag}a%7Db", f"{{{tag}}}", f"{tag}a", f"{tag}é 🚀 :q", tag * 2048]
    ids.append("x" * (65535 - len(tag)) + tag)
    for i, client in enumerate(ids):
        await store.append(client, 0, 1, FAR, client.encode())
        await store.append(client, 1, 1, FAR, str(i).encode())
    for i, client in enumerate(ids):
        window = await store.window(client, 10, now_ms=0)
        assert [m.data for m in window] == [client.encode(), str(i).encode()]
        assert {m.client_id for m in window} == {client}
        assert await store.count(client) == 2


async def test_invalid_arguments_raise_value_error(store: MessageStore) -> None:
    client = new_client()
    with pytest.raises(ValueError, match="qos"):
        await store.append(client, 0, 0, FAR, b"")
    with pytest.raises(ValueError, match="source_offset"):
        await store.append(client, -1, 1, FAR, b"")
    with pytest.raises(ValueError, match="expires_at_ms"):
        await store.append(client, 0, 1, 2**53, b"")
    with pytest.raises(ValueError, match="limit"):
        await store.window(client, -1, now_ms=0)
    assert await store.count(client) == 0


# --- Packet Identifiers ----------------------------------------------------------------------


async def set_last_packet_id(backend: Backend, client: str, last: int) -> None:
    """Put ``client``'s Packet Identifier counter at ``last``, as ~65,000 appends would.

    Reaching the wrap-around through the API takes 65,535 appends, too slow for a test on
    PostgreSQL; this writes that one counter directly, in each backend's documented layout.
    """
    if backend.name == "redis":
        counters = RedisMessageStore(backend.url, key_prefix=backend.prefix)._keys(client)[3]
        async with aioredis.Redis.from_url(backend.url) as raw:
            assert await raw.hset(counters, "pid", last) == 0  # the field existed
    else:
        async with await psycopg.AsyncConnection.connect(backend.url, autocommit=True) as conn:
            cursor = await conn.execute(
                "UPDATE persisted_clients SET last_packet_id = %s WHERE client_key = %s",
                (last, client_key(client)),
            )
            assert cursor.rowcount == 1


async def test_packet_ids_wrap_past_65535_and_skip_ids_in_use(backend: Backend) -> None:
    store = backend.make()
    client = new_client()
    await append_many(store, client, 3)  # packet ids 1, 2, 3
    assert await store.acknowledge(client, 2, AckKind.PUBACK)  # 2 is free again
    await set_last_packet_id(backend, client, 65533)

    results = await append_many(store, client, 4, first_offset=3)

    # 65534, 65535, then wrap: 1 is in use (skipped), 2 is free, 3 is in use, 4.
    assert [r.packet_id for r in results] == [65534, 65535, 2, 4]
    window = await store.window(client, 10, now_ms=0)
    assert [m.packet_id for m in window] == [1, 3, 65534, 65535, 2, 4]
    assert [m.data for m in window] == [b"m0", b"m2", b"m3", b"m4", b"m5", b"m6"]


def test_a_cap_of_65535_or_more_is_refused() -> None:
    for cap in (0, 65535, 100_000):
        with pytest.raises(ValueError, match="max_messages"):
            RedisMessageStore("redis://127.0.0.1:1/0", max_messages=cap)
        with pytest.raises(ValueError, match="max_messages"):
            PostgresMessageStore("postgresql://u@127.0.0.1:1/db", max_messages=cap)
    with pytest.raises(ValueError, match="braces"):
        RedisMessageStore("redis://127.0.0.1:1/0", key_prefix="a{b}:")


# --- idempotence -----------------------------------------------------------------------------


async def test_append_is_idempotent_by_source_offset(store: MessageStore) -> None:
    client = new_client()
    assert (await store.append(client, 10, 1, FAR, b"a")).packet_id == 1
    assert await store.append(client, 10, 1, FAR, b"a") == AppendResult(None, 0)
    assert await store.append(client, 3, 1, FAR, b"old") == AppendResult(None, 0)
    assert (await store.append(client, 11, 1, FAR, b"b")).packet_id == 2
    assert [m.data for m in await store.window(client, 10, now_ms=0)] == [b"a", b"b"]

    # The offset is remembered after the messages are gone (acknowledged) ...
    await store.acknowledge(client, 1, AckKind.PUBACK)
    await store.acknowledge(client, 2, AckKind.PUBACK)
    assert await store.append(client, 11, 1, FAR, b"b") == AppendResult(None, 0)
    # ... and forgotten by clear, with every other counter.
    await store.clear(client)
    assert await store.append(client, 10, 1, FAR, b"again") == AppendResult(1, 0)


# --- the cap ---------------------------------------------------------------------------------


async def test_the_cap_drops_the_oldest_messages_and_counts_them(backend: Backend) -> None:
    store = backend.make(max_messages=3)
    client = new_client()
    results = await append_many(store, client, 5)

    assert [r.dropped for r in results] == [0, 0, 0, 1, 1]
    assert [m.data for m in await store.window(client, 10, now_ms=0)] == [b"m2", b"m3", b"m4"]
    assert await store.stats(client) == StoreStats(stored=3, dropped=2)

    # A process with a lower cap trims the excess in one append.
    smaller = backend.make(max_messages=1)
    assert await smaller.append(client, 5, 1, FAR, b"m5") == AppendResult(6, 3)
    assert [m.data for m in await store.window(client, 10, now_ms=0)] == [b"m5"]
    assert await store.stats(client) == StoreStats(stored=1, dropped=5)


# --- expiry ----------------------------------------------------------------------------------


async def test_window_deletes_expired_queued_messages(store: MessageStore) -> None:
    # Expiry times in the real future: Redis drops a client's keys at its latest expiry.
    t = int(time.time() * 1000) + 3_600_000
    client = new_client()
    for offset, expires in enumerate([t + 1000, t + 5000, t + 2000, t + 3000, t + 9000]):
        await store.append(client, offset, 1, expires, b"e%d" % (expires - t))

    # Expired ones do not use up the limit; expires_at_ms == now is already dead.
    window = await store.window(client, 2, now_ms=t + 3000)

    assert [m.data for m in window] == [b"e5000", b"e9000"]
    assert await store.count(client) == 2
    assert [m.data for m in await store.window(client, 10, now_ms=t + 9000)] == []
    assert await store.stats(client) == StoreStats(stored=0, dropped=0)


async def test_window_after_seq_counts_what_was_sent_without_returning_it(
    store: MessageStore,
) -> None:
    client = new_client()
    await append_many(store, client, 6)
    seqs = [m.seq for m in await store.window(client, 10, now_ms=0)]
    # The first two count toward the limit of 4: two more come back, not the first two.
    window = await store.window(client, 4, now_ms=0, after_seq=seqs[1])
    assert [m.data for m in window] == [b"m2", b"m3"]
    assert await store.window(client, 2, now_ms=0, after_seq=seqs[1]) == []
    assert [m.data for m in await store.window(client, 10, 0, after_seq=seqs[5])] == []


async def test_batched_calls_do_what_the_single_ones_do(store: MessageStore) -> None:
    a, b = new_client(), new_client()
    results = await store.append_many(
        [
            AppendRequest(a, 0, 1, FAR, b"a0"),
            AppendRequest(b, 0, 2, FAR, b"b0"),
            AppendRequest(a, 1, 1, FAR, b"a1"),
            AppendRequest(a, 1, 1, FAR, b"a1 again"),  # same source offset: ignored
        ]
    )
    assert results == [
        AppendResult(1, 0), AppendResult(1, 0), AppendResult(2, 0), AppendResult(None, 0)
    ]  # fmt: skip
    windows = await store.windows([WindowRequest(a, 10), WindowRequest(b, 10)], now_ms=0)
    assert [[m.data for m in w] for w in windows] == [[b"a0", b"a1"], [b"b0"]]
    await store.mark_sent_many([(a, [1]), (b, [1])])
    acked = await store.acknowledge_many(
        [
            AckRequest(a, 1, AckKind.PUBACK),
            AckRequest(b, 1, AckKind.PUBREC),
            AckRequest(b, 1, AckKind.PUBACK),  # wrong kind for QoS 2
        ]
    )
    assert acked == [True, True, False]
    windows = await store.windows([WindowRequest(a, 10), WindowRequest(b, 10)], now_ms=0)
    assert [[(m.data, m.state) for m in w] for w in windows] == [
        [(b"a1", MessageState.QUEUED)],
        [(b"b0", MessageState.RELEASED)],
    ]
    assert await store.append_many([]) == [] and await store.acknowledge_many([]) == []


async def test_a_batch_appends_acknowledges_and_starts_the_windows_in_one_call(
    store: MessageStore,
) -> None:
    a, b = new_client(), new_client()
    await store.append_many([AppendRequest(a, 0, 1, FAR, b"a0")])
    first = await store.apply_batch(
        [AppendRequest(a, 1, 1, FAR, b"a1"), AppendRequest(b, 0, 2, FAR, b"b0")],
        None,
        "",
        [],
        [WindowRequest(a, 10), WindowRequest(b, 0)],
        now_ms=0,
    )
    assert first.appended == [AppendResult(2, 0), AppendResult(1, 0)]
    # The windows give the state before the call started the deliveries: first sends.
    assert [[(m.data, m.state) for m in w] for w in first.windows] == [
        [(b"a0", MessageState.QUEUED), (b"a1", MessageState.QUEUED)],
        [],
    ]
    seq = first.windows[0][-1].seq
    second = await store.apply_batch(
        [],
        None,
        "",
        [AckRequest(a, 1, AckKind.PUBACK)],
        [WindowRequest(a, 10, after_seq=seq), WindowRequest(b, 10)],
        now_ms=0,
    )
    assert second.appended == []
    assert [[m.data for m in w] for w in second.windows] == [[], [b"b0"]]
    # Started means SENT: a resend (a new connection's window) carries DUP=1.
    windows = await store.windows([WindowRequest(a, 10), WindowRequest(b, 10)], now_ms=0)
    assert [[(m.data, m.state) for m in w] for w in windows] == [
        [(b"a1", MessageState.SENT)],
        [(b"b0", MessageState.SENT)],
    ]


async def test_a_batch_is_one_round_trip_to_redis(
    redis_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # device_persist's batch was four (append, acknowledge, window, mark sent).
    store = RedisMessageStore(redis_server, key_prefix=f"test-{uuid.uuid4().hex[:12]}:")
    a, b = new_client(), new_client()
    try:
        await store.append_many([AppendRequest(a, 0, 1, FAR, b"a0")])  # scripts loaded
        writes = 0
        original = AbstractConnection.send_packed_command

        async def counted(conn: AbstractConnection, *args: object, **kwargs: object) -> None:
            nonlocal writes
            writes += 1
            await original(conn, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(AbstractConnection, "send_packed_command", counted)
        done = await store.apply_batch(
            [AppendRequest(a, 1, 1, FAR, b"a1"), AppendRequest(b, 0, 1, FAR, b"b0")],
            None,
            "",
            [AckRequest(a, 1, AckKind.PUBACK)],
            [WindowRequest(a, 10), WindowRequest(b, 10)],
            now_ms=0,
        )
        assert writes == 1
        assert [[m.data for m in w] for w in done.windows] == [[b"a1"], [b"b0"]]
    finally:
        await store.close()


async def test_a_large_batch_of_appends_is_stored_whole_and_in_order(backend: Backend) -> None:
    # More than one PostgreSQL transaction's worth (CHUNK).
    client, count = new_client(), 2 * CHUNK + 1
    store = backend.make(max_messages=count)
    requests = [AppendRequest(client, i, 1, FAR, b"m%d" % i) for i in range(count)]
    results = await store.append_many(requests)
    assert [r.packet_id for r in results] == list(range(1, count + 1))
    window = await store.window(client, count, now_ms=0)
    assert [m.data for m in window] == [r.data for r in requests]
    assert [r.packet_id for r in await store.append_many(requests)] == [None] * count


async def test_expiry_spares_messages_whose_delivery_started(store: MessageStore) -> None:
    t = int(time.time() * 1000) + 3_600_000
    client = new_client()
    await store.append(client, 0, 1, t, b"sent")
    await store.append(client, 1, 2, t, b"released")
    await store.append(client, 2, 1, t, b"queued")
    await store.mark_sent(client, [1, 2])
    assert await store.acknowledge(client, 2, AckKind.PUBREC)

    window = await store.window(client, 10, now_ms=t + 1000)

    # MQTT 5.0 3.3.2.3.3: only a copy whose onward delivery has not started is deleted.
    assert [(m.data, m.state) for m in window] == [
        (b"sent", MessageState.SENT),
        (b"released", MessageState.RELEASED),
    ]


@pytest.mark.parametrize("backend", ["redis"], indirect=True)
async def test_redis_keys_expire_with_the_latest_message(backend: Backend) -> None:
    # Key TTLs are Redis's own; PostgreSQL rows stay until window, acknowledge or clear.
    store = backend.make()
    client = new_client()
    t = int(time.time() * 1000)
    await store.append(client, 0, 1, t + 600_000, b"later")
    await store.append(client, 1, 1, t + 300_000, b"sooner")
    async with aioredis.Redis.from_url(backend.url) as raw:
        keys = RedisMessageStore(backend.url, key_prefix=backend.prefix)._keys(client)
        assert [await raw.pexpiretime(key) for key in keys] == [t + 600_000] * 4
    # A message already dead on arrival takes the client's keys with it at once.
    other = new_client()
    await store.append(other, 0, 1, t - 1, b"dead")
    assert await store.stats(other) == StoreStats(stored=0, dropped=0)


# --- delivery state machine ------------------------------------------------------------------


async def test_qos1_message_is_deleted_by_puback_only(store: MessageStore) -> None:
    client = new_client()
    pid = (await store.append(client, 0, 1, FAR, b"one")).packet_id
    assert pid is not None
    await store.mark_sent(client, [pid])
    assert [m.state for m in await store.window(client, 10, now_ms=0)] == [MessageState.SENT]

    assert not await store.acknowledge(client, pid, AckKind.PUBREC)
    assert not await store.acknowledge(client, pid, AckKind.PUBCOMP)
    assert [m.state for m in await store.window(client, 10, now_ms=0)] == [MessageState.SENT]
    assert await store.acknowledge(client, pid, AckKind.PUBACK)
    assert not await store.acknowledge(client, pid, AckKind.PUBACK)
    assert await store.window(client, 10, now_ms=0) == []
    assert await store.count(client) == 0


async def test_qos2_message_is_released_by_pubrec_and_deleted_by_pubcomp(
    store: MessageStore,
) -> None:
    client = new_client()
    pid = (await store.append(client, 0, 2, FAR, b"two")).packet_id
    assert pid is not None
    await store.mark_sent(client, [pid])

    assert not await store.acknowledge(client, pid, AckKind.PUBACK)
    assert not await store.acknowledge(client, pid, AckKind.PUBCOMP)  # not released yet
    assert await store.acknowledge(client, pid, AckKind.PUBREC)
    assert [m.state for m in await store.window(client, 10, now_ms=0)] == [MessageState.RELEASED]
    assert not await store.acknowledge(client, pid, AckKind.PUBREC)  # already released
    await store.mark_sent(client, [pid])  # leaves RELEASED alone
    assert [m.state for m in await store.window(client, 10, now_ms=0)] == [MessageState.RELEASED]
    assert not await store.acknowledge(client, pid, AckKind.PUBACK)
    assert await store.acknowledge(client, pid, AckKind.PUBCOMP)
    assert not await store.acknowledge(client, pid, AckKind.PUBCOMP)
    assert await store.count(client) == 0


async def test_mark_sent_changes_only_queued_messages_it_names(store: MessageStore) -> None:
    client = new_client()
    await append_many(store, client, 4, qos=2)  # packet ids 1..4
    await store.mark_sent(client, [2, 3, 999, 65535])
    await store.mark_sent(client, [])
    await store.mark_sent(new_client(), [1])

    states = [m.state for m in await store.window(client, 10, now_ms=0)]

    queued, sent = MessageState.QUEUED, MessageState.SENT
    assert states == [queued, sent, sent, queued]


async def test_acknowledging_a_message_never_marked_sent_is_accepted(store: MessageStore) -> None:
    # It may have been sent by a process that stopped before recording mark_sent.
    client = new_client()
    await store.append(client, 0, 1, FAR, b"q1")
    await store.append(client, 1, 2, FAR, b"q2")
    assert await store.acknowledge(client, 1, AckKind.PUBACK)
    assert await store.acknowledge(client, 2, AckKind.PUBREC)
    assert not await store.acknowledge(client, 3, AckKind.PUBACK)
    assert not await store.acknowledge(new_client(), 1, AckKind.PUBACK)
    assert [m.state for m in await store.window(client, 10, now_ms=0)] == [MessageState.RELEASED]


# --- clear -----------------------------------------------------------------------------------


async def test_clear_deletes_everything_about_the_client(backend: Backend) -> None:
    store = backend.make(max_messages=2)
    client, other = new_client(), new_client()
    await append_many(store, client, 3)
    await append_many(store, other, 1)
    assert await store.stats(client) == StoreStats(stored=2, dropped=1)

    assert await store.clear(client) == 2

    assert await store.stats(client) == StoreStats(stored=0, dropped=0)
    assert await store.window(client, 10, now_ms=0) == []
    assert await store.clear(client) == 0
    assert await store.count(other) == 1
    # Counters start again: seq and Packet Identifier 1.
    assert await store.append(client, 0, 1, FAR, b"fresh") == AppendResult(1, 0)
    assert [m.seq for m in await store.window(client, 10, now_ms=0)] == [1]


# --- concurrency -----------------------------------------------------------------------------


async def test_concurrent_appends_and_acks_on_one_client(backend: Backend) -> None:
    store = backend.make(max_messages=1000)
    client = new_client()
    first = 200

    async def append(offset: int) -> tuple[int, int | None]:
        return offset, (await store.append(client, offset, 1, FAR, b"%d" % offset)).packet_id

    phase1 = await asyncio.gather(*(append(offset) for offset in range(first)))
    accepted = {offset: pid for offset, pid in phase1 if pid is not None}
    # Concurrent calls may reach the server out of order; an append whose offset is below
    # one already stored is a duplicate by definition. The highest one always gets in.
    assert first - 1 in accepted

    to_ack = sorted(accepted.values())[::2]
    # Each identifier acknowledged twice, interleaved with 200 more appends.
    jobs = [store.acknowledge(client, pid, AckKind.PUBACK) for pid in to_ack * 2]
    appends = [append(offset) for offset in range(first, 2 * first)]
    outcomes = await asyncio.gather(*jobs, *appends)
    acks, phase2 = outcomes[: len(jobs)], outcomes[len(jobs) :]
    accepted.update({offset: pid for offset, pid in phase2 if pid is not None})

    # Every acknowledged identifier was deleted exactly once.
    assert sum(1 for ok in acks if ok) == len(to_ack)
    assert all(acks[i] != acks[i + len(to_ack)] for i in range(len(to_ack)))
    # Identifiers were never handed out twice.
    assert len(set(accepted.values())) == len(accepted)
    # Nothing lost: what is stored is exactly what was accepted and not acknowledged, in
    # source-offset order, with strictly increasing seqs.
    window = await store.window(client, 10_000, now_ms=0)
    acked = set(to_ack)
    expected = sorted(offset for offset, pid in accepted.items() if pid not in acked)
    assert [int(m.data) for m in window] == expected
    assert [m.packet_id for m in window] == [accepted[offset] for offset in expected]
    assert all(a.seq < b.seq for a, b in itertools.pairwise(window))
    assert await store.count(client) == len(expected)


# --- failures --------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
async def test_an_unreachable_server_raises_store_unavailable(backend: str) -> None:
    port = free_port()
    store: MessageStore
    if backend == "redis":
        store = RedisMessageStore(f"redis://127.0.0.1:{port}/0", timeout=1.0)
        name = "Redis"
    else:
        store = PostgresMessageStore(
            f"postgresql://cormorant:secret@127.0.0.1:{port}/cormorant", timeout=1.0
        )
        name = "PostgreSQL"
    client = new_client()
    calls = [
        lambda: store.append(client, 0, 1, FAR, b"x"),
        lambda: store.window(client, 10, now_ms=0),
        lambda: store.mark_sent(client, [1]),
        lambda: store.acknowledge(client, 1, AckKind.PUBACK),
        lambda: store.clear(client),
        lambda: store.count(client),
        lambda: store.stats(client),
    ]
    try:
        for call in calls:
            with pytest.raises(StoreUnavailable) as caught:
                await call()
            message = str(caught.value)
            assert name in message and f"127.0.0.1:{port}" in message, message
            assert "secret" not in message
    finally:
        await store.close()


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
async def test_a_call_that_times_out_changes_nothing(backend: Backend) -> None:
    # Another session holds the client's row lock for longer than the store's timeout.
    store = backend.make(timeout=0.5)
    client = new_client()
    await store.append(client, 0, 1, FAR, b"first")
    async with await psycopg.AsyncConnection.connect(backend.url) as blocker:
        await blocker.execute(
            "SELECT 1 FROM persisted_clients WHERE client_key = %s FOR UPDATE",
            (client_key(client),),
        )
        with pytest.raises(StoreUnavailable, match=r"PostgreSQL.*within 0\.5 s"):
            await store.append(client, 1, 1, FAR, b"second")
        with pytest.raises(StoreUnavailable):
            await store.acknowledge(client, 1, AckKind.PUBACK)
        await blocker.rollback()

    assert [m.data for m in await store.window(client, 10, now_ms=0)] == [b"first"]
    assert await store.append(client, 1, 1, FAR, b"second") == AppendResult(2, 0)


# --- factory ---------------------------------------------------------------------------------


async def test_open_store_builds_the_configured_backend() -> None:
    redis_store = open_store(Settings(store_backend="redis", persisted_max_messages=5))
    postgres_store = open_store(Settings(store_backend="postgres"))
    try:
        assert isinstance(redis_store, RedisMessageStore)
        assert isinstance(postgres_store, PostgresMessageStore)
    finally:
        await redis_store.close()
        await postgres_store.close()


# --- Redis durability ------------------------------------------------------------------------


class PrivateRedis:
    """A redis-server of one test's own, in ``directory`` on a free port, whose append-only
    file is fsync'd on every write (``--appendfsync always``)."""

    def __init__(self, directory: Path) -> None:
        binary = shutil.which("redis-server")
        assert binary is not None, "redis-server is not installed"
        self.binary = binary
        self.directory = directory
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Its URL, database 0."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start it on its port and directory and wait until it answers PING."""
        argv = [
            self.binary,
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", str(self.directory),
            "--appendonly", "yes",
            "--appendfsync", "always",
            "--save", "",  # no RDB snapshots: the append-only file alone carries the data
            "--daemonize", "no",
            "--logfile", str(self.directory / "redis.log"),
        ]  # fmt: skip
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
        wait_until(lambda: local_redis.ping(self.port), f"redis on {self.port}", 30.0)

    def kill(self) -> None:
        """SIGKILL it (no shutdown, no last save) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A :class:`PrivateRedis` in ``tmp_path``, not started; killed at the end."""
    server = PrivateRedis(tmp_path)
    yield server
    server.kill()


async def test_redis_data_survives_a_kill_thanks_to_the_append_only_file(
    private_redis: PrivateRedis,
) -> None:
    private_redis.start()
    store = RedisMessageStore(private_redis.url, max_messages=10)
    client = new_client()
    try:
        await append_many(store, client, 3, qos=2)
        await store.mark_sent(client, [1])
        assert await store.acknowledge(client, 2, AckKind.PUBREC)

        # In a thread, so the event loop keeps running as it would in a service, and sees
        # the pooled connection closed.
        await asyncio.to_thread(private_redis.kill)
        await asyncio.to_thread(private_redis.start)

        # The same store object: redis-py replaces its dead pooled connection.
        window = await store.window(client, 10, now_ms=0)
        assert [(m.packet_id, m.state, m.data) for m in window] == [
            (1, MessageState.SENT, b"m0"),
            (2, MessageState.RELEASED, b"m1"),
            (3, MessageState.QUEUED, b"m2"),
        ]
        assert await store.append(client, 2, 2, FAR, b"dup") == AppendResult(None, 0)
        assert await store.append(client, 3, 2, FAR, b"m3") == AppendResult(4, 0)
    finally:
        await store.close()


# --- PostgreSQL schema migrations ------------------------------------------------------------


async def test_two_processes_migrating_at_once_apply_each_file_once(postgres_server: str) -> None:
    params = conninfo_to_dict(postgres_server)
    admin = make_conninfo(postgres_server, user="postgres", dbname="postgres")
    database = f"migrate_{uuid.uuid4().hex[:12]}"
    async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as conn:
        await conn.execute(f'CREATE DATABASE "{database}" OWNER "{params["user"]}"'.encode())
    try:
        fresh = make_conninfo(postgres_server, dbname=database)
        first = await psycopg.AsyncConnection.connect(fresh)
        second = await psycopg.AsyncConnection.connect(fresh)
        async with first, second:
            applied = await asyncio.gather(migrate(first), migrate(second))
            again = await migrate(first)
            cursor = await first.execute("SELECT version FROM schema_migrations ORDER BY 1")
            recorded = [row[0] for row in await cursor.fetchall()]
        versions = [m.version for m in load_migrations()]
        assert versions and versions[0] == 1
        assert sorted(applied, key=len) == [[], versions]
        assert again == []
        assert recorded == versions
    finally:
        async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as conn:
            await conn.execute(f'DROP DATABASE "{database}" WITH (FORCE)'.encode())


async def test_redis_appends_of_a_partition_applied_on_another_primary_are_refused(
    redis_server: str,
) -> None:
    """The failover guard (device_persist re-applies from Kafka what a failover dropped):
    an append of a partition whose epoch is not the primary's replication id writes
    nothing and names the id; re-applied under that id it goes in, records already there
    are not stored twice, how far the partition is applied is kept, and once adopted the
    partition's appends are accepted again."""
    store = RedisMessageStore(redis_server, key_prefix=f"test-{uuid.uuid4().hex[:12]}:")
    client = new_client()
    try:
        first = AppendRequest(client, 7, 1, FAR, b"m7", source_partition=3)
        with pytest.raises(StoreFailedOver) as refused:
            await store.append_many([first], {3: 8})
        assert await store.count(client) == 0  # nothing written
        replication_id = refused.value.replication_id
        state = await store.failover_state([3])
        assert state == FailoverState(replication_id, {}, frozenset())
        replayed = [first, AppendRequest(client, 8, 1, FAR, b"m8", source_partition=3)]
        results = await store.append_many(replayed, {3: 9}, replaying=replication_id)
        assert [r.packet_id for r in results] == [1, 2]
        again = await store.append_many(replayed, {3: 9}, replaying=replication_id)
        assert [r.packet_id for r in again] == [None, None]  # keyed by offset: not twice
        with pytest.raises(StoreFailedOver):  # not adopted yet
            await store.append_many([], {3: 9})
        assert await store.adopt([3], replication_id)
        assert not await store.adopt([3], "another primary's id")
        assert await store.failover_state([3, 4]) == FailoverState(
            replication_id, {3: 9}, frozenset({3})
        )
        later = AppendRequest(client, 9, 1, FAR, b"m9", source_partition=3)
        assert [r.packet_id for r in await store.append_many([later], {3: 10})] == [3]
        window = await store.window(client, 10, 0)
        assert [m.data for m in window] == [b"m7", b"m8", b"m9"]
    finally:
        await store.close()


async def test_redis_store_loads_its_scripts_again_when_the_server_lost_them(
    redis_server: str,
) -> None:
    """Scripts go to Redis as bare EVALSHA (no SCRIPT EXISTS round trip first): a server
    that lost them (restarted, failed over to a replica, SCRIPT FLUSH) answers NOSCRIPT, and
    the store loads them and runs the calls again, losing and doubling nothing."""
    store = RedisMessageStore(redis_server, key_prefix=f"test-{uuid.uuid4().hex[:12]}:")
    admin = aioredis.Redis.from_url(redis_server)
    client = new_client()
    try:
        await store.append_many([AppendRequest(client, 0, 1, FAR, b"m0")])
        await admin.script_flush()
        results = await store.append_many(
            [AppendRequest(client, 0, 1, FAR, b"m0"), AppendRequest(client, 1, 1, FAR, b"m1")]
        )
        assert [r.packet_id for r in results] == [None, 2]  # offset 0 stored once
        await admin.script_flush()
        assert await store.acknowledge_many([AckRequest(client, 1, AckKind.PUBACK)]) == [True]
        await admin.script_flush()
        [window] = await store.windows([WindowRequest(client, 10)], now_ms=0)
        assert [(m.packet_id, m.data) for m in window] == [(2, b"m1")]
    finally:
        await admin.aclose()
        await store.close()
