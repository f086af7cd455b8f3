"""The one SparkSession of the analytics tests: ``local[2]``, few shuffle partitions, no UI,
the Kafka connector's jars from the project's Maven cache (fetched once per machine)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from services.local.settings import LocalSettings
from spark_emr.jars import fetch_jars
from spark_emr.session import local_session


@pytest.fixture(scope="package")
def spark(settings: LocalSettings) -> Iterator[SparkSession]:
    """The session every Spark test shares (started on first use, stopped after the last
    analytics test: its JVM need not stay beside the rest of the suite)."""
    session = local_session(
        "local[2]", fetch_jars(settings.cache_dir), shuffle_partitions=2, driver_memory="1g"
    )
    yield session
    session.stop()
