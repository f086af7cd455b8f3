"""JWT credentials that name a JWKS URL, against a JSON Web Key Set this test serves over
HTTPS on 127.0.0.1 (tests/jwks_server.py, a certificate of tests/pki.py's CA): keys
picked by ``kid``, fetched at most once per refresh interval, rotated keys taken after the
refetch, and an unreachable or untrusted JWKS refused with 0x87 Not authorized.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from services.common.auth.authenticate import Authenticator
from services.common.auth.credentials import CredentialType
from services.common.auth.jwks import JwksKeys
from services.common.auth.jwt_auth import JwtSettings
from services.common.auth.principal import Accepted, AuthRequest
from services.common.mqtt.reason_codes import ReasonCode
from tests.jwks_server import JwksServer, SigningKey, public_jwk, serve_jwks, signed_token
from tests.pki import Pki, make_pki
from tests.unit.test_auth_authenticate import Memory, code, credential
from tests.waiting import wait_for

#: The refresh interval of these tests (seconds): short, so the test can wait it out.
REFRESH = 1.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("jwks-pki"))


@pytest.fixture
def jwks_server(pki: Pki) -> Iterator[JwksServer]:
    with serve_jwks(pki.cert, pki.key) as served:
        yield served


def _token(key: SigningKey, kid: str) -> bytes:
    return signed_token(key, kid, aud="mqtt", sub="dev-1")


def _authenticator(url: str, ca: Path | None) -> Authenticator:
    issuer = credential(
        "issuer",
        CredentialType.JWT,
        jwt=JwtSettings(("RS256", "ES256"), "", audience="mqtt", jwks_url=url),
    )
    jwks = JwksKeys(REFRESH, None if ca is None else str(ca), retry_seconds=REFRESH)
    return Authenticator(Memory(issuer), jwks=jwks)


async def test_keys_are_picked_by_kid_refetched_at_most_once_per_interval_and_rotated(
    jwks_server: JwksServer, pki: Pki
) -> None:
    first = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    second = ec.generate_private_key(ec.SECP256R1())
    jwks_server.keys = [public_jwk(first, "k1")]
    auth = _authenticator(jwks_server.url, pki.ca)

    async def connect(token: bytes) -> int:
        return code(await auth.authenticate(AuthRequest("dev-1", None, token)))

    outcome = await auth.authenticate(AuthRequest("dev-1", None, _token(first, "k1")))
    assert isinstance(outcome, Accepted) and outcome.principal.credential_name == "issuer"
    assert jwks_server.requests == 1
    fetched_at = time.monotonic()

    # The issuer rotates to a new key: until the interval has passed, the new kid (like any
    # kid the set lacks) is refused without fetching the set again.
    jwks_server.keys = [public_jwk(second, "k2")]
    for _ in range(5):
        assert await connect(_token(second, "k2")) == ReasonCode.BAD_USER_NAME_OR_PASSWORD
        assert await connect(_token(second, "made-up")) == ReasonCode.BAD_USER_NAME_OR_PASSWORD
    assert jwks_server.requests == 1
    assert await connect(_token(first, "k1")) == 0  # the cached set still serves k1

    await wait_for(lambda: time.monotonic() > fetched_at + REFRESH, "the refresh interval")
    assert await connect(_token(second, "k2")) == 0
    assert jwks_server.requests == 2
    fetched_at = time.monotonic()
    for _ in range(5):
        assert await connect(_token(second, "k2")) == 0
        assert await connect(_token(first, "k1")) == ReasonCode.BAD_USER_NAME_OR_PASSWORD
    assert jwks_server.requests == 2
    assert time.monotonic() < fetched_at + REFRESH, "too slow to show the interval holds"


async def test_a_key_not_in_the_set_is_refused(jwks_server: JwksServer, pki: Pki) -> None:
    served = ec.generate_private_key(ec.SECP256R1())
    stranger = ec.generate_private_key(ec.SECP256R1())
    jwks_server.keys = [public_jwk(served, "k1")]
    auth = _authenticator(jwks_server.url, pki.ca)
    assert code(await auth.authenticate(AuthRequest("d", None, _token(served, "k1")))) == 0
    for token in (_token(stranger, "k1"), _token(stranger, "k9")):
        outcome = await auth.authenticate(AuthRequest("d", None, token))
        assert code(outcome) == ReasonCode.BAD_USER_NAME_OR_PASSWORD


async def test_an_unreachable_or_untrusted_jwks_is_not_authorized_and_logged_without_secrets(
    jwks_server: JwksServer, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    jwks_server.keys = [public_jwk(key, "k1")]
    token = _token(key, "k1")
    untrusted = _authenticator(jwks_server.url, None)  # the system's CAs: not the test's
    closed = _authenticator("https://127.0.0.1:1/jwks.json?api_key=hush", pki.ca)
    with caplog.at_level(logging.WARNING, logger="services.common.auth.authenticate"):
        for auth in (untrusted, closed):
            outcome = await auth.authenticate(AuthRequest("d", None, token))
            assert code(outcome) == ReasonCode.NOT_AUTHORIZED
    assert jwks_server.requests == 0
    warnings = [r.getMessage() for r in caplog.records if "JWKS" in r.getMessage()]
    assert len(warnings) == 2, warnings
    assert "CERTIFICATE_VERIFY_FAILED" in warnings[0]
    for message in warnings:
        assert "hush" not in message and token.decode() not in message


async def test_an_unusable_key_set_is_not_authorized_and_not_retried_at_once(
    jwks_server: JwksServer, pki: Pki
) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    token = _token(key, "k1")
    auth = _authenticator(jwks_server.url, pki.ca)

    async def connect() -> int:
        return code(await auth.authenticate(AuthRequest("d", None, token)))

    jwks_server.keys = []  # a JSON object, but no key in it
    # CONNECTs arriving together wait for one fetch; its failure is not retried at once.
    assert await asyncio.gather(*(connect() for _ in range(5))) == [0x87] * 5
    failed_at = time.monotonic()
    jwks_server.keys = [public_jwk(key, "k1")]
    assert await connect() == 0x87
    assert jwks_server.requests == 1
    await wait_for(lambda: time.monotonic() > failed_at + REFRESH, "the retry interval")
    assert await asyncio.gather(*(connect() for _ in range(5))) == [0] * 5
    assert jwks_server.requests == 2
