"""Delayed publication through the whole cluster (issue 28.2, docs/concepts/delayed-publish.md):
``PUBLISH $delayed/<seconds>/<topic>`` from mosquitto_pub arrives at an aiomqtt subscriber
on ``<topic>`` once, after its delay, also when the ingest node holding it is killed with
SIGKILL while it waits (``disruptive``: that test runs last and restarts the node).

"Not before its delay" is proven by order: a marker the same client publishes right after
the delayed message's PUBACK arrives first (had the delayed message been published at once,
its ``msg.all`` record would precede the marker's, MQTT 4.6). "Once" likewise: once
``msg.delayed`` holds no waiting message of the client, a second marker arrives with
nothing before it.
"""

from __future__ import annotations

import time

import aiomqtt
import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment

from services.common.kafka.names import TopicNames
from services.common.kafka.partitioner import partition_of
from services.common.records import parse_delayed
from tests.e2e.clients import aio_client, collect, mosquitto_pub, unique, until_marker
from tests.e2e.kafka_view import waiting_of
from tests.servers import LocalCluster
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

NODE = "ingest-node1"
NODE_ID = "node1"

#: Seconds node 1's msg.delayed partitions take to move to node 2 after a kill: the
#: consumer session timeout and a rebalance, with room for a loaded machine.
TAKEOVER = 15.0


async def _waiting(cluster: LocalCluster, client_id: str) -> int:
    """How many delayed messages of ``client_id`` wait in ``msg.delayed`` now."""
    names = TopicNames.from_settings(cluster.settings)
    return await waiting_of(cluster, names.msg_delayed, parse_delayed, client_id)


async def _waiting_is(cluster: LocalCluster, client_id: str, count: int) -> bool:
    return await _waiting(cluster, client_id) == count


def _publish(port: int, client_id: str, topic: str, message: str) -> None:
    """``mosquitto_pub`` a v5 QoS 1 message; returns once it got its positive PUBACK."""
    done = mosquitto_pub(port, topic, message, qos=1, version=5, client_id=client_id)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "received PUBACK (Mid: 1, RC:0)" in done.stdout, done.stdout


async def _delivered_once(
    cluster: LocalCluster, watcher: aiomqtt.Client, port: int, client_id: str, topic: str
) -> None:
    """Once ``msg.delayed`` holds nothing of ``client_id``, a marker it publishes arrives
    with nothing before it: the delayed message was not published a second time."""
    await wait_for(lambda: _waiting_is(cluster, client_id, 0), "the delayed message's tombstone")
    _publish(port, client_id, topic, "after")
    assert await until_marker(watcher, b"after") == []


async def test_a_delayed_message_arrives_once_after_its_delay(cluster: LocalCluster) -> None:
    node1, node2 = cluster.node_ports
    publisher = unique("delayer")
    topic = unique("e2e/delayed")
    delay = 3
    async with aio_client(node2, unique("watcher")) as watcher:
        await watcher.subscribe(topic, qos=1)
        _publish(node1, publisher, f"$delayed/{delay}/{topic}", "later")
        acked_at = time.monotonic()
        _publish(node1, publisher, topic, "now")
        assert await until_marker(watcher, b"now") == []  # not published at once
        [delayed] = await collect(watcher, 1, timeout=delay + TAKEOVER)
        assert time.monotonic() - acked_at >= delay
        assert (str(delayed.topic), delayed.payload, delayed.qos) == (topic, b"later", 1)
        await _delivered_once(cluster, watcher, node1, publisher, topic)


async def _partitions_of(cluster: LocalCluster, group: str, node_id: str) -> set[int]:
    """The partitions static member ``node_id`` of consumer ``group`` holds now (Kafka names
    a static member ``<group.instance.id>-<uuid>``); empty while the group rebalances."""
    admin = AIOKafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
    await admin.start()
    try:
        [description] = await admin.describe_consumer_groups([group])
        [_, _, state, _, _, members, *_] = description.groups[0]
        if state != "Stable":
            return set()
        for member_id, *_, assignment in members:
            if member_id.startswith(f"{node_id}-"):
                decoded = ConsumerProtocolMemberAssignment.decode(assignment)
                return {p for _, partitions in decoded.assignment for p in partitions}
        return set()
    finally:
        await admin.close()


@pytest.mark.disruptive
async def test_a_delayed_message_survives_a_kill_of_the_node_holding_it(
    cluster: LocalCluster,
) -> None:
    _, node2 = cluster.node_ports
    settings = cluster.settings
    group = TopicNames.from_settings(settings).delayed_group
    held: set[int] = set()

    async def node1_holds_partitions() -> bool:
        held.update(await _partitions_of(cluster, group, NODE_ID))
        return bool(held)

    await wait_for(node1_holds_partitions, "node 1's msg.delayed partitions")
    # A publisher whose messages wait in a partition node 1 holds.
    publisher = next(
        client_id
        for client_id in (unique("held") for _ in range(1000))
        if partition_of(client_id, settings.state_topic_partitions) in held
    )
    topic = unique("e2e/delayed-kill")
    delay = 10  # room for the checks before the kill
    try:
        async with aio_client(node2, unique("watcher")) as watcher:
            await watcher.subscribe(topic, qos=1)
            _publish(node2, publisher, f"$delayed/{delay}/{topic}", "survived")
            acked_at = time.monotonic()
            assert await _waiting(cluster, publisher) == 1  # in Kafka before its PUBACK
            assert cluster.kill(NODE)
            # Else node 1 may have published it itself: the test would prove nothing.
            assert time.monotonic() - acked_at < delay, "node 1 killed after it was due"
            [delayed] = await collect(watcher, 1, timeout=delay + TAKEOVER)
            assert time.monotonic() - acked_at >= delay
            assert cluster.pid(NODE) is None  # published by node 2: node 1 is still down
            assert delayed.payload == b"survived"
            await _delivered_once(cluster, watcher, node2, publisher, topic)
    finally:
        cluster.start(NODE)
