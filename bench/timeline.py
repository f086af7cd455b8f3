"""Where the seconds of a recovery go: the failover steps of a kill, read from the logs.

After a kill, the steps that bring delivery back are written in the logs of the processes
that take them: the Kafka brokers (the KRaft controller's election, the fence of the dead
broker, the leaderships it moves, the group and transaction coordinators that load their
partitions elsewhere), the Redis Sentinels (the primary held down, agreed down, switched;
TILT when the machine starved them), the Redis node promoted, and the services (a failed
store batch, a failover re-applied, a consumer group joined and synced).
:func:`timeline` finds the first line of each step within a window after the kill and
gives it in seconds after the kill, per process, so that a chaos round
(:mod:`bench.chaos`) prints where its outage went.

Each log line carries its own wall-clock time (Kafka's and the services'
``[YYYY-mm-dd HH:MM:SS,mmm]``, Redis' ``27 Nov 2026 01:49:58.728``), read as this
machine's local time, as the processes write it.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

#: Kafka's and the services' (Python logging) time stamp at the start of a line.
_BRACKETED = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})\]")

#: Redis' and Sentinel's time stamp: ``<pid>:<role> 27 Nov 2026 01:49:58.728 ``.
_REDIS = re.compile(r"^\d+:[A-Z] (\d\d? \w{3} \d{4} \d\d:\d\d:\d\d)\.(\d{3}) ")


@dataclass(frozen=True, slots=True)
class Step:
    """A failover step: its ``name``, the processes whose logs show it (file name
    prefixes), and the ``pattern`` of its line."""

    name: str
    processes: tuple[str, ...]
    pattern: re.Pattern[str]


def _step(name: str, processes: str, pattern: str) -> Step:
    return Step(name, tuple(processes.split(",")), re.compile(pattern))


_SERVICES = "router,device-persist,app-delivery,ingest-node"

#: Every step looked for, roughly in the order they happen.
STEPS: tuple[Step, ...] = (
    _step("KRaft: election started", "kafka", r"Attempting durable transition to CandidateState"),
    _step("KRaft: new active controller", "kafka", r"Becoming the active controller"),
    _step("Kafka: dead broker fenced", "kafka", r"Fencing broker \d+ because its session"),
    _step("Kafka: leaderships moved", "kafka", r"handleBrokerFenced: changing"),
    _step("Kafka: group coordinator moved", "kafka", r"Elected as the group coordinator"),
    _step("Kafka: offsets loaded", "kafka", r"Finished loading offsets and group metadata"),
    _step("Kafka: transactions loaded", "kafka", r"Finished loading \d+ transaction metadata"),
    _step("Sentinel: TILT (starved)", "redis-sentinel", r"\+tilt"),
    _step("Sentinel: primary down (own view)", "redis-sentinel", r"\+sdown master"),
    _step("Sentinel: primary down (agreed)", "redis-sentinel", r"\+odown master"),
    _step("Sentinel: switched to a replica", "redis-sentinel", r"\+switch-master"),
    _step("Redis: replica promoted", "redis", r"MASTER MODE enabled"),
    _step("store write failed", "device-persist", r"was not stored, it will be read again"),
    _step("store failover re-applied", "device-persist", r"applied on the primary with"),
    _step("Kafka: client lost a broker", _SERVICES, r"Unable connect to node|NodeNotReady"),
    _step("group: heartbeat failed", _SERVICES, r"Heartbeat failed"),
    _step("group: (re-)joining", _SERVICES, r"\(Re-\)joining group"),
    _step("group: joined", _SERVICES, r"Joined group"),
    _step("group: synced", _SERVICES, r"Successfully synced group"),
    _step("group: partitions assigned", _SERVICES, r"Setting newly assigned partitions"),
)


@dataclass(frozen=True, slots=True)
class Event:
    """The first line of ``step`` in ``process``'s log at ``seconds`` after the kill."""

    seconds: float
    process: str
    step: str
    line: str


def line_time(line: str) -> float | None:
    """The Unix time of a log line's time stamp (local time), None without one."""
    if match := _BRACKETED.match(line):
        when = datetime.datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S")
    elif match := _REDIS.match(line):
        when = datetime.datetime.strptime(match[1], "%d %b %Y %H:%M:%S")
    else:
        return None
    return when.timestamp() + int(match[2]) / 1000


def _lines(path: Path, since: float, until: float) -> Iterable[tuple[float, str]]:
    """``(time, line)`` of the stamped lines of ``path`` within ``[since, until)``."""
    with path.open(encoding="utf-8", errors="replace") as lines:
        for line in lines:
            at = line_time(line)
            if at is not None and since <= at < until:
                yield at, line.rstrip()


def timeline(log_dir: Path, killed_at: float, until: float) -> list[Event]:
    """The first line of each :data:`STEPS` step in each log of ``log_dir`` between the
    kill (``killed_at``, Unix seconds) and ``until``, in time order. A process's log that
    is missing or unreadable contributes nothing."""
    events: list[Event] = []
    for path in sorted(log_dir.glob("*.log")):
        process = path.stem
        steps = [s for s in STEPS if process.startswith(s.processes)]
        if not steps:
            continue
        seen: set[str] = set()
        try:
            for at, line in _lines(path, killed_at, until):
                for step in steps:
                    if step.name not in seen and step.pattern.search(line):
                        seen.add(step.name)
                        events.append(Event(at - killed_at, process, step.name, line))
        except OSError:
            continue
    return sorted(events, key=lambda e: e.seconds)


def first_per_step(events: Iterable[Event]) -> list[Event]:
    """The earliest event of each step (whichever process showed it first)."""
    first: dict[str, Event] = {}
    for event in sorted(events, key=lambda e: e.seconds):
        first.setdefault(event.step, event)
    return sorted(first.values(), key=lambda e: e.seconds)


def render(events: Iterable[Event]) -> str:
    """``+  6.2 s  Sentinel: switched to a replica (redis-sentinel2)`` lines."""
    return "\n".join(f"+{e.seconds:5.1f} s  {e.step} ({e.process})" for e in events)
