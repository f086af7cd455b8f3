"""The local cluster launcher points the services at its own servers."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.local import cluster, haproxy, layout
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


def test_every_service_process_has_its_own_http_port(tmp_path: Path) -> None:
    settings = LocalSettings(state_dir=tmp_path, router_instances=2, app_delivery_instances=3)
    ports = cluster.http_ports(settings)
    parts = {part.name: part.http_port for part in cluster.services_of(settings)}
    assert {name: port for name, port in parts.items() if port is not None} == ports
    assert len(set(ports.values())) == len(ports)
    assert ports["router-2"] == settings.http_base_port + 16 + 2
    node = cluster.ingest_overrides(cluster.local_settings(settings), 2)
    assert node["http_port"] == str(ports["ingest-node2"])
    # The local CA is trusted for JWKS URLs too (a JWKS served under it, as the e2e test does).
    assert node["jwt_jwks_ca_file"] == str(tmp_path / "tls" / "ca.pem")


def test_the_production_layout_runs_the_same_services_health_checked(tmp_path: Path) -> None:
    normal = LocalSettings(state_dir=tmp_path)
    production = layout.apply(normal, layout.PRODUCTION)

    def services(settings: LocalSettings) -> list[tuple[str, int | None, int | None]]:
        return [(p.name, p.port, p.http_port) for p in cluster.services_of(settings)]

    assert services(production) == services(normal)
    proxies = [name for name, _, http in services(production) if http is None]
    assert proxies == haproxy.process_names(production) and proxies[0] == haproxy.NAME
    assert cluster.ADMIN in cluster.http_ports(production)
    config = haproxy.render_config(production)
    assert config.count("http-check send meth GET uri /ready") == len(haproxy.KINDS)
    assert config.count("check port") == len(haproxy.KINDS) * production.ingest_nodes


def test_the_local_nodes_share_one_scram_unknown_user_key_made_once(tmp_path: Path) -> None:
    settings = cluster.local_settings(LocalSettings(state_dir=tmp_path))
    keys = {cluster.ingest_overrides(settings, node)["scram_unknown_user_key"] for node in (1, 2)}
    path = tmp_path / cluster.SCRAM_KEY_FILE
    assert keys == {path.read_text().strip()} and len(keys.pop()) >= 32
    assert path.stat().st_mode & 0o777 == 0o600
    again = cluster.local_settings(LocalSettings(state_dir=tmp_path))  # `cormorant up` again
    assert cluster.ingest_overrides(again, 1)["scram_unknown_user_key"] == path.read_text().strip()
    given = cluster.local_settings(
        LocalSettings(state_dir=tmp_path / "given", scram_unknown_user_key="k" * 32)
    )
    assert "scram_unknown_user_key" not in cluster.ingest_overrides(given, 1)
    assert not (tmp_path / "given" / cluster.SCRAM_KEY_FILE).exists()
    path.write_text("short\n")
    with pytest.raises(ValueError, match="remove it to make a new one"):
        cluster.ingest_overrides(again, 1)
    assert path.read_text() == "short\n"
