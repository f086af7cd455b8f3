"""The local cluster launcher points the services at its own servers."""

from __future__ import annotations

from pathlib import Path

from services.local import cluster
from services.local.settings import LocalSettings


def test_local_settings_point_the_store_at_the_local_redis_and_postgres() -> None:
    local = cluster.local_settings(LocalSettings(redis_port=16379, postgres_port=15432))
    assert local.redis_url == "redis://127.0.0.1:16379/0"
    assert local.postgres_dsn == "postgresql://cormorant@127.0.0.1:15432/cormorant"


def test_anonymous_access_is_off_by_default_and_on_for_a_loopback_local_cluster() -> None:
    from services.common.settings import Settings

    assert Settings.model_fields["allow_anonymous"].default is False
    assert cluster.anonymous_allowed(LocalSettings(mqtt_host="127.0.0.1"))
    assert cluster.anonymous_allowed(LocalSettings(mqtt_host="::1"))
    assert not cluster.anonymous_allowed(LocalSettings(mqtt_host="0.0.0.0"))
    assert not cluster.anonymous_allowed(LocalSettings(mqtt_host="10.0.0.5"))
    assert not cluster.anonymous_allowed(LocalSettings(local_anonymous=False))
    # what every service process of the cluster is given (extra ingest nodes too)
    for settings, said in (
        (LocalSettings(), "true"),
        (LocalSettings(local_anonymous=False), "false"),
        (LocalSettings(mqtt_host="0.0.0.0", allow_anonymous=True), "true"),
    ):
        service = cluster.runtime_settings(cluster.local_settings(settings))
        assert cluster.child_environment(service)["CORMORANT_ALLOW_ANONYMOUS"] == said.title()


def test_the_secured_test_cluster_and_the_next_session_stay_clear_of_a_sessions_ports() -> None:
    from tests.servers import PORT_STEP, TEST_PORTS, cluster_ports, secured_ports

    def block(shift: int) -> tuple[set[int], set[int]]:
        ports = {name: port + shift for name, port in TEST_PORTS.items()}
        return set(cluster_ports(ports, 2)), set(cluster_ports(secured_ports(ports), 1))

    session, secured = block(0)
    next_session, next_secured = block(PORT_STEP)
    assert not session & secured
    assert not (session | secured) & (next_session | next_secured)


def test_every_service_process_has_its_own_http_port(tmp_path: Path) -> None:
    settings = LocalSettings(state_dir=tmp_path, router_instances=2, app_delivery_instances=3)
    ports = cluster.http_ports(settings)
    parts = {part.name: part.http_port for part in cluster.services_of(settings)}
    assert {name: port for name, port in parts.items() if port is not None} == ports
    assert len(set(ports.values())) == len(ports)
    assert ports["router-2"] == settings.http_base_port + 16 + 2
    node = cluster.ingest_overrides(cluster.local_settings(settings), 2)
    assert node["http_port"] == str(ports["ingest-node2"])
