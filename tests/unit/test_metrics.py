"""An ingest node's metric families, rendered in Prometheus' text format and parsed back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import cast

import pytest
from aiokafka import AIOKafkaConsumer
from cryptography import x509
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric

from services.app_delivery.clients import lag_families
from services.common.kafka.consumer import Record, consume_batches
from services.common.metrics import (
    Drop,
    MqttCounters,
    Samples,
    dropped_family,
    mqtt_families,
    parse_exposition,
    total,
)
from services.common.settings import Settings
from services.common.web import readiness_families
from services.ingest.tls import certificate_not_after
from tests.pki import make_pki


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


def test_dropped_messages_are_served_for_every_reason_zero_included() -> None:
    counts = dict.fromkeys(Drop, 0) | {Drop.STORE_FULL: 4}
    family = dropped_family(counts)
    assert family.name == "cormorant_messages_dropped"
    assert {s.labels["reason"]: s.value for s in family.samples} == {
        "no_subscriber": 0,
        "expired": 0,
        "queue_full": 0,
        "store_full": 4,
        "not_authorized": 0,
        "too_large": 0,
        "session_gone": 0,
    }


def test_app_client_lag_names_the_top_clients_and_sums_the_others() -> None:
    behind = [(5, "e"), (50, "b"), (50, "a"), (0, "z"), (7, "c")]
    lag, other = lag_families(behind, top=3)
    assert [(s.labels["client_id"], s.value) for s in lag.samples] == [
        ("a", 50),
        ("b", 50),
        ("c", 7),
    ]
    assert (other.name, other.samples[0].value) == ("cormorant_app_client_lag_other_records", 5)
    lag, other = lag_families(behind, top=0)
    assert (lag.samples, other.samples[0].value) == ([], 112)


def test_readiness_is_one_only_when_every_check_passes() -> None:
    def served(checks: dict[str, str]) -> tuple[float, dict[str, float]]:
        ready, each = readiness_families(checks)
        return ready.samples[0].value, {s.labels["check"]: s.value for s in each.samples}

    assert served({"serving": "ok", "kafka": "ok"}) == (1.0, {"serving": 1.0, "kafka": 1.0})
    failing = {"serving": "ok", "kafka": "no answer within 2 s"}
    assert served(failing) == (0.0, {"serving": 1.0, "kafka": 0.0})
    assert served({}) == (0.0, {})


def test_the_tls_certificates_not_after_is_read_from_the_file_or_the_pem(
    tmp_path: Path,
) -> None:
    pki = make_pki(tmp_path)
    expected = x509.load_pem_x509_certificate(pki.cert.read_bytes()).not_valid_after_utc
    from_file = Settings(tls_cert_file=pki.cert, tls_key_file=pki.key)
    assert certificate_not_after(from_file) == expected.timestamp() > time.time()
    from_pem = Settings(tls_cert_pem=pki.cert.read_text(), tls_key_pem=pki.key.read_text())
    assert certificate_not_after(from_pem) == expected.timestamp()


def test_a_consumer_loop_without_a_stage_name_is_refused() -> None:
    """Its lag series would have ``stage=""`` (the delayed wills' consumer had none)."""

    async def handle(records: list[Record]) -> list[Awaitable[object]]:
        return []

    consumer = cast(AIOKafkaConsumer, object())  # refused before it is used
    with pytest.raises(ValueError, match="stage name"):
        asyncio.run(consume_batches(consumer, handle, stage=""))
