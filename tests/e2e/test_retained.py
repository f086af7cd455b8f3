"""Retained messages end to end (MQTT 3.3.1.3, MQTT 5.0 3.8.3.1 Retain Handling, 4.8.2).

A retained PUBLISH acknowledged before a SUBSCRIBE is delivered on that SUBSCRIBE, to a
client on either node, with RETAIN set; live messages keep RETAIN only with Retain As
Published; an empty retained PUBLISH deletes; Shared Subscriptions get none.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Iterator

import aiomqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from tests.e2e.clients import aio_client, collect, unique, until_marker
from tests.servers import LocalCluster

pytestmark = pytest.mark.cluster

#: Seconds a router continued after a pause may take to route again (it may have to rejoin
#: its consumer group first).
ROUTER_BACK = 60.0


def _options(retain_handling: int = 0, rap: bool = False) -> SubscribeOptions:
    return SubscribeOptions(qos=1, retainHandling=retain_handling, retainAsPublished=rap)


@pytest.mark.parametrize("version", [4, 5], ids=["v311", "v5"])
async def test_a_retained_message_reaches_a_later_subscriber_on_the_other_node(
    cluster: LocalCluster, version: int
) -> None:
    node1, node2 = cluster.node_ports
    base = unique("e2e/retained")
    async with aio_client(node1, unique("pub"), version) as pub:
        await pub.subscribe(f"{base}/#", qos=1)
        await pub.publish(f"{base}/a", b"kept a", qos=1, retain=True)
        await pub.publish(f"{base}/b", b"kept b", qos=1, retain=True)
        await pub.publish(f"{base}/a", b"newer a", qos=1, retain=True)  # replaces
        await collect(pub, 3)  # routed: none of them can reach the subscriber live
        async with aio_client(node2, unique("sub"), version) as sub:
            await sub.subscribe(f"{base}/+", qos=1)
            got = await collect(sub, 2)
            assert sorted((str(m.topic), m.payload, m.retain) for m in got) == [
                (f"{base}/a", b"newer a", True),
                (f"{base}/b", b"kept b", True),
            ]
            await pub.publish(f"{base}/a", b"live", qos=1)
            [live] = await collect(sub, 1)
            assert (live.payload, live.retain) == (b"live", False)


async def test_an_empty_retained_message_deletes_it(cluster: LocalCluster) -> None:
    node1, node2 = cluster.node_ports
    topic = unique("e2e/retained-del")
    async with aio_client(node1, unique("pub")) as pub:
        await pub.publish(topic, b"soon gone", qos=1, retain=True)
        await pub.publish(topic, b"", qos=1, retain=True)
        async with aio_client(node2, unique("sub")) as sub:
            await sub.subscribe(topic, qos=1)
            await _no_retained(sub, topic)


async def _no_retained(client: aiomqtt.Client, topic: str) -> None:
    """Assert that no message with RETAIN reaches ``client`` on its SUBSCRIBE to ``topic``.

    Proven by order: the subscriber's own PUBLISH after its SUBACK follows its retained
    message request (one client id, one ``msg.all`` partition), so any retained message
    would come before it. The router applies the newest subscriptions to every message it
    routes, so a live message published just before the SUBSCRIBE may still reach the new
    subscriber (with RETAIN 0: at least what MQTT asks for, never less).
    """
    await client.publish(topic, b"marker", qos=1)
    for message in await until_marker(client, b"marker"):
        assert not message.retain, f"retained message {message.payload!r}"


async def test_retain_handling_and_retain_as_published(cluster: LocalCluster) -> None:
    node1, node2 = cluster.node_ports
    base = unique("e2e/rh")
    async with aio_client(node1, unique("pub")) as pub:
        await pub.subscribe(f"{base}/t", qos=1)
        await pub.publish(f"{base}/t", b"r", qos=1, retain=True)
        await collect(pub, 1)  # routed: it cannot reach the subscriber live
        async with aio_client(node2, unique("sub")) as sub:
            await sub.subscribe(f"{base}/t", options=_options(retain_handling=2))
            await sub.publish(f"{base}/t", b"marker", qos=1)  # its own: ordered after
            assert await until_marker(sub, b"marker") == []  # 2: never on subscribe
            await sub.subscribe(f"{base}/#", options=_options(retain_handling=1))
            [first] = await collect(sub, 1)  # 1: a new subscription gets it ...
            assert (first.payload, first.retain) == (b"r", True)
            await sub.subscribe(f"{base}/#", options=_options(retain_handling=1))
            await sub.publish(f"{base}/t", b"marker", qos=1)
            assert await until_marker(sub, b"marker") == []  # ... an existing one does not
            await sub.subscribe(f"{base}/#", options=_options(retain_handling=0, rap=True))
            [again] = await collect(sub, 1)  # 0: every SUBSCRIBE
            assert again.retain is True
            await pub.publish(f"{base}/t", b"live", qos=1, retain=True)
            # Matched by two subscriptions: one delivery; Retain As Published keeps RETAIN.
            [live] = await collect(sub, 1)
            assert (live.payload, live.retain) == (b"live", True)


async def test_shared_subscriptions_get_no_retained_messages(cluster: LocalCluster) -> None:
    node1, node2 = cluster.node_ports
    topic = unique("e2e/rshare")
    async with aio_client(node1, unique("pub")) as pub:
        await pub.publish(topic, b"r", qos=1, retain=True)
        async with aio_client(node2, unique("sub")) as sub:
            await sub.subscribe(f"$share/g/{topic}", qos=1)
            await _no_retained(sub, topic)  # MQTT 4.8.2


async def test_an_expired_retained_message_is_not_delivered(cluster: LocalCluster) -> None:
    node1, node2 = cluster.node_ports
    base = unique("e2e/rexp")
    expiring = Properties(PacketTypes.PUBLISH)
    expiring.MessageExpiryInterval = 1
    lasting = Properties(PacketTypes.PUBLISH)
    lasting.MessageExpiryInterval = 600
    async with aio_client(node1, unique("pub")) as pub:
        await pub.publish(f"{base}/short", b"x", qos=1, retain=True, properties=expiring)
        await pub.publish(f"{base}/long", b"y", qos=1, retain=True, properties=lasting)
        async with aio_client(node2, unique("sub")) as sub:
            await sub.subscribe(f"{base}/long", qos=1)
            [kept] = await collect(sub, 1)  # the clock runs ...
            interval = kept.properties.MessageExpiryInterval  # type: ignore[union-attr]
            assert 0 < interval <= 600
        # A Message Expiry Interval is wall time: let it pass (this is no synchronisation).
        await asyncio.sleep(1.2)
        async with aio_client(node2, unique("sub")) as sub:
            await sub.subscribe(f"{base}/#", qos=1)
            got = await collect(sub, 1)
            await sub.publish(f"{base}/marker", b"marker", qos=1)
            assert await until_marker(sub, b"marker") == []
    assert [m.payload for m in got] == [b"y"]  # ... and the 1 s one is gone


async def test_a_retained_publish_acknowledged_before_a_subscribe_arrives_once(
    cluster: LocalCluster,
) -> None:
    """Exactly one copy, the retained one (MQTT 3.3.1.3; Mosquitto does the same), also when
    the router reads the new subscription before it routes the PUBLISH (issue 22.2). The
    routers are paused (SIGSTOP) from before the PUBLISH until after the SUBACK, so they
    route the PUBLISH knowing the subscription: before the subscription's cut, that gave a
    live copy (RETAIN 0) besides the retained one. A marker from the same publisher, routed
    after the PUBLISH, proves that no live copy follows."""
    node1, node2 = cluster.node_ports
    topic = unique("e2e/rpersist")
    client = aiomqtt.Client(
        "127.0.0.1",
        node2,
        identifier=unique("psub"),
        protocol=aiomqtt.ProtocolVersion.V311,
        clean_session=False,
    )
    async with aio_client(node1, unique("pub")) as pub, contextlib.AsyncExitStack() as stack:
        with _paused(cluster, "router"):
            await pub.publish(topic, b"for the store", qos=1, retain=True)
            sub = await stack.enter_async_context(client)
            await sub.subscribe(topic, qos=1)
        # A router paused past its consumer group's session timeout rejoins the group first.
        [received] = await collect(sub, 1, ROUTER_BACK)
        await pub.publish(topic, b"marker", qos=1)
        assert await until_marker(sub, b"marker") == []
    assert (received.payload, received.qos, received.retain) == (b"for the store", 1, True)


@contextlib.contextmanager
def _paused(cluster: LocalCluster, stage: str) -> Iterator[None]:
    """Every running process of ``stage`` stopped (SIGSTOP) inside the block, continued
    (SIGCONT) after it, however the block ends."""
    pids = [
        pid
        for name in cluster.names()
        if name == stage or name.startswith(f"{stage}-")
        if (pid := cluster.pid(name)) is not None
    ]
    assert pids, f"no {stage} runs"
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
