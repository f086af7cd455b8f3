"""Versions of the outside software Cormorant is built and tested against, in one place.

The local cluster fetches :data:`KAFKA_VERSION`; ``infra/`` deploys the MSK version of the
same line. spark_emr/ pins PySpark and its Kafka connector to :data:`SPARK_VERSION` (the
``analytics`` extra, checked by a test), and ``infra/`` deploys its EMR Serverless
application with :data:`EMR_RELEASE_LABEL`, a release that runs the same Spark line
(checked by ``cormorant_infra.shared.check_emr_release``). Spark-only versions (Scala, the
MSK IAM login module) are in :mod:`spark_emr.versions`.
"""

from __future__ import annotations

KAFKA_VERSION = "3.9.1"
"""The Apache Kafka release of the local cluster and the tests (MSK offers the 3.9 line)."""

SPARK_VERSION = "3.5.7"
"""The Apache Spark (PySpark) release the Spark jobs pin: the 3.5 line that EMR 7 runs."""

EMR_RELEASE_LABEL = "emr-7.12.0"
"""The EMR release of the Spark jobs' EMR Serverless application (Spark 3.5.6: the newest
3.5 patch level among the releases ``infra/`` knows), the default of ``infra/``'s
``emrReleaseLabel``."""


def release_line(version: str) -> str:
    """``major.minor`` of a dotted version: ``"3.5.7"`` → ``"3.5"``, ``"3.5.6-amzn-1"`` →
    ``"3.5"``. Raises ``ValueError`` when ``version`` has no ``major.minor`` numbers."""
    parts = version.split(".")
    if len(parts) < 2 or not parts[0].isdigit() or not parts[1].isdigit():
        raise ValueError(f"not a major.minor[.patch] version: {version!r}")
    return f"{parts[0]}.{parts[1]}"


def cormorant_version() -> str:
    """Cormorant's own version: the installed distribution's, or ``pyproject.toml``'s when
    run from a checkout that is not installed (``0.0.0`` if neither says)."""
    from importlib import metadata

    try:
        return metadata.version("cormorant")
    except metadata.PackageNotFoundError:
        pass
    import tomllib
    from pathlib import Path

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        return str(tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "0.0.0"
