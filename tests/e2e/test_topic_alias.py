"""Topic Alias, client to server (MQTT 5.0 3.3.2.3.4), through the whole cluster."""

from __future__ import annotations

import threading

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.e2e.clients import HOST, TIMEOUT, aio_client, collect, unique
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
