"""A JSON Web Key Set served over HTTPS on 127.0.0.1 by a thread of the test (http.server
with ssl), counting the requests it answers: the issuer that JWKS URL credentials fetch from
in tests/integration/test_jwks.py and tests/e2e/test_auth.py.
"""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from tests.serving import serving

SigningKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey


@dataclass
class JwksServer:
    """The served key set (``keys``: public JWKs as dicts, replaceable) and the requests
    answered so far."""

    url: str
    keys: list[dict[str, Any]] = field(default_factory=list)
    requests: int = 0


@contextmanager
def serve_jwks(cert: Path, key: Path) -> Iterator[JwksServer]:
    """Serve a JWKS at ``https://127.0.0.1:<free port>/.well-known/jwks.json`` with the
    certificate ``cert`` (PEM, naming 127.0.0.1) and its ``key``, until the block ends."""
    served = JwksServer("")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            served.requests += 1
            body = json.dumps({"keys": served.keys}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: the requests are counted instead."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    with serving(server) as port:
        served.url = f"https://127.0.0.1:{port}/.well-known/jwks.json"
        yield served


def _algorithm(key: SigningKey) -> str:
    return "RS256" if isinstance(key, rsa.RSAPrivateKey) else "ES256"


def public_jwk(key: SigningKey, kid: str) -> dict[str, Any]:
    """The public half of ``key`` as a signing JWK named ``kid`` (RFC 7517 4)."""
    algorithm = jwt.get_algorithm_by_name(_algorithm(key))
    jwk: dict[str, Any] = json.loads(algorithm.to_jwk(key.public_key()))
    return {**jwk, "kid": kid, "use": "sig"}


def signed_token(key: SigningKey, kid: str, **claims: Any) -> bytes:
    """A token signed by ``key`` (RS256 or ES256) with ``kid`` in its header, valid 60 s."""
    body = {"exp": int(time.time()) + 60, **claims}
    return jwt.encode(body, key, _algorithm(key), headers={"kid": kid}).encode()
