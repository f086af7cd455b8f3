"""Side by side: one scenario against the local Cormorant cluster and a Mosquitto the bench
starts, alternately (A B A B …), then the results file, Markdown table and chart.

With several transports (``--transports tcp,tls,ws,wss``) every round runs the scenario over
each of them, Cormorant then Mosquitto per transport (Mosquitto only over the ones it
serves, ``brokers.MOSQUITTO_TRANSPORTS``), each round starting one transport further, and
the table gives every transport's medians with their ratios to Cormorant over plain TCP and
to Mosquitto over TLS.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import brokers, chart, results
from bench.loadgen import runner
from bench.loadgen.plan import Options, Timing, build


def compare(
    scenario: str,
    options: Options,
    timing: Timing,
    *,
    rounds: int,
    workers: int,
    mosquitto_port: int,
    pause: float,
    results_dir: Path,
    log: Callable[[str], None],
    transports: tuple[str, ...] = ("tcp",),
    mosquitto_tls_port: int = brokers.MOSQUITTO_TLS_PORT,
    cormorant_port: int | None = None,
) -> tuple[Path, Path, Path]:
    """Run ``rounds`` rounds of Cormorant then Mosquitto over each of ``transports``;
    ``pause`` seconds between runs. Cormorant's plain MQTT port is ``cormorant_port``
    (default: the cluster's ``listen_port``), its other ports come from its settings;
    ``options.host``/``port`` are replaced by each target's.

    Returns the paths of the JSON lines file, the Markdown table and the PNG chart.

    Raises:
        brokers.BrokerUnavailable: the cluster is down, or Mosquitto cannot start.
        runner.RunError: a run failed.
        ValueError: no transport, or one unknown.
    """
    if not transports:
        raise ValueError("give at least one transport")
    cormorant = brokers.cormorant(options.host, cormorant_port)
    brokers.mosquitto_binary()
    records: list[dict[str, Any]] = []
    label = build(scenario, options, timing).label
    if transports != ("tcp",):
        label += "-" + "-".join(transports)
    jsonl = results_dir / f"{label}.jsonl"
    for round_ in range(1, rounds + 1):
        # Each round starts one transport later, so no transport always follows the same
        # run (an unpaced run's leftovers) or always meets the same moment of the round.
        shift = (round_ - 1) % len(transports)
        runs = [
            (transport, name)
            for transport in transports[shift:] + transports[:shift]
            for name in ("cormorant", "mosquitto")
            if name == "cormorant" or transport in brokers.MOSQUITTO_TRANSPORTS
        ]
        for transport, name in runs:
            # A fresh Mosquitto per run: no heap left over from the previous run (which
            # would hide the connections scenario's memory growth).
            with contextlib.ExitStack() as stack:
                target = (
                    cormorant
                    if name == "cormorant"
                    else stack.enter_context(brokers.mosquitto(mosquitto_port, mosquitto_tls_port))
                )
                end = target.endpoint(transport)
                opts = dataclasses.replace(
                    options, host=end.host, port=end.port, transport=transport, ca_file=end.ca_file
                )
                plan = build(scenario, opts, timing)
                log(f"round {round_}/{rounds}: {label} against {target.name} over {transport}")
                report = runner.run(plan, target, workers, log)
            log(summary_line(report))
            rec = results.record(
                label=label,
                scenario=scenario,
                broker=target.name,
                round_=round_,
                options={**dataclasses.asdict(opts), **dataclasses.asdict(timing)},
                report=report,
                transport=transport,
            )
            results.append(jsonl, rec)
            records.append(rec)
            time.sleep(pause)
    md = results_dir / f"{label}.md"
    png = results_dir / f"{label}.png"
    if transports == ("tcp",):
        md.write_text(results.markdown(records), encoding="utf-8")
        return jsonl, md, chart.draw(records, png, ("cormorant", "mosquitto"))
    md.write_text(results.transports_markdown(records), encoding="utf-8")
    series = [{**rec, "broker": results.series(rec)} for rec in records]
    names = tuple(dict.fromkeys(rec["broker"] for rec in series))
    return jsonl, md, chart.draw(series, png, names)


def summary_line(report: dict[str, Any]) -> str:
    """One line of the headline figures of a report (for the console)."""
    if "connects_per_s" in report:
        per_conn = report["memory_per_connection_kib"]
        return (
            f"  {report['connections']} connections, {report['connects_per_s'] or 0:,.0f}/s, "
            f"{per_conn if per_conn is not None else float('nan'):.2f} KiB/conn, "
            f"{report['failed']} failed"
        )
    lat = report["latency_ms"]

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    tls = f", {report['tls']}" if report.get("tls") else ""
    return (
        f"  published {report['published_per_s']:,.0f}/s, delivered "
        f"{report['delivered_per_s']:,.0f}/s, e2e p50/p99/max {ms(lat['p50'])}/"
        f"{ms(lat['p99'])}/{ms(lat['max'])} ms, PUBACK p50/p99 "
        f"{ms(report['puback_ms']['p50'])}/{ms(report['puback_ms']['p99'])} ms, lost "
        f"{report['lost']}, dup {report['duplicates']}, broker CPU "
        f"{report['broker_cpu_total_s']:.2f}s, generator CPU {report['generator_cpu_s']:.2f}s{tls}"
    )
