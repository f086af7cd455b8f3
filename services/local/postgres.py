"""The local PostgreSQL server: a cluster initialised once under ``<state_dir>/postgres``.

It listens on 127.0.0.1:<postgres_port> only (no Unix socket) and holds a ``cormorant``
database owned by a ``cormorant`` role. Authentication is ``trust``: this is a developer's
loopback-only server, and no password then has to be stored or passed around.

PostgreSQL refuses to run as root. Run as root, initdb and postgres are started as the
``postgres`` user through ``setpriv`` with the ambient capability CAP_DAC_READ_SEARCH: the
state dir usually lies under a directory the postgres user may not enter (``/root`` or
pytest's ``/tmp/pytest-of-root`` are mode 0700), and that capability lets it reach its own
data directory without loosening the permissions of anyone's home. ``setpriv`` execs, so
the recorded pid is the postmaster's own.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
from pathlib import Path

import psutil

from services.local import processes
from services.local.settings import LocalSettings

NAME = "postgres"
DATABASE = "cormorant"
ROLE = "cormorant"
SUPERUSER = "postgres"

#: Seconds the server may take to start (crash recovery included) and accept connections.
START_TIMEOUT = 60.0

#: postgres stops on SIGINT with a "fast" shutdown; SIGTERM would wait for every client.
STOP_SIGNAL = signal.SIGINT

_CREATE_SQL = f"""
SELECT 'CREATE ROLE {ROLE} LOGIN'
 WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{ROLE}') \\gexec
SELECT 'CREATE DATABASE {DATABASE} OWNER {ROLE}'
 WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '{DATABASE}') \\gexec
"""


def bin_dir() -> Path:
    """The directory holding PostgreSQL's initdb, postgres and psql together.

    Debian keeps them off PATH in ``/usr/lib/postgresql/<major>/bin`` (the newest major
    wins); elsewhere the directory of ``initdb`` on PATH, symlinks resolved. Raises
    ``FileNotFoundError`` if no such directory exists.
    """
    debian = sorted(
        (p for p in Path("/usr/lib/postgresql").glob("*/bin") if p.parent.name.isdigit()),
        key=lambda p: int(p.parent.name),
        reverse=True,
    )
    on_path = shutil.which("initdb")
    candidates = [*debian, *([Path(on_path).resolve().parent] if on_path else [])]
    for directory in candidates:
        if all((directory / program).exists() for program in ("initdb", "postgres", "psql")):
            return directory
    raise FileNotFoundError("PostgreSQL is not installed: run scripts/bootstrap.sh")


def dsn(settings: LocalSettings) -> str:
    """The connection URL of the ``cormorant`` database, e.g. for psycopg."""
    return f"postgresql://{ROLE}@127.0.0.1:{settings.postgres_port}/{DATABASE}"


def _as_postgres(argv: list[str]) -> list[str]:
    """``argv`` run as the postgres user when this process is root, else unchanged."""
    if os.geteuid() != 0:
        return argv
    return [
        shutil.which("setpriv") or "/usr/bin/setpriv",
        f"--reuid={SUPERUSER}", f"--regid={SUPERUSER}", "--init-groups",
        "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search",
        "--", *argv,
    ]  # fmt: skip


def _init_cluster(settings: LocalSettings, data: Path) -> None:
    """Run initdb into ``data`` unless it already holds a cluster (PG_VERSION present)."""
    if (data / "PG_VERSION").exists():
        return
    data.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        user = pwd.getpwnam(SUPERUSER)
        os.chown(data, user.pw_uid, user.pw_gid)
    data.chmod(0o700)  # postgres refuses a data directory others can read
    log = processes.log_file(settings.state_dir, NAME)
    log.parent.mkdir(parents=True, exist_ok=True)
    argv = _as_postgres(
        [str(bin_dir() / "initdb"), "-D", str(data), "-U", SUPERUSER,
         "--auth=trust", "--encoding=UTF8", "--no-locale"]
    )  # fmt: skip
    with log.open("ab") as out:
        result = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=120)
    if result.returncode != 0:
        raise processes.StartError(NAME, log, f"initdb failed (exit {result.returncode})")


def _psql(settings: LocalSettings, sql: str) -> subprocess.CompletedProcess[str]:
    argv = [
        str(bin_dir() / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1",
        "-h", "127.0.0.1", "-p", str(settings.postgres_port), "-U", SUPERUSER,
        "-d", "postgres", "-f", "-",
    ]  # fmt: skip
    return subprocess.run(argv, input=sql, capture_output=True, text=True, timeout=30, check=False)


def _tls(settings: LocalSettings) -> bool:
    return settings.local_tls_cert_file is not None and settings.local_tls_key_file is not None


def _secure(settings: LocalSettings, data: Path) -> list[str]:
    """Set up TLS and client authentication from ``settings``; return postgres options.

    pg_hba.conf is rewritten on every start: the superuser (the launcher's psql) is trusted
    on loopback; the ``cormorant`` role is trusted too on a plain local cluster, and with
    ``local_tls_cert_file`` it must come over TLS (``hostssl``) and, when
    ``postgres_password`` is set, log in with it (SCRAM-SHA-256); any other role logs in
    with its password (SCRAM-SHA-256). The certificate and key
    are copied into the data directory, owned by the server's user with mode 0600, as
    PostgreSQL requires of its key.
    """
    method = "trust" if settings.postgres_password is None else "scram-sha-256"
    kind = "hostssl" if _tls(settings) else "host"
    hba = data / "pg_hba.conf"
    hba.write_text(
        f"host    all  {SUPERUSER}  127.0.0.1/32  trust\n"
        f"{kind}  all  {ROLE}  127.0.0.1/32  {method}\n"
        # Any other role (one cormorant migrate-db made) logs in with its password.
        f"{kind}  all  all  127.0.0.1/32  scram-sha-256\n",
        encoding="utf-8",
    )
    files = [hba]
    options = []
    if _tls(settings):
        assert settings.local_tls_cert_file is not None and settings.local_tls_key_file is not None
        for source, name in (
            (settings.local_tls_cert_file, "server.crt"),
            (settings.local_tls_key_file, "server.key"),
        ):
            target = data / name
            target.touch(mode=0o600)
            target.write_bytes(source.read_bytes())
            files.append(target)
        options = [
            "-c",
            "ssl=on",
            "-c",
            "ssl_cert_file=server.crt",
            "-c",
            "ssl_key_file=server.key",
        ]
    if os.geteuid() == 0:
        user = pwd.getpwnam(SUPERUSER)
        for path in files:
            os.chown(path, user.pw_uid, user.pw_gid)
    for path in files:
        path.chmod(0o600)
    return options


def _clear_dead_lock(data: Path) -> None:
    """Remove ``postmaster.pid`` if it names a postmaster that died and awaits reaping.

    After ``kill -9`` the postmaster stays a zombie until its parent reaps it; if the
    launcher that started it has exited, that parent is the system's init, which may take
    a while. PostgreSQL sees the zombie's pid alive and refuses to start ("lock file
    already exists"), although a zombie holds no file.
    """
    lock = data / "postmaster.pid"
    try:
        pid = int(lock.read_text(encoding="utf-8").split("\n", 1)[0])
        dead = psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except (OSError, ValueError, psutil.NoSuchProcess):
        return  # no lock, or PostgreSQL judges it itself
    if dead:
        lock.unlink(missing_ok=True)


def start(settings: LocalSettings) -> int:
    """Start PostgreSQL unless it runs (initdb on first use); ensure the cormorant database.

    Returns the postmaster's pid. Raises :class:`~services.local.processes.StartError`
    (quoting ``postgres.log``) if initdb fails, the server exits, its port is taken, it
    does not accept queries within ``START_TIMEOUT`` seconds, or the database cannot be
    created.
    """
    data = settings.state_dir / "postgres"
    _init_cluster(settings, data)
    _clear_dead_lock(data)
    argv = _as_postgres(
        [str(bin_dir() / "postgres"), "-D", str(data),
         "-c", "listen_addresses=127.0.0.1", "-c", f"port={settings.postgres_port}",
         "-c", "unix_socket_directories=", "-c", "logging_collector=off",
         *_secure(settings, data)]
    )  # fmt: skip
    pid = processes.ensure_started(
        settings.state_dir,
        NAME,
        argv,
        lambda: _psql(settings, "SELECT 1").returncode == 0,
        START_TIMEOUT,
        port=settings.postgres_port,
        stop_signal=STOP_SIGNAL,
    )
    sql = _CREATE_SQL
    if settings.postgres_password is not None:
        quoted = settings.postgres_password.get_secret_value().replace("'", "''")
        sql += f"ALTER ROLE {ROLE} PASSWORD '{quoted}';\n"  # over stdin, not the command line
    result = _psql(settings, sql)
    if result.returncode != 0:
        raise processes.StartError(
            NAME,
            processes.log_file(settings.state_dir, NAME),
            f"could not create the {DATABASE} database: {result.stderr.strip()}",
        )
    return pid
