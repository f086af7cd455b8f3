"""The parent side of one run: start the workers, drive the phases, sample CPU and memory
of the broker and of the generator, and turn the workers' counts into a report.

A report is a flat dict (JSON-ready). Rates are msg/s; latencies ms; CPU in seconds;
memory in bytes or KiB as the key says. Any failure stops every worker (their sockets are
closed by the workers themselves; a worker that does not exit in time is terminated).
"""

from __future__ import annotations

import multiprocessing
import time
from array import array
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection as Pipe
from multiprocessing.connection import wait
from typing import Any

import psutil

from bench import brokers
from bench.brokers import Target, assert_alive, cpu_seconds, rss_bytes
from bench.loadgen import stats, worker
from bench.loadgen.plan import Plan

#: Seconds between the start command and the first PUBLISH (lets every worker get it).
START_LEAD = 0.3

#: Seconds a worker may take to exit after its last message before it is terminated.
EXIT_TIMEOUT = 15.0


class RunError(RuntimeError):
    """A worker failed or a phase did not complete in time; the message says which."""


Job = tuple[str, Callable[..., None], tuple[object, ...]]
"""One process to start: its name, its entry point (called as ``target(pipe, *args)``, the
pipe being its end of the control pipe) and the arguments after the pipe (picklable)."""


class Workers:
    """The worker processes of one run and their pipes."""

    def __init__(self, jobs: Sequence[Job]) -> None:
        """Start one process per job (spawned, so no state leaks from this process); the
        pipes and processes are in the order of ``jobs``."""
        ctx = multiprocessing.get_context("spawn")
        self.pipes: list[Pipe] = []
        self.procs: list[multiprocessing.process.BaseProcess] = []
        for name, target, args in jobs:
            parent_end, child_end = ctx.Pipe()
            proc = ctx.Process(target=target, args=(child_end, *args), name=name, daemon=True)
            proc.start()
            child_end.close()
            self.pipes.append(parent_end)
            self.procs.append(proc)

    def broadcast(self, kind: str, data: object = None) -> None:
        """Send ``(kind, data)`` to every worker still listening."""
        for pipe in self.pipes:
            try:
                pipe.send((kind, data))
            except OSError:
                continue

    @classmethod
    def of_plan(cls, plan: Plan, count: int) -> Workers:
        """``count`` load generator workers, each running its share of ``plan``."""
        return cls(
            [
                (f"bench-worker-{index}", worker.main, (plan.share(index, count), index))
                for index in range(count)
            ]
        )

    def send(self, index: int, kind: str, data: object = None) -> None:
        """Send ``(kind, data)`` to worker ``index``."""
        self.pipes[index].send((kind, data))

    def gather(self, kind: str, timeout: float, only: Sequence[int] | None = None) -> list[Any]:
        """The data of one ``kind`` message from each worker (or from the workers whose
        indexes are ``only``), in worker order.

        Raises:
            RunError: a worker reported an error, exited, or the ``timeout`` (s) passed.
        """
        got: dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        index_of = {id(p): i for i, p in enumerate(self.pipes)}
        wanted = range(len(self.pipes)) if only is None else only
        while len(got) < len(wanted):
            left = deadline - time.monotonic()
            waiting = [self.pipes[i] for i in wanted if i not in got]
            ready = wait(waiting, timeout=max(left, 0))
            if not ready:
                raise RunError(f"workers did not report {kind!r} within {timeout:g}s")
            for pipe in ready:
                assert isinstance(pipe, Pipe)
                try:
                    msg_kind, data = pipe.recv()
                except EOFError:
                    raise RunError(f"worker {index_of[id(pipe)]} exited unexpectedly") from None
                if msg_kind == "error":
                    raise RunError(str(data))
                if msg_kind != kind:
                    raise RunError(f"expected {kind!r} from a worker, got {msg_kind!r}")
                got[index_of[id(pipe)]] = data
        return [got[i] for i in wanted]

    def cpu(self) -> float:
        """User + system CPU seconds the workers used so far (their children excluded)."""
        return sum(self.cpu_each())

    def cpu_each(self) -> list[float]:
        """User + system CPU seconds each worker used so far, in worker order (0 for one
        not started or gone)."""
        seconds: list[float] = []
        for proc in self.procs:
            try:
                times = psutil.Process(proc.pid).cpu_times() if proc.pid is not None else None
            except psutil.Error:
                times = None
            seconds.append(0.0 if times is None else times.user + times.system)
        return seconds

    def stop(self, abort: bool) -> None:
        """Tell the workers to abort (when ``abort``), wait for them, terminate stragglers."""
        if abort:
            self.broadcast("abort", "the parent stopped the run")
        deadline = time.monotonic() + EXIT_TIMEOUT
        for proc in self.procs:
            proc.join(max(deadline - time.monotonic(), 0.1))
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
        for pipe in self.pipes:
            pipe.close()


def _sleep_until(epoch_ns: int) -> None:
    time.sleep(max(epoch_ns - time.time_ns(), 0) / 1e9)


def run(plan: Plan, target: Target, workers: int, log: Callable[[str], None]) -> dict[str, Any]:
    """Run ``plan`` against ``target`` with ``workers`` processes; return the report.

    Raises:
        RunError: a phase failed (the report would be meaningless).
        BrokerUnavailable: the broker does not treat the plan's APPLICATION subscribers so.
    """
    brokers.require_application(target, [s.client_id for s in plan.subscribers if s.application])
    count = max(1, min(workers, max(len(plan.publishers), len(plan.subscribers), 1)))
    if plan.scenario == "connections":
        count = max(1, min(workers, plan.connections))
    pool = Workers.of_plan(plan, count)
    ok = False
    try:
        if plan.scenario == "connections":
            report = _connections(plan, target, pool, log)
        else:
            report = _traffic(plan, target, pool, log)
        ok = True
    finally:
        pool.stop(abort=not ok)
    report["workers"] = count
    return report


def _traffic(
    plan: Plan, target: Target, pool: Workers, log: Callable[[str], None]
) -> dict[str, Any]:
    timing = plan.timing
    pool.gather("subscribed", timing.setup * (1 + len(plan.subscribers) / 20))
    pool.broadcast("publishers")
    routed = pool.gather("routed", timing.setup * 2)
    log(f"route confirmed after {max(routed, default=0):.2f}s; warm-up {timing.warmup:g}s")
    t0 = time.time_ns() + int(START_LEAD * 1e9)
    pool.broadcast("start", t0)
    window_start = t0 + int(timing.warmup * 1e9)
    window_end = window_start + int(timing.duration * 1e9)
    _sleep_until(window_start)
    broker_before, gen_before = cpu_seconds(target.processes), pool.cpu()
    _sleep_until(window_end)
    broker_after, gen_after = cpu_seconds(target.processes), pool.cpu()
    assert_alive(target)
    log(f"measured {timing.duration:g}s; draining (at most {timing.drain:g}s)")
    sent_parts = pool.gather("sent", timing.drain + timing.setup)
    sent: dict[int, int] = {}
    for part in sent_parts:
        sent.update(part)
    pool.broadcast("expect", sent)
    results: list[worker.WorkerResult] = pool.gather("result", timing.drain + timing.setup)
    gen_total = pool.cpu()
    return summarize(
        plan,
        results,
        sent,
        broker_cpu={k: broker_after[k] - broker_before[k] for k in broker_after},
        generator_cpu=gen_after - gen_before,
        generator_cpu_total=gen_total,
        route_seconds=max(routed, default=0.0),
        socket_holders=target.memory,
    )


def summarize(
    plan: Plan,
    results: list[worker.WorkerResult],
    sent: dict[int, int],
    *,
    broker_cpu: dict[str, float],
    generator_cpu: float,
    generator_cpu_total: float,
    route_seconds: float,
    socket_holders: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The report of a traffic run from the workers' results (pure; see the module doc).

    ``socket_holders`` name the processes of ``broker_cpu`` that hold the client sockets
    (Cormorant's ingest nodes, Mosquitto): what a transport (TLS, WebSocket) costs is
    spent there, reported as their CPU µs per delivered message.
    """
    duration = plan.timing.duration
    e2e = array("q")
    ack = array("q")
    lost = duplicates = reordered = expected = received = 0
    for res in results:
        e2e.extend(res.e2e)
        ack.extend(res.ack)
        for sub in res.subscribers:
            lost += stats.lost(sent, sub.expected, sub.distinct)
            duplicates += sub.duplicates
            reordered += sub.reordered
            received += sub.received
            expected += sum(sent.get(p, 0) for p in sub.expected)
    published = sum(r.published for r in results)
    delivered = sum(r.delivered for r in results)
    latency = stats.latency_summary_ms(e2e)
    ack_latency = stats.latency_summary_ms(ack)
    stack_cpu = sum(broker_cpu.values())
    holders_cpu = sum(broker_cpu.get(name, 0.0) for name in socket_holders)
    report: dict[str, Any] = {
        "transport": plan.transport,
        "tls": next((r.tls for r in results if r.tls), ""),
        "published_per_s": published / duration,
        "delivered_per_s": delivered / duration,
        "latency_ms": latency,
        "puback_ms": {"p50": ack_latency["p50"], "p99": ack_latency["p99"]},
        "latency_samples": len(e2e),
        "sent": sum(sent.values()),
        "expected_deliveries": expected,
        "received": received,
        "lost": lost,
        "duplicates": duplicates,
        "reordered": reordered,
        "unacked": sum(r.unacked for r in results),
        "disconnects": sum(r.disconnects for r in results),
        "route_seconds": route_seconds,
        "generator_cpu_s": generator_cpu,
        "generator_cpu_total_s": generator_cpu_total,
        "broker_cpu_s": broker_cpu,
        "broker_cpu_total_s": stack_cpu,
        "delivered_per_cpu_s": stats.ratio(delivered, stack_cpu),
        # Per stage: what each process costs a delivered message, which a loaded machine
        # distorts less than throughput does.
        "broker_cpu_us_per_delivered": {
            name: stats.ratio(seconds * 1e6, delivered) for name, seconds in broker_cpu.items()
        },
        "socket_holders_cpu_s": holders_cpu if socket_holders else None,
        "socket_holders_us_per_delivered": (
            stats.ratio(holders_cpu * 1e6, delivered) if socket_holders else None
        ),
        "published_per_cpu_s": stats.ratio(published, stack_cpu),
    }
    return report


def _connections(
    plan: Plan, target: Target, pool: Workers, log: Callable[[str], None]
) -> dict[str, Any]:
    timing = plan.timing
    rss_before = rss_bytes(target.processes, tuple(target.processes))
    cpu_before, gen_before = cpu_seconds(target.processes), pool.cpu()
    parts: list[worker.ConnectResult] = pool.gather(
        "connected", timing.setup + plan.connections / 100
    )
    cpu_after, gen_after = cpu_seconds(target.processes), pool.cpu()
    opened = sum(p.opened for p in parts)
    log(f"{opened} connections open; holding {timing.hold:g}s")
    time.sleep(timing.hold)
    rss_after = rss_bytes(target.processes, tuple(target.processes))
    assert_alive(target)
    pool.broadcast("close")
    pool.gather("closed", timing.setup)
    latencies = array("q")
    for part in parts:
        latencies.extend(part.latencies)
    started = [p.first_start for p in parts if p.opened]
    finished = [p.last_done for p in parts if p.opened]
    span = (max(finished) - min(started)) / 1e9 if started else 0.0
    growth = {n: rss_after[n] - rss_before[n] for n in rss_after if n in rss_before}
    held = sum(growth.get(n, 0) for n in target.memory)
    broker_cpu = {k: cpu_after[k] - cpu_before[k] for k in cpu_after}
    return {
        "transport": plan.transport,
        "connections": opened,
        "failed": sum(p.failed for p in parts),
        "errors": [e for p in parts for e in p.errors][:5],
        "connects_per_s": stats.ratio(opened, span),
        "connect_ms": stats.latency_summary_ms(latencies),
        "rss_before_bytes": rss_before,
        "rss_after_bytes": rss_after,
        "rss_per_connection_kib": {n: growth[n] / opened / 1024 for n in growth if opened},
        "memory_per_connection_kib": held / opened / 1024 if opened else None,
        "memory_processes": list(target.memory),
        "generator_cpu_s": gen_after - gen_before,
        "broker_cpu_s": broker_cpu,
        "broker_cpu_total_s": sum(broker_cpu.values()),
    }
