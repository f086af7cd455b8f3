"""Recovery times: how long MQTT delivery stops when a process of the local cluster dies.

:func:`measure_recovery` runs a probe through the broker (QoS 1 or 2, one message every
``interval`` seconds from each of several publishers, one subscriber each), kills a process
with the caller's ``kill``, optionally brings it back with ``restart``, and reports when
delivery resumed: the moment every subscriber has received a message published after the
kill. The probe pairs cover every partition (each publisher's client id falls in another
``msg.all`` partition, each subscriber's in another partition of the client-keyed topics),
so whichever partitions the killed process held, their recovery is in the figure. It also
counts, over the whole probe, acknowledged messages never delivered, duplicates, and
deliveries that came after a newer message of the same publisher.

Three kinds of subscribers take three paths: ``live`` (non-persistent: router → downlink),
``persistent`` (persistent DEVICE sessions: router → msg.persisted → device_persist) and
``application`` (persistent APPLICATION clients, ``app-*`` ids: router → msg.app →
app_delivery; the cluster must treat ``app-*`` as APPLICATION). The probe's clients must
stay connected: it measures the stages and Kafka, not an ingest node that holds them.

``python -m bench.recovery <process> [--restart] [--path ...]`` measures one process of the
local cluster (``cormorant up``'s, or the one ``CORMORANT_*`` settings point to). The chaos
run (``python -m bench chaos``, :mod:`bench.chaos`) kills every process in turn under a
heavier load of its own and times recovery over that load (:mod:`bench.resumption`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import aiomqtt
import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from bench import results
from bench.loadgen.stats import median
from services.common.kafka.partitioner import partition_of

ProbePath = Literal["live", "persistent", "application"]

#: Seconds a persistent subscriber's session outlives its connection (the probe removes it).
SESSION_EXPIRY = 600


@dataclass
class RecoveryTimes:
    """What one :func:`measure_recovery` saw. Times are Unix seconds.

    ``killed_at``: just before ``kill`` was called; ``back_at``: when ``restart`` returned
    (the process ready again), None without a restart; ``resumed_at``: when the last probe
    subscriber received a message published after the kill (None: delivery did not resume
    within the timeout). ``lost``: messages accepted (PUBACK, or PUBCOMP, with a success
    Reason Code) and never delivered; ``duplicates``: deliveries of a message delivered
    before; ``reordered``: first deliveries that came after a newer message of the same
    publisher (MQTT 4.6).
    """

    process: str
    path: str
    pairs: int
    killed_at: float
    back_at: float | None
    resumed_at: float | None
    published: int = 0
    acknowledged: int = 0
    delivered: int = 0
    lost: int = 0
    duplicates: int = 0
    reordered: int = 0

    @property
    def after_kill(self) -> float | None:
        """Seconds from the kill until delivery resumed."""
        return None if self.resumed_at is None else self.resumed_at - self.killed_at

    @property
    def after_back(self) -> float | None:
        """Seconds from the process being ready again until delivery resumed."""
        if self.resumed_at is None or self.back_at is None:
            return None
        return self.resumed_at - self.back_at


@dataclass
class _Pair:
    """One probe publisher and its subscriber, and what they saw."""

    publisher_id: str
    subscriber_id: str
    topic: str
    sent_at: dict[int, float] = field(default_factory=dict)  # seq → when PUBLISH was sent
    acked: set[int] = field(default_factory=set)
    arrivals: list[tuple[int, float]] = field(default_factory=list)  # (seq, when received)


def _ids_in_partitions(prefix: str, partitions: int, count: int) -> list[str]:
    """``count`` distinct client ids starting with ``prefix``, the i-th in partition
    ``i % partitions`` of a topic of ``partitions`` partitions."""
    ids: list[str] = []
    while len(ids) < count:
        candidate = f"{prefix}{uuid.uuid4().hex[:8]}"
        if partition_of(candidate, partitions) == len(ids) % partitions:
            ids.append(candidate)
    return ids


class _ProbeClient(aiomqtt.Client):
    """aiomqtt's client, which keeps the Reason Code of the last PUBACK or PUBCOMP.

    aiomqtt 2.5 returns from ``publish`` whatever the Reason Code (a v5 server refuses a
    PUBLISH it could not store with PUBACK 0x80, or PUBREC 0x80 and then PUBCOMP 0x92):
    the probe reads it here to count only what was accepted. Right for a client with one
    PUBLISH in flight at a time.
    """

    last_reason: ReasonCode | None = None

    def _on_publish(
        self,
        client: mqtt.Client,
        userdata: Any,
        mid: int,
        reason_code: ReasonCode,
        properties: Properties,
    ) -> None:
        self.last_reason = reason_code
        super()._on_publish(client, userdata, mid, reason_code, properties)

    def accepted(self) -> bool:
        """Whether the last PUBLISH was acknowledged with a success Reason Code."""
        return self.last_reason is not None and not self.last_reason.is_failure


def _client(host: str, port: int, client_id: str, session_expiry: int = 0) -> _ProbeClient:
    """An MQTT 5 client; with ``session_expiry`` (seconds) > 0, a persistent session that
    resumes if it exists."""
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = session_expiry
    return _ProbeClient(
        host,
        port,
        identifier=client_id,
        protocol=aiomqtt.ProtocolVersion.V5,
        clean_start=session_expiry == 0,
        properties=props,
        timeout=30,
    )


async def measure_recovery(
    host: str,
    port: int,
    *,
    process: str,
    kill: Callable[[], object],
    restart: Callable[[], object] | None = None,
    path: ProbePath = "live",
    qos: int = 1,
    msg_all_partitions: int = 12,
    client_partitions: int = 12,
    interval: float = 0.05,
    timeout: float = 60.0,
    log: Callable[[str], None] = lambda line: None,
) -> RecoveryTimes:
    """Kill a process under a probe load and time the recovery (see the module docstring).

    ``host``/``port``: the broker's MQTT address; ``process`` names what ``kill`` kills
    (for the report). ``kill()`` and ``restart()`` are called in a thread; ``restart``
    returns once the process is ready. ``qos``: of the probe's PUBLISHes and subscriptions
    (with 2, a redelivery with DUP=1 is not a duplicate: the subscriber's client drops it).
    ``msg_all_partitions`` and ``client_partitions`` are the cluster's partition counts
    (``msg_all_partitions``, ``state_topic_partitions``): one probe pair per partition.
    ``interval``: seconds between two messages of a publisher; ``timeout``: seconds to wait
    for delivery to resume (well over the consumer session timeout, which a killed
    member's partitions wait out), and again for the last acknowledged messages. Raises
    ``aiomqtt.MqttError`` if the probe cannot connect before the kill.
    """
    run = uuid.uuid4().hex[:6]
    count = max(msg_all_partitions, client_partitions)
    publishers = _ids_in_partitions(f"probe-pub-{run}-", msg_all_partitions, count)
    prefix = "app-probe-" if path == "application" else "probe-sub-"
    subscribers = _ids_in_partitions(f"{prefix}{run}-", client_partitions, count)
    pairs = [_Pair(publishers[i], subscribers[i], f"probe/{run}/{i}") for i in range(count)]
    expiry = 0 if path == "live" else SESSION_EXPIRY
    times = RecoveryTimes(process, path, count, 0.0, None, None)
    async with contextlib.AsyncExitStack() as stack:
        subs = [
            await stack.enter_async_context(_client(host, port, p.subscriber_id, expiry))
            for p in pairs
        ]
        for pair, sub in zip(pairs, subs, strict=True):
            await sub.subscribe(pair.topic, qos=qos)
        stop = asyncio.Event()
        tasks = [
            asyncio.create_task(_receive(pair, sub)) for pair, sub in zip(pairs, subs, strict=True)
        ]
        tasks += [
            asyncio.create_task(_publish(host, port, pair, interval, qos, stop)) for pair in pairs
        ]
        try:
            await _wait(lambda: all(p.arrivals for p in pairs), timeout, "the probe flowing")
            log(f"probe flowing over {count} pairs; killing {process}")
            times.killed_at = time.time()
            await asyncio.to_thread(kill)
            if restart is not None:
                await asyncio.to_thread(restart)
                times.back_at = time.time()
                log(f"{process} back after {times.back_at - times.killed_at:.2f} s")
            killed_at = times.killed_at
            with contextlib.suppress(TimeoutError):
                await _wait(
                    lambda: all(_resumed(p, killed_at) is not None for p in pairs),
                    timeout,
                    "delivery to resume",
                )
                times.resumed_at = max(
                    t for p in pairs if (t := _resumed(p, killed_at)) is not None
                )
            stop.set()
            with contextlib.suppress(TimeoutError):
                await _wait(lambda: all(p.acked <= _seqs(p) for p in pairs), timeout, "drain")
        finally:
            stop.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    _count(times, pairs)
    if path != "live":
        await _end_sessions(host, port, [p.subscriber_id for p in pairs])
    return times


RECONNECT_SECONDS = 0.2
"""How long a probe publisher waits before it connects again (a broker still down refuses)."""

PUBLISH_TIMEOUT = 12.0
"""Seconds a probe publisher waits for a PUBACK before it gives the PUBLISH up and connects
again: beyond the broker's own bound (it refuses or closes the connection once Kafka has not
answered within ``kafka_request_timeout_seconds``, 10 s by default). aiomqtt 2.5 does not wake
a ``publish`` waiting for its PUBACK when the connection closes, so with the client's 30 s
timeout the probe measured that wait after a Kafka broker kill, not the broker."""


def _seqs(pair: _Pair) -> set[int]:
    return {seq for seq, _ in pair.arrivals}


def _resumed(pair: _Pair, killed_at: float) -> float | None:
    """When ``pair``'s subscriber first received a message published after ``killed_at``."""
    for seq, received_at in pair.arrivals:
        sent = pair.sent_at.get(seq)
        if sent is not None and sent > killed_at:
            return received_at
    return None


async def _wait(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        await asyncio.sleep(0.01)  # the probe's time resolution


async def _publish(
    host: str, port: int, pair: _Pair, interval: float, qos: int, stop: asyncio.Event
) -> None:
    """Publish ``pair``'s numbered messages every ``interval`` seconds until ``stop``, as a
    real client does: a PUBLISH refused or unanswered counts as sent, not acknowledged; a
    connection the broker closed (it closes rather than refuse a PUBLISH it could not
    store) is opened again, every ``RECONNECT_SECONDS`` until the broker takes it."""
    seq = 0
    while not stop.is_set():
        try:
            async with _client(host, port, pair.publisher_id) as client:
                while not stop.is_set():
                    seq += 1
                    pair.sent_at[seq] = time.time()
                    client.last_reason = None
                    await client.publish(
                        pair.topic, str(seq).encode(), qos=qos, timeout=PUBLISH_TIMEOUT
                    )
                    if client.accepted():
                        pair.acked.add(seq)
                    await asyncio.sleep(interval)
        except aiomqtt.MqttError:
            await asyncio.sleep(RECONNECT_SECONDS)


async def _receive(pair: _Pair, client: aiomqtt.Client) -> None:
    async for message in client.messages:
        pair.arrivals.append((int(bytes(message.payload)), time.time()))


def _count(times: RecoveryTimes, pairs: list[_Pair]) -> None:
    for pair in pairs:
        times.published += len(pair.sent_at)
        times.acknowledged += len(pair.acked)
        seen: set[int] = set()
        newest = 0
        for seq, _ in pair.arrivals:
            if seq in seen:
                times.duplicates += 1
                continue
            seen.add(seq)
            if seq < newest:
                times.reordered += 1
            newest = max(newest, seq)
        times.delivered += len(seen)
        times.lost += len(pair.acked - seen)


async def _end_sessions(host: str, port: int, client_ids: list[str]) -> None:
    """Connect each probe subscriber once more with Clean Start and a Session Expiry
    Interval of 0: the session (and an APPLICATION client's topic) is deleted."""
    for client_id in client_ids:
        with contextlib.suppress(aiomqtt.MqttError):
            async with _client(host, port, client_id):
                pass


def main(argv: list[str] | None = None) -> None:
    """``python -m bench.recovery``: kill one process of the local cluster ``--rounds``
    times, print each round's times as JSON and their medians."""
    from services.local import cluster
    from services.local.settings import LocalSettings

    parser = argparse.ArgumentParser(prog="python -m bench.recovery", description=__doc__)
    parser.add_argument("process", help="a process of the local cluster: router, router-2 ...")
    parser.add_argument("--restart", action="store_true", help="start it again at once")
    parser.add_argument("--path", choices=("live", "persistent", "application"), default="live")
    parser.add_argument("--qos", type=int, choices=(1, 2), default=1)
    parser.add_argument("--interval", type=float, default=0.05, help="seconds between messages")
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=1, help="kills, one after another")
    parser.add_argument(
        "--pause",
        type=float,
        default=10.0,
        help="seconds between rounds: the consumer groups settle after the process is back",
    )
    parser.add_argument("--port", type=int, help="MQTT port (default: the cluster's HAProxy)")
    parser.add_argument("--output", help="append each round as a JSON line to this file")
    args = parser.parse_args(argv)
    settings = LocalSettings()
    names = [part.name for part in cluster.components(settings)]
    if args.process not in names:
        raise SystemExit(f"no process {args.process!r}: {', '.join(names)}")
    rounds: list[RecoveryTimes] = []
    for round_ in range(1, args.rounds + 1):
        if round_ > 1:
            time.sleep(args.pause)
        times = asyncio.run(
            measure_recovery(
                "127.0.0.1",
                args.port or settings.listen_port,
                process=args.process,
                kill=lambda: cluster.kill_component(settings, args.process),
                restart=(lambda: cluster.start_component(settings, args.process))
                if args.restart
                else None,
                path=args.path,
                qos=args.qos,
                msg_all_partitions=settings.msg_all_partitions,
                client_partitions=settings.state_topic_partitions,
                interval=args.interval,
                timeout=args.timeout,
                log=lambda line: print(line, file=sys.stderr, flush=True),
            )
        )
        if not args.restart:
            cluster.start_component(settings, args.process)  # for the next round
        rounds.append(times)
        result = {
            **asdict(times),
            "round": round_,
            "after_kill": times.after_kill,
            "after_back": times.after_back,
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "machine": results.machine(),
            "git_commit": results.git_commit(results.RESULTS_DIR.parent.parent),
            "command": " ".join(["python -m bench.recovery", *sys.argv[1:]]),
        }
        print(json.dumps(result, indent=2))
        if args.output:
            results.append(Path(args.output), result)
    print(summary(rounds))


def summary(rounds: list[RecoveryTimes]) -> str:
    """One line: the medians of ``rounds``' recovery times (seconds) and their totals of
    lost, duplicated and reordered messages."""

    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f} s"

    resumed = sum(t.resumed_at is not None for t in rounds)
    return (
        f"{rounds[0].process} ({rounds[0].path}), {len(rounds)} rounds, resumed in "
        f"{resumed}: median after kill {seconds(median(t.after_kill for t in rounds))}, "
        f"after back {seconds(median(t.after_back for t in rounds))}; lost "
        f"{sum(t.lost for t in rounds)}, duplicates {sum(t.duplicates for t in rounds)}, "
        f"reordered {sum(t.reordered for t in rounds)}"
    )


if __name__ == "__main__":
    main()
