"""Stable ingest node ids: leases on a bounded pool of slots kept in PostgreSQL.

An ingest node's id names its downlink topic (``msg.downlink.<node_id>``,
:meth:`~services.common.kafka.names.TopicNames.downlink`). Named after each ECS task, every
task replacement (deploy, scale-in, crash) left one more topic behind, and about 25 of them
filled a kafka.t3.small cluster's partition replicas (issue 24, finding 5). An autoscaled
ingest task now claims the lowest free slot of a pool of ``ingest_node_pool_size`` slots
and is node ``ingest-<slot>`` while it renews its lease (every third of
``ingest_node_lease_seconds``); a task that stops releases it, one that dies lets it expire.
So there are never more downlink topics than slots, whatever fails: what TBMQ's Kubernetes
StatefulSet gives its pods (``tbmq-0`` ... ``tbmq-N``).

Why leases rather than deleting a dead node's downlink topic once drained:

- the node id is more than its topic: it is the node's static member id in the
  ``client.wills`` group and the node the session state shows clients connected to. A new
  holder of the id takes the dead node's will partitions back without a rebalance and ends
  the sessions that died with it (:meth:`~services.ingest.node.IngestNode.reconcile`);
  with throw-away ids nobody does;
- deleting needs the same knowledge (which node is dead, and for sure) plus the certainty
  that no router still writes to the topic; a router with a stale session record writing
  after the delete would fail or, where topic auto-creation is on, create it again;
- with a pool the bound holds by construction, with no cleaner that could itself stop.

A node fences itself: if it could not renew its lease for ``ingest_node_lease_seconds``
minus one renewal interval (PostgreSQL unreachable), :meth:`HeldLease.hold` raises
:class:`LeaseLost` before the server may give the slot to another task, and the node's
worker crashes (its supervisor, ECS, starts a new task). Kafka's static membership fences
an older member with the same id too.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from services.common.settings import Settings
from services.common.stores.base import StoreUnavailable
from services.common.stores.postgres_pool import Connection, MigratedPool, password_of

log = logging.getLogger(__name__)

NODE_ID_PREFIX = "ingest-"
"""A pooled node's id is this and its slot number: ``ingest-3``."""

_CLAIM = """
INSERT INTO ingest_node_leases AS held (prefix, slot, holder, expires_at)
SELECT %(prefix)s, candidate, %(holder)s, now() + make_interval(secs => %(seconds)s)
FROM generate_series(1, %(size)s) AS candidate
WHERE NOT EXISTS (
    SELECT 1 FROM ingest_node_leases AS other
    WHERE other.prefix = %(prefix)s AND other.slot = candidate AND other.expires_at > now()
)
ORDER BY candidate
LIMIT 1
ON CONFLICT (prefix, slot) DO UPDATE
    SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at
    WHERE held.expires_at <= now()
RETURNING slot
"""
# Two tasks claiming at once may pick the same expired or missing slot: the row lock makes
# the second re-check the WHERE of the conflict clause on the first one's row, which then
# fails, so it gets no row and tries again.

_RENEW = """
UPDATE ingest_node_leases SET expires_at = now() + make_interval(secs => %(seconds)s)
WHERE prefix = %(prefix)s AND slot = %(slot)s AND holder = %(holder)s
RETURNING slot
"""

_RELEASE = "DELETE FROM ingest_node_leases WHERE prefix = %s AND slot = %s AND holder = %s"


class LeaseLost(RuntimeError):
    """This node's id lease is gone (another task holds the slot now), or could not be
    renewed in time: the node must stop serving under that id."""


class PoolExhausted(RuntimeError):
    """Every slot of the node id pool stayed held by a live node while a task waited."""


def node_id_of(slot: int) -> str:
    """The node id of pool slot ``slot`` (1-based): ``ingest-<slot>``."""
    return f"{NODE_ID_PREFIX}{slot}"


def default_holder() -> str:
    """Who claims a lease: the ECS task id when running in one (the operator finds the
    task from its node id, and its log stream ends with it), else host name and process
    id; a random suffix tells two claims of one process apart."""
    from services.cloud.ecs_task import NotInEcsTask, task_id

    try:
        base = task_id()
    except NotInEcsTask:
        base = f"{socket.gethostname()}:{os.getpid()}"
    return f"{base}/{uuid.uuid4().hex[:8]}"


@dataclass
class HeldLease:
    """A claimed slot: :attr:`node_id` is this node's id while :meth:`hold` runs.

    ``claimed_at`` is the :func:`time.monotonic` reading taken before the claim was sent:
    the server's expiry is at least ``seconds`` after it.
    """

    leases: NodeLeases
    slot: int
    holder: str
    claimed_at: float
    released: bool = field(default=False, init=False)

    @property
    def node_id(self) -> str:
        """This node's id, ``ingest-<slot>``."""
        return node_id_of(self.slot)

    async def renew(self) -> None:
        """Extend the lease by the pool's lease seconds from now. Raises :class:`LeaseLost`
        if another task holds the slot (or it was released), and
        :class:`~services.common.stores.base.StoreUnavailable` if PostgreSQL does not answer."""
        leases = self.leases
        params = {"prefix": leases.prefix, "slot": self.slot, "holder": self.holder}

        async def body(conn: Connection) -> bool:
            cursor = await conn.execute(_RENEW, {**params, "seconds": leases.seconds})
            return await cursor.fetchone() is not None

        if not await leases.pool.run("renew the node id lease", body):
            raise LeaseLost(f"node id {self.node_id} is no longer held by {self.holder}")

    async def hold(self, clock: Callable[[], float] = time.monotonic) -> None:
        """Renew the lease now, then every :attr:`NodeLeases.interval` seconds, until
        :meth:`release` (then return). Raises :class:`LeaseLost` when the slot went to
        another task, or when no renewal succeeded for ``seconds - interval`` seconds: by
        the server's expiry at the latest, this node stops using the id. (A renewal that
        succeeds proves the slot was still this node's, however late it comes.)"""
        leases = self.leases
        renewed_at = self.claimed_at
        while not self.released:
            sent = clock()
            fence = renewed_at + leases.seconds - leases.interval
            try:
                # A renewal still in flight at the server's expiry could no longer prove
                # anything: it gets until then (at least one interval, after a slow start).
                async with asyncio.timeout(max(fence - sent, leases.interval)):
                    await self.renew()
                renewed_at = sent
            except LeaseLost:
                if self.released:
                    return
                raise
            except (StoreUnavailable, TimeoutError) as exc:
                if clock() >= fence:
                    raise LeaseLost(
                        f"node id {self.node_id}: lease not renewed for "
                        f"{leases.seconds - leases.interval:g} s ({exc})"
                    ) from exc
                log.warning("node id %s: lease renewal failed, retrying: %s", self.node_id, exc)
            await asyncio.sleep(leases.interval)

    def moved_to(self, leases: NodeLeases) -> HeldLease:
        """This lease renewed through ``leases`` (the same pool, another connection: one
        of the event loop that runs :meth:`hold`)."""
        return HeldLease(leases, self.slot, self.holder, self.claimed_at)

    async def release(self) -> None:
        """Give the slot back (a clean stop): the next task may take it at once. Raises
        :class:`~services.common.stores.base.StoreUnavailable` if PostgreSQL does not answer
        (the lease then expires by itself)."""
        self.released = True
        params = (self.leases.prefix, self.slot, self.holder)

        async def body(conn: Connection) -> None:
            await conn.execute(_RELEASE, params)

        await self.leases.pool.run("release the node id lease", body)


class NodeLeases:
    """The node id pool of one deployment (``prefix``: its ``topic_prefix``): ``size``
    slots whose leases last ``seconds`` (renewed every :attr:`interval` = a third of it),
    kept in table ``ingest_node_leases`` through ``pool``."""

    def __init__(self, pool: MigratedPool, prefix: str, size: int, seconds: float) -> None:
        self.pool = pool
        self.prefix = prefix
        self.size = size
        self.seconds = seconds
        self.interval = seconds / 3

    @classmethod
    def from_settings(cls, settings: Settings) -> NodeLeases:
        """The pool of ``ingest_node_pool_size`` slots and ``ingest_node_lease_seconds``
        leases, in the PostgreSQL database of ``settings`` (one connection)."""
        pool = MigratedPool(
            settings.postgres_dsn,
            name="node id leases",
            timeout=settings.store_timeout_seconds,
            pool_size=1,
            password=password_of(settings),
            sslmode=settings.postgres_sslmode,
            sslrootcert=settings.postgres_sslrootcert,
        )
        return cls(
            pool,
            settings.topic_prefix,
            settings.ingest_node_pool_size,
            settings.ingest_node_lease_seconds,
        )

    async def claim(self, holder: str, wait: float | None = None) -> HeldLease:
        """Take the lowest slot that is free or whose lease expired, for ``holder``.

        Waits up to ``wait`` seconds (default: one lease's length, within which a dead
        task's slot comes free) trying again, then raises :class:`PoolExhausted`. Raises
        :class:`~services.common.stores.base.StoreUnavailable` if PostgreSQL does not answer.
        """
        deadline = time.monotonic() + (self.seconds if wait is None else wait)
        params = {"prefix": self.prefix, "holder": holder, "size": self.size}
        while True:
            sent = time.monotonic()

            async def body(conn: Connection) -> int | None:
                cursor = await conn.execute(_CLAIM, {**params, "seconds": self.seconds})
                row = await cursor.fetchone()
                return None if row is None else int(row[0])

            slot = await self.pool.run("claim a node id", body)
            if slot is not None:
                log.info("node id %s claimed by %s", node_id_of(slot), holder)
                return HeldLease(self, slot, holder, sent)
            if time.monotonic() >= deadline:
                raise PoolExhausted(
                    f"all {self.size} node ids (ingest_node_pool_size) are held by live ingest "
                    "nodes; raise ingest_node_pool_size to at least twice the ingest "
                    "service's maximum task count (a rolling deploy runs both generations)"
                )
            await asyncio.sleep(min(1.0, self.interval))

    async def close(self) -> None:
        """Close the pool's connection."""
        await self.pool.close()


def claim_node_id(settings: Settings) -> HeldLease:
    """Claim a node id for this process before the ingest service starts (blocking; its own
    event loop and connection, both closed on return: the service renews the lease in its
    own loop, through :meth:`HeldLease.moved_to`). Raises :class:`PoolExhausted` or
    :class:`~services.common.stores.base.StoreUnavailable`."""

    async def claim() -> HeldLease:
        leases = NodeLeases.from_settings(settings)
        try:
            return await leases.claim(default_holder())
        finally:
            await leases.close()

    return asyncio.run(claim())
