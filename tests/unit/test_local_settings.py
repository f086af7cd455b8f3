"""The local cluster launcher points the services at its own servers."""

from __future__ import annotations

from services.local import cluster
from services.local.settings import LocalSettings


def test_local_settings_point_the_store_at_the_local_redis_and_postgres() -> None:
    local = cluster.local_settings(LocalSettings(redis_port=16379, postgres_port=15432))
    assert local.redis_url == "redis://127.0.0.1:16379/0"
    assert local.postgres_dsn == "postgresql://cormorant@127.0.0.1:15432/cormorant"
