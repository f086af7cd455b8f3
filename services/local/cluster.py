"""The whole local cluster: which processes it has, in which order they start and stop.

Infrastructure (Kafka, Redis, PostgreSQL, side by side) comes first, then the services, all
at once: the ingest nodes, the router, device_persist, app_delivery, the integrations stage,
the admin service; and HAProxy last so that clients only reach nodes that are ready.
``down`` stops in the opposite order (HAProxy first, then the services at once, then the
infrastructure). Every start waits for real readiness (port accepts, Kafka answers metadata,
the service's ready file exists) and is a no-op for a running process.
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import signal
import socket
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from pydantic import SecretStr

import services
from services.command_names import INTEGRATIONS_COMMAND
from services.common.auth.authorize import ALLOW_ALL_RULE
from services.common.drain import DrainTiming
from services.common.readiness import clear_ready
from services.common.settings import Settings
from services.local import (
    certificates,
    haproxy,
    kafka,
    layout,
    open_files,
    postgres,
    processes,
    progress,
    redis,
)
from services.local.settings import LocalSettings

#: Seconds a service may take from launch to writing its ready file.
SERVICE_START_TIMEOUT = 90.0

#: Seconds a service may take to shut down cleanly after SIGTERM.
SERVICE_STOP_TIMEOUT = 20.0

#: Seconds Redis, PostgreSQL and HAProxy may take to shut down cleanly.
INFRA_STOP_TIMEOUT = 30.0

ROUTER = "router"
DEVICE_PERSIST = "device-persist"
APP_DELIVERY = "app-delivery"
INTEGRATIONS = INTEGRATIONS_COMMAND
ADMIN = "admin"

#: The stages' blocks of HTTP ports after ``http_base_port``: instance j (from 1) of a stage
#: on ``http_base_port + haproxy.PORT_BLOCK * block + j`` (ingest node i: base + i).
STAGE_HTTP_BLOCKS = {ROUTER: 1, DEVICE_PERSIST: 2, APP_DELIVERY: 3, INTEGRATIONS: 4}


@dataclass(frozen=True, slots=True)
class Component:
    """One process of the local cluster and how to start, probe and stop it."""

    name: str
    port: int | None
    start: Callable[[], int]
    ready_file: Path | None = None
    http_port: int | None = None
    stop_signal: signal.Signals = signal.SIGTERM
    stop_timeout: float = INFRA_STOP_TIMEOUT


@dataclass(frozen=True, slots=True)
class ComponentStatus:
    """What ``status`` found about one component (``None``: not applicable)."""

    name: str
    pid: int | None
    port: int | None
    port_open: bool | None
    ready: bool | None
    http_port: int | None = None

    @property
    def healthy(self) -> bool:
        """Alive, its port (if any) accepts, and its ready file (if any) exists."""
        return self.pid is not None and self.port_open is not False and self.ready is not False

    @property
    def health(self) -> str:
        """A one-word verdict with the first failing check: ``up`` or ``down (...)``."""
        if self.pid is None:
            return "down (no process)"
        if self.port_open is False:
            return "down (port closed)"
        if self.ready is False:
            return "down (not ready)"
        return "up"


def local_settings(settings: LocalSettings) -> LocalSettings:
    """``settings`` as the local cluster runs them: local Kafka (every broker, topics
    replicated as the brokers allow), Redis (through its Sentinels, waiting for a replica,
    when it has replicas) and PostgreSQL, absolute directories, anonymous clients allowed
    when :func:`anonymous_allowed` (or ``allow_anonymous``) says so (every ingest node,
    extra ones included), with :func:`local_anonymous_rules`."""
    return settings.model_copy(
        update={
            "allow_anonymous": anonymous_allowed(settings) or settings.allow_anonymous,
            "anonymous_rules": local_anonymous_rules(settings),
            "kafka_bootstrap": kafka.bootstrap(settings),
            "replication_factor": kafka.replication_factor(settings),
            "redis_url": redis.url(settings),
            "redis_sentinels": redis.sentinels(settings),
            "redis_wait_replicas": settings.redis_wait_replicas or min(1, settings.redis_replicas),
            "postgres_dsn": postgres.dsn(settings),
            "state_dir": settings.state_dir.resolve(),
            "cache_dir": settings.cache_dir.resolve(),
            # HAProxy must have taken a draining node out before its clients come back.
            "drain_notice_seconds": (
                settings.drain_notice_seconds
                if "drain_notice_seconds" in settings.model_fields_set
                else haproxy.OUT_OF_ROTATION_SECONDS
            ),
        }
    )


def ingest_stop_timeout(settings: LocalSettings) -> float:
    """Seconds an ingest node of the cluster may take to drain and exit after SIGTERM
    (:attr:`~services.common.drain.DrainTiming.stop_seconds` of its settings), and no
    less than any other service's :data:`SERVICE_STOP_TIMEOUT`."""
    timing = DrainTiming.of(local_settings(settings))
    return max(SERVICE_STOP_TIMEOUT, float(timing.stop_seconds))


def runtime_settings(settings: LocalSettings) -> Settings:
    """The services' part of ``settings`` (:class:`~services.common.settings.Settings`): what
    a service process is given, without the launcher's own ports, heap and versions."""
    values = settings.model_dump(include=set(Settings.model_fields))
    # The MQTT bridges' reverse directions publish here as any client does: through HAProxy.
    values["integrations_mqtt_port"] = settings.listen_port
    return Settings.model_validate(values)


def child_environment(settings: Settings, **overrides: str) -> dict[str, str]:
    """The environment of a child process: this one's, plus every field of ``settings`` as
    CORMORANT_* (a service gets :func:`runtime_settings`, a launcher command all of them).

    Unset optional settings (None) are left out; lists and mappings are written as JSON, the form
    pydantic-settings reads them in. ``overrides`` (setting name → value) win.
    The settings file is switched off (``CORMORANT_SETTINGS_FILE=/dev/null``) so that the
    child sees exactly the launcher's resolved settings, not a file read from its own cwd.
    """
    env = dict(os.environ)
    values = {k: v for k, v in settings.model_dump(mode="json").items() if v is not None}
    # JSON mode masks secrets ("**********"); the child needs the real value.
    values.update(
        (name, secret.get_secret_value())
        for name in values
        if isinstance(secret := getattr(settings, name), SecretStr)
    )
    values.update(overrides)
    for name, value in values.items():
        text = json.dumps(value) if isinstance(value, list | dict) else str(value)
        env[f"CORMORANT_{name.upper()}"] = text
    env["CORMORANT_SETTINGS_FILE"] = os.devnull
    env["PYTHONUNBUFFERED"] = "1"  # log lines reach the log file as they are written
    # The project root, so that ``-m services.cli`` imports even when not pip-installed.
    root = str(Path(services.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def ready_file(settings: LocalSettings, name: str) -> Path:
    """The ready file of service ``name``: ``<state_dir>/run/<name>.ready``."""
    return processes.ready_file(settings.state_dir, name)


def instance_counts(settings: LocalSettings) -> dict[str, int]:
    """How many instances of each stage the cluster runs (``router_instances``...)."""
    return {
        ROUTER: settings.router_instances,
        DEVICE_PERSIST: settings.device_persist_instances,
        APP_DELIVERY: settings.app_delivery_instances,
        INTEGRATIONS: settings.integrations_instances,
    }


def http_ports(settings: LocalSettings) -> dict[str, int]:
    """Each service process's HTTP port (``/health``, ``/ready``, ``/metrics``; the admin
    API's ``admin_port``), by process name: ingest node i on ``http_base_port + i``,
    instance j of a stage in its block (:data:`STAGE_HTTP_BLOCKS`)."""
    base = settings.http_base_port
    ports = {
        haproxy.node_name(i): port for i, port in enumerate(haproxy.node_http_ports(settings), 1)
    }
    for stage, count in instance_counts(settings).items():
        block = base + haproxy.PORT_BLOCK * STAGE_HTTP_BLOCKS[stage]
        ports |= {name: block + j for j, name in enumerate(instance_names(stage, count), 1)}
    ports[ADMIN] = settings.admin_port
    return ports


def _start_service(
    settings: LocalSettings, name: str, command: str, port: int | None, **overrides: str
) -> int:
    """Start ``cormorant <command>`` as service ``name`` and wait for its ready file."""
    ready = ready_file(settings, name)
    if processes.find(settings.state_dir, name) is None:
        clear_ready(ready)  # left by a process that was killed: it says nothing now
    argv = [sys.executable, "-m", "services.cli", command]
    env = child_environment(runtime_settings(settings), ready_file=str(ready), **overrides)

    def is_ready() -> bool:
        return ready.exists() and (port is None or processes.port_open(port))

    return processes.ensure_started(
        settings.state_dir, name, argv, is_ready, SERVICE_START_TIMEOUT, port=port, env=env
    )


def infrastructure(settings: LocalSettings) -> list[Component]:
    """Kafka's brokers, Redis' nodes and Sentinels, and PostgreSQL, in start order (stopped
    in the opposite order: the Sentinels go before the nodes, so that no failover starts)."""
    settings = local_settings(settings)
    brokers = [
        Component(
            kafka.broker_name(settings, node),
            kafka.client_port(settings, node),
            partial(kafka.start, settings, node),
            stop_timeout=kafka.STOP_TIMEOUT,
        )
        for node in kafka.broker_ids(settings)
    ]
    nodes = [
        Component(
            redis.node_name(settings, node),
            redis.node_port(settings, node),
            partial(redis.start, settings, node),
        )
        for node in redis.node_ids(settings)
    ]
    sentinels = [
        Component(
            redis.sentinel_name(j),
            redis.sentinel_port(settings, j),
            partial(redis.start_sentinel, settings, j),
        )
        for j in redis.sentinel_ids(settings)
    ]
    database = Component(
        postgres.NAME,
        settings.postgres_port,
        partial(postgres.start, settings),
        stop_signal=postgres.STOP_SIGNAL,
    )
    return [*brokers, *nodes, *sentinels, database]


def _service(
    settings: LocalSettings, name: str, command: str, port: int | None = None, **overrides: str
) -> Component:
    """The component of service ``name``, run as ``cormorant <command>`` with its own HTTP
    port (:func:`http_ports`)."""
    http_port = http_ports(settings)[name]
    overrides.setdefault("http_port", str(http_port))
    return Component(
        name,
        port,
        partial(_start_service, settings, name, command, port, **overrides),
        ready_file=ready_file(settings, name),
        stop_timeout=SERVICE_STOP_TIMEOUT,
        http_port=http_port,
    )


def local_anonymous_rules(settings: LocalSettings) -> list[str]:
    """The rules of the local cluster's anonymous clients: ``anonymous_rules`` when set,
    else, where :func:`anonymous_allowed`, the explicit ``allow all #`` (rules are deny by
    default: without it an anonymous client could do nothing). The ingest nodes log the
    rules they let anonymous clients in with."""
    if settings.anonymous_rules or not anonymous_allowed(settings):
        return list(settings.anonymous_rules)
    return [str(ALLOW_ALL_RULE)]


def anonymous_allowed(settings: LocalSettings) -> bool:
    """Whether the local cluster lets anonymous clients in: ``local_anonymous`` on, and
    the ingest nodes listening on a loopback address only (HAProxy always does)."""
    if not settings.local_anonymous:
        return False
    host = settings.mqtt_host
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def tls_dir(settings: LocalSettings) -> Path:
    """Where ``cormorant up`` keeps the local CA and certificates: ``<state_dir>/tls``."""
    return settings.state_dir / "tls"


SCRAM_KEY_FILE = "scram_unknown_user_key"
"""The local cluster's ``scram_unknown_user_key``, in its state dir (mode 600)."""


def scram_unknown_user_key(settings: LocalSettings) -> str:
    """The key every local ingest node derives an unknown SCRAM user's salt from: read from
    ``<state_dir>/scram_unknown_user_key``, made there (32 random bytes, base64url, mode
    600) the first time, so the nodes answer an unknown user name alike, restart after
    restart. Raises ``ValueError`` if the file holds fewer than 32 characters (it is left
    as it is: remove it to make a new key)."""
    path = settings.state_dir / SCRAM_KEY_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        # O_EXCL: nodes started side by side cannot each write a key of their own.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        key = path.read_text().strip()
        if len(key) < 32:
            raise ValueError(
                f"{path} holds no key of 32 characters or more; remove it to make a new one"
            ) from None
        return key
    key = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w") as file:
        file.write(key + "\n")
    return key


def ingest_overrides(settings: LocalSettings, node: int) -> dict[str, str]:
    """The settings that make ingest node ``node`` (from 1) of the local cluster: its id,
    its direct port, its HTTP port (:func:`http_ports`), its listeners behind HAProxy
    (:func:`haproxy.node_listeners`) and,
    unless ``tls_cert_file`` is set, the local CA's server certificate
    (:mod:`services.local.certificates`, made on first use) with client certificates
    verified when sent (``tls_client_auth`` optional, unless set), and that CA trusted for
    JWKS URLs besides the system's (``jwt_jwks_ca_file``, unless set); and the state
    dir's :func:`scram_unknown_user_key` unless that setting is set."""
    port = haproxy.node_ports(settings)[node - 1]
    listeners = [listener.model_dump() for listener in haproxy.node_listeners(settings, node)]
    overrides = {
        "node_id": f"node{node}",
        "mqtt_port": str(port),
        "http_port": str(haproxy.node_http_ports(settings)[node - 1]),
        "listeners": json.dumps(listeners),
    }
    if settings.tls_cert_file is None and settings.tls_cert_pem is None:
        pki = certificates.ensure_local_pki(tls_dir(settings))
        overrides |= {"tls_cert_file": str(pki.server.cert), "tls_key_file": str(pki.server.key)}
        if "tls_client_auth" not in settings.model_fields_set:
            overrides |= {"tls_client_auth": "optional", "tls_client_ca_file": str(pki.ca.cert)}
        if settings.jwt_jwks_ca_file is None:
            overrides["jwt_jwks_ca_file"] = str(pki.ca.cert)
    if settings.scram_unknown_user_key is None:
        overrides["scram_unknown_user_key"] = scram_unknown_user_key(settings)
    return overrides


def _start_ingest(settings: LocalSettings, node: int) -> int:
    port = haproxy.node_ports(settings)[node - 1]
    overrides = ingest_overrides(settings, node)
    return _start_service(settings, haproxy.node_name(node), "ingest", port, **overrides)


def services_of(settings: LocalSettings) -> list[Component]:
    """The ingest nodes, the routers, the device_persist and app_delivery instances
    (``router_instances``... of each) and HAProxy, in start order."""
    settings = local_settings(settings)
    nodes = [
        Component(
            haproxy.node_name(i),
            port,
            partial(_start_ingest, settings, i),
            ready_file=ready_file(settings, haproxy.node_name(i)),
            stop_timeout=ingest_stop_timeout(settings),
            http_port=http,
        )
        for i, (port, http) in enumerate(
            zip(haproxy.node_ports(settings), haproxy.node_http_ports(settings), strict=True),
            start=1,
        )
    ]
    stages = [
        _service(
            settings, name, command, None, group_instance_id=name, **_only_first(command, name)
        )
        for command, count in instance_counts(settings).items()
        for name in instance_names(command, count)
    ]
    admin = _service(
        settings,
        ADMIN,
        "admin",
        settings.admin_port,
        cluster_endpoints=_endpoints(settings),
        admin_console_ws_url=f"ws://127.0.0.1:{settings.ws_listen_port}/mqtt",
        admin_haproxy_stats_sockets=json.dumps(
            [
                str(haproxy.stats_socket(settings, i))
                for i in range(1, haproxy.process_count(settings) + 1)
            ]
        ),
    )
    proxies = [
        Component(
            haproxy.process_name(i), settings.listen_port, partial(haproxy.start, settings, i)
        )
        for i in range(1, haproxy.process_count(settings) + 1)
    ]
    return [*nodes, *stages, admin, *proxies]


def _only_first(command: str, name: str) -> dict[str, str]:
    """Settings of instance ``name`` of stage ``command``: only the first integrations
    stage runs the MQTT bridges' reverse directions (each holds a session on the remote
    broker that a second one would take over)."""
    if command == INTEGRATIONS and name != INTEGRATIONS:
        return {"integrations_mqtt_reverse": "false"}
    return {}


def _endpoints(settings: LocalSettings) -> str:
    """The admin service's ``cluster_endpoints``: every service process's HTTP address."""
    ports = http_ports(settings)
    del ports[ADMIN]
    return json.dumps({name: f"http://127.0.0.1:{port}" for name, port in ports.items()})


def instance_names(stage: str, count: int) -> list[str]:
    """The process names of ``count`` instances of ``stage`` (``router``,
    ``device-persist``, ``app-delivery``): the stage's name, then ``<stage>-2``,
    ``<stage>-3``... Each is also the instance's static consumer group member id
    (``group_instance_id``)."""
    return [stage if i == 1 else f"{stage}-{i}" for i in range(1, count + 1)]


def components(settings: LocalSettings) -> list[Component]:
    """Every component of the cluster, in start order."""
    return infrastructure(settings) + services_of(settings)


def _start_all(settings: LocalSettings, parts: list[Component]) -> dict[str, int]:
    """Start each of ``parts`` in order (running ones are left alone), telling progress."""
    state_dir = local_settings(settings).state_dir
    pids = {}
    for part in parts:
        if processes.find(state_dir, part.name) is not None:
            pids[part.name] = part.start()  # running: only its readiness is checked
            continue
        progress.report(f"starting {part.name}, waiting until it is ready...")
        started = time.monotonic()
        pids[part.name] = part.start()
        progress.report(f"{part.name} ready in {time.monotonic() - started:.1f} s")
    return pids


def _start_side_by_side(settings: LocalSettings, chains: list[list[Component]]) -> dict[str, int]:
    """Start the chains of components side by side, each chain in its order
    (:func:`_start_all`): most of a start is waiting (a JVM, imports, a consumer group
    forming), and chains that need nothing of each other need not wait in turn. Returns name
    → pid; raises the first chain's error, once every chain has ended."""
    chains = [chain for chain in chains if chain]
    with ThreadPoolExecutor(max_workers=max(1, len(chains))) as pool:
        started = [pool.submit(_start_all, settings, chain) for chain in chains]
    pids: dict[str, int] = {}
    for chain in started:
        pids |= chain.result()
    return pids


def raise_open_files(settings: LocalSettings) -> int:
    """Raise this process's open-file limit, which the processes it starts inherit, towards
    what ``settings``' connections need (:func:`~services.local.open_files.target_open_files`
    of ``ingest_nodes`` and ``max_connections``); return the soft limit now
    (:func:`~services.local.open_files.raise_limit`)."""
    return open_files.raise_limit(
        open_files.target_open_files(settings.ingest_nodes, settings.max_connections)
    )


def up_infrastructure(settings: LocalSettings) -> dict[str, int]:
    """Bring Kafka (with the core topics), Redis and PostgreSQL up; return name → pid.

    Running processes are left alone, dead ones started. Raises
    :class:`~services.local.processes.StartError` naming the failing part's log file.
    """
    layout.record(settings)
    raise_open_files(settings)  # inherited by every process started from here
    if settings.kafka_brokers > 1:
        kafka.launch(local_settings(settings))  # a quorum forms only once they all run
    parts = infrastructure(settings)
    brokers = {kafka.broker_name(settings, node) for node in kafka.broker_ids(settings)}
    # Kafka, Redis (the Sentinels after the nodes: they are told the primary) and
    # PostgreSQL need nothing of each other.
    return _start_side_by_side(
        settings,
        [
            [part for part in parts if part.name in brokers],
            [part for part in parts if part.name not in brokers and part.name != postgres.NAME],
            [part for part in parts if part.name == postgres.NAME],
        ],
    )


def up_services(settings: LocalSettings) -> dict[str, int]:
    """Bring the ingest nodes, the router and HAProxy up; return name → pid.

    Needs the infrastructure up. Raises :class:`~services.local.processes.StartError`
    naming the failing part's log file.
    """
    raise_open_files(settings)  # inherited; HAProxy's maxconn follows it
    parts = services_of(settings)
    proxies = {haproxy.process_name(i) for i in range(1, haproxy.process_count(settings) + 1)}
    # The services need only the infrastructure, not each other: all at once. HAProxy last,
    # once every ingest node is ready.
    pids = _start_side_by_side(settings, [[part] for part in parts if part.name not in proxies])
    return pids | _start_all(settings, [part for part in parts if part.name in proxies])


def up(settings: LocalSettings) -> dict[str, int]:
    """Bring the whole cluster up (infrastructure, then services); return name → pid.

    Harmless when already running. Raises :class:`~services.local.processes.StartError`.
    """
    return up_infrastructure(settings) | up_services(settings)


def start_extra(
    settings: LocalSettings, name: str, command: str, port: int | None = None, **overrides: str
) -> int:
    """Start one more process ``name`` running ``cormorant <command>`` with the cluster's
    settings and ``overrides`` (setting name → value as its environment variable holds
    it; another app_delivery instance, an ingest node with settings of its own), and wait
    until it is ready (and listens on ``port``, if given); return its pid. ``down`` stops
    it with the rest. Its HTTP port (``/metrics``) is ``overrides``' ``http_port``, else one
    the kernel picks. Raises :class:`~services.local.processes.StartError`."""
    overrides.setdefault("http_port", str(free_port()))
    return _start_service(local_settings(settings), name, command, port, **overrides)


def free_port() -> int:
    """A TCP port of 127.0.0.1 free now (the kernel's pick, from the ephemeral range: clear
    of every port the cluster is configured with)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def start_instance(settings: LocalSettings, stage: str, name: str) -> int:
    """Start one more instance of ``stage`` (``router``, ``device-persist`` or
    ``app-delivery``) as process ``name``, a static member of the stage's consumer group
    beside those the settings ask for (they share the stage's partitions), with
    :func:`start_extra`; return its pid. Stop it with :func:`stop_extra`. Raises
    ``ValueError`` for another stage and :class:`~services.local.processes.StartError`."""
    if stage not in STAGE_HTTP_BLOCKS:
        raise ValueError(f"{stage!r} is not a stage with instances")
    return start_extra(settings, name, stage, group_instance_id=name)


def stop_extra(settings: LocalSettings, name: str) -> bool:
    """Stop the process ``name`` that :func:`start_extra` or :func:`start_instance` started;
    True if it was running."""
    settings = local_settings(settings)
    # It may be an ingest node (with settings of its own): it may take its drain's time.
    stopped = processes.stop(settings.state_dir, name, timeout=ingest_stop_timeout(settings))
    clear_ready(ready_file(settings, name))
    return stopped


def _find_component(settings: LocalSettings, name: str) -> Component:
    for part in components(settings):
        if part.name == name:
            return part
    known = ", ".join(p.name for p in components(settings))
    raise KeyError(f"no component named {name!r} (known: {known})")


def start_component(settings: LocalSettings, name: str) -> int:
    """Start the one component ``name`` (e.g. ``kafka``) unless it runs; return its pid.

    Raises ``KeyError`` for an unknown name and
    :class:`~services.local.processes.StartError` if it does not become ready. The open-file
    limit is raised first (:func:`raise_open_files`), as :func:`up` does.
    """
    raise_open_files(settings)
    return _find_component(settings, name).start()


def _stop(settings: LocalSettings, part: Component) -> bool:
    stopped = processes.stop(settings.state_dir, part.name, part.stop_signal, part.stop_timeout)
    if part.ready_file is not None:
        clear_ready(part.ready_file)  # a killed service could not remove it itself
    return stopped


def stop_component(settings: LocalSettings, name: str) -> bool:
    """Stop the one component ``name`` cleanly (SIGKILL after its deadline).

    Returns True if it was running. Raises ``KeyError`` for an unknown name.
    """
    settings = local_settings(settings)
    return _stop(settings, _find_component(settings, name))


def kill_component(settings: LocalSettings, name: str) -> bool:
    """``kill -9`` process ``name`` (no clean shutdown: a crash); True if it was running.

    Its ready file goes too (the process cannot remove it itself), so the launcher sees it
    down. Any recorded process may be named (an extra stage instance too).
    """
    settings = local_settings(settings)
    killed = processes.stop(settings.state_dir, name, signal.SIGKILL, timeout=10.0)
    clear_ready(ready_file(settings, name))
    return killed


def down(settings: LocalSettings) -> list[str]:
    """Stop the whole cluster: services first, infrastructure last; return the names stopped.

    Processes with a pid file but no longer part of the configuration (a node beyond a
    lowered ``ingest_nodes``) are stopped with the services.
    """
    settings = local_settings(settings)
    services_order = list(reversed(services_of(settings)))
    infra_order = list(reversed(infrastructure(settings)))
    known = {part.name for part in services_order + infra_order}
    proxies = {haproxy.process_name(i) for i in range(1, haproxy.process_count(settings) + 1)}
    # HAProxy first (no client reaches a stopping node), then every other service at once:
    # each shutdown is mostly waiting (closing connections, leaving consumer groups).
    stopped = [
        part.name for part in services_order if part.name in proxies and _stop(settings, part)
    ]
    stopped += _stop_side_by_side(
        settings, [[part] for part in services_order if part.name not in proxies]
    )

    def stop_stray(name: str) -> bool:
        done = processes.stop(settings.state_dir, name, timeout=ingest_stop_timeout(settings))
        clear_ready(ready_file(settings, name))
        return done

    strays = [n for n in processes.recorded_names(settings.state_dir) if n not in known]
    with ThreadPoolExecutor(max_workers=max(1, len(strays))) as pool:
        stopped += [
            name for name, done in zip(strays, pool.map(stop_stray, strays), strict=True) if done
        ]
    brokers = {kafka.broker_name(settings, node) for node in kafka.broker_ids(settings)}
    # The brokers together: stopped one by one, the last would wait out its whole stop
    # timeout for a controller quorum that left with the others. Beside them the rest in
    # order (the Sentinels before the Redis nodes: no failover starts).
    stopped += _stop_side_by_side(
        settings,
        [[part for part in infra_order if part.name not in brokers]]
        + [[part] for part in infra_order if part.name in brokers],
    )
    layout.forget(settings)
    return stopped


def _stop_side_by_side(settings: LocalSettings, chains: list[list[Component]]) -> list[str]:
    """Stop the chains of components side by side, each chain in its order; return the
    names of those that were running."""

    def stop_chain(chain: list[Component]) -> list[str]:
        return [part.name for part in chain if _stop(settings, part)]

    chains = [chain for chain in chains if chain]
    with ThreadPoolExecutor(max_workers=max(1, len(chains))) as pool:
        return [name for names in pool.map(stop_chain, chains) for name in names]


def _probe(settings: LocalSettings, part: Component) -> ComponentStatus:
    proc = processes.find(settings.state_dir, part.name)
    return ComponentStatus(
        name=part.name,
        pid=None if proc is None else proc.pid,
        port=part.port,
        port_open=None if part.port is None else processes.port_open(part.port),
        ready=None if part.ready_file is None else part.ready_file.exists(),
        http_port=part.http_port,
    )


def status(settings: LocalSettings, *, infrastructure_only: bool = False) -> list[ComponentStatus]:
    """Probe every component (or only the infrastructure) without changing anything."""
    parts = infrastructure(settings) if infrastructure_only else components(settings)
    settings = local_settings(settings)
    return [_probe(settings, part) for part in parts]
