"""The local SparkSession of the analytics commands and the tests.

EMR Serverless builds its own session from the job run's Spark parameters; locally the
connector's jars (:mod:`spark_emr.jars`) are handed over as ``spark.jars``, times are UTC,
and Arrow carries the pandas UDFs' batches.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from pyspark.sql import SparkSession

#: Spark settings the jobs rely on wherever they run (also sent to EMR with the job run).
JOB_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # The archive's partitions are (date, hour): keep date a date, hour an int, when read.
    "spark.sql.sources.partitionColumnTypeInference.enabled": "true",
    # The Iceberg tables' SQL: CALL <catalog>.system.expire_snapshots(...) and the like.
    "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
}


def local_session(
    master: str,
    jars: Sequence[Path],
    *,
    app_name: str = "cormorant-analytics",
    shuffle_partitions: int = 8,
    driver_memory: str = "2g",
    ui: bool = False,
) -> SparkSession:
    """A SparkSession on ``master`` (``local[*]``, ``local[2]``…) with ``jars`` on its
    classpath; ``shuffle_partitions`` small (the report's tables are aggregates), the web UI
    off unless ``ui``. The JVM starts here; a second call returns the same session."""
    # The driver's ports (block manager, RPC) on loopback only, whatever the host name says.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.jars", ",".join(str(j) for j in jars))
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.driver.memory", driver_memory)
        .config("spark.ui.enabled", str(ui).lower())
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
    )
    for key, value in JOB_CONF.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
