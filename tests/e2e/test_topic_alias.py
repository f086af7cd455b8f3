"""Topic Aliases through the whole cluster (MQTT 5.0 3.3.2.3.4): set by a publisher
(client to server), and assigned by the server to a subscriber that allows them."""

from __future__ import annotations

import threading

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.e2e.clients import HOST, TIMEOUT, PahoClient, aio_client, collect, unique
from tests.servers import LocalCluster

pytestmark = pytest.mark.cluster


def _alias(value: int) -> Properties:
    props = Properties(PacketTypes.PUBLISH)
    props.TopicAlias = value
    return props


async def test_a_publisher_sets_and_reuses_topic_aliases(cluster: LocalCluster) -> None:
    node1, node2 = cluster.node_ports
    base = unique("e2e/alias")
    connack: dict[str, object] = {}
    connected = threading.Event()

    def on_connect(_c: object, _u: object, _f: object, rc: object, props: object) -> None:
        connack["maximum"] = getattr(props, "TopicAliasMaximum", None)
        connected.set()

    publisher = paho.Client(
        CallbackAPIVersion.VERSION2, client_id=unique("apub"), protocol=paho.MQTTv5
    )
    publisher.on_connect = on_connect
    publisher.connect(HOST, node2)
    publisher.loop_start()
    try:
        assert connected.wait(TIMEOUT)
        assert connack["maximum"] == cluster.settings.topic_alias_maximum > 0
        async with aio_client(node1, unique("asub")) as sub:
            await sub.subscribe(f"{base}/#", qos=1)
            sends = [
                (f"{base}/a", b"1", 1),  # sets alias 1
                ("", b"2", 1),  # alias 1 only
                (f"{base}/b", b"3", 2),  # sets alias 2
                ("", b"4", 2),
                ("", b"5", 1),
                (f"{base}/c", b"6", 1),  # alias 1 remapped
                ("", b"7", 1),
            ]
            for topic, payload, alias in sends:
                publisher.publish(topic, payload, qos=1, properties=_alias(alias)).wait_for_publish(
                    TIMEOUT
                )
            got = [(str(m.topic), m.payload) for m in await collect(sub, len(sends))]
    finally:
        publisher.loop_stop()
        publisher.disconnect()
    assert got == [
        (f"{base}/a", b"1"),
        (f"{base}/a", b"2"),
        (f"{base}/b", b"3"),
        (f"{base}/b", b"4"),
        (f"{base}/a", b"5"),
        (f"{base}/c", b"6"),
        (f"{base}/c", b"7"),
    ]


@pytest.mark.parametrize("qos", [0, 1])
def test_a_subscriber_that_allows_topic_aliases_gets_server_assigned_ones(
    cluster: LocalCluster, qos: int
) -> None:
    """The Topic Name goes once with a new alias, then the alias alone; with the client's
    Topic Alias Maximum of 2 reached, the least recently used alias is reassigned."""
    node1, node2 = cluster.node_ports
    base = unique("e2e/alias-out")
    subscriber = PahoClient(node1, unique("asub"), topic_alias_maximum=2)
    plain = PahoClient(node1, unique("plain"))  # allows none: full Topic Names
    publisher = PahoClient(node2, unique("apub"))
    sends = [("a", b"1"), ("a", b"2"), ("b", b"3"), ("c", b"4"), ("a", b"5"), ("c", b"6")]
    try:
        for client in (subscriber, plain):
            assert client.connect() == 0
            assert [rc.value for rc in client.subscribe(f"{base}/#", qos)] == [qos]
        assert publisher.connect() == 0
        for level, payload in sends:
            publisher.client.publish(f"{base}/{level}", payload, qos).wait_for_publish(TIMEOUT)
        wire = []
        for _ in sends:
            message = subscriber.messages.get(timeout=TIMEOUT)
            alias = getattr(message.properties, "TopicAlias", None)
            wire.append((message.topic, alias, message.payload))
        full = [plain.messages.get(timeout=TIMEOUT) for _ in sends]
    finally:
        for client in (subscriber, plain, publisher):
            client.close()
    assert wire == [
        (f"{base}/a", 1, b"1"),
        ("", 1, b"2"),
        (f"{base}/b", 2, b"3"),
        (f"{base}/c", 1, b"4"),  # a was least recently used: its alias goes to c
        (f"{base}/a", 2, b"5"),  # b's now
        ("", 1, b"6"),
    ]
    assert [(m.topic, getattr(m.properties, "TopicAlias", None)) for m in full] == [
        (f"{base}/{level}", None) for level, _ in sends
    ]
