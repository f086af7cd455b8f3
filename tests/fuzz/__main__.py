"""``python -m tests.fuzz TARGET [libFuzzer options] [CORPUS_DIR ...]``: fuzz one target.

TARGET is ``decoder``, ``connect`` or ``connection`` (:mod:`tests.fuzz.targets`). The
modules of ``services`` are instrumented for coverage (atheris), so libFuzzer keeps the
inputs that reach new code. Without a CORPUS_DIR the stored corpus of the target
(tests/fuzz/corpus/TARGET) is read and grown; name a scratch directory first to keep the
stored one unchanged (new inputs go to the first directory). Useful options: ``-runs=N``
(executions), ``-max_total_time=S`` (seconds), ``-artifact_prefix=DIR/`` (where a crashing
input is written), ``-merge=1 OUT IN...`` (minimise a corpus). tests/fuzz/README.md has the
commands and the figures of the long run.
"""

from __future__ import annotations

import sys
from pathlib import Path

import atheris

with atheris.instrument_imports(include=["services"]):
    from tests.fuzz.targets import TARGETS

CORPUS = Path(__file__).parent / "corpus"


def main(argv: list[str]) -> None:
    """Run libFuzzer over the target named by ``argv[1]`` (never returns: libFuzzer exits
    with 0 when done, non-zero after a crash)."""
    if len(argv) < 2 or argv[1] not in TARGETS:
        raise SystemExit(f"usage: python -m tests.fuzz {{{','.join(TARGETS)}}} [options] [dirs]")
    name, rest = argv[1], argv[2:]
    target = TARGETS[name]
    if not any(not arg.startswith("-") for arg in rest):
        rest.append(str(CORPUS / name))

    def test_one_input(data: bytes) -> None:
        target(data)

    # libFuzzer runs argv[0] again through the shell for -merge=1 and -jobs: the command
    # that reaches this target (from the repository root).
    atheris.Setup([f"{sys.executable} -m tests.fuzz {name}", *rest], test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
