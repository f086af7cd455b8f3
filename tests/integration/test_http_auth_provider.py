"""The HTTP authentication provider (services/common/auth/http_provider.py) inside the
authenticator, against a real local HTTP endpoint (tests/auth_server.py) that allows,
denies, answers garbage, hangs and is down: what a CONNECT gets, the failure policies, the
cache, the signature, the metrics."""

from __future__ import annotations

import logging
import socket
import uuid
from collections.abc import Sequence
from pathlib import Path

import pytest

from services.common.auth import http_provider
from services.common.auth.authenticate import Authenticator
from services.common.auth.authorize import parse_rules
from services.common.auth.credentials import Credential, CredentialType
from services.common.auth.http_provider import (
    FailurePolicy,
    HttpAuthProvider,
    ProviderSettings,
    Result,
)
from services.common.auth.passwords import hash_password
from services.common.auth.principal import Accepted, AuthRequest, Refused
from services.common.records import ClientKind
from tests.auth_server import SECRET, serve_auth
from tests.pki import make_pki

STORED_PASSWORD = b"a stored password"


class OneStoredCredential:
    """A credential source holding one MQTT_BASIC credential, of user name ``stored``."""

    def __init__(self) -> None:
        self.credential = Credential(
            uuid.uuid4(),
            "stored",
            CredentialType.MQTT_BASIC,
            username="stored",
            password_hash=hash_password(STORED_PASSWORD),
            rules=parse_rules(["allow all #"]),
        )

    async def by_username(self, username: str) -> Sequence[Credential]:
        return [self.credential] if username == "stored" else []

    async def by_client_id(self, client_id: str) -> Sequence[Credential]:
        return []

    async def by_fingerprint(self, fingerprint: str) -> Sequence[Credential]:
        return []

    async def unkeyed(self) -> Sequence[Credential]:
        return []


def _authenticator(
    url: str, policy: FailurePolicy, timeout: float = 5.0, ca_file: Path | None = None
) -> Authenticator:
    settings = ProviderSettings(url, SECRET.encode(), timeout, policy, ca_file=ca_file)
    return Authenticator(
        OneStoredCredential(),
        http_provider=HttpAuthProvider(settings),
        scram_unknown_user_key=b"k" * 32,
    )


async def _close(authenticator: Authenticator) -> None:
    authenticator.close()
    assert authenticator.http_provider is not None
    await authenticator.http_provider.close()


def _request(username: str, password: bytes = b"secret", client_id: str = "c1") -> AuthRequest:
    return AuthRequest(client_id, username, password, address="192.0.2.9")


async def test_an_allow_admits_with_the_answers_kind_and_rules_and_is_cached() -> None:
    with serve_auth() as server:
        server.rules = ["allow publish ${username}/#"]
        auth = _authenticator(server.url, FailurePolicy.DENY)
        hits = http_provider.CACHE_HITS[Result.ALLOW]
        try:
            outcome = await auth.authenticate(_request("app-7", "pässword".encode()))
            again = await auth.authenticate(_request("app-7", "pässword".encode()))
            other_password = await auth.authenticate(_request("app-7", b"another"))
        finally:
            await _close(auth)
    assert isinstance(outcome, Accepted) and again == outcome
    principal = outcome.principal
    assert (principal.kind, principal.username, principal.rules) == (
        ClientKind.APPLICATION,
        "app-7",
        parse_rules(["allow publish ${username}/#"]),
    )
    assert (principal.credential_id, principal.owner, principal.client_id_bound) == (
        None,
        "http:app-7",
        True,
    )
    assert isinstance(other_password, Accepted)
    # The second CONNECT came from the cache; another password is another question.
    assert server.count("app-7") == 2 and http_provider.CACHE_HITS[Result.ALLOW] == hits + 1
    assert server.bad_signatures == 0
    assert server.received[0] == {
        "client_id": "c1",
        "username": "app-7",
        "password": "pässword",
        "password_base64": "cMOkc3N3b3Jk",
        "certificate_fingerprint": None,
        "address": "192.0.2.9",
    }


async def test_a_deny_refuses_and_a_malformed_answer_refuses_without_logging_the_password(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with serve_auth() as server:
        auth = _authenticator(server.url, FailurePolicy.FALL_THROUGH)
        try:
            denied = await auth.authenticate(_request("deny-1"))
            with caplog.at_level(logging.WARNING):
                garbage = await auth.authenticate(_request("garbage-1", b"do-not-log-me"))
        finally:
            await _close(auth)
    assert isinstance(denied, Refused) and denied.reason_code == 0x86
    assert isinstance(garbage, Refused) and garbage.reason_code == 0x87
    assert "malformed" in caplog.text and "do-not-log-me" not in caplog.text


@pytest.mark.parametrize(
    ("policy", "stored_gets_in"), [(FailurePolicy.DENY, False), (FailurePolicy.FALL_THROUGH, True)]
)
async def test_a_hanging_endpoint_times_out_into_the_failure_policy(
    policy: FailurePolicy, stored_gets_in: bool
) -> None:
    timeouts = http_provider.REQUESTS[Result.TIMEOUT]
    with serve_auth() as server:
        auth = _authenticator(server.url, policy, timeout=0.5)
        try:
            # A user name the endpoint hangs on, whose stored credential exists.
            outcome = await auth.authenticate(_request("hang-1"))
            stored = await auth.authenticate(_request("stored", STORED_PASSWORD))
        finally:
            await _close(auth)
    assert http_provider.REQUESTS[Result.TIMEOUT] == timeouts + 1
    assert isinstance(outcome, Refused)
    # The endpoint answered 401 for "stored": a failure, so the policy decides again.
    if stored_gets_in:
        assert outcome.reason_code == 0x86  # fell through: no stored credential "hang-1"
        assert isinstance(stored, Accepted) and stored.principal.credential_name == "stored"
    else:
        assert outcome.reason_code == 0x88  # Server unavailable
        assert isinstance(stored, Refused) and stored.reason_code == 0x88


@pytest.mark.parametrize("policy", [FailurePolicy.DENY, FailurePolicy.FALL_THROUGH])
async def test_an_endpoint_that_is_down_is_a_failure(policy: FailurePolicy) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}/auth"  # bound, not listening
        auth = _authenticator(url, policy)
        errors = http_provider.REQUESTS[Result.ERROR]
        try:
            outcome = await auth.authenticate(_request("stored", STORED_PASSWORD))
        finally:
            await _close(auth)
    assert http_provider.REQUESTS[Result.ERROR] == errors + 1
    if policy is FailurePolicy.FALL_THROUGH:
        assert isinstance(outcome, Accepted)
    else:
        assert isinstance(outcome, Refused) and outcome.reason_code == 0x88


async def test_an_https_endpoint_is_trusted_only_with_a_certificate_that_verifies(
    tmp_path: Path,
) -> None:
    pki = make_pki(tmp_path)
    with serve_auth((pki.cert, pki.key)) as server:
        untrusted = _authenticator(server.url, FailurePolicy.DENY)  # the system's CAs only
        trusted = _authenticator(server.url, FailurePolicy.DENY, ca_file=pki.ca)
        try:
            refused = await untrusted.authenticate(_request("allow-tls"))
            admitted = await trusted.authenticate(_request("allow-tls"))
        finally:
            await _close(untrusted)
            await _close(trusted)
    assert isinstance(refused, Refused) and refused.reason_code == 0x88
    assert isinstance(admitted, Accepted)
    assert server.count("allow-tls") == 1  # the untrusted one never sent its request
