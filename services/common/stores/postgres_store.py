"""The message store on PostgreSQL (the alternative backend): psycopg 3 with a pool.

Schema (``migrations/0001_message_store.sql``, applied on first use by :mod:`.migrate`):

- ``persisted_clients``: one row per client, found by ``client_key`` = SHA-256 of the UTF-8
  client id, with its counters (last seq, last Packet Identifier, highest source offset,
  stored and dropped counts);
- ``persisted_messages``: one row per message, primary key ``(client_ref, seq)`` (the queue
  order), unique ``(client_ref, packet_id)`` (identifier lookups).

Every operation is one transaction (READ COMMITTED). One that changes a client first locks
the client's row with ``SELECT ... FOR UPDATE``: changes to one client are serialised, and
each statement after the lock sees everything committed before it. ``window`` reads without
the lock and takes it only to delete expired messages.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import psycopg

from services.common.stores.base import (
    MAX_PACKET_ID,
    AckKind,
    AckRequest,
    AppendRequest,
    AppendResult,
    MessageState,
    MessageStore,
    StoredMessage,
    StoreError,
    StoreStats,
    check_append,
    check_max_messages,
)
from services.common.stores.postgres_pool import Connection, MigratedPool, PostgresPassword

T = TypeVar("T")
R = TypeVar("R")

#: Appends or acknowledgements per transaction in the batched calls (``append_many``,
#: ``acknowledge_many``): few enough that a chunk commits well within the store's timeout
#: on a busy server.
CHUNK = 100

#: Packet Identifiers tested per query when looking for a free one: after a wrap-around a
#: few may still be in use, rarely more than this.
_PACKET_ID_BATCH = 64

_LOCK = """
SELECT id, last_seq, last_packet_id, source_offset, stored
  FROM persisted_clients WHERE client_key = %s FOR UPDATE
"""

_CREATE = """
INSERT INTO persisted_clients (client_key, client_id) VALUES (%s, %s)
    ON CONFLICT (client_key) DO NOTHING
"""

_DROP_OLDEST = """
DELETE FROM persisted_messages
 WHERE client_ref = %(ref)s
   AND seq IN (SELECT seq FROM persisted_messages
                WHERE client_ref = %(ref)s ORDER BY seq LIMIT %(n)s)
"""

_INSERT = """
WITH message AS (
    INSERT INTO persisted_messages
        (client_ref, seq, packet_id, qos, state, expires_at_ms, data)
    VALUES (%(ref)s, %(seq)s, %(pid)s, %(qos)s, 0, %(expires)s, %(data)s)
)
UPDATE persisted_clients
   SET last_seq = %(seq)s, last_packet_id = %(pid)s, source_offset = %(offset)s,
       stored = %(stored)s, dropped = dropped + %(dropped)s
 WHERE id = %(ref)s
"""

_SCAN = """
SELECT seq, packet_id, qos, state, expires_at_ms, data FROM persisted_messages
 WHERE client_ref = %s AND seq > %s ORDER BY seq LIMIT %s
"""

_COUNT_UP_TO = """
SELECT count(*) FROM persisted_messages WHERE client_ref = %s AND seq <= %s
"""

_DELETE_EXPIRED = """
DELETE FROM persisted_messages
 WHERE client_ref = %s AND seq = ANY(%s) AND state = 0 AND expires_at_ms <= %s
"""

# PUBACK and PUBCOMP delete the message and lower the stored count in one statement;
# PUBREC changes its state. One row changed = the acknowledgement applied.
_PUBACK = """
WITH gone AS (
    DELETE FROM persisted_messages
     WHERE client_ref = %(ref)s AND packet_id = %(pid)s AND qos = 1
     RETURNING 1
)
UPDATE persisted_clients SET stored = stored - 1
 WHERE id = %(ref)s AND EXISTS (SELECT FROM gone)
"""
_PUBCOMP = """
WITH gone AS (
    DELETE FROM persisted_messages
     WHERE client_ref = %(ref)s AND packet_id = %(pid)s AND qos = 2 AND state = 2
     RETURNING 1
)
UPDATE persisted_clients SET stored = stored - 1
 WHERE id = %(ref)s AND EXISTS (SELECT FROM gone)
"""
_PUBREC = """
UPDATE persisted_messages SET state = 2
 WHERE client_ref = %(ref)s AND packet_id = %(pid)s AND qos = 2 AND state <> 2
"""


def client_key(client_id: str) -> bytes:
    """The 32-byte key of ``client_id``'s row: SHA-256 of its UTF-8 encoding."""
    return hashlib.sha256(client_id.encode("utf-8")).digest()


class PostgresMessageStore(MessageStore):
    """:class:`MessageStore` on PostgreSQL 12+ (``psycopg`` 3, ``psycopg_pool``).

    ``dsn``: a libpq connection string or URL; ``password``, ``sslmode`` and ``sslrootcert``
    (a PEM CA bundle), when given, are added to it (the password stays out of the DSN and of
    every message; ``verify-full`` checks the server's certificate and host name).
    ``max_messages``: per-client cap, 1..65534.
    ``timeout``: seconds one operation may take, waiting for a connection included.
    ``pool_size``: most connections held. The pool opens and the schema is migrated on first
    use, so the constructor does no I/O. Raises ``ValueError`` for an invalid cap.
    """

    def __init__(
        self,
        dsn: str,
        *,
        max_messages: int = 10_000,
        timeout: float = 5.0,
        pool_size: int = 10,
        password: PostgresPassword = None,
        sslmode: str | None = None,
        sslrootcert: Path | None = None,
    ) -> None:
        self._max_messages = check_max_messages(max_messages)
        self._pool = MigratedPool(
            dsn,
            name="message store",
            timeout=timeout,
            pool_size=pool_size,
            password=password,
            sslmode=sslmode,
            sslrootcert=sslrootcert,
        )

    async def _run(self, what: str, body: Callable[[Connection], Awaitable[T]]) -> T:
        """Run ``body`` in one transaction within the timeout, mapping psycopg's errors."""
        try:
            return await self._pool.run(what, body)
        except psycopg.Error as exc:
            raise StoreError(
                f"PostgreSQL message store at {self._pool.address}: {what} failed: {exc}"
            ) from exc

    @staticmethod
    async def _lock(conn: Connection, key: bytes) -> tuple[Any, ...] | None:
        """Lock the client's row; return (id, last_seq, last_packet_id, source_offset, stored)."""
        cursor = await conn.execute(_LOCK, (key,))
        return await cursor.fetchone()

    async def append(
        self, client_id: str, source_offset: int, qos: int, expires_at_ms: int, data: bytes
    ) -> AppendResult:
        """See :meth:`MessageStore.append`. One transaction, 3 to 5 statements."""
        [result] = await self.append_many(
            [AppendRequest(client_id, source_offset, qos, expires_at_ms, data)]
        )
        return result

    async def append_many(
        self,
        requests: Sequence[AppendRequest],
        applied: Mapping[int, int] | None = None,
        replaying: str = "",
    ) -> list[AppendResult]:
        """See :meth:`MessageStore.append_many`. One transaction per :data:`CHUNK` appends,
        3 to 5 statements each: a commit (a WAL flush) per chunk, not per message. Raises
        ``ValueError`` (before any write) for arguments out of range. ``applied`` and
        ``replaying`` are not needed: a committed transaction is not dropped by a restart,
        and a standby's promotion is PostgreSQL's replication's business."""
        for r in requests:
            check_append(r.source_offset, r.qos, r.expires_at_ms)
        return await self._chunked("append", requests, self._append)

    async def _chunked(
        self,
        what: str,
        requests: Sequence[R],
        one: Callable[[Connection, R], Awaitable[T]],
    ) -> list[T]:
        """``one`` for each request, in order, :data:`CHUNK` of them per transaction."""
        results: list[T] = []
        for start in range(0, len(requests), CHUNK):
            chunk = requests[start : start + CHUNK]

            async def body(conn: Connection, chunk: Sequence[R] = chunk) -> list[T]:
                return [await one(conn, r) for r in chunk]

            results += await self._run(what, body)
        return results

    async def _append(self, conn: Connection, r: AppendRequest) -> AppendResult:
        """One append inside the caller's transaction (it locks the client's row)."""
        key = client_key(r.client_id)
        row = await self._lock(conn, key)
        while row is None:
            # First message of this client. DO NOTHING waits for a concurrent insert of
            # the same key; the loop covers that row being cleared again before our lock.
            await conn.execute(_CREATE, (key, r.client_id))
            row = await self._lock(conn, key)
        ref, last_seq, last_pid, last_offset, stored = row
        if r.source_offset <= last_offset:
            return AppendResult(None, 0)
        dropped = 0
        if stored >= self._max_messages:
            excess = stored - self._max_messages + 1
            cursor = await conn.execute(_DROP_OLDEST, {"ref": ref, "n": excess})
            dropped = cursor.rowcount
        pid = await self._free_packet_id(conn, ref, last_pid)
        await conn.execute(
            _INSERT,
            {
                "ref": ref,
                "seq": last_seq + 1,
                "pid": pid,
                "qos": r.qos,
                "expires": r.expires_at_ms,
                "data": r.data,
                "offset": r.source_offset,
                "stored": stored - dropped + 1,
                "dropped": dropped,
            },
        )
        return AppendResult(pid, dropped)

    @staticmethod
    async def _free_packet_id(conn: Connection, ref: int, last: int) -> int:
        """The first identifier after ``last`` (1..65535, wrapping) no stored message uses.

        The caller holds the client's lock and has made room under the cap (< 65535), so
        one exists.
        """
        start = last
        while True:
            candidates = [(start + i) % MAX_PACKET_ID + 1 for i in range(_PACKET_ID_BATCH)]
            cursor = await conn.execute(
                "SELECT packet_id FROM persisted_messages"
                " WHERE client_ref = %s AND packet_id = ANY(%s)",
                (ref, candidates),
            )
            used = {row[0] for row in await cursor.fetchall()}
            for candidate in candidates:
                if candidate not in used:
                    return candidate
            start = candidates[-1]

    async def window(
        self, client_id: str, limit: int, now_ms: int, after_seq: int = 0
    ) -> list[StoredMessage]:
        """See :meth:`MessageStore.window`. One transaction; O(log n + limit + expired).

        The scan takes one statement per batch, each with its own snapshot: a message
        appended meanwhile may be included (it comes last), never one out of order.
        """
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        if limit == 0:
            return []
        key = client_key(client_id)

        async def body(conn: Connection) -> list[StoredMessage]:
            # No lock for reading: a transaction that locks a row gets a transaction id and
            # waits for a WAL flush at commit, which would make every read cost an fsync.
            cursor = await conn.execute(
                "SELECT id FROM persisted_clients WHERE client_key = %s", (key,)
            )
            row = await cursor.fetchone()
            if row is None:
                return []
            ref = row[0]
            live: list[StoredMessage] = []
            expired: list[int] = []
            before = 0
            if after_seq > 0:
                cursor = await conn.execute(_COUNT_UP_TO, (ref, after_seq))
                counted = await cursor.fetchone()
                before = counted[0] if counted is not None else 0
            after = after_seq  # seqs start at 1
            while before + len(live) < limit:
                cursor = await conn.execute(_SCAN, (ref, after, limit - before - len(live)))
                rows = await cursor.fetchall()
                if not rows:
                    break
                for seq, pid, qos, state, expires, data in rows:
                    if state == MessageState.QUEUED and expires <= now_ms:
                        expired.append(seq)
                    else:
                        live.append(
                            StoredMessage(
                                client_id, seq, pid, qos, MessageState(state), expires, data
                            )
                        )
                after = rows[-1][0]
            if expired and await self._lock(conn, key) is not None:
                # The condition is checked again under the lock: a message sent or deleted
                # since the scan is left alone.
                cursor = await conn.execute(_DELETE_EXPIRED, (ref, expired, now_ms))
                if cursor.rowcount:
                    await conn.execute(
                        "UPDATE persisted_clients SET stored = stored - %s WHERE id = %s",
                        (cursor.rowcount, ref),
                    )
            return live

        return await self._run("window", body)

    async def mark_sent(self, client_id: str, packet_ids: Sequence[int]) -> None:
        """See :meth:`MessageStore.mark_sent`. One transaction, 2 statements."""
        wanted = [pid for pid in packet_ids if 1 <= pid <= MAX_PACKET_ID]
        if not wanted:
            return
        key = client_key(client_id)

        async def body(conn: Connection) -> None:
            row = await self._lock(conn, key)
            if row is not None:
                await conn.execute(
                    "UPDATE persisted_messages SET state = 1"
                    " WHERE client_ref = %s AND packet_id = ANY(%s) AND state = 0",
                    (row[0], wanted),
                )

        await self._run("mark_sent", body)

    async def acknowledge(self, client_id: str, packet_id: int, kind: AckKind) -> bool:
        """See :meth:`MessageStore.acknowledge`. One transaction, 2 statements."""
        [done] = await self.acknowledge_many([AckRequest(client_id, packet_id, kind)])
        return done

    async def acknowledge_many(self, requests: Sequence[AckRequest]) -> list[bool]:
        """See :meth:`MessageStore.acknowledge_many`. One transaction per :data:`CHUNK`
        acknowledgements, 2 statements each."""
        return await self._chunked("acknowledge", requests, self._acknowledge)

    async def _acknowledge(self, conn: Connection, r: AckRequest) -> bool:
        """One acknowledgement inside the caller's transaction."""
        statement = {AckKind.PUBACK: _PUBACK, AckKind.PUBREC: _PUBREC, AckKind.PUBCOMP: _PUBCOMP}[
            AckKind(r.kind)
        ]
        row = await self._lock(conn, client_key(r.client_id))
        if row is None:
            return False
        cursor = await conn.execute(statement, {"ref": row[0], "pid": r.packet_id})
        return cursor.rowcount == 1

    async def clear(self, client_id: str) -> int:
        """See :meth:`MessageStore.clear`. One DELETE; the messages go by ON DELETE CASCADE."""
        key = client_key(client_id)

        async def body(conn: Connection) -> int:
            cursor = await conn.execute(
                "DELETE FROM persisted_clients WHERE client_key = %s RETURNING stored", (key,)
            )
            row = await cursor.fetchone()
            return 0 if row is None else int(row[0])

        return await self._run("clear", body)

    async def count(self, client_id: str) -> int:
        """See :meth:`MessageStore.count`. One SELECT of the client's row."""
        return (await self._counters("count", client_id)).stored

    async def stats(self, client_id: str) -> StoreStats:
        """See :meth:`MessageStore.stats`. One SELECT of the client's row."""
        return await self._counters("stats", client_id)

    async def counts(self, client_ids: Sequence[str]) -> list[int]:
        """See :meth:`MessageStore.counts`. One SELECT of the clients' rows."""
        keys = [client_key(client_id) for client_id in client_ids]

        async def body(conn: Connection) -> list[int]:
            cursor = await conn.execute(
                "SELECT client_key, stored FROM persisted_clients WHERE client_key = ANY(%s)",
                (keys,),
            )
            stored = {bytes(key): int(count) for key, count in await cursor.fetchall()}
            return [stored.get(key, 0) for key in keys]

        return await self._run("counts", body) if keys else []

    async def ping(self) -> None:
        """See :meth:`MessageStore.ping`. One ``SELECT 1`` (the schema migrated first)."""

        async def body(conn: Connection) -> None:
            await conn.execute("SELECT 1")

        await self._run("ping", body)

    async def _counters(self, what: str, client_id: str) -> StoreStats:
        key = client_key(client_id)

        async def body(conn: Connection) -> StoreStats:
            cursor = await conn.execute(
                "SELECT stored, dropped FROM persisted_clients WHERE client_key = %s", (key,)
            )
            row = await cursor.fetchone()
            return StoreStats(0, 0) if row is None else StoreStats(int(row[0]), int(row[1]))

        return await self._run(what, body)

    async def close(self) -> None:
        """See :meth:`MessageStore.close`. Closes the pool's connections."""
        await self._pool.close()
