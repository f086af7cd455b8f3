"""Facts the deployment takes from the shared package: keep alive rule, versions, groups."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pyspark
import pytest

from cormorant_infra import shared
from services.common.faust_app import make_app
from services.common.kafka.names import TopicNames
from services.common.mqtt.keep_alive import (
    max_keep_alive_for_idle_timeout,
    silence_allowed,
)
from services.common.settings import Settings
from services.common.versions import EMR_RELEASE_LABEL, KAFKA_VERSION, SPARK_VERSION, release_line
from services.local.settings import LocalSettings
from spark_emr import versions as spark_versions

ROOT = Path(__file__).resolve().parents[2]


def test_silence_allowed_is_one_and_a_half_keep_alives() -> None:
    assert silence_allowed(60) == 90.0


@pytest.mark.parametrize(
    ("idle", "keep_alive"), [(350, 230), (6000, 3996), (60, 36), (120, 76), (6.6, 1)]
)
def test_max_keep_alive_for_an_idle_timeout(idle: float, keep_alive: int) -> None:
    assert max_keep_alive_for_idle_timeout(idle) == keep_alive
    # The broker gives up on a silent client (plus the margin) before the balancer does.
    assert silence_allowed(keep_alive) + 5 <= idle < silence_allowed(keep_alive + 1) + 5


def test_an_idle_timeout_too_short_for_any_keep_alive() -> None:
    with pytest.raises(ValueError, match="allows no keep alive"):
        max_keep_alive_for_idle_timeout(6)


def test_release_lines() -> None:
    assert release_line(SPARK_VERSION) == "3.5"
    assert release_line("3.5.6-amzn-1") == "3.5"
    assert release_line(KAFKA_VERSION) == "3.9"
    # The local cluster runs the Kafka release MSK is deployed with the line of.
    assert LocalSettings().kafka_version == KAFKA_VERSION
    for bad in ("3", "x.5.1", ""):
        with pytest.raises(ValueError, match=r"not a major\.minor"):
            release_line(bad)


def test_one_spark_line_for_pyspark_the_jobs_and_emr() -> None:
    # pyproject.toml's pin, the jobs' connector (spark_emr) and the EMR release (infra/)
    # all follow services/common/versions.py.
    assert pyspark.__version__ == SPARK_VERSION
    assert (spark_versions.SPARK_VERSION, spark_versions.EMR_RELEASE_LABEL) == (
        SPARK_VERSION,
        EMR_RELEASE_LABEL,
    )
    assert spark_versions.KAFKA_CONNECTOR.endswith(f":{SPARK_VERSION}")
    assert release_line(shared.check_emr_release(EMR_RELEASE_LABEL)) == release_line(SPARK_VERSION)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert f"pyspark=={SPARK_VERSION}" in pyproject["project"]["optional-dependencies"]["analytics"]


def test_service_group_is_the_faust_app_id(tmp_path: object) -> None:
    settings = Settings(topic_prefix="p.", state_dir=tmp_path)
    assert TopicNames("p.").service_group("router") == "p.cormorant-router"
    assert make_app(settings, "router").conf.id == "p.cormorant-router"
