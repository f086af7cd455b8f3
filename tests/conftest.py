"""Session fixtures that start REAL servers (Kafka, Redis, PostgreSQL, HAProxy, services).

Each server starts once per session, on the first test that needs it, through the local
cluster launcher (:mod:`services.local`); everything is stopped at the end of the session.
A test that stops a process (``cluster.stop("kafka")``) starts it again before it ends.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Coroutine, Iterator
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata
from hypothesis import settings as hypothesis_settings

from services.common.kafka.admin import TopicSpec, ensure_topics, wait_for_kafka
from services.local import cluster as local_cluster
from services.local import haproxy, kafka, postgres, processes, redis
from services.local.settings import LocalSettings
from tests.servers import LocalCluster, make_test_settings

DISRUPTIVE = "disruptive"

#: The marker of a test that stops the whole session cluster (``cormorant down``).
STOPS_CLUSTER = "stops_cluster"

#: The fixture of the production-layout test cluster (tests/topology/conftest.py).
PRODUCTION = "production"

# Property tests check behaviour, never speed (bench/ measures that): no per-example
# deadline, which a shared, loaded machine exceeds now and then (an example at 280 ms).
hypothesis_settings.register_profile("cormorant", deadline=None)
hypothesis_settings.load_profile("cormorant")


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``disruptive`` and ``stops_cluster`` markers."""
    config.addinivalue_line(
        "markers",
        f"{DISRUPTIVE}: stops part of the shared cluster (and restores it); runs last",
    )
    config.addinivalue_line(
        "markers",
        f"{STOPS_CLUSTER}: stops the whole shared cluster; runs after the disruptive tests",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run ``disruptive`` tests after all others: a failed restore then spoils nothing else.

    A ``stops_cluster`` test runs after them: the next test to need the cluster's
    services would start them all again (the infrastructure test brings back only the
    infrastructure), and after it only the production-layout tests come, which stop the
    session's cluster anyway. Those tests (the ``production`` fixture,
    tests/topology/conftest.py) run last of all: that cluster starts on their first test
    and, started earlier, would run beside every test after it on the shared machine.
    """
    items.sort(
        key=lambda item: (
            PRODUCTION in getattr(item, "fixturenames", ()),
            item.get_closest_marker(STOPS_CLUSTER) is not None,
            item.get_closest_marker(DISRUPTIVE) is not None,
        )
    )


@pytest.fixture(scope="session")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSettings]:
    """Settings of this session's test cluster; tears the whole cluster down at the end."""
    value = make_test_settings(tmp_path_factory.mktemp("cormorant"))
    yield value
    local_cluster.down(value)


@pytest.fixture(scope="session")
def kafka_bootstrap(settings: LocalSettings) -> str:
    """A running Kafka broker with the core topics: its bootstrap address ``host:port``."""
    local_cluster.start_component(settings, kafka.NAME)
    return kafka.bootstrap(settings)


@pytest.fixture(scope="session")
def redis_server(settings: LocalSettings) -> str:
    """A running Redis server: its URL ``redis://127.0.0.1:<port>/0``."""
    local_cluster.start_component(settings, redis.NAME)
    return redis.url(settings)


@pytest.fixture(scope="session")
def postgres_server(settings: LocalSettings) -> str:
    """A running PostgreSQL server: the URL of its ``cormorant`` database."""
    local_cluster.start_component(settings, postgres.NAME)
    return postgres.dsn(settings)


@pytest.fixture
def cluster(settings: LocalSettings) -> LocalCluster:
    """The whole cluster up (infrastructure, ingest nodes, router, HAProxy).

    The processes are shared by the whole session: they start on first use. Each test
    checks that they all still run, because an earlier test may have stopped some (the
    infrastructure tests run ``cormorant down``); only what is down is started again. It
    also waits until HAProxy routes to every ingest node again: a node that was not ready
    a moment ago (Kafka restarted) is back in rotation only after its next health check.
    """
    if not all(row.healthy for row in local_cluster.status(settings)):
        local_cluster.up(settings)
    else:
        for name in haproxy.process_names(settings):
            local_cluster.start_component(settings, name)
    return LocalCluster(settings)


@pytest.fixture(scope="session")
def sink_kafka(settings: LocalSettings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A SECOND Kafka cluster (one broker, launched like the first by
    :func:`services.local.kafka.launch`, in a state dir of its own on free ports, without
    Cormorant's topics): where the integrations' Kafka sink writes. Its bootstrap address
    ``host:port``."""
    sink = settings.model_copy(
        update={
            "state_dir": tmp_path_factory.mktemp("sink-kafka"),
            "kafka_port": local_cluster.free_port(),
            "kafka_controller_port": local_cluster.free_port(),
            "kafka_brokers": 1,
        }
    )
    address = kafka.bootstrap(sink)

    def serves() -> bool:
        try:
            _run_apart(wait_for_kafka(address, timeout=10.0))
        except (TimeoutError, KafkaError, OSError):
            return False
        return True

    kafka.launch(sink)
    try:
        processes.wait_until(serves, kafka.START_TIMEOUT, "the sink Kafka")
        _run_apart(_first_transaction(address))
        yield address
    finally:
        processes.stop(sink.state_dir, kafka.NAME, timeout=kafka.STOP_TIMEOUT)


def _run_apart(coroutine: Coroutine[Any, Any, None]) -> None:
    """Run ``coroutine`` to its end on an event loop of its own thread: the test that first
    asks for a session fixture may run inside a loop already (Playwright's sync API keeps
    one running), where ``asyncio.run`` is refused. Raises what the coroutine raises."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, coroutine).result()


async def _first_transaction(address: str) -> None:
    """One transaction with a consumer group's offset on the fresh cluster at ``address``:
    Kafka creates its transaction state and offsets topics on first use, which took the
    first transactions of a test more than their 30 s timeout on the loaded machine."""
    await ensure_topics(address, [TopicSpec("warm-up", 1)])
    producer = AIOKafkaProducer(bootstrap_servers=address, transactional_id="warm-up")
    await producer.start()
    try:
        await producer.begin_transaction()
        await producer.send_and_wait("warm-up", b"")
        await producer.send_offsets_to_transaction(
            {TopicPartition("warm-up", 0): OffsetAndMetadata(1, "")}, "warm-up"
        )
        await producer.commit_transaction()
    finally:
        await producer.stop()
