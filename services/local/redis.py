"""The local Redis server: 127.0.0.1:<redis_port>, append-only file under ``<state_dir>/redis``."""

from __future__ import annotations

import shutil
import socket

from services.local import processes
from services.local.settings import LocalSettings

NAME = "redis"

#: Seconds Redis may take to load its append-only file and answer PING.
START_TIMEOUT = 60.0


def url(settings: LocalSettings) -> str:
    """The URL of the local Redis server's database 0, e.g. for redis-py."""
    return f"redis://127.0.0.1:{settings.redis_port}/0"


def ping(port: int, host: str = "127.0.0.1", timeout: float = 1.0) -> bool:
    """Whether the Redis server at ``host:port`` answers PING with PONG.

    A server still loading its data answers ``-LOADING`` instead, so this is a readiness
    test, not only a liveness test.
    """
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def start(settings: LocalSettings) -> int:
    """Start redis-server unless it runs and wait until it answers PING; return its pid.

    Raises :class:`~services.local.processes.StartError` (quoting ``redis.log``) if it
    exits, its port is taken, or it does not answer within ``START_TIMEOUT`` seconds, and
    ``FileNotFoundError`` if redis-server is not installed.
    """
    binary = shutil.which("redis-server")
    if binary is None:
        raise FileNotFoundError("redis-server is not installed: run scripts/bootstrap.sh")
    data = settings.state_dir / "redis"
    data.mkdir(parents=True, exist_ok=True)
    argv = [
        binary,
        "--bind", "127.0.0.1",
        "--port", str(settings.redis_port),
        "--dir", str(data),
        "--appendonly", "yes",
        "--daemonize", "no",
        "--logfile", "",  # log to stdout, which the launcher sends to redis.log
    ]  # fmt: skip
    return processes.ensure_started(
        settings.state_dir,
        NAME,
        argv,
        lambda: ping(settings.redis_port),
        START_TIMEOUT,
        port=settings.redis_port,
    )
