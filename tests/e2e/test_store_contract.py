"""The records an ingest node exchanges with the message stores and the router's retained
store, against a real node: the test plays the store by hand (those services come later).

- a downlink record whose target carries a store-assigned Packet Identifier (and DUP) is
  delivered with it, and the client's PUBACK / PUBREC / PUBCOMP land in ``client.acks``
  under the session's id (records.py: ``Target.packet_id``, ``AckRecord``);
- a downlink record with header ``b`` (a stored window) is delivered message by message, in
  order; a garbage one is skipped and counted, and the node goes on;
- a downlink record with header ``r`` makes the node send PUBREL (MQTT 4.4);
- a SUBSCRIBE writes a retained message request to ``msg.all`` (header ``q``).
"""

from __future__ import annotations

import struct
import time
import urllib.request

import pytest

from services.common.kafka.names import TopicNames
from services.common.metrics import parse_exposition, total
from services.common.records import (
    HEADER_META,
    HEADER_RELEASES,
    HEADER_RETAINED_REQUEST,
    HEADER_TARGETS,
    AckKind,
    PublishMeta,
    Target,
    decode_ack,
    decode_session,
    decode_subscriptions,
    downlink_bundle_record,
    encode_meta,
    encode_releases,
    encode_targets,
)
from services.common.subscription import Subscription
from services.local import cluster as local_cluster
from tests.e2e.clients import RawSocket, packet, session_connect_packet, unique
from tests.e2e.kafka_view import TopicTail, downlink_writer, latest_state
from tests.servers import LocalCluster

pytestmark = pytest.mark.cluster

NODE_ID = "node1"  # the local cluster's first ingest node (services.local.cluster)


def _publish(raw: RawSocket) -> tuple[int, int, bool, bytes]:
    """Read a v5 PUBLISH: (QoS, Packet Identifier, DUP, payload)."""
    kind, body = raw.read_packet()
    assert kind >> 4 == 3, (hex(kind), body)
    qos = (kind >> 1) & 0x03
    (topic_len,) = struct.unpack(">H", body[:2])
    pos = 2 + topic_len
    (packet_id,) = struct.unpack(">H", body[pos : pos + 2])
    pos += 2
    props_len = body[pos]  # short properties: a one-byte Variable Byte Integer
    return qos, packet_id, bool(kind & 0x08), body[pos + 1 + props_len :]


def _expect(raw: RawSocket, kind: int, packet_id: int) -> None:
    got, body = raw.read_packet()
    assert (got, struct.unpack(">H", body[:2])[0]) == (kind, packet_id), (hex(got), body)


def _ack(kind: int, packet_id: int) -> bytes:
    return packet(kind, struct.pack(">H", packet_id))


def _undecodable_downlinks(cluster: LocalCluster) -> float:
    """The node's count of downlink records it skipped as undecodable (its ``/metrics``)."""
    port = local_cluster.http_ports(cluster.settings)[f"ingest-{NODE_ID}"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        samples = parse_exposition(response.read().decode())
    return total(samples, "cormorant_kafka_undecodable_records_total", topic="msg.downlink")


async def test_store_assigned_deliveries_releases_and_acknowledgements(
    cluster: LocalCluster,
) -> None:
    node1 = cluster.node_ports[0]
    names = TopicNames.from_settings(cluster.settings)
    client_id = unique("stored")
    key = client_id.encode()
    topic = unique("e2e/store")
    meta = [(HEADER_META, encode_meta(PublishMeta(topic, 2, False, int(time.time() * 1000), 5)))]

    def targets(*wanted: Target) -> list[tuple[str, bytes]]:
        return [*meta, (HEADER_TARGETS, encode_targets(wanted))]

    async with (
        TopicTail.open(cluster.kafka_bootstrap, names.client_acks) as acks,
        downlink_writer(cluster) as store,
    ):
        downlink = names.downlink(NODE_ID)
        with RawSocket(node1) as raw:
            raw.send(session_connect_packet(client_id, level=5, clean_start=True))
            assert raw.read_packet()[0] == 0x20
            sessions, _ = await latest_state(cluster)
            session_value = sessions[client_id]
            assert session_value is not None
            session_id = decode_session(session_value).session_id

            async def next_acks() -> list[tuple[AckKind, int]]:
                record = decode_ack((await acks.next_with_key(key)).value)
                assert record.session_id == session_id
                return record.acks

            # QoS 1 with the store's Packet Identifier.
            await store.send_and_wait(
                downlink, b"one", b"store", headers=targets(Target(client_id, 1, packet_id=321))
            )
            assert _publish(raw) == (1, 321, False, b"one")
            raw.send(_ack(0x40, 321))  # PUBACK
            assert await next_acks() == [(AckKind.PUBACK, 321)]

            # A garbage bundle (its header one byte short) is skipped, logged and counted;
            # the node goes on: the next bundle, same key and partition, is what comes next.
            undecodable = _undecodable_downlinks(cluster)
            bundle = downlink_bundle_record(
                names, NODE_ID, client_id, [(meta[0][1], b"x", Target(client_id, 1, packet_id=326))]
            )
            [(name, head)] = bundle.headers
            await store.send_and_wait(downlink, bundle.value, key, headers=[(name, head[:-1])])

            # A stored window as one record (device_persist's bundle): in order.
            window = [
                (meta[0][1], payload, Target(client_id, 1, packet_id=pid))
                for payload, pid in ((b"three", 324), (b"four", 325))
            ]
            bundle = downlink_bundle_record(names, NODE_ID, client_id, window)
            await store.send_and_wait(downlink, bundle.value, key, headers=list(bundle.headers))
            assert [_publish(raw), _publish(raw)] == [
                (1, 324, False, b"three"),
                (1, 325, False, b"four"),
            ]
            assert _undecodable_downlinks(cluster) == undecodable + 1
            raw.send(_ack(0x40, 324) + _ack(0x40, 325))
            acknowledged: list[tuple[AckKind, int]] = []
            while len(acknowledged) < 2:  # one record per read of the socket
                acknowledged += await next_acks()
            assert acknowledged == [(AckKind.PUBACK, 324), (AckKind.PUBACK, 325)]

            # QoS 2, resent after a reconnect (DUP).
            await store.send_and_wait(
                downlink,
                b"two",
                b"store",
                headers=targets(Target(client_id, 2, packet_id=322, dup=True)),
            )
            assert _publish(raw) == (2, 322, True, b"two")
            raw.send(_ack(0x50, 322))  # PUBREC
            _expect(raw, 0x62, 322)  # PUBREL
            assert await next_acks() == [(AckKind.PUBREC, 322)]
            raw.send(_ack(0x70, 322))  # PUBCOMP
            assert await next_acks() == [(AckKind.PUBCOMP, 322)]

            # A QoS 2 delivery PUBREC'd before the reconnect: the store asks for PUBREL.
            releases = [(HEADER_RELEASES, encode_releases([(client_id, 323)]))]
            await store.send_and_wait(downlink, b"", b"store", headers=releases)
            _expect(raw, 0x62, 323)
            raw.send(_ack(0x70, 323))
            assert await next_acks() == [(AckKind.PUBCOMP, 323)]


async def test_subscribe_writes_a_retained_message_request(cluster: LocalCluster) -> None:
    node1 = cluster.node_ports[0]
    names = TopicNames.from_settings(cluster.settings)
    client_id = unique("retained")
    topic_filter = unique("e2e/retained") + "/#"
    async with TopicTail.open(cluster.kafka_bootstrap, names.msg_all) as msg_all:
        with RawSocket(node1) as raw:
            raw.send(session_connect_packet(client_id, level=5, clean_start=True))
            assert raw.read_packet()[0] == 0x20
            encoded = topic_filter.encode()
            options = 0x01 | 0x10  # QoS 1, Retain Handling 1 (new subscriptions only)
            body = struct.pack(">HB", 5, 0) + struct.pack(">H", len(encoded)) + encoded
            raw.send(packet(0x82, body + bytes([options])))
            kind, suback = raw.read_packet()
            assert (kind, suback[-1]) == (0x90, 1)
            record = await msg_all.next_with_key(client_id.encode())
    assert record.value == b""
    headers = dict(record.headers)
    assert HEADER_META not in headers
    assert decode_subscriptions(client_id, headers[HEADER_RETAINED_REQUEST]) == [
        Subscription(client_id, topic_filter, 1, retain_handling=1)
    ]
