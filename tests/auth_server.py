"""An HTTP authentication provider served on 127.0.0.1 by a thread of the test (http.server):
the endpoint that ``auth_http_url`` names in tests/integration/test_http_auth_provider.py and
tests/e2e/test_http_auth.py. It checks each request's signature and answers by the User
Name's prefix:

- ``allow-...``: allow, as a DEVICE with :attr:`AuthServer.rules`;
- ``app-...``: allow, as an APPLICATION with the same rules;
- ``deny-...``: deny;
- ``garbage-...``: a 200 whose body is not the answer's schema;
- ``hang-...``: no answer for :data:`HANG_SECONDS` (past any timeout of the tests);
- anything else, or a request whose signature does not verify: 401.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.serving import serving

HANG_SECONDS = 5.0

SECRET = "a-test-secret-of-at-least-32-characters"


@dataclass
class AuthServer:
    """The endpoint's ``url``, the ``rules`` an allow carries, the JSON bodies it received
    (in order) and how many of its requests had a signature that did not verify."""

    url: str
    rules: list[str] = field(default_factory=lambda: ["allow all #"])
    received: list[dict[str, Any]] = field(default_factory=list)
    bad_signatures: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: Callable[[], None] | None = None

    def stop(self) -> None:
        """Stop serving now (the endpoint is down: connections to its port are refused)."""
        if self._stop is not None:
            self._stop()
            self._stop = None

    def count(self, username: str) -> int:
        """Requests received for ``username``."""
        with self._lock:
            return sum(1 for body in self.received if body.get("username") == username)


def _answer(server: AuthServer, body: dict[str, Any]) -> tuple[int, bytes]:
    username = str(body.get("username") or "")
    if username.startswith(("allow-", "app-")):
        kind = "APPLICATION" if username.startswith("app-") else "DEVICE"
        return 200, json.dumps({"result": "allow", "kind": kind, "rules": server.rules}).encode()
    if username.startswith("deny-"):
        return 200, b'{"result": "deny"}'
    if username.startswith("garbage-"):
        return 200, b'{"result": "maybe", "rules": 7}'
    if username.startswith("hang-"):
        time.sleep(HANG_SECONDS)
    return 401, b""


@contextmanager
def serve_auth(tls: tuple[Path, Path] | None = None) -> Iterator[AuthServer]:
    """Serve the provider at ``http://127.0.0.1:<free port>/auth`` until the block ends;
    with ``tls`` (a PEM certificate naming 127.0.0.1 and its key), at ``https://...``."""
    served = AuthServer("")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            timestamp = self.headers.get("X-Cormorant-Timestamp", "")
            expected = hmac.new(
                SECRET.encode(), timestamp.encode() + b"." + raw, hashlib.sha256
            ).hexdigest()
            given = self.headers.get("X-Cormorant-Signature", "")
            body = json.loads(raw)
            with served._lock:
                served.received.append(body)
                valid = hmac.compare_digest(given, f"sha256={expected}")
                if not valid:
                    served.bad_signatures += 1
            status, answer = _answer(served, body) if valid else (401, b"")
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)
            except OSError:
                pass  # the broker gave up waiting (a hang)

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: the requests are recorded instead."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    scheme = "http"
    if tls is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(*tls)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        scheme = "https"
    with ExitStack() as stack:
        port = stack.enter_context(serving(server))
        served.url = f"{scheme}://127.0.0.1:{port}/auth"
        served._stop = stack.close
        yield served
