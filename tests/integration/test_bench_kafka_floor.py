"""The Kafka floor (bench/kafka_floor.py) against the real broker: a short run of both phases
passes every record through both hops once, in order, and deletes its topics. Counts only:
the figures belong to ``python -m bench compare`` and ``python -m bench run kafka-floor``."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from bench import brokers, kafka_floor
from bench.loadgen.plan import Options, Timing
from services.local.settings import LocalSettings

pytestmark = pytest.mark.kafka

TIMING = Timing(warmup=0.5, duration=1.5, drain=20.0, setup=60.0)


async def _topics(bootstrap: str) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


def test_a_floor_run_passes_every_record_through_both_hops(
    settings: LocalSettings, kafka_bootstrap: str
) -> None:
    target = brokers.Target("kafka", "127.0.0.1", 0)  # no CPU accounting of Kafka here
    before = asyncio.run(_topics(kafka_bootstrap))
    report = kafka_floor.run(Options(pairs=2, rate=200, inflight=8), TIMING, settings, target,
                             lambda _: None)  # fmt: skip
    assert report["sent"] > 200  # paced for 2 s at 200 msg/s
    assert report["received"] == report["sent"]
    assert (report["lost"], report["duplicates"], report["reordered"]) == (0, 0, 0)
    assert report["latency_samples"] > 200 and report["latency_ms"]["p50"] > 0
    assert report["puback_ms"]["p50"] is not None
    assert report["unpaced_records_per_s"] > 0 and report["unpaced_not_received"] == 0
    assert set(report["broker_cpu_s"]) == {"floor-source", "floor-relay", "floor-sink"}
    leftovers = asyncio.run(_topics(kafka_bootstrap)) - before
    assert not {t for t in leftovers if ".bench.floor." in t}
