"""A webhook endpoint served on 127.0.0.1 by a thread of the test (http.server), for the
webhook tests of tests/e2e/test_integrations.py. It checks each request's signature (the
receiver of docs/integrations/webhook.md) and answers as :attr:`WebhookServer.answer`
decides for that request: ``"ok"`` (200, the request is accepted), ``"fail"`` (500) or
``"hang"`` (no answer for :data:`HANG_SECONDS`, past the webhook's timeout)."""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

from tests.serving import serving

HANG_SECONDS = 4.0

SECRET = "a-webhook-secret-of-at-least-32-characters"

Answer = Literal["ok", "fail", "hang"]


@dataclass(frozen=True)
class Request:
    """One request as received: its body, headers (names in lowercase) and what it was
    answered."""

    body: bytes
    headers: dict[str, str]
    answer: Answer


@dataclass
class WebhookServer:
    """The endpoint's ``url``, how it answers the n-th request (from 1) with body ``body``
    (``answer(n, body)``), every request received in order, and how many had a signature
    that did not verify (those are answered 401 and not accepted)."""

    url: str
    answer: Callable[[int, bytes], Answer] = lambda n, body: "ok"
    received: list[Request] = field(default_factory=list)
    bad_signatures: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def accepted(self) -> list[Request]:
        """The requests answered 200, in the order received."""
        with self._lock:
            return [request for request in self.received if request.answer == "ok"]

    def answered(self, answer: Answer) -> int:
        """How many requests were answered ``answer``."""
        with self._lock:
            return sum(1 for request in self.received if request.answer == answer)


def verified(headers: dict[str, str], body: bytes) -> bool:
    """Whether ``X-Cormorant-Signature`` is the HMAC-SHA-256 under :data:`SECRET` of
    ``<X-Cormorant-Timestamp>.<body>``, the timestamp within five minutes of now
    (``headers``: names in lowercase)."""
    stamp = headers.get("x-cormorant-timestamp", "")
    if not stamp.isdigit() or abs(time.time() - int(stamp)) > 300:
        return False
    expected = hmac.new(SECRET.encode(), f"{stamp}.".encode() + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(headers.get("x-cormorant-signature", ""), f"sha256={expected}")


@contextmanager
def serve_webhook() -> Iterator[WebhookServer]:
    """Serve the endpoint at ``http://127.0.0.1:<free port>/hook`` until the block ends."""
    served = WebhookServer("")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            headers = {name.lower(): value for name, value in self.headers.items()}
            with served._lock:
                valid = verified(headers, body)
                if not valid:
                    served.bad_signatures += 1
                    answer: Answer = "fail"
                else:
                    answer = served.answer(len(served.received) + 1, body)
                    served.received.append(Request(body, headers, answer))
            if answer == "hang":
                time.sleep(HANG_SECONDS)
            status = {"ok": 200, "fail": 500, "hang": 504}[answer] if valid else 401
            try:
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()
            except OSError:
                pass  # the webhook gave up waiting (a hang)

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: the requests are recorded instead."""

    with serving(ThreadingHTTPServer(("127.0.0.1", 0), Handler)) as port:
        served.url = f"http://127.0.0.1:{port}/hook"
        yield served
