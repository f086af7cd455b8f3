"""The message store on Redis (the default backend): one Lua script per operation.

Keys of one client (``P`` = the key prefix, ``C`` = the client id with ``%``, ``{`` and
``}`` percent-encoded, so it holds no brace and the encoding is unambiguous):

- ``P{C}:q``  sorted set: member = Packet Identifier (decimal), score = seq. The order of
  the queue, the "is this identifier in use" test and identifier → seq, all O(log n).
- ``P{C}:m``  hash: Packet Identifier → meta, an ASCII string ``<qos><state><expires_at_ms>``
  (``"10"`` + ``"1767225600000"``: QoS 1, QUEUED). Small, so a state change rewrites little.
- ``P{C}:d``  hash: Packet Identifier → data (bytes), written once and deleted once.
- ``P{C}:c``  hash of counters: ``seq`` (last assigned), ``pid`` (last Packet Identifier),
  ``off`` (highest source offset), ``dropped``, ``exp`` (latest expires_at_ms appended).

``{C}`` is the Redis Cluster hash tag, so all of a client's keys live in one slot and one
script may touch them all. Each append sets every key to expire (PEXPIREAT) at ``exp``: a
client nobody touches any more vanishes when its last message would have expired.

Kafka is the source of truth where Redis replication cannot promise durability (as TBMQ's
clustering does): two hashes of ``msg.persisted`` partition → value say what the data holds:

- ``P:applied``: the offset below which every record of the partition has been applied
  (written after the appends of each batch, in the same replication stream, so a replica
  that has it has those appends too);
- ``P:epochs``: the replication id (``master_replid``) of the primary the partition's
  records were last applied on.

A promoted replica, or a replica resynchronised from one, holds a prefix of its former
primary's writes, and its ``master_replid`` is new. Every append checks the partition's
epoch against the primary's id and is refused (:class:`StoreFailedOver`, nothing written)
when they differ; the caller re-applies the partition's records from ``P:applied`` (the
appends are idempotent by source offset, so what the new primary has is not stored
twice), then :meth:`RedisMessageStore.adopt` sets the epoch.

With replicas (``wait_replicas``), every writing call ends with ``WAIT``: it returns only once
that many replicas have the call's writes (device_persist commits Kafka offsets only after
that). That is not enough by itself: the Sentinels may promote a replica that had not
confirmed the write, and the one that had then resynchronises from it and drops it; the
epochs above recover such writes from Kafka.
``WAIT`` covers the writes made on its own connection, and a retried call may find its work
done already and write nothing; so the pipeline writes the counter ``P:replicated`` just
before ``WAIT``: the replication stream is ordered, so its acknowledgement by a replica
covers every write the primary had applied before it, whichever connection made them.

Each script is atomic on the server and does all its reads and checks before its first
write, so a call is applied whole or not at all. The scripts start with ``#!lua`` (Redis 7):
Redis then refuses a writing script before it starts when memory is full, instead of
failing it halfway.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeAlias, TypeVar
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from pydantic import SecretStr
from redis import exceptions as redis_errors
from redis.asyncio.client import Pipeline
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.retry import Retry

from services.common.stores.base import (
    MAX_PACKET_ID,
    AckKind,
    AckRequest,
    AppendRequest,
    AppendResult,
    BatchResult,
    FailoverState,
    MessageState,
    MessageStore,
    StoredMessage,
    StoreError,
    StoreFailedOver,
    StoreStats,
    StoreUnavailable,
    WindowRequest,
    check_append,
    check_max_messages,
)

T = TypeVar("T")

# The primary's replication id, and the refusal of a write for a partition whose records
# were last applied on another primary (unless they are being re-applied on this one).
_GUARD = """
local function replid()
  return string.match(redis.call('INFO', 'replication'), 'master_replid:(%w+)')
end
local function guard(epochs, partition, replaying)
  if partition == '' then
    return
  end
  local now = replid()
  if replaying ~= now and redis.call('HGET', epochs, partition) ~= now then
    error({err = 'FAILOVER ' .. now})
  end
end
"""

# KEYS q m d c epochs; ARGV max_messages partition replaying, then (source_offset qos
# expires_at_ms data) per message, all for this one client, in order. Returns one string,
# "<packet_id>:<dropped>" per message joined by spaces (packet_id 0 when its offset was
# already appended): one reply to parse per client, not two per message.
_APPEND = (
    """#!lua
"""
    + _GUARD
    + """
local q, m, d, c = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
guard(KEYS[5], ARGV[2], ARGV[3])
local cap = tonumber(ARGV[1])
local out = {}
local last = tonumber(redis.call('HGET', c, 'off') or '-1')
local pid = tonumber(redis.call('HGET', c, 'pid') or '0')
local exp = tonumber(redis.call('HGET', c, 'exp') or '0')
local total_dropped = 0
for i = 4, #ARGV, 4 do
  local offset = tonumber(ARGV[i])
  if offset <= last then
    out[#out + 1] = '0:0'
  else
    last = offset
    local dropped = 0
    -- A loop, not one pop: a lower cap than a previous process used trims the excess at once.
    while redis.call('ZCARD', q) >= cap do
      local oldest = redis.call('ZPOPMIN', q)
      redis.call('HDEL', m, oldest[1])
      redis.call('HDEL', d, oldest[1])
      dropped = dropped + 1
    end
    total_dropped = total_dropped + dropped
    -- The cap (< 65535) guarantees a free identifier, so this loop ends.
    repeat
      pid = pid % 65535 + 1
    until not redis.call('ZSCORE', q, pid)
    local seq = redis.call('HINCRBY', c, 'seq', 1)
    redis.call('ZADD', q, seq, pid)
    redis.call('HSET', m, pid, ARGV[i + 1] .. '0' .. ARGV[i + 2])
    redis.call('HSET', d, pid, ARGV[i + 3])
    local expires = tonumber(ARGV[i + 2])
    if expires > exp then
      exp = expires
    end
    out[#out + 1] = pid .. ':' .. dropped
  end
end
if last >= 0 then
  redis.call('HSET', c, 'pid', pid, 'off', last, 'exp', exp)
  if total_dropped > 0 then
    redis.call('HINCRBY', c, 'dropped', total_dropped)
  end
  for i = 1, 4 do
    redis.call('PEXPIREAT', KEYS[i], exp)
  end
end
return table.concat(out, ' ')
"""
)

# KEYS epochs applied; ARGV replaying, then (partition offset) pairs: every record of the
# partition below the offset is applied (never lowered).
_APPLIED = (
    """#!lua
"""
    + _GUARD
    + """
for i = 2, #ARGV, 2 do
  guard(KEYS[1], ARGV[i], ARGV[1])
end
for i = 2, #ARGV, 2 do
  local old = tonumber(redis.call('HGET', KEYS[2], ARGV[i]) or '-1')
  if tonumber(ARGV[i + 1]) > old then
    redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
  end
end
return 0
"""
)

# KEYS applied epochs; ARGV partitions. Returns {replid, then per partition: offset or -1,
# 1 if its epoch is the primary's id else 0}.
_FAILOVER_STATE = (
    """#!lua
"""
    + _GUARD
    + """
local now = replid()
local out = {now}
for i = 1, #ARGV do
  out[#out + 1] = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '-1')
  out[#out + 1] = redis.call('HGET', KEYS[2], ARGV[i]) == now and 1 or 0
end
return out
"""
)

# KEYS epochs; ARGV replid, then partitions. Returns 1 when marked, 0 when the primary's
# id is another one.
_ADOPT = (
    """#!lua
"""
    + _GUARD
    + """
if replid() ~= ARGV[1] then
  return 0
end
for i = 2, #ARGV do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[1])
end
return 1
"""
)

# KEYS q m d; ARGV limit now_ms after_seq start. Returns {heads, data, data, ...}: heads is
# "<pid>:<seq>:<meta>" per message joined by spaces, then each message's data in order (one
# reply element per message plus one, not four per message: fewer to parse). With start =
# 1 the QUEUED messages returned are marked SENT (the caller sends them now: no second call
# to mark them); the heads keep the state from before.
_WINDOW = """#!lua
local q, m, d = KEYS[1], KEYS[2], KEYS[3]
local limit, now, after = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local start = ARGV[4] == '1'
local heads, out, live, expired, started = {}, {''}, 0, {}, {}
local from = '-inf'
if after > 0 then
  -- Sent already by the caller: counted, not returned, never expired.
  live = redis.call('ZCOUNT', q, '-inf', after)
  from = '(' .. after
end
while live < limit do
  local batch = redis.call('ZRANGEBYSCORE', q, from, '+inf', 'WITHSCORES', 'LIMIT', 0, limit - live)
  if #batch == 0 then
    break
  end
  for i = 1, #batch, 2 do
    local pid, seq = batch[i], batch[i + 1]
    local meta = redis.call('HGET', m, pid)
    if string.sub(meta, 2, 2) == '0' and tonumber(string.sub(meta, 3)) <= now then
      expired[#expired + 1] = pid
    else
      heads[#heads + 1] = pid .. ':' .. seq .. ':' .. meta
      out[#out + 1] = redis.call('HGET', d, pid)
      live = live + 1
      if start and string.sub(meta, 2, 2) == '0' then
        started[#started + 1] = pid
        started[#started + 1] = string.sub(meta, 1, 1) .. '1' .. string.sub(meta, 3)
      end
    end
    from = '(' .. seq
  end
end
for _, pid in ipairs(expired) do
  redis.call('ZREM', q, pid)
  redis.call('HDEL', m, pid)
  redis.call('HDEL', d, pid)
end
for i = 1, #started, 2 do
  redis.call('HSET', m, started[i], started[i + 1])
end
out[1] = table.concat(heads, ' ')
return out
"""

# KEYS m; ARGV packet ids. QUEUED → SENT.
_MARK_SENT = """#!lua
-- One HGET per identifier rather than HMGET with unpack(): unpack is limited to a few
-- thousand values by Lua's C stack, and a window may hold up to 65,535 identifiers.
local m = KEYS[1]
for _, pid in ipairs(ARGV) do
  local meta = redis.call('HGET', m, pid)
  if meta and string.sub(meta, 2, 2) == '0' then
    redis.call('HSET', m, pid, string.sub(meta, 1, 1) .. '1' .. string.sub(meta, 3))
  end
end
return 0
"""

# KEYS q m d; ARGV (packet_id kind) pairs, in the order the client sent them. Returns 1 per
# pair if it changed something, else 0: one call per client and batch, not per
# acknowledgement.
_ACKNOWLEDGE = """#!lua
local q, m, d = KEYS[1], KEYS[2], KEYS[3]
local out = {}
for i = 1, #ARGV, 2 do
  local pid, kind = ARGV[i], ARGV[i + 1]
  local meta = redis.call('HGET', m, pid)
  local changed = 0
  if meta then
    local qos, state = string.sub(meta, 1, 1), string.sub(meta, 2, 2)
    if (kind == '4' and qos == '1') or (kind == '7' and qos == '2' and state == '2') then
      redis.call('ZREM', q, pid)
      redis.call('HDEL', m, pid)
      redis.call('HDEL', d, pid)
      changed = 1
    elseif kind == '5' and qos == '2' and state ~= '2' then
      redis.call('HSET', m, pid, '22' .. string.sub(meta, 3))
      changed = 1
    end
  end
  out[#out + 1] = changed
end
return out
"""

# KEYS q m d c. Returns the number of messages deleted.
_CLEAR = """#!lua
local n = redis.call('ZCARD', KEYS[1])
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
return n
"""

# KEYS q c. Returns {stored, dropped}.
_STATS = """#!lua
return {redis.call('ZCARD', KEYS[1]), tonumber(redis.call('HGET', KEYS[2], 'dropped') or '0')}
"""

#: Replies that mean "this server cannot serve now, try again": a replica after a failover
#: (READONLY), a server loading its data, a cluster without quorum, full memory.
_UNAVAILABLE_ERRORS: tuple[type[Exception], ...] = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    redis_errors.ReadOnlyError,
    redis_errors.OutOfMemoryError,
    redis_errors.ClusterDownError,
    redis_errors.TryAgainError,
    OSError,
)


#: A guarded script's refusal (``_GUARD``).
_FAILED_OVER = re.compile(r"^FAILOVER (\w+)")


def _escape(client_id: str) -> str:
    """``client_id`` with ``%``, ``{`` and ``}`` percent-encoded: no brace can end the tag."""
    return client_id.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")


def _public_address(url: str) -> str:
    """``url`` without user name or password, for error messages."""
    parts = urlsplit(url)
    host = parts.hostname or "localhost"
    port = parts.port or 6379
    return f"{parts.scheme}://{host}:{port}{parts.path}"


def _sentinel_address(address: str) -> tuple[str, int]:
    """``(host, port)`` of a Sentinel given as ``host:port``; ``ValueError`` otherwise."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"a Redis Sentinel is host:port, got {address!r}")
    return host, int(port)


class RedisMessageStore(MessageStore):
    """:class:`MessageStore` on one Redis 7 server (or a Cluster's slot), via redis.asyncio.

    ``url``: ``redis://[user:password@]host:port/db``, or ``rediss://`` for TLS (the server's
    certificate and host name verified against ``ssl_cafile``, PEM, or the system's trust
    store). ``password``: the AUTH password (ElastiCache's auth token), kept out of the URL
    and of every message. ``key_prefix`` starts every key and must not contain ``{`` or
    ``}``. ``max_messages``: per-client cap, 1..65534. ``timeout``: seconds one operation
    may take, connecting included. ``sentinels`` (``host:port`` each): the primary is the
    one these Redis Sentinels name for ``sentinel_master``, asked again after a failover
    (``url`` then gives only the scheme, user and database; Sentinels are spoken to in plain
    TCP). ``wait_replicas``: replicas that must confirm every write (Redis ``WAIT``, within
    half of ``timeout``) before a writing call returns; fewer raise
    :class:`StoreUnavailable`. Raises ``ValueError`` for an invalid prefix, cap or Sentinel
    address. Connects on first use.
    """

    def __init__(
        self,
        url: str,
        *,
        key_prefix: str = "cormorant:",
        max_messages: int = 10_000,
        timeout: float = 5.0,
        password: SecretStr | None = None,
        ssl_cafile: Path | None = None,
        sentinels: Sequence[str] = (),
        sentinel_master: str = "cormorant",
        wait_replicas: int = 0,
    ) -> None:
        if "{" in key_prefix or "}" in key_prefix:
            raise ValueError(f"key_prefix must not contain braces, got {key_prefix!r}")
        if wait_replicas < 0:
            raise ValueError(f"wait_replicas must be >= 0, got {wait_replicas}")
        self._prefix = key_prefix
        self._max_messages = check_max_messages(max_messages)
        self._timeout = timeout
        self._wait_replicas = wait_replicas
        self._wait_ms = max(1, int(timeout * 500))
        # No retries inside redis-py: a retried script could run twice after a lost reply,
        # and the caller owns the retry policy (every operation is safe to repeat).
        options: dict[str, Any] = {
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            "retry": Retry(NoBackoff(), 0),
        }
        if password is not None:
            options["password"] = password.get_secret_value()
        parts = urlsplit(url)
        tls = parts.scheme == "rediss"
        if tls:  # certificate and host name always verified
            options |= {"ssl_cert_reqs": "required", "ssl_check_hostname": True}
            if ssl_cafile is not None:
                options["ssl_ca_certs"] = str(ssl_cafile)
        if sentinels:
            addresses = [_sentinel_address(a) for a in sentinels]
            self._address = f"{sentinel_master} (Sentinels {', '.join(sentinels)})"
            if parts.username:
                options["username"] = parts.username
            if parts.password and password is None:
                options["password"] = parts.password
            options["db"] = int(parts.path.lstrip("/") or 0)
            watchers = Sentinel(  # type: ignore[no-untyped-call]
                addresses,
                sentinel_kwargs={"socket_timeout": timeout, "socket_connect_timeout": timeout},
                ssl=tls,
                **options,
            )
            self._redis = watchers.master_for(sentinel_master)
        else:
            self._address = _public_address(url)
            self._redis = aioredis.Redis.from_url(url, **options)
        self._append = self._redis.register_script(_APPEND)
        self._applied = self._redis.register_script(_APPLIED)
        self._failover_state = self._redis.register_script(_FAILOVER_STATE)
        self._adopt = self._redis.register_script(_ADOPT)
        self._epochs_key = f"{key_prefix}epochs"
        self._applied_key = f"{key_prefix}applied"
        self._window = self._redis.register_script(_WINDOW)
        self._mark_sent = self._redis.register_script(_MARK_SENT)
        self._acknowledge = self._redis.register_script(_ACKNOWLEDGE)
        self._clear = self._redis.register_script(_CLEAR)
        self._stats = self._redis.register_script(_STATS)
        self._scripts = (
            self._append,
            self._applied,
            self._failover_state,
            self._adopt,
            self._window,
            self._mark_sent,
            self._acknowledge,
            self._clear,
            self._stats,
        )

    def _keys(self, client_id: str) -> list[str]:
        """The client's keys, in the order the scripts expect: q, m, d, c."""
        base = f"{self._prefix}{{{_escape(client_id)}}}:"
        return [base + "q", base + "m", base + "d", base + "c"]

    async def _run(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """Await ``call()`` within the timeout, turning redis-py's errors into StoreErrors."""
        try:
            async with asyncio.timeout(self._timeout):
                return await call()
        except TimeoutError as exc:
            raise StoreUnavailable(
                f"Redis store at {self._address} is unavailable ({what}): no answer within "
                f"{self._timeout} s"
            ) from exc
        except _UNAVAILABLE_ERRORS as exc:
            raise StoreUnavailable(
                f"Redis store at {self._address} is unavailable ({what}): {exc}"
            ) from exc
        except redis_errors.ResponseError as exc:
            failed_over = _FAILED_OVER.search(str(exc))
            if failed_over is None:
                raise StoreError(f"Redis store at {self._address}: {what} failed: {exc}") from exc
            replication_id = failed_over.group(1)
            raise StoreFailedOver(
                f"Redis store at {self._address}: {what} refused: the primary (replication "
                f"id {replication_id}) is not the one the records were last applied on",
                replication_id,
            ) from exc
        except redis_errors.RedisError as exc:
            raise StoreError(f"Redis store at {self._address}: {what} failed: {exc}") from exc

    async def append(
        self, client_id: str, source_offset: int, qos: int, expires_at_ms: int, data: bytes
    ) -> AppendResult:
        """See :meth:`MessageStore.append`. One EVALSHA; O(log n) plus O(log n) per drop."""
        request = AppendRequest(client_id, source_offset, qos, expires_at_ms, data)
        [result] = await self.append_many([request])
        return result

    async def window(
        self, client_id: str, limit: int, now_ms: int, after_seq: int = 0
    ) -> list[StoredMessage]:
        """See :meth:`MessageStore.window`. One EVALSHA; O(log n + limit + expired)."""
        [messages] = await self.windows([WindowRequest(client_id, limit, after_seq)], now_ms)
        return messages

    async def windows(
        self, requests: Sequence[WindowRequest], now_ms: int
    ) -> list[list[StoredMessage]]:
        """See :meth:`MessageStore.windows`. One pipelined round trip for all of them."""
        calls = self._window_calls(requests, now_ms, start=False)
        # Not waited for: its only writes drop expired messages, which expire again.
        replies = await self._pipeline("window", _queue(calls), writes=False) if calls else []
        return _windows(requests, replies)

    def _window_calls(
        self, requests: Sequence[WindowRequest], now_ms: int, *, start: bool
    ) -> list[_Call]:
        """The ``_WINDOW`` calls of ``requests`` (none for a limit of 0); ``start`` marks
        the QUEUED messages they return SENT. Raises ``ValueError`` for a negative limit."""
        for request in requests:
            if request.limit < 0:
                raise ValueError(f"limit must be >= 0, got {request.limit}")
        flag = 1 if start else 0
        return [
            (self._window, self._keys(r.client_id)[:3], [r.limit, now_ms, r.after_seq, flag])
            for r in requests
            if r.limit > 0
        ]

    async def _pipeline(
        self, what: str, queue: Callable[[Pipeline], None], *, writes: bool = True
    ) -> list[Any]:
        """Run the commands ``queue`` adds to a pipeline in one round trip (no MULTI: each
        script is atomic by itself); the replies, in order. A pipeline that ``writes`` waits
        for ``wait_replicas`` replicas (module docstring) and raises StoreUnavailable when
        fewer confirm in time.

        Scripts go as EVALSHA alone (:func:`_evalsha`): redis-py would first ask SCRIPT
        EXISTS for them, a second round trip on every call. A server that lacks a script
        (restarted, failed over, SCRIPT FLUSH) answers NOSCRIPT: the scripts are loaded and
        the whole pipeline runs again, which every operation of this store allows (each is
        idempotent: appends by source offset, acknowledgements and marks by state)."""
        wait = writes and self._wait_replicas > 0

        async def execute() -> list[Any]:
            async with self._redis.pipeline(transaction=False) as pipe:
                queue(pipe)
                if wait:
                    pipe.incr(f"{self._prefix}replicated")
                    pipe.execute_command("WAIT", self._wait_replicas, self._wait_ms)
                replies: list[Any] = await pipe.execute(raise_on_error=False)
                return replies

        async def run() -> list[Any]:
            replies = await execute()
            if any(isinstance(reply, redis_errors.NoScriptError) for reply in replies):
                for script in self._scripts:
                    script.sha = await self._redis.script_load(script.script)
                replies = await execute()
            for reply in replies:
                # Raised here rather than by execute(), whose message for a failed
                # command of a pipeline loses the server's words (redis-py 5).
                if isinstance(reply, Exception):
                    raise reply
            return replies

        replies = await self._run(what, run)
        if not wait:
            return replies
        confirmed = int(replies[-1])
        if confirmed < self._wait_replicas:
            raise StoreUnavailable(
                f"Redis store at {self._address}: {what} written on the primary but "
                f"confirmed by {confirmed} of {self._wait_replicas} replicas within "
                f"{self._wait_ms} ms"
            )
        return replies[:-2]

    async def append_many(
        self,
        requests: Sequence[AppendRequest],
        applied: Mapping[int, int] | None = None,
        replaying: str = "",
    ) -> list[AppendResult]:
        """See :meth:`MessageStore.append_many`. One pipelined round trip, one EVALSHA per
        client (with all of that client's messages), then one for ``applied``; O(log n)
        per message and per drop. Each checks its partitions' epochs first (module
        docstring): :class:`StoreFailedOver` when one is not the primary's."""
        groups, calls = self._append_calls(requests, applied, replaying)
        if not calls:
            return [AppendResult(None, 0)] * len(requests)
        replies = await self._pipeline("append", _queue(calls))
        return _appended(len(requests), groups, replies)

    def _append_calls(
        self,
        requests: Sequence[AppendRequest],
        applied: Mapping[int, int] | None,
        replaying: str,
    ) -> tuple[list[list[int]], list[_Call]]:
        """The ``_APPEND`` calls of ``requests``, one per client with the indexes of its
        requests (the groups, in call order), then the ``_APPLIED`` call of ``applied`` if
        any. Raises ``ValueError`` for an append out of range."""
        by_client: dict[str, list[int]] = {}
        for index, r in enumerate(requests):
            check_append(r.source_offset, r.qos, r.expires_at_ms)
            by_client.setdefault(r.client_id, []).append(index)
        calls: list[_Call] = []
        for client_id, indexes in by_client.items():
            partition = requests[indexes[0]].source_partition
            args: list[Any] = [self._max_messages, "" if partition is None else partition]
            args.append(replaying)
            for index in indexes:
                r = requests[index]
                args += (r.source_offset, r.qos, r.expires_at_ms, r.data)
            calls.append((self._append, [*self._keys(client_id), self._epochs_key], args))
        marks = [value for item in sorted((applied or {}).items()) for value in item]
        if marks:
            keys = [self._epochs_key, self._applied_key]
            calls.append((self._applied, keys, [replaying, *marks]))
        return list(by_client.values()), calls

    async def failover_state(self, partitions: Collection[int]) -> FailoverState:
        """See :meth:`MessageStore.failover_state`. One EVALSHA (reads only)."""
        wanted = sorted(partitions)
        keys = [self._applied_key, self._epochs_key]
        reply = await self._run(
            "failover state", lambda: self._failover_state(keys=keys, args=wanted)
        )
        replication_id = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
        offsets, current = reply[1::2], reply[2::2]
        applied = {p: int(o) for p, o in zip(wanted, offsets, strict=True) if int(o) >= 0}
        same = frozenset(p for p, c in zip(wanted, current, strict=True) if int(c) == 1)
        return FailoverState(replication_id, applied, same)

    async def adopt(self, partitions: Collection[int], replication_id: str) -> bool:
        """See :meth:`MessageStore.adopt`. One EVALSHA, confirmed by ``wait_replicas``."""
        wanted = sorted(partitions)

        def queue(pipe: Pipeline) -> None:
            _evalsha(pipe, self._adopt, [self._epochs_key], [replication_id, *wanted])

        if not wanted:
            return True
        [marked] = await self._pipeline("adopt", queue)
        return int(marked) == 1

    async def acknowledge_many(self, requests: Sequence[AckRequest]) -> list[bool]:
        """See :meth:`MessageStore.acknowledge_many`. One pipelined round trip, one EVALSHA
        per client with all of its acknowledgements in order; O(log n) each."""
        groups, calls = self._acknowledge_calls(requests)
        changed = [False] * len(requests)
        if not calls:
            return changed
        replies = await self._pipeline("acknowledge", _queue(calls))
        for indexes, reply in zip(groups, replies, strict=True):
            for index, done in zip(indexes, reply, strict=True):
                changed[index] = done == 1
        return changed

    def _acknowledge_calls(
        self, requests: Sequence[AckRequest]
    ) -> tuple[list[list[int]], list[_Call]]:
        """The ``_ACKNOWLEDGE`` calls of ``requests``: one per client with all of its
        acknowledgements in order, and the indexes of its requests (in call order)."""
        by_client: dict[str, list[int]] = {}
        for index, r in enumerate(requests):
            by_client.setdefault(r.client_id, []).append(index)
        calls: list[_Call] = []
        for client_id, indexes in by_client.items():
            args: list[int] = []
            for index in indexes:
                args += (requests[index].packet_id, int(AckKind(requests[index].kind)))
            calls.append((self._acknowledge, self._keys(client_id)[:3], args))
        return list(by_client.values()), calls

    async def apply_batch(
        self,
        appends: Sequence[AppendRequest],
        applied: Mapping[int, int] | None,
        replaying: str,
        acknowledgements: Sequence[AckRequest],
        starts: Sequence[WindowRequest],
        now_ms: int,
    ) -> BatchResult:
        """See :meth:`MessageStore.apply_batch`. One pipelined round trip for all of it
        (appends, applied offsets, acknowledgements, windows marked as they are read), in
        that order; each script atomic by itself, as in the separate calls. Where
        device_persist made four round trips per batch (append, acknowledge, window, mark
        sent), it makes one."""
        groups, append_calls = self._append_calls(appends, applied, replaying)
        _, acknowledge_calls = self._acknowledge_calls(acknowledgements)
        window_calls = self._window_calls(starts, now_ms, start=True)
        calls = [*append_calls, *acknowledge_calls, *window_calls]
        if not calls:
            return BatchResult([AppendResult(None, 0)] * len(appends), [[] for _ in starts])
        replies = await self._pipeline("batch", _queue(calls))
        appended = _appended(len(appends), groups, replies)
        windows = _windows(starts, replies[len(replies) - len(window_calls) :])
        return BatchResult(appended, windows)

    async def mark_sent_many(self, sent: Sequence[tuple[str, Sequence[int]]]) -> None:
        """See :meth:`MessageStore.mark_sent_many`. One pipelined round trip."""
        wanted = [
            (client_id, [pid for pid in ids if 1 <= pid <= MAX_PACKET_ID])
            for client_id, ids in sent
        ]
        wanted = [(client_id, ids) for client_id, ids in wanted if ids]

        def queue(pipe: Pipeline) -> None:
            for client_id, ids in wanted:
                _evalsha(pipe, self._mark_sent, self._keys(client_id)[1:2], ids)

        if wanted:
            await self._pipeline("mark_sent", queue)

    async def mark_sent(self, client_id: str, packet_ids: Sequence[int]) -> None:
        """See :meth:`MessageStore.mark_sent`. One EVALSHA; O(len(packet_ids))."""
        await self.mark_sent_many([(client_id, packet_ids)])

    async def acknowledge(self, client_id: str, packet_id: int, kind: AckKind) -> bool:
        """See :meth:`MessageStore.acknowledge`. One EVALSHA; O(log n)."""
        [changed] = await self.acknowledge_many([AckRequest(client_id, packet_id, kind)])
        return changed

    async def clear(self, client_id: str) -> int:
        """See :meth:`MessageStore.clear`. One EVALSHA; O(n) (the keys are freed)."""

        def queue(pipe: Pipeline) -> None:
            _evalsha(pipe, self._clear, self._keys(client_id), [])

        [deleted] = await self._pipeline("clear", queue)
        return int(deleted)

    async def count(self, client_id: str) -> int:
        """See :meth:`MessageStore.count`. One ZCARD; O(1)."""
        key = self._keys(client_id)[0]
        stored: Any = await self._run("count", lambda: self._redis.zcard(key))
        return int(stored)

    async def counts(self, client_ids: Sequence[str]) -> list[int]:
        """See :meth:`MessageStore.counts`. One pipeline of ZCARDs."""

        def queue(pipe: Pipeline) -> None:
            for client_id in client_ids:
                pipe.zcard(self._keys(client_id)[0])

        if not client_ids:
            return []
        return [int(n) for n in await self._pipeline("counts", queue, writes=False)]

    async def ping(self) -> None:
        """See :meth:`MessageStore.ping`. One PING."""
        await self._run("ping", self._redis.ping)

    async def server_info(self) -> dict[str, Any]:
        """The primary's ``INFO`` (its default sections: server, replication, memory...;
        field name → value, as redis-py parses it) and the address asked (without
        credentials) under ``"address"``. Raises :class:`StoreUnavailable` or
        :class:`StoreError` as every call does."""
        info: dict[str, Any] = await self._run("info", self._redis.info)
        return {**info, "address": self._address}

    async def stats(self, client_id: str) -> StoreStats:
        """See :meth:`MessageStore.stats`. One EVALSHA; O(1)."""
        q, _, _, c = self._keys(client_id)
        stored, dropped = await self._run("stats", lambda: self._stats(keys=[q, c]))
        return StoreStats(stored=int(stored), dropped=int(dropped))

    async def close(self) -> None:
        """See :meth:`MessageStore.close`. Closes the connection pool."""
        await self._redis.aclose()


_Call: TypeAlias = tuple[AsyncScript, list[str], list[Any]]
"""One script call of a pipeline: the script, its keys, its arguments."""


def _queue(calls: Sequence[_Call]) -> Callable[[Pipeline], None]:
    """What queues ``calls`` on a pipeline, in order (for ``RedisMessageStore._pipeline``)."""

    def queue(pipe: Pipeline) -> None:
        for script, keys, args in calls:
            _evalsha(pipe, script, keys, args)

    return queue


def _appended(
    count: int, groups: Sequence[Sequence[int]], replies: Sequence[Any]
) -> list[AppendResult]:
    """The results of ``count`` appends from the ``_APPEND`` replies (the first
    ``len(groups)`` of ``replies``), each client's group being the indexes of its requests."""
    results: list[AppendResult] = [AppendResult(None, 0)] * count
    for indexes, reply in zip(groups, replies, strict=False):
        for index, item in zip(indexes, reply.split(), strict=True):
            packet_id, dropped = map(int, item.split(b":"))
            results[index] = AppendResult(packet_id or None, dropped)
    return results


def _windows(
    requests: Sequence[WindowRequest], replies: Sequence[Any]
) -> list[list[StoredMessage]]:
    """The windows of ``requests`` from the ``_WINDOW`` replies, one per request with a
    limit above 0, in order (the others are empty)."""
    queue = iter(replies)
    return [_stored(r.client_id, next(queue)) if r.limit > 0 else [] for r in requests]


def _evalsha(pipe: Pipeline, script: AsyncScript, keys: Sequence[str], args: Sequence[Any]) -> None:
    """Queue ``script`` on ``pipe`` as a bare EVALSHA (``RedisMessageStore._pipeline`` loads
    the scripts when the server answers NOSCRIPT)."""
    pipe.evalsha(script.sha, len(keys), *keys, *args)


def _stored(client_id: str, reply: list[bytes]) -> list[StoredMessage]:
    """The messages of a ``_WINDOW`` reply."""
    messages = []
    heads = reply[0].split() if reply[0] else []
    for head, data in zip(heads, reply[1:], strict=True):
        packet_id, seq, meta = head.split(b":")
        messages.append(
            StoredMessage(
                client_id=client_id,
                seq=int(seq),
                packet_id=int(packet_id),
                qos=meta[0] - 0x30,  # ASCII digit
                state=MessageState(meta[1] - 0x30),
                expires_at_ms=int(meta[2:]),
                data=data,
            )
        )
    return messages
