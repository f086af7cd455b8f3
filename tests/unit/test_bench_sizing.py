"""The sizing bench's arithmetic (bench/sizing.py) and its model (bench/sizing_model.py)."""

from __future__ import annotations

import pytest

from bench import sizing, sizing_model
from bench.sizing_model import Measured, Workload


def test_growth_per_unit_is_summed_per_stage_without_redis_used_memory() -> None:
    before = {"ingest-node1": 100.0, "ingest-node2": 100.0, "redis": 50.0, sizing.REDIS_USED: 7.0}
    after = {"ingest-node1": 300.0, "ingest-node2": 500.0, "redis": 50.0, sizing.REDIS_USED: 9.0}
    assert sizing.per_unit(before, after, 10) == {"ingest": 60.0, "redis": 0.0}
    assert sizing.stage_of("kafka3") == "kafka"
    assert sizing.stage_of("device-persist") == "device_persist"
    with pytest.raises(ValueError):
        sizing.per_unit(before, after, 0)
    # 2 CPU s in a 20 s window, 0.05 s/s of it idle use: 1 s for 1,000 messages.
    assert sizing.marginal_us({"router": 2.0}, {"router": 0.05}, 20.0, 1000) == {
        "router": pytest.approx(1000.0)
    }


def test_memory_figures_and_bootstrap_line() -> None:
    samples = {
        "baseline": {"router": 0.0, sizing.REDIS_USED: 0.0},
        "idle": {"router": 1000.0, sizing.REDIS_USED: 0.0},
        "subscribed": {"router": 3000.0, sizing.REDIS_USED: 0.0},
        "persistent": {"router": 7000.0, sizing.REDIS_USED: 800.0},
    }
    figures = sizing.memory_figures(samples, connections=10, subscriptions=2)
    assert figures["bytes_per_connection"] == {"router": 100.0}
    assert figures["bytes_per_subscription"] == {"router": 100.0}
    assert figures["bytes_per_persistent_session"] == {"router": 400.0}
    assert figures["redis_used_bytes_per_persistent_session"] == 80.0
    assert sizing.fit_line([(0, 2.0), (100_000, 12.0), (50_000, 7.0)]) == pytest.approx(
        (2.0, 0.0001)
    )
    with pytest.raises(ValueError):
        sizing.fit_line([(5, 1.0), (5, 2.0)])


def _measured() -> Measured:
    cpu = {"router": 100.0, "ingest": 200.0, "kafka": 50.0, "redis": 40.0}
    return Measured(
        connection_bytes={"ingest": 10_000.0},
        subscription_bytes={"ingest": 1_000.0, "router": 500.0},
        persistent_session_bytes={"ingest": 20_000.0},
        measured_subscriptions=2,
        redis_bytes_per_session=1_000.0,
        cpu_us={"p2p": cpu, "persistent-p2p": cpu, "fan-in-app": cpu},
        stored_session_bytes={"router": 2_000.0, "ingest": 1_000.0, "device_persist": 500.0},
        base_rss_bytes={"router": 100 * 2**20, "ingest": 100 * 2**20},
    )


def test_plan_sizes_stages_from_cpu_and_memory() -> None:
    plan = sizing_model.plan(_measured(), Workload(100_000, 10_000.0))
    # 10,000 msg/s x 100 µs = 1 vCPU at 60 %: 2 tasks; ingest: 2 vCPU / 0.6 -> 4 tasks, and
    # memory: (8 GiB x 0.75 - 100 MiB - 100,000 x 1 kB) / 20 kB = 305,000 connections a task.
    assert plan.tasks["router"] == 2
    assert plan.tasks["ingest"] == 4
    assert plan.memory_mib["router"] == 2048
    assert plan.kafka_brokers == 3
    assert plan.cost["nlb"] == pytest.approx((0.0225 + 1 * 0.006) * 730)
    assert plan.notes == []


def test_plan_says_what_does_not_fit() -> None:
    # 10M sessions x 2 kB in every router: 19 GiB (a 30 GiB task); x 1 kB in every ingest
    # task leaves no room in 8 GiB; 250,000 persistent msg/s x 40 µs = 10 Redis cores.
    plan = sizing_model.plan(_measured(), Workload(10_000_000, 1_000_000.0))
    assert plan.memory_mib["router"] == sizing_model.FARGATE_MAX_MIB
    assert plan.redis_shards == 17
    assert any("ingest task's copy" in n for n in plan.notes)
    assert any("shards" in n for n in plan.notes)
    table = sizing_model.markdown([plan])
    assert "| 10,000,000 | 1,000,000 |" in table
