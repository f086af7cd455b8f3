"""The chaos run's short form (``python -m bench chaos``, bench/README.md): two processes
killed in turn under load on the production-layout cluster, nothing acknowledged lost,
each publisher's order kept."""

from __future__ import annotations

import pytest

from bench import chaos
from tests.servers import LocalCluster

pytestmark = [pytest.mark.cluster, pytest.mark.disruptive]

#: Short phases: the run takes about a minute.
TIMING = chaos.Timing(warmup=3.0, down=0.5, settle=3.0, recovery_timeout=60.0, drain=120.0)


def test_chaos_over_an_ingest_node_and_device_persist_loses_nothing(
    topology: LocalCluster,
) -> None:
    result = chaos.run(
        topology.settings,
        ["ingest-node1", "device-persist"],
        publishers=20,
        rate=200.0,
        timing=TIMING,
        log=print,
    )
    print(chaos.table(result))
    assert [d.error for d in result.disruptions] == [None, None]
    assert all(d.recovery_s is not None for d in result.disruptions), result.disruptions
    assert result.report is not None
    assert result.report.lost == 0, result.report
    assert result.report.reordered == 0, result.report


#: The production rounds' short form: three Redis primary kills in a row (each kills the node
#: the previous failover promoted, and a node killed before, restarted as a replica, may be
#: the one promoted next), each down longer than Sentinel's down-after
#: (chaos.PRODUCTION_DOWN), with short settling phases. The Kafka brokers' rounds are left to
#: the full run (``python -m bench chaos --production``) and tests/topology/test_kafka_brokers.py:
#: a broker's restart alone takes two minutes on a loaded machine.
PRODUCTION_TIMING = chaos.Timing(
    warmup=3.0, down=chaos.PRODUCTION_DOWN, settle=3.0, recovery_timeout=60.0, drain=120.0
)


def test_production_chaos_over_redis_failovers_in_a_row_loses_nothing(
    topology: LocalCluster,
) -> None:
    rounds = [chaos.REDIS_PRIMARY] * 3
    result = chaos.run(
        topology.settings, rounds, publishers=20, rate=200.0, timing=PRODUCTION_TIMING, log=print
    )
    print(chaos.table(result))
    assert [d.error for d in result.disruptions] == [None] * len(rounds)
    assert all(d.outage_s is not None for d in result.disruptions), result.disruptions
    for d in result.disruptions:
        assert d.round is not None
        assert (d.round.lost, d.round.reordered) == (0, 0), (d.process, d.round)
    assert result.report is not None
    assert (result.report.lost, result.report.reordered) == (0, 0), result.report
