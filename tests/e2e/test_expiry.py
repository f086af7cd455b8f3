"""Message Expiry Interval on delivery (MQTT 5.0 3.3.2.3.3) through the whole cluster.

A slow consumer (Receive Maximum 1, holding its first message unacknowledged) makes the
next messages wait in the ingest node; one whose interval passes while it waits is never
sent [MQTT-3.3.2-5], one still alive is sent with the interval that is left [MQTT-3.3.2-6].
"""

from __future__ import annotations

import time

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.e2e.clients import TIMEOUT, PahoClient, unique
from tests.servers import LocalCluster

pytestmark = pytest.mark.cluster

#: Seconds the first message is held unacknowledged: longer than the short expiry below.
HOLD = 2.0


def _expiring(seconds: int) -> Properties:
    props = Properties(PacketTypes.PUBLISH)
    props.MessageExpiryInterval = seconds
    return props


def test_a_message_expired_behind_a_slow_consumer_is_not_delivered(
    cluster: LocalCluster,
) -> None:
    node1, node2 = cluster.node_ports
    topic = unique("e2e/expiry")
    slow = PahoClient(node1, unique("slow"), receive_maximum=1, manual_ack=True)
    publisher = PahoClient(node2, unique("pub"))
    try:
        assert slow.connect() == 0
        assert [rc.value for rc in slow.subscribe(topic, 1)] == [1]
        assert publisher.connect() == 0
        publisher.publish(topic, b"held", 1)
        publisher.publish(topic, b"expires", 1, _expiring(1))
        publisher.publish(topic, b"keeps", 1, _expiring(60))
        publisher.publish(topic, b"marker", 0)  # QoS 0 does not wait for the window
        held = slow.messages.get(timeout=TIMEOUT)
        assert held.payload == b"held"
        # While "held" is unacknowledged the window of one is full: the QoS 0 message sent
        # after the others overtakes them.
        assert slow.messages.get(timeout=TIMEOUT).payload == b"marker"
        # "expires" outlives its interval waiting in the node: an interval is wall time,
        # so let it pass (no synchronisation).
        time.sleep(HOLD)
        slow.ack(held)
        kept = slow.messages.get(timeout=TIMEOUT)
        assert kept.payload == b"keeps"  # "expires", before it in order, was dropped
        # It waited at least HOLD seconds: the interval sent says so (rounded up).
        assert kept.properties.MessageExpiryInterval <= 60 - int(HOLD)  # type: ignore[union-attr]
        slow.ack(kept)
        publisher.publish(topic, b"last", 1)
        assert slow.messages.get(timeout=TIMEOUT).payload == b"last"  # nothing else came
    finally:
        slow.close()
        publisher.close()
