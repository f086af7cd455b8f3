"""An ingest node's drain pace and time budget (services/common/drain.py), and the local
cluster's share of it: HAProxy stops routing to a draining node within its notice, and
``cormorant down`` waits for the whole drain."""

from __future__ import annotations

import math
from pathlib import Path

from services.common.drain import (
    EXIT_MARGIN_SECONDS,
    SHUTDOWN_FLUSH_SECONDS,
    DrainPace,
    DrainTiming,
)
from services.local import cluster, haproxy
from services.local.settings import LocalSettings


def test_the_drain_rate_paces_the_disconnects() -> None:
    pace = DrainPace(clients=1000, rate=200.0, window=60.0)
    assert pace.effective_rate == 200.0 and pace.seconds == 5.0
    assert [pace.due(t) for t in (0.0, 0.5, 1.0, 4.999, 5.0)] == [1, 101, 201, 1000, 1000]


def test_a_node_with_more_clients_than_the_window_allows_goes_faster() -> None:
    pace = DrainPace(clients=60_000, rate=200.0, window=60.0)
    assert pace.effective_rate == 1000.0 and pace.seconds == 60.0
    assert pace.due(30.0) == 30_001
    assert pace.due(60.0) == 60_000  # the window's end: whoever is left


def test_no_window_is_all_at_once() -> None:
    pace = DrainPace(clients=50, rate=200.0, window=0.0)
    assert math.isinf(pace.effective_rate) and pace.seconds == 0.0
    assert pace.due(0.0) == 50


def test_the_stop_budget_is_the_notice_the_window_the_flush_and_a_margin() -> None:
    timing = DrainTiming(notice=10.0, window=60.0)
    assert timing.stop_seconds == math.ceil(10 + 60 + SHUTDOWN_FLUSH_SECONDS + EXIT_MARGIN_SECONDS)


def test_local_nodes_wait_until_haproxy_took_them_out_and_down_waits_for_the_drain(
    tmp_path: Path,
) -> None:
    settings = cluster.local_settings(LocalSettings(state_dir=tmp_path))
    # The next check, then fall - 1 fast ones: out of rotation before the first disconnect.
    out = haproxy.CHECK_INTERVAL_SECONDS + (haproxy.CHECK_FALL - 1) * (
        haproxy.FAST_CHECK_INTERVAL_SECONDS
    )
    assert out < settings.drain_notice_seconds == haproxy.OUT_OF_ROTATION_SECONDS
    config = haproxy.render_config(settings)
    assert (
        f"inter {haproxy.CHECK_INTERVAL_SECONDS * 1000:.0f}ms "
        f"fastinter {haproxy.FAST_CHECK_INTERVAL_SECONDS * 1000:.0f}ms "
        f"fall {haproxy.CHECK_FALL} "
    ) in config
    nodes = [p for p in cluster.services_of(settings) if p.name.startswith("ingest-node")]
    budget = DrainTiming.of(settings).stop_seconds
    assert nodes and all(node.stop_timeout >= budget for node in nodes)
    # An operator's own notice is kept.
    mine = cluster.local_settings(LocalSettings(state_dir=tmp_path, drain_notice_seconds=7))
    assert mine.drain_notice_seconds == 7
