"""Redis with replicas and Sentinels (as ElastiCache with failover): device_persist follows
the new primary, never commits a Kafka offset for a store write no replica confirmed,
re-applies from Kafka what a failover dropped all the same, and delivers again while the
killed primary is still down.

A write of the Redis store counts as done only once a replica has it (``WAIT 1``, the
store's ``wait_replicas``); device_persist commits the offsets of a batch only once its
writes are done. That is not enough: the Sentinels may promote the other replica, one
that had not confirmed the write yet, and the replica that had confirmed it then
resynchronises from the new primary in full and drops it
(:func:`test_a_write_a_replica_confirmed_and_a_failover_dropped_is_reapplied_from_kafka`).
With two replicas, the promoted one still has a replica to confirm its writes while the
killed node is down (with one, every write waited for its return).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import aiomqtt
import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from redis import Redis

from services.common.kafka.names import TopicNames
from services.local import redis
from tests.e2e.clients import HOST, TIMEOUT, aio_client, collect, unique, until_marker
from tests.e2e.kafka_view import TopicTail
from tests.servers import LocalCluster
from tests.topology.load import (
    RESUME_BOUND,
    finish,
    load,
    note,
    wait_for_delivery_since,
    wait_for_traffic,
)
from tests.waiting import wait_for, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.disruptive]


async def _committed(cluster: LocalCluster, group: str, tp: TopicPartition) -> int | None:
    """The offset ``group`` committed for ``tp`` (None: none)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    meta = offsets.get(tp)
    return None if meta is None else meta.offset


def _node(cluster: LocalCluster, node: int, *command: object) -> Any:
    """Redis node ``node``'s reply to ``command``."""
    settings = cluster.settings
    password = settings.redis_password
    client = Redis(
        host=HOST,
        port=redis.node_port(settings, node),
        password=None if password is None else password.get_secret_value(),
        socket_timeout=5.0,
    )
    try:
        return client.execute_command(*command)  # type: ignore[no-untyped-call]
    finally:
        client.close()


def _sentinels_see_priority(cluster: LocalCluster, node: int, priority: int) -> bool:
    """Whether every Sentinel knows node ``node``'s replica priority to be ``priority``."""
    settings = cluster.settings
    port = redis.node_port(settings, node)
    for sentinel in redis.sentinel_ids(settings):
        client = Redis(host=HOST, port=redis.sentinel_port(settings, sentinel), socket_timeout=5.0)
        try:
            replicas = client.execute_command(  # type: ignore[no-untyped-call]
                "SENTINEL", "REPLICAS", settings.redis_sentinel_master
            )
        finally:
            client.close()
        seen = [_fields(r) for r in replicas]
        wanted = {"port": str(port), "slave-priority": str(priority)}
        if not any(wanted.items() <= r.items() for r in seen):
            return False
    return True


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _fields(reply: Any) -> dict[str, str]:
    """A Sentinel's description of a replica (a flat list, or redis-py's dict) as text."""
    pairs = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2], strict=True)
    return {_text(k): _text(v) for k, v in pairs}


def _offset(cluster: LocalCluster, node: int) -> int:
    """Node ``node``'s replication offset (``ROLE``: a primary's, or what a replica has)."""
    role = _node(cluster, node, "ROLE")
    return int(role[1] if role[0] == b"master" else role[4])


def _replicas(cluster: LocalCluster) -> list[str]:
    primary = redis.primary(cluster.settings)
    nodes = [n for n in redis.node_ids(cluster.settings) if n != primary]
    return [redis.node_name(cluster.settings, node) for node in nodes]


async def test_no_offset_is_committed_for_a_store_write_no_replica_confirmed(
    topology: LocalCluster,
) -> None:
    names = TopicNames.from_settings(topology.settings)
    group = names.service_group("device-persist")
    subscriber_id, topic = unique("replicated"), unique("replicated/topic")
    replicas = _replicas(topology)
    log = topology.log("device-persist")
    persistent = aiomqtt.Client(
        HOST,
        topology.mqtt_port,
        identifier=subscriber_id,
        protocol=aiomqtt.ProtocolVersion.V311,
        clean_session=False,
        timeout=TIMEOUT,
    )
    async with persistent as sub, aio_client(topology.mqtt_port, unique("pub"), 4) as pub:
        await sub.subscribe(topic, qos=1)
        await pub.publish(topic, b"confirmed", qos=1)
        assert [m.payload for m in await collect(sub, 1)] == [b"confirmed"]
        async with TopicTail.open(topology.kafka_bootstrap, names.msg_persisted) as tail:
            assert all([topology.stop(replica) for replica in replicas])
            try:
                seen = log.stat().st_size
                await pub.publish(topic, b"unconfirmed", qos=1)  # acknowledged: in Kafka
                record = await tail.next_with_key(subscriber_id.encode())
                # device_persist stored it on the primary alone, and failed the batch.
                await wait_for(
                    lambda: "confirmed by 0 of 1 replicas" in log.read_text()[seen:],
                    "device_persist refusing a write no replica confirmed",
                )
                tp = TopicPartition(record.topic, record.partition)
                committed = await _committed(topology, group, tp)
                assert committed is None or committed <= record.offset
            finally:
                for replica in replicas:
                    await asyncio.to_thread(topology.start, replica)
        [message] = await collect(sub, 1, timeout=RESUME_BOUND)
        assert message.payload == b"unconfirmed"

        async def moved_on() -> bool:
            committed = await _committed(topology, group, tp)
            return committed is not None and committed > record.offset

        await wait_for(moved_on, "the offset committed once the replica confirmed", RESUME_BOUND)
        await sub.unsubscribe(topic)


def test_kill_9_of_the_redis_primary_loses_nothing_and_deliveries_resume_while_it_is_down(
    topology: LocalCluster,
) -> None:
    """The Sentinels promote a replica, deliveries resume while the killed primary is still
    down, the killed node rejoins as a replica (the new primary stays), nothing
    acknowledged is lost."""
    settings = topology.settings
    with load(topology) as running:
        wait_for_traffic(running)
        old = redis.primary(settings)
        assert old is not None
        name = redis.node_name(settings, old)
        killed_at = time.monotonic()
        assert topology.kill(name)
        try:
            wait_until(
                lambda: redis.primary(settings) not in (None, old), "a failover", RESUME_BOUND
            )
            note("Sentinels promoted the replica", time.monotonic() - killed_at)
            resumed = wait_for_delivery_since(running, killed_at)
            assert topology.pid(name) is None  # delivered again without the killed node
            note("deliveries resumed with the killed primary still down", resumed)
        finally:
            topology.start(name)
        # Back as a replica of the new primary: device_persist's writes are confirmed again.
        assert redis.primary(settings) not in (None, old)
        report = finish(running)
    assert report.lost == 0, report


async def test_a_write_a_replica_confirmed_and_a_failover_dropped_is_reapplied_from_kafka(
    topology: LocalCluster,
) -> None:
    """Primary A, replicas B and C. C falls behind (stopped, its link cut); message m2 is
    stored on A and confirmed by B (``WAIT 1``), and device_persist commits its offset
    (waited for: with little traffic a batch stays uncommitted, and a failure would have it
    read again anyway). A dies, the
    Sentinels promote C (B is not eligible: priority 0), B resynchronises from C in full:
    m2 is gone from every node (on the code before the fix it stayed gone). device_persist
    must store it again from Kafka, without waiting for a new message: the offline
    subscriber gets m1 and m2, then m3; the connected one, whose connection had been sent
    m2 from A, gets m3 (before the fix m3 reused m2's seq, below the connection's cursor,
    and nothing reached it again)."""
    settings = topology.settings
    a = redis.primary(settings)
    assert a is not None
    b, c = [n for n in redis.node_ids(settings) if n != a]
    topic = unique("dropped/topic")
    offline_id, live_id = unique("offline"), unique("live")

    def persistent(identifier: str) -> aiomqtt.Client:
        return aiomqtt.Client(
            HOST,
            topology.mqtt_port,
            identifier=identifier,
            protocol=aiomqtt.ProtocolVersion.V311,
            clean_session=False,
            timeout=TIMEOUT,
        )

    names = TopicNames.from_settings(settings)
    group = names.service_group("device-persist")
    filler_topic = unique("dropped/filler")
    async with persistent(offline_id) as offline:
        await offline.subscribe(topic, qos=1)
    async with persistent(unique("filler")) as filler:
        await filler.subscribe(filler_topic, qos=1)  # offline: its messages are stored
    c_pid = topology.pid(redis.node_name(settings, c))
    assert c_pid is not None
    _node(topology, b, "CONFIG", "SET", "replica-priority", "0")
    stopped = False
    try:
        async with (
            persistent(live_id) as live,
            aio_client(topology.mqtt_port, unique("p"), 4) as pub,
        ):
            await live.subscribe(topic, qos=1)
            await pub.publish(topic, b"m1", qos=1)
            assert [m.payload for m in await collect(live, 1, RESUME_BOUND)] == [b"m1"]
            await wait_for(lambda: _offset(topology, c) >= _offset(topology, a), "C in sync", 30)
            await wait_for(
                lambda: _sentinels_see_priority(topology, b, 0),
                "the Sentinels seeing B's priority",
                30,  # they ask each replica for its INFO every 10 s
            )
            # C falls behind: stopped, then its link cut, so it gets nothing more from A.
            [link] = _node(topology, c, "CLIENT", "LIST", "TYPE", "master").decode().splitlines()
            local = dict(f.split("=", 1) for f in link.split() if "=" in f)["laddr"]
            os.kill(c_pid, signal.SIGSTOP)
            stopped = True
            assert _node(topology, a, "CLIENT", "KILL", "ADDR", local) in (True, b"OK")
            async with TopicTail.open(topology.kafka_bootstrap, names.msg_persisted) as tail:
                await pub.publish(topic, b"m2", qos=1)
                record = await tail.next_with_key(offline_id.encode())
            assert [m.payload for m in await collect(live, 1)] == [b"m2"]  # stored, confirmed
            tp = TopicPartition(record.topic, record.partition)

            async def committed_past_m2() -> bool:
                # More batches, so that m2's settles and its offset is committed.
                await pub.publish(filler_topic, b"filler", qos=1)
                committed = await _committed(topology, group, tp)
                return committed is not None and committed > record.offset

            await wait_for(committed_past_m2, "m2's offset committed", RESUME_BOUND)
            assert topology.kill(redis.node_name(settings, a))
            os.kill(c_pid, signal.SIGCONT)
            stopped = False
            await wait_for(lambda: redis.primary(settings) == c, "C promoted", RESUME_BOUND)
            await wait_for(
                lambda: redis.in_sync(settings, b), "B resynchronised from C", RESUME_BOUND
            )
            # m2, which B had confirmed, is gone from B now (device_persist may have stored
            # it again on C already: it checks for a failover every second).
            await asyncio.to_thread(topology.start, redis.node_name(settings, a))
            async with persistent(offline_id) as offline:
                # Nothing new published: device_persist finds the failover by itself.
                got = await collect(offline, 2, RESUME_BOUND)
                assert [m.payload for m in got] == [b"m1", b"m2"]
                await pub.publish(topic, b"m3", qos=1)
                assert await until_marker(offline, b"m3", RESUME_BOUND) == []
                await offline.unsubscribe(topic)
            got = await until_marker(live, b"m3", RESUME_BOUND)
            # Sent again (DUP) at most: the failover may have dropped their PUBACKs too.
            assert {m.payload for m in got} <= {b"m1", b"m2"}
            await live.unsubscribe(topic)
    finally:
        if stopped:
            os.kill(c_pid, signal.SIGCONT)
        _node(topology, b, "CONFIG", "SET", "replica-priority", "100")
        if topology.pid(redis.node_name(settings, a)) is None:
            await asyncio.to_thread(topology.start, redis.node_name(settings, a))
