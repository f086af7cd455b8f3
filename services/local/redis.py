"""The local Redis server: 127.0.0.1:<redis_port>, append-only file under ``<state_dir>/redis``."""

from __future__ import annotations

import shutil
import socket
import ssl

from services.local import processes
from services.local.settings import LocalSettings

NAME = "redis"

#: Seconds Redis may take to load its append-only file and answer PING.
START_TIMEOUT = 60.0


def _tls(settings: LocalSettings) -> bool:
    """Whether the local Redis serves TLS (only): the local cluster has a certificate."""
    return settings.local_tls_cert_file is not None and settings.local_tls_key_file is not None


def url(settings: LocalSettings) -> str:
    """The URL of the local Redis server's database 0, e.g. for redis-py (``rediss://``
    when it serves TLS)."""
    scheme = "rediss" if _tls(settings) else "redis"
    return f"{scheme}://127.0.0.1:{settings.redis_port}/0"


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
    # The password goes in a file only this user reads, never on the command line.
    config = data / "redis.conf"
    config.touch(mode=0o600)
    password = settings.redis_password
    quoted = "" if password is None else password.get_secret_value()
    quoted = quoted.replace("\\", "\\\\").replace('"', '\\"')
    config.write_text("" if password is None else f'requirepass "{quoted}"\n', encoding="utf-8")
    argv = [
        binary, str(config),
        "--bind", "127.0.0.1",
        "--dir", str(data),
        "--appendonly", "yes",
        "--daemonize", "no",
        "--logfile", "",  # log to stdout, which the launcher sends to redis.log
    ]  # fmt: skip
    tls: ssl.SSLContext | None = None
    if _tls(settings):
        argv += [
            "--port", "0",  # TLS only, as ElastiCache with in-transit encryption
            "--tls-port", str(settings.redis_port),
            "--tls-cert-file", str(settings.local_tls_cert_file),
            "--tls-key-file", str(settings.local_tls_key_file),
            "--tls-auth-clients", "no",
        ]  # fmt: skip
        tls = ssl.create_default_context(
            cafile=None if settings.redis_ssl_cafile is None else str(settings.redis_ssl_cafile)
        )
    else:
        argv += ["--port", str(settings.redis_port)]
    secret = None if password is None else password.get_secret_value()
    return processes.ensure_started(
        settings.state_dir,
        NAME,
        argv,
        lambda: ping(settings.redis_port, tls=tls, password=secret),
        START_TIMEOUT,
        port=settings.redis_port,
    )
