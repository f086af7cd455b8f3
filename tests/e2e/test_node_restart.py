"""An ingest node that stops or dies: its clients' Will Messages and session end records.

Runs last (``disruptive``): each test stops ingest node 1, cleanly or with SIGKILL, and
starts it again before it ends.

- A clean stop closes every connection (v5: DISCONNECT 0x8B Server shutting down) and
  publishes their Will Messages before the process ends; one with a Will Delay Interval is
  stored to wait it out, and published after it by whichever node owns it
  (tests/e2e/test_durable_wills.py: the same through a kill -9).
- A node that died leaves session records saying its clients are connected to it; when it
  starts again it ends those sessions before it accepts connections (persistent: marked
  disconnected; non-persistent: deleted with their subscriptions).
"""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from services.common.records import SessionRecord, decode_session
from tests.e2e.clients import (
    TIMEOUT,
    PahoClient,
    RawSocket,
    aio_client,
    collect,
    session_connect_packet,
    unique,
)
from tests.e2e.kafka_view import latest_state
from tests.servers import LocalCluster

pytestmark = [pytest.mark.cluster, pytest.mark.disruptive]

NODE = "ingest-node1"
SERVER_SHUTTING_DOWN = 0x8B


async def test_a_stopped_node_publishes_its_clients_wills_and_hands_the_waiting_ones_over(
    cluster: LocalCluster,
) -> None:
    node1, node2 = cluster.node_ports
    topic = unique("e2e/will-shutdown")
    delay = 2
    async with aio_client(node2, unique("watcher")) as watcher:
        await watcher.subscribe(topic, qos=1)
        with RawSocket(node1) as at_once, RawSocket(node1) as delayed:
            at_once.connect_accepted(
                session_connect_packet(
                    unique("a"), level=5, clean_start=True, will=(topic, b"at once")
                ),
            )
            delayed.connect_accepted(
                session_connect_packet(
                    unique("d"),
                    level=5,
                    clean_start=False,
                    session_expiry=600,
                    will=(topic, b"delayed"),
                    will_delay=delay,
                ),
            )
            stopped_at = time.monotonic()
            try:
                assert cluster.stop(NODE)
                for raw in (at_once, delayed):
                    rest = raw.read_until_closed()
                    assert rest[:1] == b"\xe0" and rest[2] == SERVER_SHUTTING_DOWN, rest
            finally:
                cluster.start(NODE)
        [first] = await collect(watcher, 1)
        assert first.payload == b"at once"
        # The waiting one outlived its node's process, and waited out its delay.
        [second] = await collect(watcher, 1, timeout=TIMEOUT + delay)
        assert second.payload == b"delayed"
        assert time.monotonic() - stopped_at >= delay


def _session(sessions: dict[str, bytes | None], client_id: str) -> SessionRecord | None:
    value = sessions[client_id]
    return None if value is None else decode_session(value)


async def test_a_killed_nodes_sessions_are_ended_when_it_starts_again(
    cluster: LocalCluster,
) -> None:
    node1, _ = cluster.node_ports
    persistent_id = unique("kept")
    passing_id = unique("passing")
    passing = PahoClient(node1, passing_id, version=4)
    with RawSocket(node1) as kept:
        kept.connect_accepted(
            session_connect_packet(persistent_id, level=5, clean_start=False, session_expiry=600),
        )
        assert passing.connect() == 0
        assert [rc.value for rc in passing.subscribe(unique("e2e/restart"), 1)] == [1]
        sessions, subscribed = await latest_state(cluster)
        before = _session(sessions, persistent_id)
        assert before is not None and before.connected
        assert passing_id in subscribed
        pid = cluster.pid(NODE)
        assert pid is not None
        try:
            os.kill(pid, signal.SIGKILL)  # no shutdown: the records still say "connected"
            psutil.Process(pid).wait(TIMEOUT)
        except psutil.NoSuchProcess:
            pass
        finally:
            cluster.start(NODE)
    passing.close()
    sessions, subscribed = await latest_state(cluster)
    after = _session(sessions, persistent_id)
    assert after is not None
    assert (after.connected, after.persistent, after.session_id) == (
        False,
        True,
        before.session_id,
    )
    assert after.updated_at_ms >= before.updated_at_ms
    assert _session(sessions, passing_id) is None  # deleted: a tombstone
    assert passing_id not in subscribed
