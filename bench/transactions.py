"""What the router's Kafka transactions cost: one scenario against the local cluster with
its routers routing by origins and in Kafka transactions, alternately.

Between two runs every router of the cluster (``router``, ``router-2``...) is stopped and
started again with ``router_transactions`` off (``origins``, the default: offsets committed
after the outputs are stored, the readers dropping what a crashed router routed again) or
on (``transactional``: one Kafka transaction per ``msg.all`` partition per batch); the rest
of the cluster keeps running. Both are exactly once through a router crash
(docs/guarantees/index.md). The routers are left in the default mode.
``python -m bench transactions <scenario> [options]`` writes
``bench/results/<label>-router-transactions.{jsonl,md,png}``: medians per mode and their
ratio (origins / transactional). Results before 2026-11-26 name the mode without
transactions ``at-least-once``: the readers did not drop copies then.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import brokers, chart, results
from bench.compare import summary_line
from bench.loadgen import runner
from bench.loadgen.plan import Options, Timing, build

#: The two modes, as the results name them (the ``broker`` of a record).
TRANSACTIONAL = "transactional"
ORIGINS = "origins"


def restart_routers(transactions: bool) -> None:
    """Stop every router of the local cluster and start it again with
    ``router_transactions=transactions``; returns once they are ready.

    Raises :class:`~services.local.processes.StartError` if one does not become ready.
    """
    from services.local import cluster
    from services.local.settings import LocalSettings

    settings = LocalSettings().model_copy(update={"router_transactions": transactions})
    for name in cluster.instance_names(cluster.ROUTER, settings.router_instances):
        cluster.stop_component(settings, name)
        cluster.start_component(settings, name)


def compare_transactions(
    scenario: str,
    options: Options,
    timing: Timing,
    *,
    rounds: int,
    workers: int,
    pause: float,
    results_dir: Path,
    log: Callable[[str], None],
    restart: Callable[[bool], None] = restart_routers,
) -> tuple[Path, Path, Path]:
    """Run ``rounds`` rounds of ``scenario``, each with the routers routing by origins and
    then transactional (``restart(transactions)`` switches them); ``pause`` seconds between
    runs.

    Returns the paths of the JSON lines file, the Markdown table and the PNG chart.

    Raises:
        brokers.BrokerUnavailable: the cluster is not healthy.
        runner.RunError: a run failed.
    """
    return alternate_routers(
        scenario,
        options,
        timing,
        modes=(ORIGINS, TRANSACTIONAL),
        restart=lambda mode: restart(mode == TRANSACTIONAL),
        suffix="router-transactions",
        rounds=rounds,
        workers=workers,
        pause=pause,
        results_dir=results_dir,
        log=log,
    )


def alternate_routers(
    scenario: str,
    options: Options,
    timing: Timing,
    *,
    modes: tuple[str, str],
    restart: Callable[[str], None],
    suffix: str,
    rounds: int,
    workers: int,
    pause: float,
    results_dir: Path,
    log: Callable[[str], None],
) -> tuple[Path, Path, Path]:
    """Run ``rounds`` rounds of ``scenario`` against the local cluster, each round once per
    name of ``modes`` (A B A B …), ``restart(mode)`` putting the routers in that mode before
    its run; ``pause`` seconds between runs. The routers are left in the first mode.

    Writes ``<results_dir>/<label>-<suffix>.{jsonl,md,png}``, the records' ``broker`` being
    the mode, the table giving the medians per mode and their ratio (first / second), and
    returns their paths.

    Raises:
        brokers.BrokerUnavailable: the cluster is not healthy.
        runner.RunError: a run failed.
    """
    records: list[dict[str, Any]] = []
    label = f"{build(scenario, options, timing).label}-{suffix}"
    jsonl = results_dir / f"{label}.jsonl"
    try:
        for round_ in range(1, rounds + 1):
            for mode in modes:
                log(f"round {round_}/{rounds}: routers {mode}")
                restart(mode)
                target = brokers.cormorant(options.host, options.port)  # the new pids
                report = runner.run(build(scenario, options, timing), target, workers, log)
                log(summary_line(report))
                rec = results.record(
                    label=label,
                    scenario=scenario,
                    broker=mode,
                    round_=round_,
                    options={**dataclasses.asdict(options), **dataclasses.asdict(timing)},
                    report=report,
                )
                results.append(jsonl, rec)
                records.append(rec)
                time.sleep(pause)  # the machine settles between runs
    finally:
        restart(modes[0])
    md = results_dir / f"{label}.md"
    md.write_text(results.markdown(records, *modes), encoding="utf-8")
    png = chart.draw(records, results_dir / f"{label}.png", modes)
    return jsonl, md, png
