"""Run the ``cormorant`` command in a child process, as the images and the launcher do."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_cormorant(
    *args: str,
    env: Mapping[str, str] | None = None,
    timeout: float = 120.0,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """``cormorant <args>`` (``python -m services.cli``, this checkout first on the path),
    its output captured as text; ``env`` replaces the environment when given; ``input`` is
    its standard input."""
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *args],
        cwd=ROOT,
        env=None if env is None else dict(env),
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
