"""The load generator over each transport of the real test cluster (HAProxy in front of the
ingest nodes): a short p2p QoS 1 run over TLS (the cluster's generated CA), MQTT over
WebSocket and WebSocket on TLS delivers every message once, with nothing left unacknowledged.
Counts only: the figures belong to ``python -m bench compare --transports``.
"""

from __future__ import annotations

import pytest

from bench import brokers
from bench.loadgen import runner
from bench.loadgen.plan import Options, Timing, build
from tests.servers import LocalCluster

TIMING = Timing(warmup=0.5, duration=1.5, drain=20.0, setup=60.0)


@pytest.mark.parametrize("transport", ["tls", "ws", "wss"])
def test_a_loadgen_run_delivers_every_message(cluster: LocalCluster, transport: str) -> None:
    target = brokers.cormorant(settings=cluster.settings)
    end = target.endpoint(transport)
    assert end.port != cluster.mqtt_port
    options = Options(
        pairs=2,
        rate=100,
        host=end.host,
        port=end.port,
        transport=transport,
        ca_file=end.ca_file,
    )
    report = runner.run(build("p2p", options, TIMING), target, 1, lambda _: None)
    assert report["transport"] == transport
    assert report["tls"].startswith("TLSv1.") == (transport in ("tls", "wss"))
    assert report["sent"] > 50
    assert report["received"] == report["expected_deliveries"] == report["sent"]
    assert (report["lost"], report["duplicates"], report["unacked"]) == (0, 0, 0)
    assert report["disconnects"] == 0
