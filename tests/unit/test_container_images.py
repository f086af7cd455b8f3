"""The Dockerfile and .dockerignore, checked without a Docker engine (there is none here).

What can be checked: the one image's entry point is the ``cormorant`` CLI and every command
the deployment runs starts (``--help`` loads its module), every file the build copies exists
and is in the build context, tests/bench/.git stay out of the context, and the final stage
is slim and unprivileged. The images themselves are built by a team with Docker (docs/deploy.md).
"""

from __future__ import annotations

import fnmatch
import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from services.cli import main
from services.command_names import MIGRATE_COMMAND, SERVICE_COMMANDS, TOPICS_COMMAND
from services.common.settings import Settings
from tests.commands import run_cormorant

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Stage:
    """One ``FROM`` stage of the Dockerfile: its base, name and instructions."""

    base: str
    name: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def values(self, keyword: str) -> list[str]:
        return [value for key, value in self.instructions if key == keyword]


def parse_dockerfile(text: str) -> list[Stage]:
    """The stages of a Dockerfile (continuation lines joined, comments dropped)."""
    logical: list[str] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        logical.append(pending + stripped)
        pending = ""
    stages: list[Stage] = []
    for line in logical:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            match = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", rest.strip(), re.IGNORECASE)
            assert match, line
            stages.append(Stage(match.group(1), match.group(2) or ""))
        elif keyword != "ARG" or stages:
            stages[-1].instructions.append((keyword, rest.strip()))
    return stages


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Whether ``path`` (relative, ``/``-separated) is left out of the build context.

    Docker's rule: patterns apply in order, the last one matching wins, ``!`` re-includes,
    and a pattern matching a directory applies to everything under it.
    """
    excluded = False
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for raw in patterns:
        negate = raw.startswith("!")
        pattern = raw[1:] if negate else raw
        pattern = pattern.rstrip("/")
        alternatives = [pattern]
        if pattern.startswith("**/"):
            alternatives.append(pattern[3:])
        if any(fnmatch.fnmatchcase(p, alt) for p in prefixes for alt in alternatives):
            excluded = not negate
    return excluded


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse_dockerfile((ROOT / "Dockerfile").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def ignore_patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def by_name(stages: list[Stage]) -> dict[str, Stage]:
    return {stage.name: stage for stage in stages}


def entry_point(stage: Stage, stages: list[Stage]) -> list[str]:
    """The stage's ENTRYPOINT (exec form), inherited from its base stage if unset."""
    named = by_name(stages)
    while True:
        found = stage.values("ENTRYPOINT")
        if found:
            value: list[str] = json.loads(found[-1])
            return value
        stage = named[stage.base]


def test_one_image_whose_entry_point_is_the_cli(stages: list[Stage]) -> None:
    # One final stage, the default target: every command runs from the same image (the
    # task definitions give the command), so a release is one push, one scan, one digest.
    final = stages[-1]
    named = by_name(stages)
    assert set(named) == {"builder", "runtime"} and final.name == "runtime"
    assert [stage.name for stage in stages if stage.values("ENTRYPOINT")] == ["runtime"]
    assert entry_point(final, stages) == ["cormorant"]
    assert final.values("CMD") == ['["--help"]']


@pytest.mark.parametrize("command", [*SERVICE_COMMANDS, TOPICS_COMMAND, MIGRATE_COMMAND])
def test_entry_point_command_exists_and_starts(command: str) -> None:
    assert command in main.commands
    # As the image runs it, minus the installed script: the module behind `cormorant`.
    result = run_cormorant(command, "--help")
    assert result.returncode == 0, result.stderr
    assert f"Usage: python -m services.cli {command}" in result.stdout


def test_console_script_is_the_entry_points_program() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert 'cormorant = "services.cli:main"' in pyproject


def test_copied_files_exist_and_are_in_the_build_context(
    stages: list[Stage], ignore_patterns: list[str]
) -> None:
    copied: list[str] = []
    for stage in stages:
        for value in stage.values("COPY"):
            if value.startswith("--from="):
                continue
            *sources, _destination = value.split()
            copied += sources
    assert copied, "the Dockerfile copies nothing from the context"
    for source in copied:
        assert (ROOT / source).exists(), f"COPY {source}: no such file in the repository"
        assert not dockerignored(source.rstrip("/"), ignore_patterns), f"{source} is ignored"
    for module in ("services/cli.py", "services/common/settings.py", "spark_emr/cli.py"):
        assert not dockerignored(module, ignore_patterns)
    # Every package pyproject.toml installs is in the image: `cormorant` imports them all.
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    packages = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    assert {f"{package.rstrip('*')}" for package in packages} <= set(copied)


@pytest.mark.parametrize(
    "path",
    [
        ".git",
        ".git/HEAD",
        "tests",
        "tests/conftest.py",
        "bench",
        "bench/NOTES.md",
        "infra",
        "scripts/test.sh",
        "services/__pycache__/cli.cpython-311.pyc",
        "cormorant.env",
    ],
)
def test_dockerignore_keeps_out(path: str, ignore_patterns: list[str]) -> None:
    assert dockerignored(path, ignore_patterns)


def test_the_final_stage_is_slim_and_unprivileged(stages: list[Stage]) -> None:
    named = by_name(stages)
    runtime = named["runtime"]
    assert runtime.base.split(":")[1].endswith("-slim-bookworm")
    assert runtime.values("USER") and not runtime.values("USER")[-1].startswith("0")
    runs = " ".join(runtime.values("RUN"))
    assert "build-essential" not in runs and "apt-get install" not in runs
    assert "build-essential" in " ".join(named["builder"].values("RUN"))


def health_check(stage: Stage) -> str:
    """The shell command of the stage's HEALTHCHECK (``CMD ["sh", "-c", "<command>"]``)."""
    [check] = stage.values("HEALTHCHECK")
    command = json.loads(check.partition(" CMD ")[2])
    assert command[:2] == ["sh", "-c"]
    found: str = command[2]
    return found


def test_the_image_checks_the_services_health_endpoint(stages: list[Stage]) -> None:
    runtime = by_name(stages)["runtime"]
    # The data-path services' check; the admin service's and the one-off tasks' (none)
    # are their task definitions' (tests/infra: ECS runs only those).
    assert health_check(runtime) == "python -m services.common.probe /health"
    # Every process listens beyond its loopback, on the ports it exposes (the settings'
    # defaults).
    defaults = Settings.model_fields
    env = " ".join(runtime.values("ENV"))
    assert "CORMORANT_HTTP_HOST=0.0.0.0" in env and "CORMORANT_ADMIN_HOST=0.0.0.0" in env
    [exposed] = runtime.values("EXPOSE")
    assert {str(defaults["http_port"].default), str(defaults["admin_port"].default)} <= set(
        exposed.split()
    )
