"""The jars the Spark jobs add to pyspark's: the Kafka connector, MSK's IAM login module and
the Iceberg runtime.

Fetched once by Maven (:func:`services.local.maven.fetch`, like the Kafka broker's jars)
into ``<cache_dir>/spark-<version>/libs`` and handed to Spark as ``spark.jars``: nothing is
downloaded at run time (no ``spark.jars.packages``).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from services.local import maven
from spark_emr import versions


def libs_dir(cache_dir: Path) -> Path:
    """Where the jars of :data:`~spark_emr.versions.SPARK_VERSION` and its companions'
    versions are cached (another Iceberg or MSK IAM version: another directory)."""
    companions = f"iceberg-{versions.ICEBERG_VERSION}-msk-iam-{versions.MSK_IAM_AUTH_VERSION}"
    return cache_dir / f"spark-{versions.SPARK_VERSION}-{companions}" / "libs"


def fetch_jars(cache_dir: Path) -> list[Path]:
    """Fetch the connector's jars with Maven unless cached; return them, sorted by name.

    Raises :class:`services.local.maven.FetchError` if Maven is missing or fails.
    """
    pom = resources.files("spark_emr").joinpath("spark-pom.xml").read_bytes()
    libs = maven.fetch(
        pom,
        libs_dir(cache_dir),
        {
            "spark.version": versions.SPARK_VERSION,
            "scala.binary.version": versions.SCALA_BINARY_VERSION,
            "msk.iam.version": versions.MSK_IAM_AUTH_VERSION,
            "iceberg.version": versions.ICEBERG_VERSION,
        },
        f"the Spark {versions.SPARK_VERSION} Kafka connector",
    )
    return sorted(libs.glob("*.jar"))
