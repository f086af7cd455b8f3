"""An ingest node's metric families, rendered in Prometheus' text format and parsed back."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric

from services.common.metrics import MqttCounters, Samples, mqtt_families, parse_exposition, total


def scrape(counters: MqttCounters, connections: dict[tuple[str, int], int]) -> Samples:
    """The node's families as Prometheus would read them from ``/metrics``."""

    class Families:
        def collect(self) -> list[Metric]:
            return list(mqtt_families(counters, lambda: connections, pending=0, refusals=[]))

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Families())
    return parse_exposition(generate_latest(registry).decode())


def connections_by_version(samples: Samples) -> dict[str, float]:
    return {
        labels["protocol_version"]: value
        for labels, value in samples["cormorant_mqtt_connections"]
        if labels["listener"] == "mqtt"
    }


def listening() -> MqttCounters:
    """The counters of a node whose TCP listener is up (it registers itself)."""
    counters = MqttCounters()
    counters.listener("mqtt")
    return counters


def test_a_node_without_clients_counts_zero_per_protocol_version() -> None:
    samples = scrape(listening(), {})
    assert connections_by_version(samples) == {"3.1": 0, "3.1.1": 0, "5.0": 0}


def test_connections_by_protocol_version() -> None:
    samples = scrape(listening(), {("mqtt", 4): 2, ("mqtt", 5): 1})
    assert connections_by_version(samples) == {"3.1": 0, "3.1.1": 2, "5.0": 1}


def test_publish_counters_by_qos() -> None:
    counters = listening()
    counters.publish_received[1] += 3
    samples = scrape(counters, {})
    assert total(samples, "cormorant_mqtt_publish_received_total", qos="1") == 3
    assert total(samples, "cormorant_mqtt_publish_received_total", qos="0") == 0
