"""Every service's ``/health``, ``/ready`` and ``/metrics`` on the real test cluster, with
counters that move by exactly what a test client did."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from services.common.metrics import Drop, parse_exposition
from services.local import cluster as local_cluster
from tests.e2e.clients import RawSocket, aio_client, collect, unique
from tests.servers import LocalCluster
from tests.waiting import wait_for, wait_until

pytestmark = pytest.mark.cluster

SERVICES = {
    "ingest-node1": "ingest",
    "ingest-node2": "ingest",
    "router": "router",
    "device-persist": "device-persist",
    "app-delivery": "app-delivery",
    "integrations-stage": "integrations-stage",
}


def get(url: str) -> tuple[int, str, str]:
    """``(status, content type, body)`` of a GET."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def url(cluster: LocalCluster, name: str, path: str) -> str:
    return f"http://127.0.0.1:{local_cluster.http_ports(cluster.settings)[name]}{path}"


def metrics_of(cluster: LocalCluster, name: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    status, content_type, body = get(url(cluster, name, "/metrics"))
    assert status == 200
    assert content_type.startswith("text/plain; version=0.0.4")
    return parse_exposition(body)


def value(samples: dict[str, Any], name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``."""
    return sum(
        v for have, v in samples.get(name, ()) if all(have.get(k) == x for k, x in labels.items())
    )


@pytest.mark.parametrize("name", list(SERVICES))
def test_health_ready_and_metrics_answer(cluster: LocalCluster, name: str) -> None:
    status, content_type, body = get(url(cluster, name, "/health"))
    assert (status, content_type.split(";")[0]) == (200, "application/json")
    health = json.loads(body)
    assert health["status"] == "alive" and health["service"] == SERVICES[name]
    assert health["version"]

    status, _, body = get(url(cluster, name, "/ready"))
    ready = json.loads(body)
    assert status == 200, ready
    assert ready["ready"] is True
    assert set(ready["checks"]) >= {"serving", "kafka"}
    assert all(outcome == "ok" for outcome in ready["checks"].values())
    if name == "device-persist":
        assert ready["checks"]["store"] == "ok"

    samples = metrics_of(cluster, name)
    [(info, one)] = samples["cormorant_service_info"]
    assert (info["service"], one) == (SERVICES[name], 1.0)
    assert "process_cpu_seconds_total" in samples
    # ingest-node2 has no downlink consumer yet; the integrations stage none without an
    # integration.
    quiet = ("ingest-node2", "integrations-stage")
    assert "cormorant_kafka_consumer_lag_records" in samples or name in quiet


async def test_counters_move_by_what_a_client_did(cluster: LocalCluster) -> None:
    node1, node2 = cluster.node_ports
    before1, before2 = metrics_of(cluster, "ingest-node1"), metrics_of(cluster, "ingest-node2")
    router_before = metrics_of(cluster, "router")
    topic = unique("metrics/count")
    async with (
        aio_client(node2, unique("sub"), 5) as sub,
        aio_client(node1, unique("pub"), 4) as pub,
    ):
        await sub.subscribe(topic, qos=1)
        during1 = metrics_of(cluster, "ingest-node1")
        for i in range(5):
            await pub.publish(topic, f"m{i}".encode(), qos=1)
        await pub.publish(topic, b"zero", qos=0)
        await collect(sub, 6)
        after1, after2 = metrics_of(cluster, "ingest-node1"), metrics_of(cluster, "ingest-node2")
    connections = "cormorant_mqtt_connections"
    assert value(during1, connections, protocol_version="3.1.1") == (
        value(before1, connections, protocol_version="3.1.1") + 1
    )
    accepted = {"listener": "mqtt", "reason_code": "0x00", "reason": "success"}
    anonymous = {"method": "anonymous", "outcome": "success"}
    for before, after in ((before1, after1), (before2, after2)):
        assert value(after, "cormorant_mqtt_connects_total", **accepted) == (
            value(before, "cormorant_mqtt_connects_total", **accepted) + 1
        )
        assert value(after, "cormorant_auth_attempts_total", **anonymous) == (
            value(before, "cormorant_auth_attempts_total", **anonymous) + 1
        )
    received = "cormorant_mqtt_publish_received_total"
    assert value(after1, received, qos="1") - value(before1, received, qos="1") == 5
    assert value(after1, received, qos="0") - value(before1, received, qos="0") == 1
    sent = "cormorant_mqtt_publish_sent_total"
    assert value(after2, sent, qos="1") - value(before2, sent, qos="1") == 5
    assert value(after2, sent, qos="0") - value(before2, sent, qos="0") == 1
    assert value(after1, "cormorant_mqtt_received_bytes_total") > value(
        before1, "cormorant_mqtt_received_bytes_total"
    )
    latency = "cormorant_kafka_produce_latency_seconds_count"
    assert value(after1, latency, topic="msg.all") - value(before1, latency, topic="msg.all") == 6

    def routed() -> float:
        return value(metrics_of(cluster, "router"), "cormorant_router_routed_records_total")

    # One downlink record per message for node2 (the router may count them a moment later).
    await wait_for(
        lambda: routed() - value(router_before, "cormorant_router_routed_records_total") == 6,
        "the router's count",
    )
    match = "cormorant_router_match_seconds_count"
    assert value(metrics_of(cluster, "router"), match) - value(router_before, match) == 6


def test_a_refused_connect_is_counted_by_its_reason_code(cluster: LocalCluster) -> None:
    before = metrics_of(cluster, "ingest-node1")
    unsupported = {"reason_code": "0x84", "reason": "unsupported_protocol_version"}
    with RawSocket(cluster.node_ports[0]) as raw:
        # CONNECT with protocol level 9 (MQTT 3.1.2.2: answered with return code 0x01).
        raw.send(bytes([0x10, 0x0C, 0x00, 0x04, *b"MQTT", 0x09, 0x02, 0x00, 0x3C, 0x00, 0x00]))
        assert raw.read(4) == bytes([0x20, 0x02, 0x00, 0x01])
    after = metrics_of(cluster, "ingest-node1")
    assert value(after, "cormorant_mqtt_connects_total", **unsupported) == (
        value(before, "cormorant_mqtt_connects_total", **unsupported) + 1
    )


def test_a_refusal_is_counted_by_its_limit(cluster: LocalCluster) -> None:
    nodes = [f"ingest-node{i}" for i in range(1, len(cluster.node_ports) + 1)]

    def refused() -> float:
        """The WebSocket handshakes refused by the ingest nodes (HAProxy picks the node)."""
        refusals = "cormorant_mqtt_refusals_total"
        return sum(
            value(metrics_of(cluster, node), refusals, limit="websocket_handshake")
            for node in nodes
        )

    before = refused()
    with RawSocket(cluster.settings.ws_listen_port) as raw:
        # A WebSocket upgrade on another path than /mqtt: 404, and the connection ends.
        raw.send(
            b"GET /not-mqtt HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n"
        )
        assert raw.read_until_closed().startswith(b"HTTP/1.1 404")
    wait_until(lambda: refused() == before + 1, "the refused handshake counted")


def test_every_process_serves_labelled_documented_state_metrics(cluster: LocalCluster) -> None:
    """No series of any process has an empty label value (``node_id=""`` of the services
    other than ingest; ``stage=""`` of the delayed wills consumer is refused by the consumer
    loop itself, tests/unit/test_metrics.py), every ``cormorant_*`` family served is in the
    generated metrics reference, and the state gauges and drop counters are served."""
    from prometheus_client.parser import text_string_to_metric_families

    from scripts.docs_reference import metrics_reference

    reference = metrics_reference()
    empty: list[str] = []
    undocumented: set[str] = set()
    served: dict[str, dict[str, list[tuple[dict[str, str], float]]]] = {}
    for name in [*SERVICES, "admin"]:
        text = get(url(cluster, name, "/metrics"))[2]
        served[name] = parse_exposition(text)
        for family in text_string_to_metric_families(text):
            exposed = f"{family.name}_total" if family.type == "counter" else family.name
            if family.name.startswith("cormorant_") and f"| `{exposed}` | {family.type} |" not in (
                reference
            ):
                undocumented.add(exposed)
            empty += [
                f"{name}: {sample.name}{sample.labels}"
                for sample in family.samples
                if any(v == "" for v in sample.labels.values())
            ]
    assert empty == []
    assert undocumented == set()
    router = served["router"]
    assert {(s["connected"], s["persistent"]) for s, _ in router["cormorant_sessions"]} == {
        ("true", "true"), ("true", "false"), ("false", "true"), ("false", "false")
    }  # fmt: skip
    assert "cormorant_subscriptions" in router and "cormorant_retained_messages" in router
    for name in SERVICES:
        assert {s["reason"] for s, _ in served[name]["cormorant_messages_dropped_total"]} == {
            reason.value for reason in Drop
        }
        assert served[name]["cormorant_ready"] == [({}, 1.0)], name
    for name in ("ingest-node1", "ingest-node2"):  # their mqtts and wss listeners
        [(_, not_after)] = served[name]["cormorant_tls_certificate_expiry_timestamp_seconds"]
        assert not_after > time.time()
