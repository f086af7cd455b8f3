"""The checks of each credential type, without a network: argon2id passwords, SCRAM against
an independent client (scramp), JWTs made with PyJWT, and the X509 lookup over identities of
real certificates (tests/pki.py)."""

from __future__ import annotations

import base64
import dataclasses
import hmac
import ssl
import time
import uuid
from pathlib import Path

import jwt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from scramp import ScramClient

from services.common.auth.authorize import parse_rules
from services.common.auth.certificates import (
    CertificateIdentity,
    CertificateMatch,
    match_certificate,
    parse_san_pattern,
)
from services.common.auth.credentials import (
    Credential,
    CredentialError,
    CredentialType,
    check_credential,
    public_view,
)
from services.common.auth.jwt_auth import (
    JwtSettings,
    NotThisIssuer,
    TokenError,
    check_settings,
    looks_like_token,
    verify_token,
)
from services.common.auth.passwords import (
    PasswordScheme,
    generate_secret,
    hash_password,
    hash_secret,
    scheme_of,
    verify,
    verify_against_dummy,
    verify_password,
)
from services.common.auth.scram import (
    ITERATIONS,
    MECHANISMS,
    ScramError,
    ScramExchange,
    derive_secret,
    unknown_user_secret,
)
from tests.pki import make_pki

# ---------------------------------------------------------------------- passwords


def test_a_password_is_stored_as_an_argon2id_hash_only() -> None:
    password = bytes(range(256))  # an MQTT password is any bytes
    encoded = hash_password(password)
    assert encoded.startswith("$argon2id$v=19$m=19456,t=2,p=1$")
    assert password not in encoded.encode("latin-1")
    assert verify_password(encoded, password)
    assert not verify_password(encoded, password[:-1])
    assert not verify_password("not a hash", password)  # logged, never raised
    assert not verify_against_dummy(password)


def test_a_generated_secret_is_256_random_bits_kept_as_a_salted_hmac_sha256() -> None:
    secret = generate_secret()
    assert len(base64.urlsafe_b64decode(secret + "=")) == 32 and secret != generate_secret()
    encoded = hash_secret(secret.encode())
    assert scheme_of(encoded) is PasswordScheme.HMAC_SHA256
    assert scheme_of(hash_password(b"x" * 12)) is PasswordScheme.ARGON2ID
    assert scheme_of("$2b$12$bcrypt") is None and scheme_of("plain") is None
    _, name, salt, digest = encoded.split("$")
    assert name == "hmac-sha256" and secret not in encoded
    # an independent computation: HMAC-SHA-256 keyed by the 16-byte salt
    raw_salt = base64.b64decode(salt + "==")
    assert len(raw_salt) == 16
    assert base64.b64decode(digest + "=") == hmac.new(raw_salt, secret.encode(), "sha256").digest()
    assert hash_secret(secret.encode()) != encoded  # a new salt each time
    assert verify(encoded, secret.encode())
    assert not verify(encoded, secret[:-1].encode())
    assert not verify(encoded, b"")
    assert not verify("$hmac-sha256$!!$??", secret.encode())  # logged, never raised
    assert verify(hash_password(b"chosen-password"), b"chosen-password")  # argon2id too


def test_an_mqtt_basic_credential_says_its_scheme_and_refuses_an_unknown_one() -> None:
    made = Credential(uuid.uuid4(), "dev", CredentialType.MQTT_BASIC, username="dev",
                      password_hash=hash_secret(b"s"))  # fmt: skip
    check_credential(made)
    assert made.password_scheme is PasswordScheme.HMAC_SHA256
    assert public_view(made)["password_scheme"] == "hmac-sha256"
    assert "hmac-sha256$" not in str(public_view(made))  # the hash itself is never shown
    with pytest.raises(CredentialError, match="no known scheme"):
        check_credential(dataclasses.replace(made, password_hash="$md5$x$y"))


# ---------------------------------------------------------------------- SCRAM


def _exchange(mechanism: str, username: str, password: str, stored: str) -> bytes:
    """A full exchange between scramp's client (``password``) and the server holding the
    secret of ``stored``; returns the server-final-message (the client checks it)."""
    client = ScramClient([mechanism], username, password)
    server = ScramExchange(mechanism)
    assert server.client_first(client.get_client_first().encode()) == username
    client.set_server_first(server.server_first(derive_secret(mechanism, stored.encode())).decode())
    final = server.client_final(client.get_client_final().encode())
    client.set_server_final(final.decode())  # raises unless the server proved the secret
    return final


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
def test_scram_completes_with_an_independent_client(mechanism: str) -> None:
    assert _exchange(mechanism, "dev,1=x", "s3cret", "s3cret").startswith(b"v=")


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
def test_a_wrong_scram_proof_is_refused(mechanism: str) -> None:
    with pytest.raises(ScramError, match="proof does not verify"):
        _exchange(mechanism, "dev-1", "wrong", "s3cret")


def test_an_unknown_user_gets_the_same_salt_from_every_node_with_the_shared_key() -> None:
    shared = b"the key every node of the cluster shares, 32+ bytes"
    first = unknown_user_secret("SCRAM-SHA-256", "ghost", shared)
    # Another node (another process: nothing but the key in common) answers alike...
    assert first.salt == unknown_user_secret("SCRAM-SHA-256", "ghost", bytes(shared)).salt
    assert first.salt != unknown_user_secret("SCRAM-SHA-256", "other", shared).salt
    assert first.salt != unknown_user_secret("SCRAM-SHA-512", "ghost", shared).salt
    # ...with the iteration count a real user of the mechanism has by default.
    assert first.iterations == ITERATIONS["SCRAM-SHA-256"] == 600_000
    assert unknown_user_secret("SCRAM-SHA-512", "ghost", shared).iterations == 210_000
    assert first.salt != unknown_user_secret("SCRAM-SHA-256", "ghost", b"k" * 32).salt


def test_the_iteration_count_is_owasps_by_default_and_bounded() -> None:
    assert derive_secret("SCRAM-SHA-256", b"x").iterations == 600_000
    assert derive_secret("SCRAM-SHA-512", b"x").iterations == 210_000
    assert derive_secret("SCRAM-SHA-256", b"x", iterations=5000).iterations == 5000
    with pytest.raises(ScramError, match="4,096 to 10,000,000, not 1,000"):
        derive_secret("SCRAM-SHA-256", b"x", iterations=1000)


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (b"p=tls-unique,,n=u,r=abc", "channel binding"),
        (b"n,a=admin,n=u,r=abc", "authorization identity"),
        (b"n,,r=abc,n=u", "must start with n= and r="),
        (b"n,,n=u,r=abc,m=ext", "extensions"),
        (b"n,,n=u=2,r=abc", "malformed"),
        (b"\xff\xfe", "not UTF-8"),
        (b"n,,n=,r=abc", "empty"),
    ],
)
def test_a_malformed_client_first_message_is_refused(message: bytes, error: str) -> None:
    with pytest.raises(ScramError, match=error):
        ScramExchange("SCRAM-SHA-256").client_first(message)


def test_scram_messages_out_of_order_are_refused() -> None:
    exchange = ScramExchange("SCRAM-SHA-256", nonce="server")
    with pytest.raises(ScramError, match="before client-first"):
        exchange.server_first(derive_secret("SCRAM-SHA-256", b"p"))
    with pytest.raises(ScramError, match="before server-first"):
        exchange.client_final(b"c=biws,r=xserver,p=AAAA")
    exchange.client_first(b"n,,n=u,r=x")
    exchange.server_first(derive_secret("SCRAM-SHA-256", b"p"))
    with pytest.raises(ScramError, match="nonce"):
        exchange.client_final(b"c=biws,r=other,p=AAAA")
    with pytest.raises(ScramError, match="channel binding"):
        exchange.client_final(b"c=eSws,r=xserver,p=AAAA")
    with pytest.raises(ScramError, match="unsupported"):
        ScramExchange("SCRAM-SHA-1")


# ---------------------------------------------------------------------- JWT

SECRET = "an HMAC secret of the issuer, 32+ bytes long"


def _token(key: object = SECRET, algorithm: str = "HS256", **claims: object) -> bytes:
    now = int(time.time())
    body = {"sub": "dev-1", "exp": now + 60, **claims}
    return jwt.encode({k: v for k, v in body.items() if v is not None}, key, algorithm).encode()


def test_a_valid_token_gives_its_claims() -> None:
    token = _token(aud="mqtt")
    assert looks_like_token(token) and not looks_like_token(b"plain password")
    claims = verify_token(token, JwtSettings(("HS256",), SECRET, audience="mqtt"))
    assert claims["sub"] == "dev-1"


@pytest.mark.parametrize(
    ("claims", "error"),
    [
        ({"exp": int(time.time()) - 120}, "expired"),
        ({"nbf": int(time.time()) + 3600}, "not valid yet"),
        ({"aud": "another"}, "audience"),
        ({"exp": None}, "lacks the 'exp' claim"),
        ({"iss": "evil"}, "issuer"),
    ],
)
def test_a_token_is_refused_with_its_reason(claims: dict[str, object], error: str) -> None:
    settings = JwtSettings(("HS256",), SECRET, audience="mqtt", issuer="us")
    body = {"aud": "mqtt", "iss": "us", **claims}
    with pytest.raises(TokenError, match=error):
        verify_token(_token(**body), settings)


def test_an_hmac_secret_shorter_than_32_bytes_is_refused() -> None:
    with pytest.raises(ValueError, match=r"at least 32 bytes \(RFC 7518 3.2\), not 31"):
        check_settings(JwtSettings(("HS256",), "x" * 31))
    with pytest.raises(ValueError, match="not 1"):
        check_settings(JwtSettings(("HS512",), "k"))
    check_settings(JwtSettings(("HS256",), "x" * 32))


def test_a_maximum_age_needs_a_recent_iat() -> None:
    settings = JwtSettings(("HS256",), SECRET, max_age_seconds=300)
    now = int(time.time())
    assert verify_token(_token(iat=now - 10), settings)["sub"] == "dev-1"
    with pytest.raises(TokenError, match="lacks the 'iat' claim"):
        verify_token(_token(), settings)
    with pytest.raises(TokenError, match="older than 300 s"):
        verify_token(_token(iat=now - 1000, exp=now + 60), settings)
    with pytest.raises(TokenError, match="not valid yet"):
        verify_token(_token(iat=now + 3600), settings)
    assert verify_token(_token(iat=now - 1000), JwtSettings(("HS256",), SECRET))  # no maximum
    with pytest.raises(ValueError, match="at least 1 second"):
        check_settings(JwtSettings(("HS256",), SECRET, max_age_seconds=0))


def test_a_token_of_another_issuer_or_algorithm_is_not_this_issuers() -> None:
    settings = JwtSettings(("HS256",), SECRET)
    with pytest.raises(NotThisIssuer):
        verify_token(_token(key="another secret of 32 bytes or more!!"), settings)
    with pytest.raises(NotThisIssuer):
        verify_token(_token(algorithm="HS512"), settings)
    with pytest.raises(TokenError, match="malformed"):
        verify_token(b"abc.def.ghi", settings)


def test_a_public_key_verifies_and_is_never_an_hmac_secret() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    settings = JwtSettings(("ES256",), public)
    check_settings(settings)
    assert verify_token(_token(key, "ES256"), settings)["sub"] == "dev-1"
    with pytest.raises(ValueError, match="mix HMAC"):
        check_settings(JwtSettings(("HS256", "ES256"), public))
    with pytest.raises(ValueError, match="does not suit HS256"):
        check_settings(JwtSettings(("HS256",), public))  # PyJWT refuses a PEM as secret
    with pytest.raises(ValueError, match="unknown JWT algorithms: none"):
        check_settings(JwtSettings(("none",), SECRET))


def test_a_jwks_url_is_https_public_key_only_and_never_with_a_key() -> None:
    url = "https://issuer.example/.well-known/jwks.json"
    check_settings(JwtSettings(("RS256", "ES256"), "", jwks_url=url))
    refused = [
        (JwtSettings(("RS256",), "", jwks_url="http://issuer.example/jwks.json"), "must be https"),
        (JwtSettings(("RS256",), "", jwks_url="file:///etc/passwd"), "must be https"),
        (JwtSettings(("RS256",), "", jwks_url="https:///jwks.json"), "has no host"),
        (JwtSettings(("RS256",), "", jwks_url="https://u:p@issuer.example/"), "user name"),
        (JwtSettings(("HS256",), "", jwks_url=url), "HMAC"),
        (JwtSettings(("RS256",), SECRET, jwks_url=url), "a key or a JWKS URL, not both"),
        (JwtSettings(("RS256",), ""), "needs a key or a JWKS URL"),
    ]
    for settings, message in refused:
        with pytest.raises(ValueError, match=message):
            check_settings(settings)


# ---------------------------------------------------------------------- X509


#: Python ssl's names of the subject attributes the test certificates hold.
_SSL_NAMES = {NameOID.COMMON_NAME: "commonName", NameOID.ORGANIZATION_NAME: "organizationName"}


def _identity(pem: Path) -> CertificateIdentity:
    """The identity as the TLS listener makes it, from what ``ssl`` gives of a peer."""
    cert = x509.load_pem_x509_certificate(pem.read_bytes())
    decoded = {
        "subject": tuple(
            tuple((_SSL_NAMES[a.oid], a.value) for a in rdn) for rdn in cert.subject.rdns
        ),
        "subjectAltName": tuple(
            ("DNS", name) for name in cert.extensions.get_extension_for_class(
                x509.SubjectAlternativeName
            ).value.get_values_for_type(x509.DNSName)
        ),
    }  # fmt: skip
    return CertificateIdentity.from_peer_certificate(
        decoded, ssl.PEM_cert_to_DER_cert(pem.read_text())
    )


def test_a_certificate_is_matched_by_fingerprint_before_patterns(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    identity = _identity(pki.cert)
    assert len(identity.fingerprint) == 64 and ("dns", "localhost") in identity.subject_alt_names
    assert identity.subject == "CN=localhost,O=Cormorant local cluster"
    assert identity.common_name == "localhost"
    candidates = [
        ("any-host", CertificateMatch(san="dns:*")),
        ("by-cn", CertificateMatch(common_name=f"{identity.common_name}")),
        ("by-san", CertificateMatch(san="dns:local*")),
        ("exact", CertificateMatch(fingerprint=identity.fingerprint)),
        ("other", CertificateMatch(fingerprint="0" * 64)),
    ]
    assert match_certificate(identity, candidates) == "exact"
    assert match_certificate(identity, candidates[:3]) in ("by-cn", "by-san")
    assert match_certificate(identity, candidates[:1]) == "any-host"
    assert match_certificate(identity, candidates[4:]) is None


def test_equally_specific_patterns_are_chosen_the_same_way_everywhere() -> None:
    sans = (("dns", "dev-7.fleet"),)
    identity = CertificateIdentity("dev-7.fleet", sans, "f" * 64, "CN=dev-7.fleet")
    candidates = [("b", CertificateMatch(common_name="dev-?.fleet")),
                  ("a", CertificateMatch(san="dns:dev-?.fleet"))]  # fmt: skip
    assert match_certificate(identity, candidates) == "a"
    assert match_certificate(identity, list(reversed(candidates))) == "a"
    nameless = CertificateIdentity(None, (), "f" * 64, "O=nameless")
    assert match_certificate(nameless, candidates) is None


def test_scram_secrets_round_trip_base64() -> None:
    secret = derive_secret("SCRAM-SHA-512", b"p", salt=b"salt" * 4, iterations=4096)
    assert base64.b64decode(base64.b64encode(secret.stored_key)) == secret.stored_key
    assert len(secret.stored_key) == 64


# ---------------------------------------------------------------------- ${client_id} rules

_CLIENT_ID_RULE = parse_rules(["allow all devices/${client_id}/#"])


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"type": CredentialType.MQTT_BASIC, "username": "u", "password_hash": "$argon2id$h"},
         "--client-id"),
        ({"type": CredentialType.JWT, "jwt": JwtSettings(("HS256",), "k" * 32)},
         "--jwt-client-id-claim"),
        ({"type": CredentialType.X509, "certificate": CertificateMatch(common_name="*")},
         "X509 credential cannot be"),
    ],
)  # fmt: skip
def test_client_id_rules_need_a_credential_bound_to_the_client_id(
    fields: dict[str, object], error: str
) -> None:
    unbound = Credential(uuid.uuid4(), "c", rules=_CLIENT_ID_RULE, **fields)  # type: ignore[arg-type]
    with pytest.raises(CredentialError, match="not bound to a Client Identifier") as refused:
        check_credential(unbound)
    assert error in str(refused.value)
    # ${username} rules are for every type: authentication binds the User Name.
    check_credential(
        Credential(uuid.uuid4(), "c", rules=parse_rules(["allow all d/${username}/#"]), **fields)  # type: ignore[arg-type]
    )


def test_client_id_rules_of_bound_credentials_are_accepted() -> None:
    check_credential(
        Credential(
            uuid.uuid4(), "c", CredentialType.MQTT_BASIC, rules=_CLIENT_ID_RULE, client_id="dev-1"
        )
    )
    settings = JwtSettings(("HS256",), "k" * 32, client_id_claim="sub")
    check_credential(
        Credential(uuid.uuid4(), "c", CredentialType.JWT, rules=_CLIENT_ID_RULE, jwt=settings)
    )


def test_a_san_pattern_matches_sans_of_its_type_only() -> None:
    """``*.devices.example.com`` is a DNS pattern: a URI (or e-mail) SAN that happens to
    fit it is not a match, and a pattern must say its type when it is made."""
    uri_only = CertificateIdentity(
        None, (("uri", "spiffe://x.devices.example.com"),), "f" * 64, "O=x"
    )
    dns = CertificateIdentity(None, (("dns", "Dev-1.Devices.Example.com"),), "f" * 64, "O=x")
    by_dns = CertificateMatch(san="dns:*.devices.example.com")
    assert not by_dns.matches(uri_only)
    assert by_dns.matches(dns)  # DNS names are compared without case
    assert CertificateMatch(san="uri:spiffe://*.devices.example.com").matches(uri_only)
    assert not CertificateMatch(san="uri:spiffe://*.devices.example.com").matches(dns)
    sans = (("email", "ops@example.com"), ("ip", "10.1.2.3"))
    mail = CertificateIdentity(None, sans, "f" * 64, "")
    assert CertificateMatch(san="email:*@example.com").matches(mail)
    assert not CertificateMatch(san="dns:*example.com").matches(mail)
    assert CertificateMatch(san="ip:10.0.0.0/8").matches(mail)
    assert not CertificateMatch(san="ip:10.1.2.4").matches(mail)
    # stored before SAN types existed: a DNS pattern
    assert not CertificateMatch(san="*.devices.example.com").matches(uri_only)
    assert CertificateMatch(san="*.devices.example.com").matches(dns)


@pytest.mark.parametrize(
    ("san", "words"),
    [
        ("*.devices.example.com", "names no SAN type"),
        ("dir:CN=x", "names no SAN type"),
        ("dns:", "empty after its type"),
        ("ip:10.0.0.300", "not an IP address or CIDR"),
    ],
)
def test_an_x509_credential_needs_a_typed_san_pattern(san: str, words: str) -> None:
    credential = Credential(
        uuid.uuid4(), "x", CredentialType.X509, certificate=CertificateMatch(san=san)
    )
    with pytest.raises(CredentialError, match=words):
        check_credential(credential)
    with pytest.raises(ValueError, match=words):
        parse_san_pattern(san)
    assert parse_san_pattern("DNS:*.devices.example.com") == ("dns", "*.devices.example.com")
