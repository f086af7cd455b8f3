"""The local cluster's certificate authority and the certificates it signs (``cryptography``).

On its first start ``cormorant up`` makes, under ``<state_dir>/tls/``, a self-signed CA, a
server certificate for ``localhost``, ``127.0.0.1`` and ``::1`` (the ingest nodes' TLS and
WSS listeners, reached through HAProxy), and one client certificate (CN
``cormorant-client``) for trying mutual TLS; later starts reuse them. Clients trust the CA
with ``--cafile <state_dir>/tls/ca.pem``. Keys are EC P-256, written readable by their
owner only (0600). Delete the directory to get new ones at the next ``cormorant up``.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650
"""Validity of the local CA (days)."""

LEAF_DAYS = 825
"""Validity of the certificates it signs (days)."""

SERVER_NAMES = ("localhost", "127.0.0.1", "::1")
"""What the local server certificate is valid for (subjectAltName)."""

CLIENT_NAME = "cormorant-client"
"""Common name of the local client certificate."""


@dataclass(frozen=True)
class Issued:
    """A certificate (PEM) and its private key (PEM, unencrypted) on disk."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class LocalPki:
    """The local cluster's CA certificate and the server and client certificates it signed."""

    ca: Issued
    server: Issued
    client: Issued


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Cormorant local cluster"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    """Write ``key`` as unencrypted PKCS#8 PEM, readable by its owner only."""
    data = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _san(name: str) -> x509.GeneralName:
    if "@" in name:
        return x509.RFC822Name(name)
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def make_ca(directory: Path, common_name: str, days: int = CA_DAYS) -> Issued:
    """Write a new self-signed CA (``ca.pem``, ``ca.key``) into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(common_name)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    issued = Issued(directory / "ca.pem", directory / "ca.key")
    _write_cert(issued.cert, cert)
    _write_key(issued.key, key)
    return issued


def issue(
    ca: Issued,
    cert_path: Path,
    key_path: Path,
    common_name: str,
    *,
    server_names: tuple[str, ...] = (),
    client_names: tuple[str, ...] = (),
    days: int = LEAF_DAYS,
) -> Issued:
    """Write a certificate for ``common_name`` signed by ``ca``, valid ``days`` days: a
    server certificate for ``server_names`` when given, else a client certificate naming
    ``client_names`` (its Subject Alternative Names, which X509 credentials may match).
    Names are DNS names, IP addresses or e-mail addresses (with ``@``). Raises
    ``ValueError`` if ``ca``'s files are not a certificate and its key."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{ca.key} is not an EC private key")
    now = datetime.datetime.now(datetime.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server_names else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    names = server_names or client_names
    if names:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([_san(name) for name in names]), critical=False
        )
    cert = builder.sign(ca_key, hashes.SHA256())
    _write_cert(cert_path, cert)
    _write_key(key_path, key)
    return Issued(cert_path, key_path)


_PKI_LOCK = threading.Lock()
"""Held while the PKI is checked and made: the launcher starts the ingest nodes side by side
on threads, and each asks for it (one thread read the CA's key while another was still
writing it: the production layout's fixture failed on a missing ``ca.key``)."""


def ensure_local_pki(directory: Path) -> LocalPki:
    """The local cluster's CA, server and client certificates in ``directory``: made on
    the first call, read from disk afterwards (the CA is made again only if it is missing,
    and then so are the certificates it signs). Safe to call from several threads."""
    with _PKI_LOCK:
        return _ensure_local_pki(directory)


def _ensure_local_pki(directory: Path) -> LocalPki:
    ca = Issued(directory / "ca.pem", directory / "ca.key")
    server = Issued(directory / "server.pem", directory / "server.key")
    client = Issued(directory / "client.pem", directory / "client.key")
    fresh = not (ca.cert.exists() and ca.key.exists())
    if fresh:
        ca = make_ca(directory, "Cormorant local CA")
    if fresh or not (server.cert.exists() and server.key.exists()):
        server = issue(ca, server.cert, server.key, "localhost", server_names=SERVER_NAMES)
    if fresh or not (client.cert.exists() and client.key.exists()):
        client = issue(ca, client.cert, client.key, CLIENT_NAME)
    return LocalPki(ca, server, client)
