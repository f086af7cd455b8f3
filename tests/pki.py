"""A throwaway certificate authority and server certificate for the TLS tests.

Made with the local cluster's own certificate code (:mod:`services.local.certificates`);
the server certificate names ``127.0.0.1`` and ``localhost``, so clients verify host names
as they do against MSK, ElastiCache, RDS and the ingest nodes' TLS listeners.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from services.local import certificates

#: Days the test certificates are valid: long enough for any test session.
DAYS = 2


@dataclass(frozen=True)
class Pki:
    """PEM files: the CA certificate, the server's certificate and its unencrypted key."""

    ca: Path
    cert: Path
    key: Path


def make_pki(directory: Path, ca_name: str = "Cormorant test CA") -> Pki:
    """Write a new CA and a server certificate it signed into ``directory``; return them."""
    ca = certificates.make_ca(directory, ca_name, days=DAYS)
    server = certificates.issue(
        ca,
        directory / "server.pem",
        directory / "server.key",
        "localhost",
        server_names=("localhost", "127.0.0.1"),
        days=DAYS,
    )
    return Pki(ca.cert, server.cert, server.key)


def issue_client(
    directory: Path, common_name: str, alt_names: tuple[str, ...] = ()
) -> certificates.Issued:
    """A client certificate for ``common_name`` (and ``alt_names`` as its Subject
    Alternative Names) signed by the CA in ``directory`` (:func:`make_pki`'s, or the local
    cluster's ``<state_dir>/tls``)."""
    ca = certificates.Issued(directory / "ca.pem", directory / "ca.key")
    return certificates.issue(
        ca,
        directory / f"{common_name}.pem",
        directory / f"{common_name}.key",
        common_name,
        client_names=alt_names,
        days=DAYS,
    )
