"""The container health check (``python -m services.common.probe``), run as the image runs it
(``sh -c``, settings from ``CORMORANT_*``) against a real HTTP server on loopback."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.serving import serving

ROOT = Path(__file__).resolve().parents[2]

ANSWERS = {"/health": 200, "/ready": 503}
"""What the stand-in service says: alive, not ready (Kafka unreachable, say)."""


class Service(BaseHTTPRequestHandler):
    """Answers GETs as :data:`ANSWERS` says (404 for the rest)."""

    def do_GET(self) -> None:
        self.send_response(ANSWERS.get(self.path, 404))
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    """The port of the stand-in service."""
    with serving(ThreadingHTTPServer(("127.0.0.1", 0), Service)) as port:
        yield port


@contextlib.contextmanager
def socket_free() -> Iterator[int]:
    """A loopback port nothing listens on while the block runs (bound, not listening)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def health_check(command: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``sh -c <command>`` as Docker and ECS run a health check, with ``python`` this one."""
    environment = {
        key: value for key, value in os.environ.items() if not key.startswith("CORMORANT_")
    }
    environment |= {"CORMORANT_SETTINGS_FILE": "/dev/null", "PYTHONPATH": str(ROOT), **env}
    return subprocess.run(
        ["sh", "-c", command.replace("python ", f"{sys.executable} ", 1)],
        env=environment,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_service_that_answers_is_healthy(port: int) -> None:
    result = health_check("python -m services.common.probe /health", CORMORANT_HTTP_PORT=str(port))
    assert result.returncode == 0, result.stderr


def test_a_refusal_or_silence_is_unhealthy(port: int) -> None:
    result = health_check("python -m services.common.probe /ready", CORMORANT_HTTP_PORT=str(port))
    assert result.returncode == 1
    assert result.stderr.strip() == f"http://127.0.0.1:{port}/ready did not answer 200"
    # Nothing listens on the admin port asked for.
    with socket_free() as free:
        result = health_check(
            "python -m services.common.probe --admin /health", CORMORANT_ADMIN_PORT=str(free)
        )
    assert result.returncode == 1
    assert f"http://127.0.0.1:{free}/health did not answer 200" in result.stderr


def test_the_admin_probe_asks_the_admin_port(port: int) -> None:
    result = health_check(
        "python -m services.common.probe --admin /health",
        CORMORANT_ADMIN_PORT=str(port),
        CORMORANT_HTTP_PORT="1",
    )
    assert result.returncode == 0, result.stderr
