"""Crashes under a steady stream: what survives them, and who takes over.

Each test runs the bench's recovery probe (:func:`bench.recovery.measure_recovery`):
aiomqtt (paho-mqtt) MQTT 5 publishers whose client ids cover every ``msg.all`` partition,
each with its own subscriber (client ids covering every partition of the client-keyed
topics), one message every 50 ms each; a process is killed with SIGKILL while it flows.
The probe counts, over the whole stream, messages accepted (PUBACK or PUBCOMP with a
success Reason Code) and never delivered, deliveries of a message already delivered, and
first deliveries that came after a newer message of the same publisher.

- Kafka killed and started again: nothing accepted is lost and each publisher's messages
  arrive in order (MQTT 4.6), across the restart.
- The router killed mid-stream and started again, QoS 2 to persistent subscribers: no
  message is stored twice (the router's Kafka transactions), none is lost.
- Two instances of a stage, one killed and not started again: the group moves its
  partitions to the other, and delivery resumes on every partition.

How long each recovery takes is measured by ``python -m bench.recovery``, not asserted
here (docs/performance.md, "Recovery and the cost of exactly once"). Runs last
(``disruptive``); what a test kills is running again when it ends.
"""

from __future__ import annotations

from functools import partial

import pytest

from bench.recovery import ProbePath, RecoveryTimes, measure_recovery
from services.common.kafka.names import TopicNames
from tests.servers import LocalCluster
from tests.waiting import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.disruptive]

#: Seconds the probe waits for each of: flowing before the kill, delivery resuming after
#: it (or after the restart), the last accepted messages.
PROBE_TIMEOUT = 90.0


async def _probe(
    cluster: LocalCluster,
    victim: str,
    *,
    path: ProbePath,
    qos: int = 1,
    restart: bool = True,
) -> RecoveryTimes:
    """Kill ``victim`` under the probe (and start it again with ``restart``)."""
    settings = cluster.settings
    times = await measure_recovery(
        "127.0.0.1",
        cluster.mqtt_port,
        process=victim,
        kill=lambda: cluster.kill(victim),
        restart=(lambda: cluster.start(victim)) if restart else None,
        path=path,
        qos=qos,
        msg_all_partitions=settings.msg_all_partitions,
        client_partitions=settings.state_topic_partitions,
        timeout=PROBE_TIMEOUT,
    )
    assert times.resumed_at is not None, f"delivery did not resume: {times}"
    assert times.acknowledged > 0 and times.delivered > 0, times
    return times


async def test_per_publisher_order_holds_across_a_kafka_kill(cluster: LocalCluster) -> None:
    try:
        times = await _probe(cluster, "kafka", path="persistent")
    finally:
        cluster.start("kafka")
    assert times.lost == 0, times
    assert times.reordered == 0, times
    # Some PUBLISHes were refused while Kafka was down; the stream went on around them.
    assert times.acknowledged < times.published, times


async def test_a_router_killed_mid_stream_stores_no_qos2_message_twice(
    cluster: LocalCluster,
) -> None:
    try:
        times = await _probe(cluster, "router", path="persistent", qos=2)
    finally:
        cluster.start("router")
    # A message routed twice would be stored twice, and delivered twice under two Packet
    # Identifiers (a resend of one delivery keeps its Packet Identifier: the client
    # drops it).
    assert times.duplicates == 0, times
    assert times.lost == 0, times
    assert times.reordered == 0, times


def _owns_partitions(cluster: LocalCluster, instance: str, stage: str) -> bool:
    """Whether ``instance``'s last rebalance in ``stage``'s consumer group gave it
    partitions. Its log says so: aiokafka logs "Setting newly assigned partitions", a
    table of them (or ``set()`` for none), then "for group <group id>"."""
    group = TopicNames.from_settings(cluster.settings).service_group(stage)
    text = cluster.log(instance).read_text(encoding="utf-8", errors="replace")
    owns = False
    for entry in text.split("Setting newly assigned partitions")[1:]:
        assigned, _, rest = entry.partition(" for group ")
        if rest.split(maxsplit=1)[:1] == [group]:
            owns = not assigned.lstrip().startswith("set()")
    return owns


@pytest.mark.parametrize(
    ("stage", "path"),
    [("router", "live"), ("device-persist", "persistent"), ("app-delivery", "application")],
)
async def test_a_killed_instances_partitions_move_to_the_other_without_a_restart(
    cluster: LocalCluster, stage: str, path: ProbePath
) -> None:
    extra = f"{stage}-2"
    cluster.start_instance(stage, extra)
    try:
        # Both instances share the stage's partitions before one dies.
        for instance in (extra, stage):
            wait_until(
                partial(_owns_partitions, cluster, instance, stage), f"{instance}'s share", 60
            )
        times = await _probe(cluster, extra, path=path, restart=False)
        assert cluster.pid(extra) is None  # resumed through the other instance alone
    finally:
        cluster.stop_extra(extra)
    assert times.lost == 0, times
    assert times.reordered == 0, times
