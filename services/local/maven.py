"""Jars from Maven Central, gathered by Maven itself and cached per (name, version).

Both the local Kafka broker (:mod:`services.local.kafka`) and the Spark jobs' Kafka
connector (:mod:`spark_emr.jars`) get their jars this way: a small POM shipped with the
code, ``mvn dependency:copy-dependencies`` into a staging directory, renamed into place only
when complete so that an interrupted fetch never leaves a half-filled cache.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

#: Seconds Maven may take to download one set of jars (a cold cache fetches about 60 MB).
FETCH_TIMEOUT = 900.0

_COMPLETE_MARKER = ".complete"


class FetchError(RuntimeError):
    """Jars could not be fetched (Maven missing or failing)."""


def fetch(pom: bytes, libs: Path, properties: dict[str, str], what: str) -> Path:
    """Copy the dependencies of ``pom`` (the POM's bytes) into ``libs`` unless cached there.

    ``properties`` are passed to Maven as ``-Dname=value`` (versions the POM leaves open);
    ``what`` names the jars in error messages ("Kafka 3.9.1"). The POM is written beside
    ``libs``. Returns ``libs``. Raises :class:`FetchError` if ``mvn`` is not installed or
    fails (the end of its output is quoted).
    """
    if (libs / _COMPLETE_MARKER).exists():
        return libs
    mvn = shutil.which("mvn")
    if mvn is None:
        raise FetchError("mvn (Apache Maven) is not installed: run scripts/bootstrap.sh")
    work = libs.parent
    work.mkdir(parents=True, exist_ok=True)
    pom_path = work / "pom.xml"
    pom_path.write_bytes(pom)
    staging = Path(tempfile.mkdtemp(prefix=f"{libs.name}-", dir=work))
    argv = [mvn, "-q", "-B", "-f", str(pom_path), "dependency:copy-dependencies",
            f"-DoutputDirectory={staging}"]  # fmt: skip
    argv += [f"-D{name}={value}" for name, value in properties.items()]
    try:
        result = subprocess.run(
            argv, capture_output=True, text=True, timeout=FETCH_TIMEOUT, check=False
        )
        if result.returncode != 0:
            output = (result.stdout + result.stderr).strip().splitlines()[-40:]
            raise FetchError(
                f"fetching {what} with Maven failed (exit {result.returncode}):\n"
                + "\n".join(output)
            )
        (staging / _COMPLETE_MARKER).touch()
        if libs.exists():  # an earlier interrupted fetch: replace it
            shutil.rmtree(libs)
        staging.rename(libs)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return libs
