"""One worker process of the generator: runs its share of the clients, phase by phase.

The parent (``runner``) drives the phases over a pipe. Worker → parent messages are
``(kind, data)`` tuples: ``subscribed``, ``routed``, ``sent``, ``result``, ``connected``,
``closed`` or ``error`` (data: the text). Parent → worker: ``publishers``, ``start`` (data:
the start time, epoch ns), ``expect`` (data: publisher id → messages sent), ``close`` and
``abort``. Every socket is closed before the process exits, whatever happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import threading
import time
import traceback
from array import array
from dataclasses import dataclass, field
from multiprocessing.connection import Connection as Pipe
from pathlib import Path
from typing import Any

from bench.loadgen import wire
from bench.loadgen.clients import (
    PINGREQ,
    ClientError,
    Connection,
    Publisher,
    Recorder,
    Subscriber,
    open_client,
)
from bench.loadgen.plan import Plan

#: Seconds between two route probes of a publisher.
PROBE_INTERVAL = 0.5

#: CONNECTs one worker has outstanding at once in the connections scenario.
CONNECT_CONCURRENCY = 64

#: Seconds allowed for closing and for cleaning up persistent sessions at the end.
CLOSE_TIMEOUT = 10.0

#: Session Expiry Interval of persistent MQTT 5.0 clients, seconds.
PERSISTENT_SESSION_EXPIRY = 3600


class Aborted(RuntimeError):
    """The parent called the run off (another worker failed, or it was interrupted)."""


@dataclass(slots=True)
class SubscriberResult:
    """What one subscriber received; ``distinct``: publisher id → distinct messages."""

    expected: tuple[int, ...]
    distinct: dict[int, int]
    duplicates: int
    reordered: int
    received: int


@dataclass(slots=True)
class WorkerResult:
    """A worker's counts after the drain; latencies in nanoseconds."""

    published: int
    delivered: int
    e2e: array[int]
    ack: array[int]
    sent: dict[int, int]
    unacked: int
    disconnects: int
    subscribers: list[SubscriberResult] = field(default_factory=list)
    tls: str = ""  # TLS version and cipher suite negotiated ("" without TLS)


@dataclass(slots=True)
class ConnectResult:
    """Connections scenario: times in epoch ns, connect latencies (to CONNACK) in ns."""

    opened: int
    failed: int
    first_start: int
    last_done: int
    latencies: array[int]
    errors: list[str]


class Control:
    """The worker's end of the pipe.

    A daemon thread blocks in ``recv`` and hands messages to the event loop; the pipe is
    never registered with the loop, which would make it non-blocking and break ``send``
    of a large result.
    """

    def __init__(self, pipe: Pipe) -> None:
        """Start reading ``pipe`` for the running loop."""
        self._pipe = pipe
        self._queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        threading.Thread(target=self._read, name="bench-control", daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                msg = self._pipe.recv()
            except (EOFError, OSError):
                msg = ("abort", "the parent process went away")
            try:
                self._loop.call_soon_threadsafe(self._queue.put_nowait, msg)
            except RuntimeError:  # the loop is closed: the worker is exiting
                return
            if msg[0] == "abort":
                return

    def send(self, kind: str, data: object = None) -> None:
        """Tell the parent ``kind`` with ``data``."""
        self._pipe.send((kind, data))

    async def expect(self, kind: str, timeout: float) -> Any:
        """The data of the next message, which must be ``kind``; ``timeout`` in seconds.

        Raises:
            Aborted: the parent sent ``abort`` or went away.
            RuntimeError: another message, or none in time.
        """
        try:
            got, data = await asyncio.wait_for(self._queue.get(), timeout)
        except TimeoutError:
            raise RuntimeError(f"no {kind!r} from the parent within {timeout:g}s") from None
        if got == "abort":
            raise Aborted(str(data))
        if got != kind:
            raise RuntimeError(f"expected {kind!r} from the parent, got {got!r}")
        return data


class Worker:
    """The clients of one worker and the phases they go through."""

    def __init__(self, plan: Plan, index: int, control: Control) -> None:
        """Prepare to run ``plan`` (already this worker's share) as worker ``index``."""
        self.plan = plan
        self.index = index
        self.control = control
        self.recorder = Recorder()
        self.connections: list[Connection] = []

    async def _open(self, client_id: str, clean: bool) -> Connection:
        plan = self.plan
        expiry = None
        if plan.version == 5 and not clean:
            expiry = PERSISTENT_SESSION_EXPIRY
        packet = wire.connect(
            client_id,
            plan.version,
            clean=clean,
            keep_alive=plan.keep_alive,
            session_expiry=expiry,
            username=plan.username,
            password=plan.password,
        )
        conn = await open_client(
            plan.endpoint, packet, plan.version, self.recorder, plan.timing.setup
        )
        self.connections.append(conn)
        return conn

    async def _keep_alive(self) -> None:
        while True:
            await asyncio.sleep(self.plan.keep_alive / 2)
            for conn in self.connections:
                conn.write(PINGREQ)

    async def traffic(self) -> None:
        """Subscribe, probe the route, publish, drain, report (see the module docstring)."""
        plan, ctl, timing = self.plan, self.control, self.plan.timing
        subs = []
        for spec in plan.subscribers:
            sub = Subscriber(spec, await self._open(spec.client_id, spec.clean))
            await sub.subscribe(timing.setup)
            subs.append(sub)
        ctl.send("subscribed", len(subs))
        await ctl.expect("publishers", timing.setup * 3)
        pubs = [
            Publisher(
                spec, await self._open(spec.client_id, spec.clean), plan.inflight, plan.version
            )
            for spec in plan.publishers
        ]
        probing = asyncio.create_task(self._probe(pubs))
        try:
            started = time.monotonic()
            await self._wait(
                [s.routed for s in subs], timing.setup, lambda: self._unrouted(subs, timing.setup)
            )
            ctl.send("routed", time.monotonic() - started)
            t0: int = await ctl.expect("start", timing.setup * 3)
        finally:
            probing.cancel()
        rec = self.recorder
        rec.window_start = t0 + int(timing.warmup * 1e9)
        rec.window_end = rec.window_start + int(timing.duration * 1e9)
        await asyncio.gather(*(p.run(t0, rec.window_end) for p in pubs))
        ctl.send("sent", {p.spec.publisher_id: p.seq for p in pubs})
        deadline = rec.window_end + int(timing.drain * 1e9)
        sent = await ctl.expect("expect", timing.drain + timing.setup)
        for sub in subs:
            sub.expect_total(sent)
        pending = [p.acked for p in pubs] + [s.drained for s in subs]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                asyncio.gather(*pending), max(deadline - time.time_ns(), 0) / 1e9
            )
        ctl.send(
            "result",
            WorkerResult(
                published=rec.published,
                delivered=rec.delivered,
                e2e=rec.e2e,
                ack=rec.ack,
                sent={p.spec.publisher_id: p.seq for p in pubs},
                unacked=sum(len(p.pending) for p in pubs),
                disconnects=rec.disconnects,
                tls=rec.tls,
                subscribers=[
                    SubscriberResult(
                        expected=s.spec.expected,
                        distinct=s.tracker.distinct(),
                        duplicates=s.tracker.duplicates,
                        reordered=s.tracker.reordered,
                        received=s.received,
                    )
                    for s in subs
                ],
            ),
        )
        persistent = [s.spec.client_id for s in subs if not s.spec.clean]
        persistent += [p.spec.client_id for p in pubs if not p.spec.clean]
        await self.close_all()
        await self._end_sessions(persistent)

    @staticmethod
    def _unrouted(subs: list[Subscriber], timeout: float) -> str:
        missing = [s for s in subs if not s.routed.done()]
        if not missing:  # the last probe came in as the deadline passed
            return f"route confirmed only at the {timeout:g}s deadline (pass a longer --setup)"
        return (
            f"route not confirmed within {timeout:g}s: {len(missing)} subscriber(s) still "
            f"missing probes, e.g. {missing[0].spec.client_id} on "
            f"{missing[0].spec.topic_filter!r} (the backlog of an earlier unpaced run is "
            "routed first: a longer --setup waits it out)"
        )

    @staticmethod
    async def _wait(futures: list[asyncio.Future[None]], timeout: float, why: Any) -> None:
        if not futures:
            return
        try:
            await asyncio.wait_for(asyncio.gather(*futures), timeout)
        except TimeoutError:
            raise ClientError(why()) from None

    @staticmethod
    async def _probe(pubs: list[Publisher]) -> None:
        while True:
            for pub in pubs:
                pub.probe()
            await asyncio.sleep(PROBE_INTERVAL)

    async def _end_sessions(self, client_ids: list[str]) -> None:
        """Reconnect persistent clients with a clean session, so the broker drops them."""
        for client_id in client_ids:
            with contextlib.suppress(ClientError, OSError, TimeoutError):
                await asyncio.wait_for(self._open(client_id, True), CLOSE_TIMEOUT)
            await self.close_all()

    async def idle_connections(self) -> None:
        """Open the worker's idle connections as fast as allowed, hold them until ``close``."""
        plan, ctl = self.plan, self.control
        gate = asyncio.Semaphore(CONNECT_CONCURRENCY)
        latencies = array("q")
        starts: list[int] = []
        ends: list[int] = []
        errors: list[str] = []

        async def one(i: int) -> None:
            async with gate:
                begun = time.time_ns()
                try:
                    await self._open(f"cb-{plan.run_id}-c{self.index}-{i}", True)
                except (ClientError, OSError, TimeoutError) as exc:
                    errors.append(f"{type(exc).__name__}: {exc}")
                    return
                done = time.time_ns()
                starts.append(begun)
                ends.append(done)
                latencies.append(done - begun)

        await asyncio.gather(*(one(i) for i in range(plan.connections)))
        ctl.send(
            "connected",
            ConnectResult(
                opened=len(latencies),
                failed=len(errors),
                first_start=min(starts, default=0),
                last_done=max(ends, default=0),
                latencies=latencies,
                errors=errors[:5],
            ),
        )
        await ctl.expect("close", plan.timing.hold + plan.timing.setup * 3)
        await self.close_all()
        ctl.send("closed")

    async def close_all(self) -> None:
        """DISCONNECT and close every open connection; wait (bounded) until they are closed."""
        conns, self.connections = self.connections, []
        for conn in conns:
            conn.expected_close = True
            conn.write(wire.disconnect(self.plan.version))
            conn.close()
        waits: list[asyncio.Future[None]] = [c.closed for c in conns]
        if waits:
            await asyncio.wait(waits, timeout=CLOSE_TIMEOUT)
        for conn in conns:
            if conn.transport is not None:
                conn.transport.abort()

    async def run(self) -> None:
        """Run the plan; on any error report it to the parent. Sockets are always closed."""
        pinger = asyncio.create_task(self._keep_alive())
        try:
            if self.plan.scenario == "connections":
                await self.idle_connections()
            else:
                await self.traffic()
        except Aborted:
            pass
        except Exception as exc:
            where = traceback.extract_tb(exc.__traceback__)[-1]
            detail = "".join(traceback.format_exception_only(exc)).strip()
            detail += f" (at {Path(where.filename).name}:{where.lineno})"
            with contextlib.suppress(OSError):
                self.control.send("error", f"worker {self.index}: {detail}")
        finally:
            pinger.cancel()
            await self.close_all()


def main(pipe: Pipe, plan: Plan, index: int) -> None:
    """Process entry point: run worker ``index`` of ``plan`` (its share) on uvloop if present."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    loop_factory = None
    with contextlib.suppress(ImportError):
        import uvloop

        loop_factory = uvloop.new_event_loop

    async def go() -> None:
        await Worker(plan, index, Control(pipe)).run()

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(go())
    pipe.close()
