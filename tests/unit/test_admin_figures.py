"""The admin service's figures of the cluster: every lag series named, CPU use from two
probes, HAProxy's rotation read from its stats table."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.admin.cluster import Endpoint, Probe, StatsSampler, sample_of
from services.admin.infrastructure import rotation
from services.common.settings import Settings

LAG = "cormorant_kafka_consumer_lag_records"


def test_a_lag_sample_without_a_stage_is_named_by_its_topic() -> None:
    probe = Probe(
        Endpoint("router", "http://127.0.0.1:1"),
        samples={
            LAG: [
                ({"stage": "", "topic": "client.wills", "partition": "0"}, 3.0),
                ({"stage": "", "topic": "client.wills", "partition": "1"}, 1.0),
                ({"stage": "router", "topic": "msg.all", "partition": "0"}, 2.0),
                ({"topic": "client.events", "partition": "0"}, 5.0),
            ]
        },
    )
    assert sample_of([probe], 0.0).lag == {
        "topic client.wills": 4.0,
        "router": 2.0,
        "topic client.events": 5.0,
    }


def test_cpu_use_is_the_cpu_seconds_between_two_probes() -> None:
    sampler = StatsSampler(Settings(), 2.0)

    def probed(seconds: float, at: float) -> None:
        sampler.probes = [
            Probe(
                Endpoint("ingest-node1", "http://127.0.0.1:1"),
                samples={"process_cpu_seconds_total": [({}, seconds)]},
            ),
            Probe(Endpoint("router", "http://127.0.0.1:2"), error="ClientConnectorError"),
        ]
        sampler._note_cpu(at)

    probed(10.0, 100.0)
    assert sampler.cpu_percent == {}
    probed(11.0, 104.0)
    assert sampler.cpu_percent == {"ingest-node1": pytest.approx(25.0)}


def test_haproxy_rotation_lists_each_server_of_each_backend() -> None:
    table = (
        "# pxname,svname,qcur,status\n"
        "mqtt,FRONTEND,,OPEN\n"
        "ingest_mqtt,node1,0,UP\n"
        "ingest_mqtt,node2,0,DOWN 1/2\n"
        "ingest_mqtt,node3,0,MAINT\n"
        "ingest_mqtt,BACKEND,0,UP\n"
    )
    found = rotation(Path("/run/haproxy/stats.sock"), table)
    assert [(e.backend, e.server, e.status, e.in_rotation) for e in found] == [
        ("ingest_mqtt", "node1", "UP", True),
        ("ingest_mqtt", "node2", "DOWN 1/2", False),
        ("ingest_mqtt", "node3", "MAINT", False),
    ]
