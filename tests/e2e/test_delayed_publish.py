"""Delayed publication through the whole cluster (issue 28.2, docs/concepts/delayed-publish.md):
``PUBLISH $delayed/<seconds>/<topic>`` from mosquitto_pub arrives at an aiomqtt subscriber
on ``<topic>`` once, after its delay, also when the ingest node holding it is killed with
SIGKILL while it waits (``disruptive``: that test runs last and restarts the node).

"Not before its delay" is proven by order: a marker the same client publishes right after
the delayed message's PUBACK arrives first (had the delayed message been published at once,
its ``msg.all`` record would precede the marker's, MQTT 4.6). "Once" likewise: once
``msg.delayed`` holds no waiting message of the client, a second marker arrives with
nothing before it.

Bounded: the test cluster lets a client have :data:`~tests.servers.DELAYED_PER_CLIENT`
delayed messages waiting; paho's next one gets PUBACK 0x97 Quota exceeded.

A cancel racing the due time gets the one true answer: the test cluster holds publications
to :data:`~tests.servers.DELAYED_HELD_PREFIX` topics open before committing them; a DELETE
made once the held publication's ``msg.all`` record is written (read uncommitted: the order
is Kafka's, no clock) is answered 409 published, and the message arrives once.
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
from services.local.settings import LocalSettings
from tests.e2e.admin import AdminApi, admin_api, running
from tests.e2e.clients import (
    PahoClient,
    aio_client,
    collect,
    mosquitto_pub,
    unique,
    until_marker,
)
from tests.e2e.kafka_view import TopicTail, waiting_of
from tests.servers import DELAYED_HELD_PREFIX, DELAYED_PER_CLIENT, LocalCluster
from tests.waiting import wait_for, wait_until

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


def test_a_delayed_publish_over_the_clients_bound_gets_0x97(cluster: LocalCluster) -> None:
    publisher = PahoClient(cluster.mqtt_port, unique("bounded"))
    assert publisher.connect() == 0
    try:
        # Due in an hour: they wait for the rest of the suite, to a topic nobody reads.
        topic = f"$delayed/3600/{unique('e2e/bounded')}"
        mids = [publisher.client.publish(topic, b"x", 1).mid for _ in range(DELAYED_PER_CLIENT + 1)]
        wait_until(lambda: set(mids) <= set(publisher.snapshot()[0]), "every PUBACK")
        pubacks, disconnects = publisher.snapshot()
        assert [pubacks[mid].value for mid in mids] == [0] * DELAYED_PER_CLIENT + [0x97]
        assert disconnects == []  # a v5 client is refused the one message, not disconnected
    finally:
        publisher.close()


@pytest.fixture(scope="module")
def api(settings: LocalSettings) -> AdminApi:
    """A logged-in admin user of the running test cluster."""
    return admin_api(running(settings))


async def test_a_cancel_racing_the_publication_is_answered_published_and_it_arrives_once(
    cluster: LocalCluster, api: AdminApi
) -> None:
    node1, node2 = cluster.node_ports
    names = TopicNames.from_settings(cluster.settings)
    publisher = unique("racer")
    topic = DELAYED_HELD_PREFIX + unique("race")
    async with aio_client(node2, unique("watcher")) as watcher:
        await watcher.subscribe(topic, qos=1)
        async with TopicTail.open(cluster.kafka_bootstrap, names.msg_all, False) as tail:
            _publish(node1, publisher, f"$delayed/1/{topic}", "raced")
            [waiting] = api.get("/api/delayed", client_id=publisher)["items"]
            # Its holder's publication is under way: written to msg.all, not committed.
            await tail.next_with_key(publisher.encode())
            answer = api.call("DELETE", f"/api/delayed/{waiting['id']}")
        assert answer.status_code == 409, answer.text
        assert "was published already" in answer.json()["detail"]
        [message] = await collect(watcher, 1)
        assert message.payload == b"raced"
        await _delivered_once(cluster, watcher, node1, publisher, topic)
    assert api.call("DELETE", f"/api/delayed/{waiting['id']}").status_code == 409


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
