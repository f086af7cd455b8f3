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
