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
from services.common.kafka.security import client_security
from services.local import maven, processes, progress
from services.local.maven import FetchError
from services.local.settings import LocalSettings

NAME = "kafka"

__all__ = ["NAME", "FetchError", "bootstrap", "fetch_jars", "libs_dir", "prepare", "start"]

#: Seconds the broker may take from launch to answering metadata requests.
START_TIMEOUT = 120.0

#: Seconds a controlled shutdown may take before the broker is killed.
STOP_TIMEOUT = 60.0

T = TypeVar("T")


def bootstrap(settings: LocalSettings) -> str:
    """The bootstrap address of the local broker: ``127.0.0.1:<kafka_port>``."""
    return f"127.0.0.1:{settings.kafka_port}"


def libs_dir(settings: LocalSettings) -> Path:
    """Where the jars of ``settings.kafka_version`` are cached."""
    return settings.cache_dir / f"kafka-{settings.kafka_version}" / "libs"


def fetch_jars(settings: LocalSettings) -> Path:
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


def _kafka_dir(settings: LocalSettings) -> Path:
    return settings.state_dir / "kafka"


def _cluster_id(settings: LocalSettings) -> str:
    """This state dir's KRaft cluster id, generated once (Kafka's url-safe base64 UUID)."""
    path = _kafka_dir(settings) / "cluster.id"
    if path.exists():
        return path.read_text(encoding="utf-8").strip()
    cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
    path.write_text(cluster_id + "\n", encoding="utf-8")
    return cluster_id


def _write_config(settings: LocalSettings) -> tuple[Path, Path]:
    """Write server.properties and log4j.properties (ports may change between runs)."""
    home = _kafka_dir(settings)
    home.mkdir(parents=True, exist_ok=True)
    port, controller = settings.kafka_port, settings.kafka_controller_port
    # The client listener speaks what the services are told to (kafka_security_protocol);
    # its name is the protocol's, and the broker's own traffic uses it too.
    protocol = settings.kafka_security_protocol
    server = home / "server.properties"
    server.touch(mode=0o600)  # it may hold the broker's SCRAM login
    server.write_text(
        "\n".join(
            [
                "process.roles=broker,controller",
                "node.id=1",
                # A static voter set: one node, no dynamic quorum to bootstrap.
                f"controller.quorum.voters=1@127.0.0.1:{controller}",
                f"listeners={protocol}://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}",
                f"advertised.listeners={protocol}://127.0.0.1:{port}",
                "controller.listener.names=CONTROLLER",
                f"inter.broker.listener.name={protocol}",
                f"listener.security.protocol.map=CONTROLLER:PLAINTEXT,{protocol}:{protocol}",
                *_security_config(settings, home),
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
                # Session timeouts of a few seconds (the stages' 3 s: a dead instance's
                # partitions move within 5 s, bench/NOTES.md "Recovery"); Kafka's own
                # minimum is 6 s.
                "group.min.session.timeout.ms=1000",
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


def _scram_login(settings: LocalSettings) -> tuple[str, str]:
    if not settings.kafka_sasl_username or settings.kafka_sasl_password is None:
        raise ValueError("a local SASL_SSL Kafka needs kafka_sasl_username and kafka_sasl_password")
    return settings.kafka_sasl_username, settings.kafka_sasl_password.get_secret_value()


def _security_config(settings: LocalSettings, home: Path) -> list[str]:
    """server.properties lines of a TLS (SSL or SASL_SSL with SCRAM-SHA-512) client listener.

    The broker's certificate and key are ``local_tls_cert_file``/``local_tls_key_file``
    (PEM), joined into one PEM keystore; it trusts ``kafka_ssl_cafile`` as a client of
    itself. Raises ``ValueError`` when one of them is missing, or for OAUTHBEARER (MSK IAM
    exists only in AWS).
    """
    protocol = settings.kafka_security_protocol
    if protocol == "PLAINTEXT":
        return []
    cert, key, cafile = (
        settings.local_tls_cert_file,
        settings.local_tls_key_file,
        settings.kafka_ssl_cafile,
    )
    if cert is None or key is None or cafile is None:
        raise ValueError(
            f"a local {protocol} Kafka needs local_tls_cert_file, local_tls_key_file and "
            "kafka_ssl_cafile"
        )
    keystore = home / "keystore.pem"
    keystore.touch(mode=0o600)
    keystore.write_bytes(key.read_bytes() + cert.read_bytes())
    lines = [
        "ssl.keystore.type=PEM",
        f"ssl.keystore.location={keystore}",
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={cafile}",
        "ssl.client.auth=none",
    ]
    if protocol == "SASL_SSL":
        if settings.kafka_sasl_mechanism != "SCRAM-SHA-512":
            raise ValueError("the local Kafka serves SCRAM-SHA-512 only (MSK IAM is AWS's)")
        username, password = _scram_login(settings)
        lines += [
            "sasl.enabled.mechanisms=SCRAM-SHA-512",
            "sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512",
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config="
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{username}" password="{password}";',
        ]
    return lines


def _java() -> str:
    java = shutil.which("java")
    if java is None:
        raise FetchError("java (OpenJDK 17) is not installed: run scripts/bootstrap.sh")
    return java


def _format_storage(
    settings: LocalSettings, java: str, classpath: str, server: Path, log4j: Path
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
    if settings.kafka_security_protocol == "SASL_SSL":
        # The SCRAM credential exists from the first start (KRaft stores it in the metadata
        # log): the broker needs it for its own login before any admin client could add it.
        username, password = _scram_login(settings)
        argv += ["--add-scram", f"SCRAM-SHA-512=[name={username},password={password}]"]
    with log.open("ab") as out:
        result = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=120)
    if result.returncode != 0:
        raise processes.StartError(NAME, log, f"storage format failed (exit {result.returncode})")


def prepare(settings: LocalSettings) -> tuple[str, str, Path, Path]:
    """Fetch the jars, write the configuration and format the storage (once).

    Returns (java, classpath, server.properties, log4j.properties). Raises
    :class:`FetchError` when jars or Java are missing and
    :class:`~services.local.processes.StartError` when formatting fails.
    """
    if not libs_dir(settings).exists():
        progress.report(
            f"fetching Kafka {settings.kafka_version}'s jars with Maven (first run only)..."
        )
    libs = fetch_jars(settings)
    java = _java()
    server, log4j = _write_config(settings)
    classpath = f"{libs}/*"
    _format_storage(settings, java, classpath, server, log4j)
    return java, classpath, server, log4j


def start(settings: LocalSettings) -> int:
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
    security = client_security(settings)

    def answers() -> bool:
        if not processes.port_open(settings.kafka_port):
            return False
        try:
            _run(wait_for_kafka(address, timeout=10.0, security=security))
        except TimeoutError:
            return False
        return True

    pid = processes.ensure_started(
        settings.state_dir, NAME, argv, answers, START_TIMEOUT, port=settings.kafka_port
    )
    specs = core_topic_specs(settings)
    created = _run(ensure_topics(address, specs, settings.replication_factor, security=security))
    if created:
        progress.report(f"created {len(created)} of {len(specs)} Kafka topics")
    return pid
