"""TLS of the ingest listeners: the server context from the settings, its reload, and the
verified client certificate a connection reports, over real TLS handshakes in memory."""

from __future__ import annotations

import hashlib
import ssl
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from services.common.auth.certificates import CertificateIdentity
from services.common.settings import Settings
from services.ingest.tls import TlsContexts, client_certificate, server_context
from services.local import certificates
from tests.pki import Pki, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _settings(pki: Pki, **more: object) -> Settings:
    return Settings.model_validate({"tls_cert_file": pki.cert, "tls_key_file": pki.key, **more})


def _handshake(
    server: ssl.SSLContext, ca: Path, cert: certificates.Issued | None = None
) -> ssl.SSLObject:
    """A TLS handshake between ``server`` and a client trusting ``ca`` (with ``cert``);
    returns the server's side. Raises ``ssl.SSLError`` as the server's handshake does."""
    client_ctx = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        client_ctx.load_cert_chain(str(cert.cert), str(cert.key))
    bios = [ssl.MemoryBIO() for _ in range(4)]
    client = client_ctx.wrap_bio(bios[0], bios[1], server_hostname="localhost")
    srv = server.wrap_bio(bios[2], bios[3], server_side=True)
    done = {"client": False, "server": False}
    for _ in range(10):
        for name, side in (("client", client), ("server", srv)):
            if not done[name]:
                try:
                    side.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        bios[2].write(bios[1].read())  # client → server
        bios[0].write(bios[3].read())  # server → client
        if all(done.values()):
            # TLS 1.3: the server checks the client's certificate on the client's Finished.
            srv.write(b"x")
            bios[0].write(bios[3].read())
            return srv
    raise AssertionError("handshake did not finish")


def test_a_verified_client_certificate_is_reported(pki: Pki, tmp_path: Path) -> None:
    ca = certificates.Issued(pki.ca, pki.ca.with_name("ca.key"))
    device = certificates.issue(
        ca, tmp_path / "d.pem", tmp_path / "d.key", "device-17",
        client_names=("device-17.fleet.example", "ops@example.com", "10.0.0.7"),
    )  # fmt: skip
    context = server_context(_settings(pki, tls_client_auth="required", tls_client_ca_file=pki.ca))
    identity = client_certificate(_handshake(context, pki.ca, device))
    der = ssl.PEM_cert_to_DER_cert(device.cert.read_text())
    assert identity == CertificateIdentity(
        common_name="device-17",
        subject_alt_names=(
            ("dns", "device-17.fleet.example"),
            ("email", "ops@example.com"),
            ("ip", "10.0.0.7"),
        ),
        fingerprint=hashlib.sha256(der).hexdigest(),
        subject="CN=device-17,O=Cormorant local cluster",
    )


def test_no_certificate_no_identity(pki: Pki) -> None:
    optional = server_context(_settings(pki, tls_client_auth="optional", tls_client_ca_file=pki.ca))
    assert client_certificate(_handshake(optional, pki.ca)) is None
    assert client_certificate(_handshake(server_context(_settings(pki)), pki.ca)) is None
    assert client_certificate(None) is None


def test_a_certificate_of_another_ca_fails_the_handshake(pki: Pki, tmp_path: Path) -> None:
    other = certificates.make_ca(tmp_path / "other", "Other CA")
    stranger = certificates.issue(other, tmp_path / "s.pem", tmp_path / "s.key", "stranger")
    context = server_context(_settings(pki, tls_client_auth="optional", tls_client_ca_file=pki.ca))
    with pytest.raises(ssl.SSLError):
        _handshake(context, pki.ca, stranger)


def test_a_required_certificate_must_be_sent(pki: Pki) -> None:
    context = server_context(_settings(pki, tls_client_auth="required", tls_client_ca_file=pki.ca))
    with pytest.raises(ssl.SSLError):
        _handshake(context, pki.ca)


def test_pem_text_serves_like_files(pki: Pki) -> None:
    settings = Settings.model_validate(
        {
            "tls_cert_pem": pki.cert.read_text(),
            "tls_key_pem": SecretStr(pki.key.read_text()),
            "tls_client_auth": "optional",
            "tls_client_ca_pem": pki.ca.read_text(),
        }
    )
    assert _handshake(server_context(settings), pki.ca).version() in ("TLSv1.2", "TLSv1.3")


def test_tls_1_1_is_refused(pki: Pki) -> None:
    context = server_context(_settings(pki))
    assert context.minimum_version is ssl.TLSVersion.TLSv1_2


def test_reload_takes_the_new_files_and_keeps_the_old_context_on_failure(
    pki: Pki, tmp_path: Path
) -> None:
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"
    cert.write_bytes(pki.cert.read_bytes())
    key.write_bytes(pki.key.read_bytes())
    contexts = TlsContexts(Settings.model_validate({"tls_cert_file": cert, "tls_key_file": key}))
    first = contexts.current
    other = make_pki(tmp_path / "new", ca_name="Renewed CA")
    cert.write_bytes(other.cert.read_bytes())
    key.write_bytes(other.key.read_bytes())
    assert contexts.reload()
    assert contexts.current is not first
    _handshake(contexts.current, other.ca)  # the new certificate is served
    renewed = contexts.current
    key.write_text("not a key")
    assert not contexts.reload()
    assert contexts.current is renewed


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"listeners": [{"kind": "mqtts", "port": 8883}]}, "needs tls_cert_file"),
        ({"tls_cert_file": "a.pem"}, "go together"),
        ({"tls_cert_file": "a", "tls_key_file": "b", "tls_cert_pem": "x"}, "not both"),
        ({"tls_client_auth": "required"}, "needs tls_client_ca_file"),
        ({"mqtt_port": 1883, "listeners": [{"kind": "ws", "port": 1883}]}, "port 1883"),
        ({"listeners": [{"kind": "quic", "port": 1}]}, "kind"),
    ],
)
def test_contradicting_listener_settings_are_refused(
    values: dict[str, object], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        Settings.model_validate(values)
