"""The bench's preflight check of APPLICATION subscribers, against real child processes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator

import psutil
import pytest

from bench import brokers
from bench.loadgen.plan import Options, Timing, build


def _idle_process(patterns: str | None) -> subprocess.Popen[bytes]:
    """Start an idle child with ``patterns`` in its environment, returned once it has exec'ed.

    Until the child's exec, /proc/<pid>/environ still shows the parent's environment, so the
    child says it is up on stdout and the parent waits for that line.
    """
    env = dict(os.environ)
    env.pop("CORMORANT_APPLICATION_CLIENT_IDS", None)
    if patterns is not None:
        env["CORMORANT_APPLICATION_CLIENT_IDS"] = patterns
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"up\n"
    return proc


@pytest.fixture
def ingest() -> Iterator[Callable[[str | None], brokers.Target]]:
    started: list[subprocess.Popen[bytes]] = []

    def target(patterns: str | None) -> brokers.Target:
        proc = _idle_process(patterns)
        started.append(proc)
        return brokers.Target(
            "cormorant", "127.0.0.1", 1883, processes={"ingest-node1": psutil.Process(proc.pid)}
        )

    yield target
    for proc in started:
        proc.kill()
        proc.wait()


def test_fan_in_app_subscribers_are_marked_application() -> None:
    plan = build("fan-in-app", Options(), Timing())
    assert plan.subscribers and all(s.application for s in plan.subscribers)
    assert not any(s.application for s in build("fan-in", Options(), Timing()).subscribers)


def test_matching_patterns_pass(ingest: Callable[[str | None], brokers.Target]) -> None:
    brokers.require_application(ingest('["app-*"]'), ["app-cb-1-s0"])


@pytest.mark.parametrize("patterns", [None, "[]", '["analytics"]'])
def test_a_device_subscriber_is_refused_with_the_fix(
    ingest: Callable[[str | None], brokers.Target], patterns: str | None
) -> None:
    with pytest.raises(brokers.BrokerUnavailable, match="CORMORANT_APPLICATION_CLIENT_IDS"):
        brokers.require_application(ingest(patterns), ["app-cb-1-s0"])


def test_other_brokers_are_not_checked() -> None:
    brokers.require_application(brokers.external("127.0.0.1", 1883), ["app-cb-1-s0"])
