"""Detached processes of the local cluster: start, identify, probe, wait for, and stop them.

Every process is known by a short name (``kafka``, ``ingest-node1``...). Its pid file is
``<state_dir>/run/<name>.pid`` and its output goes to ``<state_dir>/logs/<name>.log``, so a
later ``cormorant status`` or ``down`` (another Python process) finds it again. The pid file
also records the process's start time: a recycled pid is never mistaken for our process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import psutil

#: Seconds between two probes of a condition while waiting on it.
POLL_INTERVAL = 0.2

#: Lines of a log file quoted in a start error.
TAIL_LINES = 40


class StartError(RuntimeError):
    """A process did not become ready: the message names its log file and quotes its tail."""

    def __init__(self, name: str, log: Path, reason: str) -> None:
        self.name = name
        self.log = log
        super().__init__(f"{name} {reason}; log {log}, last lines:\n{tail(log)}")


def run_dir(state_dir: Path) -> Path:
    """The directory of pid and ready files: ``<state_dir>/run``."""
    return state_dir / "run"


def ready_file(state_dir: Path, name: str) -> Path:
    """The ready file of service ``name``: ``<state_dir>/run/<name>.ready``."""
    return run_dir(state_dir) / f"{name}.ready"


def log_dir(state_dir: Path) -> Path:
    """The directory of log files: ``<state_dir>/logs``."""
    return state_dir / "logs"


def pid_file(state_dir: Path, name: str) -> Path:
    """The pid file of process ``name``."""
    return run_dir(state_dir) / f"{name}.pid"


def log_file(state_dir: Path, name: str) -> Path:
    """The log file (stdout and stderr) of process ``name``."""
    return log_dir(state_dir) / f"{name}.log"


def tail(path: Path, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of the text file ``path`` ("" if it does not exist)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            # Reading the last 64 KiB is enough for TAIL_LINES lines of any sane log.
            f.seek(max(0, f.tell() - 65536))
            data = f.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def spawn(
    state_dir: Path,
    name: str,
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
) -> int:
    """Start ``argv`` detached (own session, stdin from /dev/null) and record its pid file.

    ``argv[0]`` is a path (PATH is not searched). Output is appended to the process's log
    file. ``env`` replaces the environment when given. Returns the pid. Raises ``OSError``
    if the program cannot be executed.
    """
    run_dir(state_dir).mkdir(parents=True, exist_ok=True)
    log = log_file(state_dir, name)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        out.write(f"=== {stamp} cormorant starts: {' '.join(argv)}\n".encode())
        out.flush()
        devnull = os.open(os.devnull, os.O_RDONLY)
        try:
            # posix_spawn rather than subprocess.Popen: the process outlives this one, and
            # no Popen object is left behind to warn about a child that is still running.
            pid = os.posix_spawn(
                argv[0],
                list(argv),
                dict(os.environ if env is None else env),
                file_actions=[
                    (os.POSIX_SPAWN_DUP2, devnull, 0),
                    (os.POSIX_SPAWN_DUP2, out.fileno(), 1),
                    (os.POSIX_SPAWN_DUP2, out.fileno(), 2),
                ],
                setsid=True,
            )
        finally:
            os.close(devnull)
    created = psutil.Process(pid).create_time()
    pid_file(state_dir, name).write_text(f"{pid} {created}\n", encoding="utf-8")
    return pid


def _reap(pid: int) -> None:
    # A process we spawned ourselves (tests, ``up`` failing over) stays a zombie until waited.
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _exited(proc: psutil.Process) -> bool:
    """Whether ``proc`` has exited: gone, or a zombie none of whose threads still runs."""
    _reap(proc.pid)
    try:
        if proc.status() != psutil.STATUS_ZOMBIE:
            return False
    except psutil.NoSuchProcess:
        return True
    # A multi-threaded process whose main thread ended shows as a zombie while its other
    # threads still run and hold its sockets (HAProxy, a JVM): it has exited only when
    # the zombie main thread is all that is left.
    try:
        return len(os.listdir(f"/proc/{proc.pid}/task")) <= 1
    except FileNotFoundError:
        return True


def find(state_dir: Path, name: str) -> psutil.Process | None:
    """The running process ``name`` recorded in its pid file, or None if it is not running."""
    try:
        pid_text, created_text = pid_file(state_dir, name).read_text(encoding="utf-8").split()
        pid, created = int(pid_text), float(created_text)
    except (FileNotFoundError, ValueError):
        return None
    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - created) > 0.01:
            return None  # the pid was recycled by an unrelated process
    except psutil.NoSuchProcess:
        return None
    return None if _exited(proc) else proc


def recorded_names(state_dir: Path) -> list[str]:
    """Names of every process that has a pid file in ``state_dir`` (sorted)."""
    return sorted(p.stem for p in run_dir(state_dir).glob("*.pid"))


def port_open(port: int, host: str = "127.0.0.1", timeout: float = 0.5) -> bool:
    """Whether a TCP connection to ``host:port`` is accepted within ``timeout`` seconds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` until it returns True; ``timeout`` in seconds.

    Raises ``TimeoutError`` mentioning ``what`` when the deadline passes first.
    """
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} not reached within {timeout:.0f}s")
        time.sleep(POLL_INTERVAL)


def wait_ready(state_dir: Path, name: str, ready: Callable[[], bool], timeout: float) -> None:
    """Wait until ``ready()`` holds while process ``name`` stays alive; ``timeout`` in seconds.

    Raises :class:`StartError` (quoting the log) if the process exits or the deadline passes.
    """
    log = log_file(state_dir, name)

    def alive_and_ready() -> bool:
        if find(state_dir, name) is None:
            raise StartError(name, log, "exited while starting")
        return ready()

    try:
        wait_until(alive_and_ready, timeout, f"{name} readiness")
    except TimeoutError as exc:
        raise StartError(name, log, f"was not ready within {timeout:.0f}s") from exc


def stop(
    state_dir: Path,
    name: str,
    sig: signal.Signals = signal.SIGTERM,
    timeout: float = 30.0,
) -> bool:
    """Stop process ``name``: send ``sig``, wait up to ``timeout`` seconds, then SIGKILL.

    The SIGKILL goes to the whole process group, so helpers the process started go too.
    Removes the pid file. Returns True if a running process was stopped.
    """
    proc = find(state_dir, name)
    if proc is None:
        pid_file(state_dir, name).unlink(missing_ok=True)
        return False
    try:
        proc.send_signal(sig)
    except psutil.NoSuchProcess:
        pid_file(state_dir, name).unlink(missing_ok=True)
        return True

    try:
        wait_until(lambda: _exited(proc), timeout, f"{name} exit")
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        wait_until(lambda: _exited(proc), 10.0, f"{name} exit after SIGKILL")
    pid_file(state_dir, name).unlink(missing_ok=True)
    return True


def ensure_started(
    state_dir: Path,
    name: str,
    argv: Sequence[str],
    ready: Callable[[], bool],
    timeout: float,
    *,
    port: int | None = None,
    env: Mapping[str, str] | None = None,
    stop_signal: signal.Signals = signal.SIGTERM,
) -> int:
    """Make sure process ``name`` runs and is ready; return its pid.

    A running process is left alone (only its readiness is awaited); otherwise ``argv`` is
    spawned and ``ready()`` awaited for up to ``timeout`` seconds. Raises
    :class:`StartError` if ``port`` is already taken by another program, or if the process
    exits or is not ready in time (a process spawned here is then stopped with
    ``stop_signal``).
    """
    proc = find(state_dir, name)
    if proc is None:
        if port is not None and port_open(port):
            raise StartError(
                name, log_file(state_dir, name), f"cannot start: port {port} is already in use"
            )
        pid = spawn(state_dir, name, argv, env)
    else:
        pid = proc.pid
    try:
        wait_ready(state_dir, name, ready, timeout)
    except StartError:
        if proc is None:  # only a process started here is taken down again
            stop(state_dir, name, stop_signal)
        raise
    return pid
