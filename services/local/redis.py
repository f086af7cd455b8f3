"""The local Redis: one server, or a primary with replicas and Sentinels as ElastiCache.

Alone, process ``redis`` serves 127.0.0.1:<redis_port> with its append-only file under
``<state_dir>/redis``. With ``redis_replicas``, processes ``redis1`` .. ``redis<n>`` (node i on
``redis_port + i - 1``, data in ``<state_dir>/redis<i>``) are one primary and its replicas,
watched by ``redis-sentinel1`` .. (Sentinel j on ``redis_sentinel_port + j - 1``) under the
master name ``redis_sentinel_master``; when the primary dies, the Sentinels promote a
replica, and the services follow through them (``redis_sentinels``). A node is started as
a replica of whichever node the Sentinels name primary now (``redis1`` the first time),
so a node brought back after a failover never comes back as a second primary.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import socket
import ssl
from pathlib import Path
from typing import Any

import redis as redis_client
from redis import exceptions as redis_errors

from services.local import processes
from services.local.settings import LocalSettings

NAME = "redis"

#: Milliseconds without an answer before the Sentinels hold the primary down (ElastiCache
#: detects a failed primary within seconds as well). At 2 s, a primary busy for a moment on
#: a loaded 2-core machine (a full resync, an append-only file rewrite) was taken for dead:
#: needless failovers, back and forth.
SENTINEL_DOWN_AFTER_MS = 5000

#: Milliseconds a Sentinel gives one failover before another may try (Redis' unit).
SENTINEL_FAILOVER_TIMEOUT_MS = 10_000

#: Seconds Redis may take to load its append-only file and answer PING.
START_TIMEOUT = 60.0


def _tls(settings: LocalSettings) -> bool:
    """Whether the local Redis serves TLS (only): the local cluster has a certificate."""
    return settings.local_tls_cert_file is not None and settings.local_tls_key_file is not None


def node_ids(settings: LocalSettings) -> list[int]:
    """The Redis nodes: 1 (the first primary) to ``1 + redis_replicas``."""
    return list(range(1, settings.redis_replicas + 2))


def node_name(settings: LocalSettings, node: int) -> str:
    """The process name of node ``node``: ``redis`` alone, ``redis<node>`` with replicas."""
    return NAME if settings.redis_replicas == 0 else f"{NAME}{node}"


def node_port(settings: LocalSettings, node: int) -> int:
    """The port of node ``node``: ``redis_port + node - 1``."""
    return settings.redis_port + node - 1


def sentinel_ids(settings: LocalSettings) -> list[int]:
    """The Sentinels: none without replicas, else 1 to ``redis_sentinel_count``."""
    return list(range(1, settings.redis_sentinel_count + 1)) if settings.redis_replicas else []


def sentinel_name(sentinel: int) -> str:
    """The process name of Sentinel ``sentinel``: ``redis-sentinel<sentinel>``."""
    return f"{NAME}-sentinel{sentinel}"


def sentinel_port(settings: LocalSettings, sentinel: int) -> int:
    """The port of Sentinel ``sentinel``: ``redis_sentinel_port + sentinel - 1``."""
    return settings.redis_sentinel_port + sentinel - 1


def sentinels(settings: LocalSettings) -> list[str]:
    """The Sentinels' addresses (``127.0.0.1:<port>``) for the services' ``redis_sentinels``."""
    return [f"127.0.0.1:{sentinel_port(settings, j)}" for j in sentinel_ids(settings)]


def url(settings: LocalSettings) -> str:
    """The URL of the local Redis server's database 0, e.g. for redis-py (``rediss://``
    when it serves TLS); with replicas, the first node's (the services ask the Sentinels
    which node is the primary)."""
    scheme = "rediss" if _tls(settings) else "redis"
    return f"{scheme}://127.0.0.1:{settings.redis_port}/0"


def _query(settings: LocalSettings, port: int, *command: str, node: bool = True) -> Any:
    """redis-py's reply to ``command`` at 127.0.0.1:``port`` (a node, with the password; a
    Sentinel: without), or None when nothing answers there."""
    password = settings.redis_password
    client = redis_client.Redis(
        host="127.0.0.1",
        port=port,
        password=None if password is None or not node else password.get_secret_value(),
        socket_timeout=1.0,
        socket_connect_timeout=1.0,
    )
    with contextlib.closing(client):
        try:
            return client.execute_command(*command)  # type: ignore[no-untyped-call]
        except (redis_errors.RedisError, OSError):
            return None


def _named_primary(settings: LocalSettings, port: int) -> int | None:
    """The port of the primary the Sentinel on ``port`` names, or None (no answer)."""
    master = settings.redis_sentinel_master
    reply = _query(settings, port, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", master, node=False)
    return int(reply[1]) if reply else None


def primary(settings: LocalSettings) -> int | None:
    """The node that is primary now: the one a running Sentinel names, else the one of the
    running nodes that says it is a master; None when nobody can tell."""
    by_port = {node_port(settings, n): n for n in node_ids(settings)}
    for j in sentinel_ids(settings):
        port = _named_primary(settings, sentinel_port(settings, j))
        if port in by_port:
            return by_port[port]
    for node in node_ids(settings):
        role = _query(settings, node_port(settings, node), "ROLE")
        if role and role[0] == b"master":
            return node
    # Nothing runs: the Sentinels' files name the last primary (they rewrite them after a
    # failover), whose data is the newest.
    for j in sentinel_ids(settings):
        config = settings.state_dir / sentinel_name(j) / "sentinel.conf"
        with contextlib.suppress(FileNotFoundError):
            for line in config.read_text(encoding="utf-8").splitlines():
                words = line.split()
                if words[:3] == ["sentinel", "monitor", settings.redis_sentinel_master]:
                    port = int(words[4])
                    if port in by_port:
                        return by_port[port]
    return None


def _primary_to_follow(settings: LocalSettings, node: int) -> int:
    """The primary that node ``node``, about to start, must follow (itself: it is primary).

    A primary that died while its replicas run is not started again as a primary: its data
    may lack writes a replica confirmed, so this waits until the Sentinels have promoted
    another node. Raises ``TimeoutError`` when they do not within ``START_TIMEOUT``.
    """
    leader = primary(settings) or 1
    others = [n for n in node_ids(settings) if n != node]
    secret = None if settings.redis_password is None else settings.redis_password.get_secret_value()
    if leader != node or not any(ping(node_port(settings, n), password=secret) for n in others):
        return leader
    processes.wait_until(
        lambda: primary(settings) not in (None, node),
        START_TIMEOUT,
        f"the Sentinels promoting a replica of {node_name(settings, node)}",
    )
    return primary(settings) or leader


def in_sync(settings: LocalSettings, node: int) -> bool:
    """Whether node ``node`` answers and, if a replica, has its link to the primary up (it
    has loaded the primary's data and follows its stream)."""
    info = _query(settings, node_port(settings, node), "INFO", "replication")
    if not isinstance(info, dict):
        return False
    return info.get("role") == "master" or info.get("master_link_status") == "up"


def used_memory(settings: LocalSettings, node: int) -> int | None:
    """Bytes node ``node`` has allocated for its data (``INFO memory`` ``used_memory``), or
    None when it does not answer."""
    info = _query(settings, node_port(settings, node), "INFO", "memory")
    if not isinstance(info, dict) or not isinstance(info.get("used_memory"), int):
        return None
    used: int = info["used_memory"]
    return used


def _command(*words: bytes) -> bytes:
    """One command in RESP (any byte may be in a word, a password included)."""
    return b"*%d\r\n" % len(words) + b"".join(b"$%d\r\n%s\r\n" % (len(w), w) for w in words)


def ping(
    port: int,
    host: str = "127.0.0.1",
    timeout: float = 1.0,
    *,
    tls: ssl.SSLContext | None = None,
    password: str | None = None,
) -> bool:
    """Whether the Redis server at ``host:port`` answers PING with PONG (over ``tls`` when
    given, after AUTH with ``password`` when given).

    A server still loading its data answers ``-LOADING`` instead, so this is a readiness
    test, not only a liveness test.
    """
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw:
            sock = raw if tls is None else tls.wrap_socket(raw, server_hostname=host)
            if password is not None:
                sock.sendall(_command(b"AUTH", password.encode()))
                if not sock.recv(64).startswith(b"+OK"):
                    return False
            sock.sendall(_command(b"PING"))
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _quoted(value: str) -> str:
    """``value`` as a double-quoted word of a Redis configuration file."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _binary() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        raise FileNotFoundError("redis-server is not installed: run scripts/bootstrap.sh")
    return binary


def _node_config(settings: LocalSettings, node: int, path: Path) -> None:
    """Write node ``node``'s configuration file: its password, and with replicas which
    primary it follows. The password goes in a file only this user reads, never on the
    command line. Raises :class:`~services.local.processes.StartError` when a dead primary
    is not replaced in time (:func:`_primary_to_follow`)."""
    lines = []
    password = settings.redis_password
    if password is not None:
        lines.append(f"requirepass {_quoted(password.get_secret_value())}")
        lines.append(f"masterauth {_quoted(password.get_secret_value())}")
    if settings.redis_replicas > 0:
        name = node_name(settings, node)
        try:
            leader = _primary_to_follow(settings, node)
        except TimeoutError as exc:
            raise processes.StartError(
                name, processes.log_file(settings.state_dir, name), str(exc)
            ) from exc
        if leader != node:
            lines.append(f"replicaof 127.0.0.1 {node_port(settings, leader)}")
    path.touch(mode=0o600)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def start(settings: LocalSettings, node: int = 1) -> int:
    """Start Redis node ``node`` unless it runs and wait until it answers PING (a replica:
    until it has synchronised with the primary); return its pid.

    Raises :class:`~services.local.processes.StartError` (quoting its log) if it exits, its
    port is taken, or it does not answer within ``START_TIMEOUT`` seconds,
    ``FileNotFoundError`` if redis-server is not installed, and ``ValueError`` for replicas
    with TLS (the local replicated Redis is plain TCP on loopback).
    """
    binary = _binary()
    name = node_name(settings, node)
    port = node_port(settings, node)
    data = settings.state_dir / name
    data.mkdir(parents=True, exist_ok=True)
    config = data / "redis.conf"
    password = settings.redis_password
    replicated = settings.redis_replicas > 0
    if replicated and _tls(settings):
        raise ValueError("a local Redis with replicas serves plain TCP only (no TLS)")
    if processes.find(settings.state_dir, name) is None:
        _node_config(settings, node, config)
    argv = [
        binary, str(config),
        "--bind", "127.0.0.1",
        "--dir", str(data),
        "--appendonly", "yes",
        "--daemonize", "no",
        "--logfile", "",  # log to stdout, which the launcher sends to its log file
    ]  # fmt: skip
    tls: ssl.SSLContext | None = None
    if _tls(settings):
        argv += [
            "--port", "0",  # TLS only, as ElastiCache with in-transit encryption
            "--tls-port", str(port),
            "--tls-cert-file", str(settings.local_tls_cert_file),
            "--tls-key-file", str(settings.local_tls_key_file),
            "--tls-auth-clients", "no",
        ]  # fmt: skip
        tls = ssl.create_default_context(
            cafile=None if settings.redis_ssl_cafile is None else str(settings.redis_ssl_cafile)
        )
    else:
        argv += ["--port", str(port)]
    secret = None if password is None else password.get_secret_value()

    def ready() -> bool:
        if not ping(port, tls=tls, password=secret):
            return False
        return not replicated or in_sync(settings, node)

    return processes.ensure_started(settings.state_dir, name, argv, ready, START_TIMEOUT, port=port)


def _sentinel_id(settings: LocalSettings, sentinel: int) -> str:
    """A Sentinel's run id (40 hex digits), the same at every start: the others know it
    again instead of counting one more Sentinel."""
    seed = f"{settings.state_dir.resolve()}:{sentinel}".encode()
    return hashlib.sha1(seed, usedforsecurity=False).hexdigest()


def _sentinel_config(settings: LocalSettings, sentinel: int, path: Path) -> None:
    """Write Sentinel ``sentinel``'s configuration: it watches the node that is primary now
    (Sentinel rewrites the file itself after a failover; it is written anew at each start)."""
    master = settings.redis_sentinel_master
    leader = primary(settings) or 1
    quorum = len(sentinel_ids(settings)) // 2 + 1
    lines = [
        f"port {sentinel_port(settings, sentinel)}",
        "bind 127.0.0.1",
        f"dir {_quoted(str(path.parent))}",
        f"sentinel myid {_sentinel_id(settings, sentinel)}",
        "sentinel resolve-hostnames no",
        f"sentinel monitor {master} 127.0.0.1 {node_port(settings, leader)} {quorum}",
        f"sentinel down-after-milliseconds {master} {SENTINEL_DOWN_AFTER_MS}",
        f"sentinel failover-timeout {master} {SENTINEL_FAILOVER_TIMEOUT_MS}",
        f"sentinel parallel-syncs {master} 1",
    ]
    if settings.redis_password is not None:
        lines.append(
            f"sentinel auth-pass {master} {_quoted(settings.redis_password.get_secret_value())}"
        )
    path.touch(mode=0o600)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def start_sentinel(settings: LocalSettings, sentinel: int) -> int:
    """Start Sentinel ``sentinel`` unless it runs and wait until it names the primary;
    return its pid. Raises as :func:`start`."""
    binary = _binary()
    name = sentinel_name(sentinel)
    port = sentinel_port(settings, sentinel)
    data = settings.state_dir / name
    data.mkdir(parents=True, exist_ok=True)
    config = data / "sentinel.conf"
    if processes.find(settings.state_dir, name) is None:
        _sentinel_config(settings, sentinel, config)
    argv = [binary, str(config), "--sentinel", "--daemonize", "no", "--logfile", ""]

    def ready() -> bool:
        return _named_primary(settings, port) is not None

    return processes.ensure_started(settings.state_dir, name, argv, ready, START_TIMEOUT, port=port)
