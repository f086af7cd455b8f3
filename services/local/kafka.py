"""The local Kafka: jars from Maven Central, one KRaft node or three as MSK, the core topics.

Each broker is one JVM with ``process.roles=broker,controller`` on 127.0.0.1, its storage
formatted once. With ``kafka_brokers=1`` it is process ``kafka`` in ``<state_dir>/kafka``;
with more, process ``kafka<i>`` in ``<state_dir>/kafka<i>``, all voters of one controller
quorum, with MSK's durability: replication factor min(3, brokers) for every topic (the
internal ones too) and ``min.insync.replicas=2``, so an ``acks=all`` write survives the
loss of any one broker. Jars are cached per Kafka version under
``<cache_dir>/kafka-<version>/libs`` and shared by every state dir (user cluster, tests).
"""

from __future__ import annotations

import asyncio
import base64
import shutil
import subprocess
import threading
import uuid
from collections.abc import Coroutine, Mapping
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from services.common.kafka.admin import core_topic_specs, ensure_topics, wait_for_kafka
from services.common.kafka.security import client_security
from services.local import maven, processes, progress
from services.local.maven import FetchError
from services.local.settings import LocalSettings

NAME = "kafka"

__all__ = [
    "NAME",
    "FetchError",
    "bootstrap",
    "broker_ids",
    "broker_name",
    "client_port",
    "controller_port",
    "fetch_jars",
    "launch",
    "libs_dir",
    "prepare",
    "replication_factor",
    "start",
    "under_replicated",
]

#: Seconds the broker may take from launch to answering metadata requests.
START_TIMEOUT = 120.0

#: Seconds a controlled shutdown may take before the broker is killed.
STOP_TIMEOUT = 60.0

#: Milliseconds without a heartbeat before the controller fences a broker and moves its
#: partitions' leadership (Kafka's default 9,000): a broker killed with -9 says nothing,
#: so this is how long the partitions it led have no leader
#: (docs/guarantees/production-failover.md).
BROKER_SESSION_TIMEOUT_MS = 4000

#: Milliseconds between a broker's heartbeats to the controller (default 2,000): four
#: heartbeats per session timeout, so one slow one on a loaded machine fences nobody.
BROKER_HEARTBEAT_INTERVAL_MS = 1000

T = TypeVar("T")


def broker_ids(settings: LocalSettings) -> list[int]:
    """The node ids of the local brokers: 1 to ``kafka_brokers``."""
    return list(range(1, settings.kafka_brokers + 1))


def broker_name(settings: LocalSettings, node: int) -> str:
    """The process name of broker ``node``: ``kafka`` alone, ``kafka<node>`` among several."""
    return NAME if settings.kafka_brokers == 1 else f"{NAME}{node}"


def client_port(settings: LocalSettings, node: int) -> int:
    """The client port of broker ``node``: ``kafka_port + 2(node - 1)``."""
    return settings.kafka_port + 2 * (node - 1)


def controller_port(settings: LocalSettings, node: int) -> int:
    """The KRaft controller port of broker ``node``: ``kafka_controller_port + 2(node - 1)``."""
    return settings.kafka_controller_port + 2 * (node - 1)


def replication_factor(settings: LocalSettings) -> int:
    """The replication factor of every topic of the local Kafka: min(3, brokers), as MSK."""
    return min(3, settings.kafka_brokers)


def _min_insync(settings: LocalSettings) -> int:
    """``min.insync.replicas``: 2 with three replicas (MSK's default), else 1."""
    return min(2, replication_factor(settings))


def bootstrap(settings: LocalSettings) -> str:
    """The bootstrap addresses of the local brokers: ``127.0.0.1:<port>[,...]``."""
    return ",".join(f"127.0.0.1:{client_port(settings, n)}" for n in broker_ids(settings))


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


def _kafka_dir(settings: LocalSettings, node: int) -> Path:
    return settings.state_dir / broker_name(settings, node)


def _cluster_id(settings: LocalSettings) -> str:
    """This state dir's KRaft cluster id, generated once (Kafka's url-safe base64 UUID) and
    kept beside the first broker: every broker formats its storage with it."""
    home = _kafka_dir(settings, 1)
    home.mkdir(parents=True, exist_ok=True)
    path = home / "cluster.id"
    if path.exists():
        return path.read_text(encoding="utf-8").strip()
    cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
    path.write_text(cluster_id + "\n", encoding="utf-8")
    return cluster_id


def _write_config(settings: LocalSettings, node: int) -> tuple[Path, Path]:
    """Write broker ``node``'s server.properties and log4j.properties (ports may change
    between runs)."""
    home = _kafka_dir(settings, node)
    home.mkdir(parents=True, exist_ok=True)
    port, controller = client_port(settings, node), controller_port(settings, node)
    # A static voter set: every broker is a controller too (MSK's brokers have theirs
    # apart; the quorum's rules are the same), no dynamic quorum to bootstrap.
    voters = ",".join(f"{n}@127.0.0.1:{controller_port(settings, n)}" for n in broker_ids(settings))
    replicas, min_insync = replication_factor(settings), _min_insync(settings)
    # The client listener speaks what the services are told to (kafka_security_protocol);
    # its name is the protocol's, and the broker's own traffic uses it too.
    protocol = settings.kafka_security_protocol
    server = home / "server.properties"
    server.touch(mode=0o600)  # it may hold the broker's SCRAM login
    server.write_text(
        "\n".join(
            [
                "process.roles=broker,controller",
                f"node.id={node}",
                f"controller.quorum.voters={voters}",
                f"listeners={protocol}://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}",
                f"advertised.listeners={protocol}://127.0.0.1:{port}",
                "controller.listener.names=CONTROLLER",
                f"inter.broker.listener.name={protocol}",
                f"listener.security.protocol.map=CONTROLLER:PLAINTEXT,{protocol}:{protocol}",
                *_security_config(settings, home),
                f"log.dirs={home / 'data'}",
                # Every topic, the internal ones too, as durable as the brokers allow.
                f"default.replication.factor={replicas}",
                f"offsets.topic.replication.factor={replicas}",
                # Fewer offsets partitions than the default 50: created faster on first use.
                "offsets.topic.num.partitions=10",
                f"transaction.state.log.replication.factor={replicas}",
                # Fewer transaction state partitions than the default 50, as for offsets: a
                # first transactional producer (the integrations' sink in a fresh cluster)
                # waited 28 s for the 50 on the loaded machine.
                "transaction.state.log.num.partitions=10",
                f"transaction.state.log.min.isr={min_insync}",
                f"min.insync.replicas={min_insync}",
                f"broker.session.timeout.ms={BROKER_SESSION_TIMEOUT_MS}",
                f"broker.heartbeat.interval.ms={BROKER_HEARTBEAT_INTERVAL_MS}",
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
    settings: LocalSettings, node: int, java: str, classpath: str, server: Path, log4j: Path
) -> None:
    """Format broker ``node``'s KRaft storage once (``meta.properties`` marks a formatted
    log dir)."""
    if (_kafka_dir(settings, node) / "data" / "meta.properties").exists():
        return
    name = broker_name(settings, node)
    log = processes.log_file(settings.state_dir, name)
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
        raise processes.StartError(name, log, f"storage format failed (exit {result.returncode})")


def prepare(settings: LocalSettings, node: int = 1) -> tuple[str, str, Path, Path]:
    """Fetch the jars, write broker ``node``'s configuration and format its storage (once).

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
    server, log4j = _write_config(settings, node)
    classpath = f"{libs}/*"
    _format_storage(settings, node, java, classpath, server, log4j)
    return java, classpath, server, log4j


def _argv(settings: LocalSettings, node: int) -> list[str]:
    java, classpath, server, log4j = prepare(settings, node)
    return [
        java, f"-Xmx{settings.kafka_heap}", "-XX:+ExitOnOutOfMemoryError",
        "-Djava.awt.headless=true", f"-Dlog4j.configuration=file:{log4j}",
        "-cp", classpath, "kafka.Kafka", str(server),
    ]  # fmt: skip


def launch(settings: LocalSettings) -> None:
    """Spawn every broker that does not run, without waiting for any.

    A first start of several brokers needs this: each waits for a majority of the
    controller quorum, so none becomes ready while the others are not launched yet.
    Raises :class:`FetchError` and :class:`~services.local.processes.StartError` as
    :func:`start`, and the latter when a broker's port is taken.
    """
    for node in broker_ids(settings):
        name = broker_name(settings, node)
        if processes.find(settings.state_dir, name) is not None:
            continue
        port = client_port(settings, node)
        if processes.port_open(port):
            log = processes.log_file(settings.state_dir, name)
            raise processes.StartError(name, log, f"cannot start: port {port} is already in use")
        processes.spawn(settings.state_dir, name, _argv(settings, node))


async def under_replicated(
    address: str, node: int | None = None, *, security: Mapping[str, Any] | None = None
) -> list[tuple[str, int]]:
    """The partitions (topic, partition) of the cluster at ``address`` whose in-sync
    replicas lack one of their replicas (only broker ``node``, when given), internal topics
    included. Raises ``aiokafka.errors.KafkaError`` when the cluster cannot be asked."""
    admin = AIOKafkaAdminClient(
        bootstrap_servers=address, request_timeout_ms=5000, **(security or {})
    )
    try:
        await admin.start()
        described = await admin.describe_topics(await admin.list_topics())
    finally:
        await admin.close()
    lagging = []
    for topic in described:
        for partition in topic["partitions"]:
            missing = set(partition["replicas"]) - set(partition["isr"])
            if missing and (node is None or node in missing):
                lagging.append((topic["topic"], partition["partition"]))
    return sorted(lagging)


async def _live_brokers(address: str, security: Mapping[str, Any]) -> int:
    admin = AIOKafkaAdminClient(bootstrap_servers=address, request_timeout_ms=5000, **security)
    try:
        await admin.start()
        cluster = await admin.describe_cluster()
    finally:
        await admin.close()
    return len(cluster["brokers"])


def _ensure_core_topics(settings: LocalSettings, security: Mapping[str, Any]) -> None:
    """Create the core topics that are missing, once enough brokers have registered to hold
    their replicas (at a first start, the others may register a moment after this one).
    Raises ``TimeoutError`` when they cannot be created within ``START_TIMEOUT``."""
    address = bootstrap(settings)
    specs = core_topic_specs(settings)

    def enough_brokers() -> bool:
        try:
            return _run(_live_brokers(address, security)) >= replication_factor(settings)
        except (KafkaError, OSError):
            return False

    def created() -> bool:
        if not enough_brokers():
            return False
        try:
            made = _run(
                ensure_topics(address, specs, replication_factor(settings), security=security)
            )
        except (KafkaError, OSError):
            return False  # a broker still joining: asked again
        if made:
            progress.report(f"created {len(made)} of {len(specs)} Kafka topics")
        return True

    processes.wait_until(created, START_TIMEOUT, "the core topics")


def start(settings: LocalSettings, node: int = 1) -> int:
    """Start broker ``node`` unless it runs, wait until it serves, create the core topics.

    A broker serves once it answers metadata requests and, among several, is back in the
    in-sync replicas of every partition it holds (a restarted broker has caught up: the
    next one may be stopped without a partition falling under ``min.insync.replicas``).
    Returns the broker's pid. Raises :class:`FetchError` when jars or Java are missing and
    :class:`~services.local.processes.StartError` (quoting its log) when the broker does not
    serve within ``START_TIMEOUT`` seconds.
    """
    name = broker_name(settings, node)
    port = client_port(settings, node)
    address = f"127.0.0.1:{port}"
    security = client_security(settings)
    several = settings.kafka_brokers > 1

    def serves() -> bool:
        if not processes.port_open(port):
            return False
        try:
            _run(wait_for_kafka(address, timeout=10.0, security=security))
            return not several or not _run(under_replicated(address, node, security=security))
        except (TimeoutError, KafkaError, OSError):
            return False

    pid = processes.ensure_started(
        settings.state_dir, name, _argv(settings, node), serves, START_TIMEOUT, port=port
    )
    _ensure_core_topics(settings, security)
    return pid
