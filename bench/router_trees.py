"""The router of the local cluster run from two source trees, alternately: what a change of
the router (or of the shared code it runs) costs or gains, with the rest of the cluster
unchanged.

``python -m bench routers <scenario> --tree NAME=DIR --tree NAME=DIR [options]``: before each
run every router of the cluster (``router``, ``router-2``...) is stopped and started again
from the named tree (a checkout or ``git archive`` of the code to measure), A B A B …; the
routers are left running the first tree. Writes
``bench/results/<label>-routers.{jsonl,md,png}``: medians per tree and their ratio (first /
second). The other services keep running the code they were started with.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from bench.loadgen.plan import Options, Timing
from bench.transactions import alternate_routers

#: Run in a tree's directory: stop every router and start it from that tree (the launcher
#: puts the tree of the ``services`` package it imports on the router's PYTHONPATH).
_RESTART = """
from services.local import cluster
from services.local.settings import LocalSettings
settings = LocalSettings()
for name in cluster.instance_names(cluster.ROUTER, settings.router_instances):
    cluster.stop_component(settings, name)
    cluster.start_component(settings, name)
"""


def parse_tree(text: str) -> tuple[str, Path]:
    """``NAME=DIR`` → (name, directory). Raises ``ValueError`` if it is not that shape or
    ``DIR`` holds no ``services`` package."""
    name, sep, directory = text.partition("=")
    path = Path(directory).resolve()
    if not sep or not name or not (path / "services" / "__init__.py").is_file():
        raise ValueError(f"expected NAME=DIR with DIR a source tree (got {text!r})")
    return name, path


def restart_from(trees: Mapping[str, Path]) -> Callable[[str], None]:
    """A function that restarts every router of the local cluster from ``trees[name]`` and
    returns once they are ready. It raises ``subprocess.CalledProcessError`` if the
    launcher fails (a router that does not become ready)."""

    def restart(name: str) -> None:
        tree = trees[name]
        env = {**os.environ, "PYTHONPATH": str(tree)}
        subprocess.run([sys.executable, "-c", _RESTART], cwd=tree, env=env, check=True)

    return restart


def compare_routers(
    scenario: str,
    options: Options,
    timing: Timing,
    *,
    trees: Mapping[str, Path],
    rounds: int,
    workers: int,
    pause: float,
    results_dir: Path,
    log: Callable[[str], None],
) -> tuple[Path, Path, Path]:
    """Run ``rounds`` rounds of ``scenario``, each once with the routers of each of the two
    ``trees`` (name → source tree), in their order; ``pause`` seconds between runs.

    Returns the paths of the JSON lines file, the Markdown table and the PNG chart.

    Raises:
        ValueError: not exactly two trees.
        brokers.BrokerUnavailable: the cluster is not healthy.
        runner.RunError: a run failed.
    """
    if len(trees) != 2:
        raise ValueError(f"two trees to compare, got {len(trees)}")
    first, second = trees
    return alternate_routers(
        scenario,
        options,
        timing,
        modes=(first, second),
        restart=restart_from(trees),
        suffix="routers",
        rounds=rounds,
        workers=workers,
        pause=pause,
        results_dir=results_dir,
        log=log,
    )
