"""The fuzzers' short run in the test suite (the long run: tests/fuzz/README.md).

Every input of the stored corpus goes through its target again (each crash found once is
kept there), then each target is fuzzed for :data:`RUNS` executions from that corpus, with
a fixed seed so that a failure reproduces; any crash fails the test with the input that
caused it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.fuzz.targets import TARGETS, check

CORPUS = Path(__file__).parent / "corpus"
ROOT = Path(__file__).parents[2]

#: Executions per target in the test suite (a few seconds each).
RUNS = 3000


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_every_stored_input_passes_its_target(name: str) -> None:
    inputs = sorted((CORPUS / name).iterdir())
    assert inputs, f"no stored corpus for {name}"
    for path in inputs:
        check(name, path.read_bytes())


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_a_short_fuzzing_run_finds_no_crash(name: str, tmp_path: Path) -> None:
    grown, crashes = tmp_path / "corpus", tmp_path / "crashes"
    grown.mkdir()
    crashes.mkdir()
    run = subprocess.run(
        [
            sys.executable, "-m", "tests.fuzz", name,
            f"-runs={RUNS}", "-seed=1", f"-artifact_prefix={crashes}/",
            str(grown), str(CORPUS / name),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )  # fmt: skip
    found = sorted(crashes.iterdir())
    assert run.returncode == 0 and not found, (
        f"{name}: crash inputs {[p.read_bytes() for p in found]}\n{run.stderr[-3000:]}"
    )
    assert f"Done {RUNS} runs" in run.stderr
