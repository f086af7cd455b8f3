"""Versions of the outside software Cormorant is built and tested against, in one place.

The local cluster fetches :data:`KAFKA_VERSION`; ``infra/`` deploys the MSK version of the
same line and chooses the EMR release whose Spark matches :data:`SPARK_VERSION`, the
version spark_emr/ pins for PySpark.
"""

from __future__ import annotations

KAFKA_VERSION = "3.9.1"
"""The Apache Kafka release of the local cluster and the tests (MSK offers the 3.9 line)."""

SPARK_VERSION = "3.5.7"
"""The Apache Spark (PySpark) release the Spark jobs pin: the 3.5 line that EMR 7 runs."""


def release_line(version: str) -> str:
    """``major.minor`` of a dotted version: ``"3.5.7"`` → ``"3.5"``, ``"3.5.6-amzn-1"`` →
    ``"3.5"``. Raises ``ValueError`` when ``version`` has no ``major.minor`` numbers."""
    parts = version.split(".")
    if len(parts) < 2 or not parts[0].isdigit() or not parts[1].isdigit():
        raise ValueError(f"not a major.minor[.patch] version: {version!r}")
    return f"{parts[0]}.{parts[1]}"
