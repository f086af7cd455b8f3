"""The one start and stop of the HTTP servers the tests run on a thread of their own
(http.server): the webhook endpoint (tests/webhook_server.py), the JWKS issuer
(tests/jwks_server.py), the HTTP authentication provider (tests/auth_server.py) and the
smaller ones of single tests."""

from __future__ import annotations

import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def serving(server: socketserver.TCPServer) -> Iterator[int]:
    """Serve ``server`` (bound already; its socket wrapped for TLS first when it serves
    HTTPS) from a daemon thread until the block ends; yields its port. Then it takes no
    new request, its listening socket is closed and the serving thread is joined. A
    handler still running on a thread of its own (an endpoint that hangs on purpose) is
    left to end by itself: a ``ThreadingHTTPServer``'s handler threads are daemons."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
