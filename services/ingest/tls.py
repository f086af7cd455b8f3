"""TLS of the ingest listeners (mqtts, wss): the server context, its reload, the client's
certificate.

:class:`TlsContexts` builds the node's server ``ssl.SSLContext`` from the settings: TLS 1.2
or newer, the server certificate chain and key (files, or the PEM text itself as ECS hands
secrets over), and for mutual TLS the client CA bundle and whether a client certificate is
optional or required. :meth:`TlsContexts.reload` (on SIGHUP) builds a new one from the same
settings; each new connection takes the current context, so open connections keep theirs
and nothing is dropped. A reload that fails (a missing file, a key that does not match)
keeps the old context and says why.

:func:`client_certificate` turns the certificate the handshake verified into the
connection's :class:`~services.common.auth.certificates.CertificateIdentity`, which X509
credentials match.
"""

from __future__ import annotations

import logging
import os
import ssl
import tempfile
from pathlib import Path

from cryptography import x509

from services.common.auth.certificates import CertificateIdentity
from services.common.metrics import MQTT
from services.common.settings import Settings

log = logging.getLogger(__name__)

_VERIFY_MODES = {
    "none": ssl.CERT_NONE,
    "optional": ssl.CERT_OPTIONAL,
    "required": ssl.CERT_REQUIRED,
}


def server_context(settings: Settings) -> ssl.SSLContext:
    """A new server context from ``settings`` (TLS 1.2+, certificate, client verification).

    Raises ``OSError`` for an unreadable file and ``ssl.SSLError`` for a certificate or key
    that does not load (or do not match).
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # Renegotiation lets a client make the server redo handshakes at will: no use to MQTT.
    context.options |= ssl.OP_NO_RENEGOTIATION
    _load_chain(context, settings)
    context.verify_mode = _VERIFY_MODES[settings.tls_client_auth]
    if settings.tls_client_auth != "none":
        if settings.tls_client_ca_file is not None:
            context.load_verify_locations(cafile=str(settings.tls_client_ca_file))
        elif settings.tls_client_ca_pem is not None:
            context.load_verify_locations(cadata=settings.tls_client_ca_pem)
    return context


def _load_chain(context: ssl.SSLContext, settings: Settings) -> None:
    """The certificate chain and key, from their files or from the PEM text itself.

    ``load_cert_chain`` reads files only: PEM text is written to a directory only this
    process may read, loaded, and removed at once.
    """
    if settings.tls_cert_file is not None and settings.tls_key_file is not None:
        context.load_cert_chain(str(settings.tls_cert_file), str(settings.tls_key_file))
        return
    if settings.tls_cert_pem is None or settings.tls_key_pem is None:
        raise ValueError("no TLS certificate: set tls_cert_file and tls_key_file")
    with tempfile.TemporaryDirectory(prefix="cormorant-tls-") as directory:
        cert, key = Path(directory) / "cert.pem", Path(directory) / "key.pem"
        cert.write_text(settings.tls_cert_pem, encoding="ascii")
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as out:
            out.write(settings.tls_key_pem.get_secret_value())
        context.load_cert_chain(str(cert), str(key))


def certificate_not_after(settings: Settings) -> float:
    """When the server certificate (the first of the chain: the leaf) stops being valid, its
    notAfter as Unix seconds, from ``tls_cert_file`` or ``tls_cert_pem``. Raises ``OSError``
    for an unreadable file, ``ValueError`` for text that is no PEM certificate."""
    if settings.tls_cert_file is not None:
        pem = settings.tls_cert_file.read_bytes()
    elif settings.tls_cert_pem is not None:
        pem = settings.tls_cert_pem.encode("ascii")
    else:
        raise ValueError("no TLS certificate: set tls_cert_file and tls_key_file")
    return x509.load_pem_x509_certificate(pem).not_valid_after_utc.timestamp()


class TlsContexts:
    """The node's current TLS server context (:attr:`current`), rebuilt by :meth:`reload`;
    the certificate's notAfter is served as
    ``cormorant_tls_certificate_expiry_timestamp_seconds`` (``MQTT.certificate_not_after``)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self.current = server_context(settings)
        MQTT.certificate_not_after = certificate_not_after(settings)

    def reload(self) -> bool:
        """Build the context again from the settings' files; True if it replaced the
        current one, False (logged, the current one kept) if it could not be built."""
        try:
            context = server_context(self._settings)
            not_after = certificate_not_after(self._settings)
        except (OSError, ssl.SSLError, ValueError) as exc:
            log.error("TLS certificate not reloaded, the previous one stays: %s", exc)
            return False
        self.current = context
        MQTT.certificate_not_after = not_after
        log.info("TLS certificate reloaded: new connections get %s", self._settings.tls_cert_file)
        return True


def client_certificate(
    ssl_object: ssl.SSLObject | ssl.SSLSocket | None,
) -> CertificateIdentity | None:
    """The verified client certificate of a TLS connection, or None when the client sent
    none (or the listener does not ask for one: an unverified certificate is not reported)."""
    if ssl_object is None:
        return None
    parsed = ssl_object.getpeercert()
    der = ssl_object.getpeercert(binary_form=True)
    if not parsed or der is None:
        return None
    return CertificateIdentity.from_peer_certificate(parsed, der)
