"""Redis with replicas and Sentinels (as ElastiCache with failover): device_persist follows
the new primary, never commits a Kafka offset for a store write a failover could drop, and
delivers again while the killed primary is still down.

A write of the Redis store counts as done only once a replica has it (``WAIT 1``, the
store's ``wait_replicas``); device_persist commits the offsets of a batch only once its
writes are done. So a record whose write no replica confirms is read again, and a
failover, which promotes the most up-to-date replica, cannot drop a write behind a
committed offset. With two replicas, the promoted one still has a replica to confirm its
writes while the killed node is down (with one, every write waited for its return).
"""

from __future__ import annotations

import asyncio
import time

import aiomqtt
import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from services.common.kafka.names import TopicNames
from services.local import redis
from tests.e2e.clients import HOST, TIMEOUT, aio_client, collect, unique
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


def test_kill_9_of_the_redis_primary_loses_nothing_acknowledged(topology: LocalCluster) -> None:
    settings = topology.settings
    with load(topology) as running:
        wait_for_traffic(running)
        old = redis.primary(settings)
        assert old is not None
        killed_at = time.monotonic()
        assert topology.kill(redis.node_name(settings, old))
        wait_until(lambda: redis.primary(settings) not in (None, old), "a failover", RESUME_BOUND)
        note("Sentinels promoted the replica", time.monotonic() - killed_at)
        # Back as a replica of the new primary: device_persist's writes are confirmed again.
        topology.start(redis.node_name(settings, old))
        assert redis.primary(settings) not in (None, old)
        note("deliveries resumed after the kill", wait_for_delivery_since(running, killed_at))
        report = finish(running)
    assert report.lost == 0, report


def test_deliveries_resume_while_the_killed_redis_primary_is_still_down(
    topology: LocalCluster,
) -> None:
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
            resumed = wait_for_delivery_since(running, killed_at)
            assert topology.pid(name) is None  # delivered again without the killed node
            note("deliveries resumed with the killed primary still down", resumed)
        finally:
            topology.start(name)
        report = finish(running)
    assert report.lost == 0, report
