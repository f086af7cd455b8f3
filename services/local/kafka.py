"""The local Kafka broker: jars from Maven Central, a single KRaft node, the core topics.

The broker is one JVM with ``process.roles=broker,controller`` on 127.0.0.1, its storage
formatted once under ``<state_dir>/kafka/data``. Jars are cached per Kafka version under
``<cache_dir>/kafka-<version>/libs`` and shared by every state dir (user cluster, tests).
"""

from __future__ import annotations

import asyncio
import base64
import shutil
import subprocess
import threading
import uuid
from collections.abc import Coroutine
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from services.common.kafka.admin import core_topic_specs, ensure_topics, wait_for_kafka
from services.common.settings import Settings
from services.local import maven, processes
from services.local.maven import FetchError

NAME = "kafka"

__all__ = ["NAME", "FetchError", "bootstrap", "fetch_jars", "libs_dir", "prepare", "start"]

#: Seconds the broker may take from launch to answering metadata requests.
START_TIMEOUT = 120.0

#: Seconds a controlled shutdown may take before the broker is killed.
STOP_TIMEOUT = 60.0

T = TypeVar("T")


def bootstrap(settings: Settings) -> str:
    """The bootstrap address of the local broker: ``127.0.0.1:<kafka_port>``."""
    return f"127.0.0.1:{settings.kafka_port}"


def libs_dir(settings: Settings) -> Path:
    """Where the jars of ``settings.kafka_version`` are cached."""
    return settings.cache_dir / f"kafka-{settings.kafka_version}" / "libs"


def fetch_jars(settings: Settings) -> Path:
    """Download the broker's jars with Maven unless cached; return the libs directory.

    Raises :class:`FetchError` if ``mvn`` is not installed or fails.
    """
    pom = resources.files("services.local").joinpath("kafka-pom.xml").read_bytes()
    return maven.fetch(
        pom,
        libs_dir(settings),
        {"kafka.version": settings.kafka_version},
        f"Kafka {settings.kafka_version}",
    )


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion from synchronous code, even inside a running event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    # Called from async code (a test): a loop already runs in this thread, use another one.
    box: list[T] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            box.append(asyncio.run(coro))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target, name="cormorant-kafka-admin")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return box[0]


def _kafka_dir(settings: Settings) -> Path:
    return settings.state_dir / "kafka"


def _cluster_id(settings: Settings) -> str:
    """This state dir's KRaft cluster id, generated once (Kafka's url-safe base64 UUID)."""
    path = _kafka_dir(settings) / "cluster.id"
    if path.exists():
        return path.read_text(encoding="utf-8").strip()
    cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
    path.write_text(cluster_id + "\n", encoding="utf-8")
    return cluster_id


def _write_config(settings: Settings) -> tuple[Path, Path]:
    """Write server.properties and log4j.properties (ports may change between runs)."""
    home = _kafka_dir(settings)
    home.mkdir(parents=True, exist_ok=True)
    port, controller = settings.kafka_port, settings.kafka_controller_port
    server = home / "server.properties"
    server.write_text(
        "\n".join(
            [
                "process.roles=broker,controller",
                "node.id=1",
                # A static voter set: one node, no dynamic quorum to bootstrap.
                f"controller.quorum.voters=1@127.0.0.1:{controller}",
                f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}",
                f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
                "controller.listener.names=CONTROLLER",
                "inter.broker.listener.name=PLAINTEXT",
                "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
                f"log.dirs={home / 'data'}",
                # One broker: every internal topic has one replica.
                "offsets.topic.replication.factor=1",
                # Fewer offsets partitions than the default 50: created faster on first use.
                "offsets.topic.num.partitions=10",
                "transaction.state.log.replication.factor=1",
                "transaction.state.log.min.isr=1",
                "min.insync.replicas=1",
                # Consumer groups form at once instead of waiting 3 s for more members.
                "group.initial.rebalance.delay.ms=0",
                # Topics are created explicitly with their partitions and configs.
                "auto.create.topics.enable=false",
                # Two cores' worth of request threads (defaults 3 + 8): measured, fewer
                # threads spend less of the broker's CPU on switching (bench/NOTES.md).
                "num.network.threads=2",
                "num.io.threads=2",
                "",
            ]
        ),
        encoding="utf-8",
    )
    log4j = home / "log4j.properties"
    log4j.write_text(
        "\n".join(
            [
                # Console output goes to <state_dir>/logs/kafka.log (the launcher redirects it).
                "log4j.rootLogger=INFO, stdout",
                "log4j.appender.stdout=org.apache.log4j.ConsoleAppender",
                "log4j.appender.stdout.layout=org.apache.log4j.PatternLayout",
                "log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n",
                "log4j.logger.state.change.logger=WARN",
                "log4j.logger.kafka.request.logger=WARN",
                "",
            ]
        ),
        encoding="utf-8",
    )
    return server, log4j


def _java() -> str:
    java = shutil.which("java")
    if java is None:
        raise FetchError("java (OpenJDK 17) is not installed: run scripts/bootstrap.sh")
    return java


def _format_storage(
    settings: Settings, java: str, classpath: str, server: Path, log4j: Path
) -> None:
    """Format the KRaft storage once (``meta.properties`` marks a formatted log dir)."""
    if (_kafka_dir(settings) / "data" / "meta.properties").exists():
        return
    log = processes.log_file(settings.state_dir, NAME)
    log.parent.mkdir(parents=True, exist_ok=True)
    argv = [
        java, f"-Dlog4j.configuration=file:{log4j}", "-cp", classpath,
        "kafka.tools.StorageTool", "format",
        # "=": a cluster id may start with "-", which would read as an option otherwise.
        f"--cluster-id={_cluster_id(settings)}", "-c", str(server), "--ignore-formatted",
    ]  # fmt: skip
    with log.open("ab") as out:
        result = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=120)
    if result.returncode != 0:
        raise processes.StartError(NAME, log, f"storage format failed (exit {result.returncode})")


def prepare(settings: Settings) -> tuple[str, str, Path, Path]:
    """Fetch the jars, write the configuration and format the storage (once).

    Returns (java, classpath, server.properties, log4j.properties). Raises
    :class:`FetchError` when jars or Java are missing and
    :class:`~services.local.processes.StartError` when formatting fails.
    """
    libs = fetch_jars(settings)
    java = _java()
    server, log4j = _write_config(settings)
    classpath = f"{libs}/*"
    _format_storage(settings, java, classpath, server, log4j)
    return java, classpath, server, log4j


def start(settings: Settings) -> int:
    """Start the broker unless it runs, wait until it answers, create the core topics.

    Returns the broker's pid. Raises :class:`FetchError` when jars or Java are missing and
    :class:`~services.local.processes.StartError` (quoting ``kafka.log``) when the broker
    does not come up within ``START_TIMEOUT`` seconds.
    """
    java, classpath, server, log4j = prepare(settings)
    argv = [
        java, f"-Xmx{settings.kafka_heap}", "-XX:+ExitOnOutOfMemoryError",
        "-Djava.awt.headless=true", f"-Dlog4j.configuration=file:{log4j}",
        "-cp", classpath, "kafka.Kafka", str(server),
    ]  # fmt: skip
    address = bootstrap(settings)

    def answers() -> bool:
        if not processes.port_open(settings.kafka_port):
            return False
        try:
            _run(wait_for_kafka(address, timeout=10.0))
        except TimeoutError:
            return False
        return True

    pid = processes.ensure_started(
        settings.state_dir, NAME, argv, answers, START_TIMEOUT, port=settings.kafka_port
    )
    _run(ensure_topics(address, core_topic_specs(settings), settings.replication_factor))
    return pid
