"""Command line: ``python -m bench run|compare|transactions|routers|summary|list|chaos|soak|sizing``
(and ``python -m bench.loadgen``).

``run <scenario>`` runs one scenario once against one broker and prints its report
(``run kafka-floor``: the two Kafka hops of a p2p message alone, :mod:`bench.kafka_floor`);
``compare <scenario>`` runs it against Cormorant and Mosquitto alternately, with the Kafka
floor in every round, and writes ``bench/results/<label>.{jsonl,md,png}``;
``transactions <scenario>`` runs it against the cluster with its routers in Kafka
transactions and without, alternately (:mod:`bench.transactions`); ``routers <scenario>``
runs it with the cluster's routers started from two source trees, alternately
(:mod:`bench.router_trees`); ``summary`` gathers the latest comparison of every label into
``bench/results/summary.{md,png}``; ``chaos`` kills each process of the local cluster in
turn under load (``bench.chaos``); ``soak`` runs a long steady load and samples the
cluster's resources (``bench.soak``); ``sizing`` measures memory per connection and
subscription, CPU per message and bootstrap time per stage (``bench.sizing``);
``sizing-plan`` turns them into tasks, brokers and costs (``bench.sizing_model``). See
bench/README.md for the scenarios.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from bench import brokers, chaos, kafka_floor, results, sizing, sizing_model, soak, summary
from bench.compare import compare, summary_line
from bench.loadgen import runner
from bench.loadgen.plan import DEFAULT_INFLIGHT, KAFKA_FLOOR, SCENARIOS, Options, Timing, build
from bench.loadgen.transports import TRANSPORTS
from bench.router_trees import compare_routers, parse_tree
from bench.transactions import compare_transactions
from services.local import cluster, layout, open_files, redis
from services.local.settings import LocalSettings

VERSIONS = {"3.1.1": 4, "5": 5, "5.0": 5}


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _common(parser: argparse.ArgumentParser, scenarios: Sequence[str] = SCENARIOS) -> None:
    parser.add_argument("scenario", choices=scenarios)
    g = parser.add_argument_group("scenario options (default: the scenario's own)")
    g.add_argument(
        "--pairs",
        type=int,
        help="p2p / persistent-p2p: publisher→subscriber pairs (kafka-floor: record keys)",
    )
    g.add_argument("--publishers", type=int, help="fan-in / fan-out: publishers")
    g.add_argument("--subscribers", type=int, help="fan-in / fan-out: subscribers")
    g.add_argument("--qos", type=int, choices=(0, 1), help="QoS of publishes and subscriptions")
    g.add_argument("--size", type=int, help="payload size in bytes (at least 20)")
    g.add_argument(
        "--rate",
        type=float,
        help="total msg/s over all publishers (default: unpaced; kafka-floor: 500, and an "
        "unpaced phase after)",
    )
    g.add_argument("--connections", type=int, help="connections scenario: idle clients to open")
    g.add_argument("--mqtt", choices=sorted(VERSIONS), default="3.1.1", help="MQTT version")
    g.add_argument(
        "--inflight",
        type=int,
        default=DEFAULT_INFLIGHT,
        help="QoS 1 PUBLISHes awaiting PUBACK per publisher (p2p: any other than the "
        "default adds -inflight<pairs * inflight> to the label)",
    )
    g.add_argument("--username", help="User Name of every client's CONNECT (label: -auth)")
    g.add_argument("--password", help="Password of every client's CONNECT")
    t = parser.add_argument_group("timing and generator")
    t.add_argument("--warmup", type=float, default=3.0, help="seconds of unmeasured traffic")
    t.add_argument("--duration", type=float, default=10.0, help="measure window, seconds")
    t.add_argument("--drain", type=float, default=10.0, help="max seconds to await stragglers")
    t.add_argument("--setup", type=float, default=30.0, help="max seconds to connect/subscribe")
    t.add_argument("--hold", type=float, default=2.0, help="connections: seconds held open")
    t.add_argument(
        "--workers",
        type=int,
        default=min(4, os.cpu_count() or 1),
        help="generator processes (default: min(4, CPUs))",
    )


def _options(args: argparse.Namespace, host: str, port: int) -> tuple[Options, Timing]:
    options = Options(
        pairs=args.pairs,
        publishers=args.publishers,
        subscribers=args.subscribers,
        qos=args.qos,
        size=args.size,
        rate=args.rate,
        connections=args.connections,
        version=VERSIONS[args.mqtt],
        inflight=args.inflight,
        host=host,
        port=port,
        username=args.username,
        password=args.password,
    )
    timing = Timing(
        warmup=args.warmup,
        duration=args.duration,
        drain=args.drain,
        setup=args.setup,
        hold=args.hold,
    )
    return options, timing


def run_parser(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``run``."""
    _common(parser, (*SCENARIOS, KAFKA_FLOOR))
    parser.add_argument(
        "--broker",
        choices=("cormorant", "mosquitto", "external"),
        default="cormorant",
        help="cormorant: the local cluster (CPU accounted); mosquitto: start one on "
        "--port (default 18830); external: just --host/--port",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument(
        "--port",
        type=int,
        help="cormorant: its plain MQTT port (default from its settings); mosquitto: its "
        "plain port (default 18830; TLS on the next one); external: the port of --transport "
        "(default 1883)",
    )
    parser.add_argument(
        "--transport",
        choices=TRANSPORTS,
        default="tcp",
        help="tcp, tls, ws (MQTT over WebSocket on /mqtt) or wss; cormorant: HAProxy's port "
        "of it and the local CA; mosquitto: tcp or tls",
    )
    parser.add_argument(
        "--ca-file", default="", help="external tls/wss: the CA certificate (PEM) to trust"
    )
    parser.add_argument("--output", type=Path, help="append the result record to this .jsonl")


def _transports(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    unknown = [t for t in names if t not in TRANSPORTS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"a comma-separated list of {', '.join(TRANSPORTS)} (got {text!r})"
        )
    return names


def _tree(text: str) -> tuple[str, Path]:
    try:
        return parse_tree(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def compare_parser(parser: argparse.ArgumentParser, *, mosquitto: bool = True) -> None:
    """Arguments of ``compare`` (and, without ``mosquitto``, of ``transactions``)."""
    _common(parser)
    parser.add_argument("--rounds", type=int, default=3, help="A/B rounds (at least 3)")
    parser.add_argument(
        "--port", type=int, help="Cormorant's plain MQTT port (default: its listen_port)"
    )
    if mosquitto:
        parser.add_argument(
            "--transports",
            type=_transports,
            default=("tcp",),
            help="comma-separated, e.g. tcp,tls,ws,wss: every round runs each (Mosquitto over "
            "tcp and tls only); the table gives ratios to Cormorant tcp and Mosquitto tls",
        )
        parser.add_argument("--mosquitto-port", type=int, default=brokers.MOSQUITTO_PORT)
        parser.add_argument("--mosquitto-tls-port", type=int, default=brokers.MOSQUITTO_TLS_PORT)
        parser.add_argument(
            "--no-kafka-floor",
            dest="kafka_floor",
            action="store_false",
            help="leave out the Kafka floor run of each round (bench/kafka_floor.py) and the "
            "latency ratios to it",
        )
    parser.add_argument("--pause", type=float, default=2.0, help="seconds between runs")
    parser.add_argument("--results-dir", type=Path, default=results.RESULTS_DIR)


@contextlib.contextmanager
def _target(args: argparse.Namespace) -> Iterator[brokers.Target]:
    if args.broker == "mosquitto":
        port = args.port or brokers.MOSQUITTO_PORT
        with brokers.mosquitto(port, port + 1) as target:
            yield target
    elif args.broker == "cormorant":
        yield brokers.cormorant(args.host, args.port)
    else:
        yield brokers.external(args.host, args.port or 1883, args.transport, args.ca_file)


def do_run(args: argparse.Namespace) -> None:
    """``run``: one scenario, one broker, once; prints the report as JSON."""
    if args.scenario == KAFKA_FLOOR:
        do_run_floor(args)
        return
    with _target(args) as target:
        end = target.endpoint(args.transport)
        options, timing = _options(args, end.host, end.port)
        options = dataclasses.replace(options, transport=end.transport, ca_file=end.ca_file)
        plan = build(args.scenario, options, timing)
        _log(f"{plan.label} against {target.name} at {end.host}:{end.port} over {end.transport}")
        report = runner.run(plan, target, args.workers, _log)
    _log(summary_line(report))
    rec = results.record(
        label=plan.label,
        scenario=plan.scenario,
        broker=target.name,
        round_=1,
        options={**vars(args), "host": end.host, "port": end.port},
        report=report,
        transport=end.transport,
    )
    if args.output:
        results.append(args.output, rec)
    print(json.dumps(rec, indent=2, sort_keys=True, default=str))


def do_run_floor(args: argparse.Namespace) -> None:
    """``run kafka-floor``: the Kafka floor on the local cluster's Kafka, once."""
    if args.broker != "cormorant" or args.transport != "tcp":
        raise SystemExit("bench: kafka-floor runs on the local cluster's Kafka only")
    from services.local.settings import LocalSettings

    settings = LocalSettings()
    target = brokers.cormorant(args.host, args.port, settings)
    options, timing = _options(args, target.host, target.port)
    name = kafka_floor.label(options)
    _log(f"{name} on Kafka at {settings.kafka_bootstrap}")
    rec = kafka_floor.run_recorded(
        options, timing, settings, target, _log,
        label=name, scenario=KAFKA_FLOOR, round_=1, recorded_options=vars(args),
    )  # fmt: skip
    if args.output:
        results.append(args.output, rec)
    print(json.dumps(rec, indent=2, sort_keys=True, default=str))


def _alternate(
    args: argparse.Namespace,
    comparison: Callable[..., tuple[Path, Path, Path]],
    **extra: object,
) -> None:
    """Run ``comparison`` (:func:`~bench.compare.compare` or
    :func:`~bench.transactions.compare_transactions`) as the arguments say, print its table."""
    if args.rounds < 1:
        raise SystemExit("--rounds must be at least 1")
    options, timing = _options(args, "127.0.0.1", args.port or 1883)
    jsonl, md, png = comparison(
        args.scenario,
        options,
        timing,
        rounds=args.rounds,
        workers=args.workers,
        pause=args.pause,
        results_dir=args.results_dir,
        log=_log,
        **extra,
    )
    print(md.read_text(encoding="utf-8"))
    _log(f"wrote {jsonl}, {md} and {png}")


def _cluster_options(parser: argparse.ArgumentParser) -> None:
    """``--own-cluster`` and ``--production``: which cluster a run disrupts or measures."""
    parser.add_argument(
        "--own-cluster",
        action="store_true",
        help="start a cluster of its own on free ports in a temporary directory",
    )
    parser.add_argument(
        "--production",
        action="store_true",
        help="3 Kafka brokers, Redis with replicas and Sentinels (with --own-cluster: start "
        "one; else the running cluster must be one); chaos: the production rounds",
    )


def _cluster(args: argparse.Namespace, stack: contextlib.ExitStack) -> LocalSettings:
    """The settings of the cluster ``args`` name: one of its own (stopped when ``stack``
    closes), or the one ``cormorant up`` started; the cluster is brought up (whatever is
    not running is started)."""
    if args.own_cluster:
        keep = getattr(args, "keep_logs", None)
        settings = stack.enter_context(chaos.own_cluster(args.production, keep_logs=keep))
    else:
        settings = layout.current(LocalSettings())
        if args.production and not settings.redis_replicas:
            raise SystemExit("--production: the running cluster is not in the production layout")
    cluster.up(settings)
    return settings


def chaos_parser(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``chaos``."""
    parser.add_argument(
        "--processes",
        help="comma-separated processes to kill, in order (default: every process of the "
        f"cluster; with --production: {','.join(chaos.PRODUCTION_ROUNDS)}; "
        f"{chaos.REDIS_PRIMARY} = the Redis node that is primary then; "
        f"{chaos.KAFKA_ROLLING} = a rolling restart of the Kafka brokers)",
    )
    parser.add_argument("--publishers", type=int, default=20, help="QoS 1 publishers")
    parser.add_argument("--rate", type=float, default=500.0, help="msg/s over all publishers")
    parser.add_argument("--mqtt", choices=sorted(VERSIONS), default="3.1.1", help="MQTT version")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds before the first kill")
    parser.add_argument(
        "--down",
        type=float,
        help="seconds a process stays dead (default 1; with --production "
        f"{chaos.PRODUCTION_DOWN:g}: beyond the failover thresholds)",
    )
    parser.add_argument(
        "--settle", type=float, default=10.0, help="seconds of load after recovery, per kill"
    )
    parser.add_argument(
        "--recovery-timeout",
        type=float,
        default=chaos.RESUME_BOUND,
        help="max seconds after a process is back to wait for new traffic to flow "
        f"(default {chaos.RESUME_BOUND:g})",
    )
    parser.add_argument(
        "--drain",
        type=float,
        default=120.0,
        help="at the end: max seconds for the last PUBACKs, then seconds without any delivery "
        "before the wait for each publisher's last message gives up",
    )
    _cluster_options(parser)
    parser.add_argument(
        "--keep-logs",
        type=Path,
        help="with --own-cluster: copy its processes' logs into this directory at the end",
    )
    parser.add_argument("--output", type=Path, default=results.RESULTS_DIR / "chaos.jsonl")


def default_processes(settings: LocalSettings) -> list[str]:
    """Every process of the cluster once, the services first in the issue's order. The
    Redis node that is primary now goes first among the Redis nodes: its kill is a
    failover (and with one replica, so is the next node's: it is primary by then)."""
    names = [part.name for part in cluster.components(settings)]
    first = ["router", "ingest-node1", "device-persist"]
    infra = [n for n in names if n.startswith(("kafka", "redis", "postgres"))]
    primary = redis.primary(settings) if settings.redis_replicas else None
    if primary is not None:
        nodes = [infra.index(redis.node_name(settings, n)) for n in redis.node_ids(settings)]
        leader = infra.index(redis.node_name(settings, primary))
        infra[nodes[0]], infra[leader] = infra[leader], infra[nodes[0]]
    rest = [n for n in names if n not in first and n not in infra]
    return [*first, *infra, *rest]


def do_chaos(args: argparse.Namespace) -> None:
    """``chaos``: kill each process in turn under load; print and record the result."""
    down = args.down
    if down is None:
        down = chaos.PRODUCTION_DOWN if args.production else 1.0
    timing = chaos.Timing(
        warmup=args.warmup,
        down=down,
        settle=args.settle,
        recovery_timeout=args.recovery_timeout,
        drain=args.drain,
    )
    with contextlib.ExitStack() as stack:
        settings = _cluster(args, stack)
        if args.processes:
            names = args.processes.split(",")
        elif args.production:
            names = list(chaos.PRODUCTION_ROUNDS)
        else:
            names = default_processes(settings)
        _log(f"chaos over {', '.join(names)} ({layout.of(settings).describe()})")
        result = chaos.run(
            settings,
            names,
            publishers=args.publishers,
            rate=args.rate,
            version=VERSIONS[args.mqtt],
            timing=timing,
            log=_log,
        )
    rec = results.record(
        label="chaos",
        scenario="chaos",
        broker="cormorant",
        round_=1,
        options={**vars(args), "layout": layout.of(settings).describe()},
        report=result.as_dict(),
    )
    results.append(args.output, rec)
    print(chaos.table(result))
    _log(f"appended to {args.output}")
    if result.report is None or result.report.lost:
        raise SystemExit(1)


def soak_parser(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``soak``."""
    parser.add_argument("--minutes", type=float, default=30.0, help="measured minutes")
    parser.add_argument("--rate", type=float, default=2000.0, help="msg/s over all publishers")
    parser.add_argument("--clients", type=int, default=5000, help="connected clients (pairs x 2)")
    parser.add_argument(
        "--persistent-every",
        type=int,
        default=10,
        help="every n-th pair is persistent (clean_session=false); 0: none",
    )
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--workers", type=int, default=2, help="load generator processes")
    _cluster_options(parser)
    parser.add_argument(
        "--out", type=Path, help="directory for samples.csv, soak.png, summary.md "
        "(default: bench/results/soak-<date>)"
    )  # fmt: skip


def do_soak(args: argparse.Namespace) -> None:
    """``soak``: a long steady load; samples, chart and summary."""
    out = args.out or results.RESULTS_DIR / f"soak-{time.strftime('%Y%m%d-%H%M')}"
    out.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        settings = _cluster(args, stack)
        load = soak.plan(
            "127.0.0.1",
            settings.listen_port,
            clients=args.clients,
            rate=args.rate,
            minutes=args.minutes,
            persistent_every=args.persistent_every,
        )
        _log(
            f"soak: {args.clients} clients, {args.rate:g} msg/s, {args.minutes:g} min "
            f"({layout.of(settings).describe()}); samples every {args.interval:g} s"
        )
        result = soak.run(settings, load, interval=args.interval, workers=args.workers, log=_log)
    soak.write_csv(result.samples, out / "samples.csv")
    title = f"{args.clients} clients, {args.rate:g} msg/s, {args.minutes:g} min"
    soak.chart(result.samples, out / "soak.png", title)
    (out / "summary.md").write_text(soak.markdown(result) + "\n", encoding="utf-8")
    rec = results.record(
        label="soak",
        scenario="soak",
        broker="cormorant",
        round_=1,
        options={**vars(args), "out": str(out), "layout": layout.of(settings).describe()},
        report={"load": result.report, "summary": result.rows},
    )
    results.append(results.RESULTS_DIR / "soak.jsonl", rec)
    print(soak.markdown(result))
    _log(f"wrote {out}/samples.csv, soak.png and summary.md")


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"comma-separated integers (got {text!r})") from None
    if not values or any(v < 0 for v in values) or values != sorted(values):
        raise argparse.ArgumentTypeError(f"ascending integers, 0 or more (got {text!r})")
    return values


def sizing_parser(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``sizing``."""
    parser.add_argument(
        "--phases",
        default="memory,cpu,bootstrap",
        help="comma-separated, in this order: memory, cpu, bootstrap",
    )
    m = parser.add_argument_group("memory")
    m.add_argument("--connections", type=int, default=2000, help="idle connections to open")
    m.add_argument("--subscriptions", type=int, default=5, help="subscriptions per connection")
    m.add_argument("--settle", type=float, default=5.0, help="seconds before each sample")
    c = parser.add_argument_group("cpu")
    c.add_argument(
        "--rates",
        type=_ints,
        default=[0, 500],
        help="ascending msg/s over all publishers, one set of runs each; 0: unpaced",
    )
    c.add_argument("--duration", type=float, default=20.0, help="measured seconds per run")
    c.add_argument("--rounds", type=int, default=2, help="runs of each scenario, alternating")
    c.add_argument("--workers", type=int, default=2, help="load generator processes")
    b = parser.add_argument_group("bootstrap")
    b.add_argument(
        "--sessions",
        type=_ints,
        default=[0, 25_000, 50_000, 100_000],
        help="ascending totals of sessions in the compacted topics, one restart step each",
    )
    b.add_argument("--session-subscriptions", type=int, default=2, help="subscriptions per session")
    b.add_argument(
        "--components",
        default="router,ingest-node1,device-persist",
        help="comma-separated components to restart at each step",
    )
    b.add_argument("--restarts", type=int, default=2, help="restarts per component and step")
    _cluster_options(parser)
    parser.add_argument("--output", type=Path, default=results.RESULTS_DIR / "sizing.jsonl")


def do_sizing(args: argparse.Namespace) -> None:
    """``sizing``: the phases asked for; each appended to the output, then a summary."""
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = set(phases) - {"memory", "cpu", "bootstrap"}
    if unknown or not phases:
        raise SystemExit(f"bench: --phases: memory, cpu and/or bootstrap (got {args.phases!r})")
    if min(args.connections, args.subscriptions, args.rounds, args.restarts) < 1:
        raise SystemExit("bench: --connections, --subscriptions, --rounds, --restarts: at least 1")
    open_files.raise_soft_limit()  # each idle connection is a socket here too
    memory: dict[str, object] | None = None
    cpu: list[dict[str, object]] = []
    boot: dict[str, object] | None = None
    with contextlib.ExitStack() as stack:
        if args.own_cluster:
            # fan-in-app's subscribers are APPLICATION clients: their ids start with "app-";
            # every connection comes from one address: no connection rate limits.
            settings = stack.enter_context(
                chaos.own_cluster(
                    args.production,
                    application_client_ids=["app-*"],
                    max_connection_rate=0,
                    max_connection_rate_per_address=0,
                )
            )
        else:
            settings = layout.current(LocalSettings())
        cluster.up(settings)
        described = layout.of(settings).describe()

        def record(phase: str, report: dict[str, object]) -> None:
            rec = results.record(
                label="sizing",
                scenario=f"sizing-{phase}",
                broker="cormorant",
                round_=1,
                options={**vars(args), "layout": described},
                report=report,
            )
            results.append(args.output, rec)

        if "memory" in phases:
            _log(f"sizing: memory, {args.connections} connections ({described})")
            memory = sizing.memory_phase(
                settings, args.connections, args.subscriptions, args.settle, _log
            )
            record("memory", memory)
        if "cpu" in phases:
            _log(f"sizing: cpu at {args.rates} msg/s (0: unpaced)")
            cpu = sizing.cpu_phase(
                settings,
                rates=args.rates,
                duration=args.duration,
                rounds=args.rounds,
                workers=args.workers,
                log=_log,
            )
            record("cpu", {"runs": cpu})
        if "bootstrap" in phases:
            _log(f"sizing: bootstrap to {args.sessions[-1]:,} sessions")
            boot = sizing.bootstrap_phase(
                settings,
                steps=args.sessions,
                subscriptions=args.session_subscriptions,
                components=[c.strip() for c in args.components.split(",") if c.strip()],
                rounds=args.restarts,
                log=_log,
            )
            record("bootstrap", boot)
    print(sizing.markdown(memory, cpu, boot))
    _log(f"appended to {args.output}")


def do_compare(args: argparse.Namespace) -> None:
    """``compare``: Cormorant vs Mosquitto, A B A B …"""
    _alternate(
        args,
        compare,
        mosquitto_port=args.mosquitto_port,
        transports=args.transports,
        mosquitto_tls_port=args.mosquitto_tls_port,
        cormorant_port=args.port,
        floor=args.kafka_floor,
    )


def do_transactions(args: argparse.Namespace) -> None:
    """``transactions``: the routers routing by origins vs in transactions, A B A B …"""
    _alternate(args, compare_transactions)


def do_routers(args: argparse.Namespace) -> None:
    """``routers``: the routers from one source tree vs another, A B A B …"""
    _alternate(args, compare_routers, trees=dict(args.tree))


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m bench``."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser(sub.add_parser("run", help="one scenario against one broker"))
    compare_parser(sub.add_parser("compare", help="Cormorant vs Mosquitto, alternating"))
    chaos_parser(sub.add_parser("chaos", help="kill each process in turn under load"))
    soak_parser(sub.add_parser("soak", help="a long steady load; are resources flat?"))
    compare_parser(
        sub.add_parser(
            "transactions", help="the router with and without Kafka transactions, alternating"
        ),
        mosquitto=False,
    )
    routers = sub.add_parser("routers", help="the routers from two source trees, alternating")
    compare_parser(routers, mosquitto=False)
    routers.add_argument(
        "--tree",
        type=_tree,
        action="append",
        required=True,
        help="NAME=DIR: a source tree to start the routers from (twice: A, then B)",
    )
    sizing_parser(sub.add_parser("sizing", help="memory, CPU and bootstrap time per stage"))
    plan_parser = sub.add_parser(
        "sizing-plan", help="tasks, brokers, Redis and cost from the sizing measurements"
    )
    plan_parser.add_argument("--input", type=Path, default=results.RESULTS_DIR / "sizing.jsonl")
    sub.add_parser("list", help="the scenario names")
    summary_parser = sub.add_parser("summary", help="one table and chart over the comparisons")
    summary_parser.add_argument("labels", nargs="*", help="result labels (default: all)")
    summary_parser.add_argument("--results-dir", type=Path, default=results.RESULTS_DIR)
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            print("\n".join((*SCENARIOS, KAFKA_FLOOR)))
        elif args.command == "summary":
            md, png = summary.summarize(args.results_dir, args.labels)
            print(md.read_text(encoding="utf-8"))
            _log(f"wrote {md} and {png}")
        elif args.command == "run":
            do_run(args)
        elif args.command == "chaos":
            do_chaos(args)
        elif args.command == "soak":
            do_soak(args)
        elif args.command == "sizing":
            do_sizing(args)
        elif args.command == "sizing-plan":
            measured = sizing_model.measured_from(args.input)
            print(sizing_model.markdown(sizing_model.grid(measured)), end="")
        elif args.command == "transactions":
            do_transactions(args)
        elif args.command == "routers":
            do_routers(args)
        else:
            do_compare(args)
    except (brokers.BrokerUnavailable, runner.RunError, ValueError, KeyError) as exc:
        raise SystemExit(f"bench: {exc}") from None
    except KeyboardInterrupt:
        raise SystemExit("bench: interrupted") from None


def run_main(argv: Sequence[str] | None = None) -> None:
    """``python -m bench.loadgen <scenario> …``: the ``run`` command."""
    parser = argparse.ArgumentParser(prog="python -m bench.loadgen", description=__doc__)
    run_parser(parser)
    args = parser.parse_args(argv)
    try:
        do_run(args)
    except (brokers.BrokerUnavailable, runner.RunError, ValueError, KeyError) as exc:
        raise SystemExit(f"bench: {exc}") from None
    except KeyboardInterrupt:
        raise SystemExit("bench: interrupted") from None
