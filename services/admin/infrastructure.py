"""The health of what Cormorant runs on, as the console's infrastructure page shows it:
Kafka's brokers and partitions, the Redis of the message store, PostgreSQL, HAProxy's
rotation of the ingest nodes, and each service process's CPU and memory.

Each part is asked on its own, within :data:`ASK_SECONDS`, and never raises: a part that
does not answer is reported as such (``reachable: false`` and its error) beside the others.

- Kafka: ``DescribeCluster`` and the metadata of every topic (aiokafka's admin client); a
  partition is under-replicated when its in-sync replicas lack one of its replicas, offline
  when it has no leader.
- Redis: ``INFO`` of the store's primary (:meth:`RedisMessageStore.server_info`): role,
  version, memory used and its limit, replicas.
- PostgreSQL: ``SELECT version()`` through the admin service's pool, timed.
- HAProxy: ``show stat`` on each stats socket of ``admin_haproxy_stats_sockets``
  (HAProxy's management guide, section 9.3): a server is in rotation while its status is
  ``UP``.
- Nodes: ``process_cpu_seconds_total`` and ``process_resident_memory_bytes`` of each
  process's ``/metrics`` (:class:`~services.admin.cluster.StatsSampler`).
"""

from __future__ import annotations

import asyncio
import csv
import io
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from aiokafka.admin import AIOKafkaAdminClient
from pydantic import BaseModel, Field

from services.admin.cluster import StatsSampler
from services.admin.users import AdminUsers
from services.common.kafka.security import client_security
from services.common.settings import Settings
from services.common.stores.base import MessageStore
from services.common.stores.postgres_pool import Connection
from services.common.stores.redis_store import RedisMessageStore

#: Seconds each part may take to answer.
ASK_SECONDS = 5.0

T = TypeVar("T")


class Broker(BaseModel):
    """One Kafka broker of the cluster's metadata."""

    node_id: int
    host: str
    port: int
    controller: bool = Field(description="Whether it is the active controller.")


class TopicHealth(BaseModel):
    """One topic's partitions: how many, and which are under-replicated or offline."""

    topic: str
    partitions: int
    replication_factor: int = Field(description="Replicas of its first partition.")
    under_replicated: list[int] = Field(
        description="Partitions whose in-sync replicas lack one of their replicas."
    )
    offline: list[int] = Field(description="Partitions without a leader.")


class KafkaHealth(BaseModel):
    """Kafka as its metadata tells it."""

    bootstrap: str
    reachable: bool
    error: str | None = None
    brokers: list[Broker] = []
    topics: list[TopicHealth] = []
    under_replicated_partitions: int = 0
    offline_partitions: int = 0


class RedisHealth(BaseModel):
    """The message store's Redis primary (``used``: false when store_backend is postgres)."""

    used: bool
    reachable: bool = False
    error: str | None = None
    address: str | None = None
    role: str | None = Field(None, description="master or slave, as INFO replication says.")
    version: str | None = None
    connected_replicas: int | None = None
    used_memory_bytes: int | None = None
    maxmemory_bytes: int | None = Field(None, description="0: no limit.")


class PostgresHealth(BaseModel):
    """PostgreSQL of the admin users, credentials and audit trail."""

    address: str
    reachable: bool
    error: str | None = None
    version: str | None = None
    latency_ms: float | None = Field(None, description="How long SELECT version() took.")


class RotationEntry(BaseModel):
    """One ingest node listener (HAProxy server) of one HAProxy backend."""

    haproxy: str = Field(description="The stats socket asked.")
    backend: str
    server: str
    status: str = Field(description="HAProxy's status: UP, DOWN, MAINT, ...")
    in_rotation: bool


class HaproxyHealth(BaseModel):
    """HAProxy's rotation (``configured``: false when no stats socket is set)."""

    configured: bool
    errors: list[str] = []
    servers: list[RotationEntry] = []


class NodeUsage(BaseModel):
    """One service process's CPU and resident memory."""

    name: str
    service: str
    node_id: str | None
    reachable: bool
    cpu_percent: float | None = Field(
        description="CPU time used between its last two probes, percent of one core "
        "(null until probed twice)."
    )
    rss_bytes: int | None


class Infrastructure(BaseModel):
    """Everything the infrastructure page shows."""

    checked_at: datetime
    kafka: KafkaHealth
    redis: RedisHealth
    postgres: PostgresHealth
    haproxy: HaproxyHealth
    nodes: list[NodeUsage]


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


async def _within(call: Callable[[], Awaitable[T]]) -> T:
    async with asyncio.timeout(ASK_SECONDS):
        return await call()


async def kafka_health(settings: Settings) -> KafkaHealth:
    """Kafka's brokers and every topic's partitions (never raises)."""
    bootstrap = settings.kafka_bootstrap
    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap,
        request_timeout_ms=int(ASK_SECONDS * 1000),
        **client_security(settings),
    )

    async def ask() -> tuple[dict[str, Any], list[dict[str, Any]]]:
        await admin.start()
        cluster = await admin.describe_cluster()
        topics = await admin.describe_topics(await admin.list_topics())
        return cluster, topics

    try:
        cluster, described = await _within(ask)
    except Exception as exc:  # any failure is the answer: Kafka is not reachable
        return KafkaHealth(bootstrap=bootstrap, reachable=False, error=_error(exc))
    finally:
        await admin.close()
    brokers = [
        Broker(
            node_id=b["node_id"],
            host=b["host"],
            port=b["port"],
            controller=b["node_id"] == cluster["controller_id"],
        )
        for b in sorted(cluster["brokers"], key=lambda b: b["node_id"])
    ]
    topics = [_topic_health(t) for t in sorted(described, key=lambda t: t["topic"])]
    return KafkaHealth(
        bootstrap=bootstrap,
        reachable=True,
        brokers=brokers,
        topics=topics,
        under_replicated_partitions=sum(len(t.under_replicated) for t in topics),
        offline_partitions=sum(len(t.offline) for t in topics),
    )


def _topic_health(topic: dict[str, Any]) -> TopicHealth:
    """One topic of a Metadata answer (aiokafka's ``describe_topics`` shape)."""
    partitions = sorted(topic["partitions"], key=lambda p: p["partition"])
    return TopicHealth(
        topic=topic["topic"],
        partitions=len(partitions),
        replication_factor=len(partitions[0]["replicas"]) if partitions else 0,
        under_replicated=[p["partition"] for p in partitions if set(p["replicas"]) - set(p["isr"])],
        offline=[p["partition"] for p in partitions if p["leader"] < 0],
    )


async def redis_health(store: MessageStore) -> RedisHealth:
    """The store's Redis primary (never raises); ``used: false`` for another store."""
    if not isinstance(store, RedisMessageStore):
        return RedisHealth(used=False)
    try:
        info = await _within(store.server_info)
    except Exception as exc:  # any failure is the answer: Redis is not reachable
        return RedisHealth(used=True, error=_error(exc))
    return RedisHealth(
        used=True,
        reachable=True,
        address=str(info["address"]),
        role=str(info.get("role")),
        version=str(info.get("redis_version")),
        connected_replicas=int(info.get("connected_slaves", 0)),
        used_memory_bytes=int(info.get("used_memory", 0)),
        maxmemory_bytes=int(info.get("maxmemory", 0)),
    )


async def postgres_health(users: AdminUsers) -> PostgresHealth:
    """PostgreSQL's version and how long asking for it took (never raises)."""
    pool = users.pool

    async def version(conn: Connection) -> str:
        cursor = await conn.execute("SELECT version()")
        row = await cursor.fetchone()
        return "" if row is None else str(row[0])

    started = time.monotonic()
    try:
        found = await _within(lambda: pool.run("version", version))
    except Exception as exc:  # any failure is the answer: PostgreSQL is not reachable
        return PostgresHealth(address=pool.address, reachable=False, error=_error(exc))
    return PostgresHealth(
        address=pool.address,
        reachable=True,
        version=found,
        latency_ms=round((time.monotonic() - started) * 1000, 1),
    )


async def show_stat(socket: Path) -> str:
    """HAProxy's answer to ``show stat`` on its stats ``socket`` (a CSV table whose header
    starts with ``# ``). Raises ``OSError`` or ``TimeoutError`` when it does not answer."""

    async def ask() -> bytes:
        reader, writer = await asyncio.open_unix_connection(str(socket))
        try:
            writer.write(b"show stat\n")
            await writer.drain()
            return await reader.read()
        finally:
            writer.close()

    return (await _within(ask)).decode("utf-8", errors="replace")


def rotation(socket: Path, table: str) -> list[RotationEntry]:
    """The servers of a ``show stat`` ``table`` (frontend and backend totals left out)."""
    rows = csv.DictReader(io.StringIO(table.removeprefix("# ")))
    return [
        RotationEntry(
            haproxy=str(socket),
            backend=row["pxname"],
            server=row["svname"],
            status=row["status"],
            in_rotation=row["status"].startswith("UP"),
        )
        for row in rows
        if row.get("svname") not in (None, "FRONTEND", "BACKEND")
    ]


async def haproxy_health(sockets: list[Path]) -> HaproxyHealth:
    """Every ingest node listener of every HAProxy process (never raises)."""
    health = HaproxyHealth(configured=bool(sockets))
    for socket in sockets:
        try:
            health.servers += rotation(socket, await show_stat(socket))
        except (OSError, TimeoutError) as exc:
            health.errors.append(f"{socket}: {_error(exc)}")
    return health


def node_usage(sampler: StatsSampler) -> list[NodeUsage]:
    """Each probed process's CPU and resident memory, from its latest probe."""
    usage = []
    for probe in sampler.probes:
        rss = probe.samples.get("process_resident_memory_bytes")
        usage.append(
            NodeUsage(
                name=probe.endpoint.name,
                service=probe.service,
                node_id=probe.node_id,
                reachable=probe.error is None,
                cpu_percent=sampler.cpu_percent.get(probe.endpoint.name),
                rss_bytes=None if not rss else int(probe.total("process_resident_memory_bytes")),
            )
        )
    return usage


async def infrastructure(
    settings: Settings, store: MessageStore, users: AdminUsers, sampler: StatsSampler
) -> Infrastructure:
    """Every part asked at once (within :data:`ASK_SECONDS` each)."""
    kafka, redis, postgres, haproxy = await asyncio.gather(
        kafka_health(settings),
        redis_health(store),
        postgres_health(users),
        haproxy_health(settings.admin_haproxy_stats_sockets),
    )
    return Infrastructure(
        checked_at=datetime.now(UTC),
        kafka=kafka,
        redis=redis,
        postgres=postgres,
        haproxy=haproxy,
        nodes=node_usage(sampler),
    )
