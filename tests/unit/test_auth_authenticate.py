"""The authentication entry point (services/common/auth/authenticate.py) over credentials held
in memory: which credential a CONNECT stands for, and each refusal's Reason Code.

The same entry point over PostgreSQL is tests/integration/test_credentials.py; through the
whole cluster, tests/e2e/test_auth.py.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Sequence

import jwt
import pytest
from scramp import ScramClient

from services.common.auth.authenticate import Authenticator
from services.common.auth.authorize import parse_rules
from services.common.auth.certificates import CertificateIdentity, CertificateMatch
from services.common.auth.credentials import Credential, CredentialType
from services.common.auth.jwt_auth import JwtSettings
from services.common.auth.passwords import generate_secret, hash_password, hash_secret
from services.common.auth.principal import Accepted, AuthRequest, Challenge, Outcome, Refused
from services.common.auth.scram import MECHANISMS, derive_secret
from services.common.mqtt.reason_codes import ReasonCode
from services.common.records import ClientKind
from services.common.stores.base import StoreUnavailable

SECRET = "the issuer's HMAC secret, long enough for HS256"


class Memory:
    """A credential source over a list (what the cache gives the authenticator)."""

    def __init__(self, *credentials: Credential) -> None:
        self.credentials = list(credentials)
        self.down = False

    def _all(self) -> list[Credential]:
        if self.down:
            raise StoreUnavailable("PostgreSQL at test is unavailable")
        return self.credentials

    async def by_username(self, username: str) -> Sequence[Credential]:
        return [c for c in self._all() if c.username == username]

    async def by_client_id(self, client_id: str) -> Sequence[Credential]:
        return [c for c in self._all() if c.client_id == client_id and c.username is None]

    async def by_fingerprint(self, fingerprint: str) -> Sequence[Credential]:
        return [
            c for c in self._all() if c.certificate and c.certificate.fingerprint == fingerprint
        ]

    async def unkeyed(self) -> Sequence[Credential]:
        return [
            c
            for c in self._all()
            if c.type is CredentialType.JWT
            or (c.type is CredentialType.X509 and c.certificate and not c.certificate.fingerprint)
        ]


def credential(
    name: str, of: CredentialType = CredentialType.MQTT_BASIC, **fields: object
) -> Credential:
    """A credential of type ``of`` named ``name`` with ``fields``."""
    return Credential(uuid.uuid4(), name, of, **fields)  # type: ignore[arg-type]


def code(outcome: Outcome) -> int:
    return outcome.reason_code if isinstance(outcome, Refused) else 0


BASIC = credential(
    "dev-1",
    username="dev-1",
    password_hash=hash_password(b"pw"),
    kind=ClientKind.APPLICATION,
    rules=parse_rules(["allow publish d/${username}/#"]),
)
BOUND = credential("bound", username="shared", client_id="c-7", password_hash=hash_password(b"b"))
LOOSE = credential("loose", username="shared", password_hash=hash_password(b"l"))
BY_ID = credential("by-id", client_id="legacy-1")
OFF = credential("off", username="off", password_hash=hash_password(b"pw"), enabled=False)


async def test_a_user_name_and_password_authenticate_with_the_credentials_kind_and_rules() -> None:
    auth = Authenticator(Memory(BASIC, BOUND, LOOSE, BY_ID, OFF))
    outcome = await auth.authenticate(AuthRequest("any", "dev-1", b"pw"))
    assert isinstance(outcome, Accepted)
    principal = outcome.principal
    assert (principal.credential_id, principal.kind, principal.username) == (
        BASIC.id,
        ClientKind.APPLICATION,
        "dev-1",
    )
    assert principal.rules == BASIC.rules
    assert code(await auth.authenticate(AuthRequest("any", "dev-1", b"nope"))) == 0x86
    assert code(await auth.authenticate(AuthRequest("any", "dev-1"))) == 0x86
    assert code(await auth.authenticate(AuthRequest("any", "ghost", b"pw"))) == 0x86
    # a user name bound to a client id is preferred; the other client ids get the loose one
    bound = await auth.authenticate(AuthRequest("c-7", "shared", b"b"))
    assert isinstance(bound, Accepted) and bound.principal.credential_name == "bound"
    loose = await auth.authenticate(AuthRequest("c-8", "shared", b"l"))
    assert isinstance(loose, Accepted) and loose.principal.credential_name == "loose"
    by_id = await auth.authenticate(AuthRequest("legacy-1"))
    assert isinstance(by_id, Accepted) and by_id.principal.kind is ClientKind.DEVICE


async def test_a_generated_secret_is_checked_on_the_loop_and_a_wrong_one_costs_the_dummy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    secret = generate_secret().encode()
    device = credential("fleet-1", username="fleet-1", password_hash=hash_secret(secret))
    auth = Authenticator(Memory(device))
    hashed: list[str] = []
    run = auth.hashing.run

    async def counted(address: str | None, check: Callable[[], bool]) -> bool:
        hashed.append(str(address))
        return await run(address, check)

    monkeypatch.setattr(auth.hashing, "run", counted)
    accepted = await auth.authenticate(AuthRequest("c", "fleet-1", secret, address="a"))
    assert isinstance(accepted, Accepted) and accepted.principal.credential_id == device.id
    assert hashed == []  # no argon2id, no thread pool
    assert (
        code(await auth.authenticate(AuthRequest("c", "fleet-1", secret[:-1], address="b"))) == 0x86
    )
    assert hashed == ["b"]  # a refusal takes as long as an unknown user name's
    assert len(auth.verified) == 0  # nothing remembered: nothing to gain


async def test_a_disabled_credential_is_banned_only_to_who_proves_it() -> None:
    auth = Authenticator(Memory(OFF))
    assert code(await auth.authenticate(AuthRequest("c", "off", b"pw"))) == ReasonCode.BANNED
    assert code(await auth.authenticate(AuthRequest("c", "off", b"guess"))) == 0x86


async def test_anonymous_clients_get_in_only_when_allowed() -> None:
    assert code(await Authenticator(Memory()).authenticate(AuthRequest("c"))) == 0x87
    rules = parse_rules(["deny subscribe admin/#", "allow all #"])
    auth = Authenticator(Memory(), allow_anonymous=True, anonymous_rules=rules)
    outcome = await auth.authenticate(AuthRequest("c"))
    assert isinstance(outcome, Accepted)
    assert outcome.principal.credential_id is None and outcome.principal.kind is None
    assert outcome.principal.rules == rules
    # a user name nobody has is refused, not taken for anonymous
    assert code(await auth.authenticate(AuthRequest("c", "ghost"))) == 0x86


async def test_a_storm_of_checks_past_the_limit_is_busy() -> None:
    auth = Authenticator(Memory(BASIC), max_pending_hashes=2)
    # Distinct guesses: CONNECTs with the same password share one verification.
    outcomes = await asyncio.gather(
        *(auth.authenticate(AuthRequest("c", "dev-1", b"wrong%d" % i)) for i in range(6))
    )
    codes = sorted(code(o) for o in outcomes)
    assert codes == [0x86, 0x86, 0x89, 0x89, 0x89, 0x89]
    assert auth.pending_hashes == 0


async def test_postgresql_down_is_server_unavailable() -> None:
    source = Memory(BASIC)
    source.down = True
    outcome = await Authenticator(source).authenticate(AuthRequest("c", "dev-1", b"pw"))
    assert code(outcome) == ReasonCode.SERVER_UNAVAILABLE


def _issuer(**settings: object) -> Credential:
    return credential(
        "issuer",
        CredentialType.JWT,
        jwt=JwtSettings(("HS256",), SECRET, **settings),  # type: ignore[arg-type]
    )


def _token(**claims: object) -> bytes:
    body = {"exp": int(time.time()) + 60, **claims}
    return jwt.encode(body, SECRET, "HS256").encode()


async def test_a_jwt_authenticates_and_its_claims_must_match_the_client() -> None:
    auth = Authenticator(
        Memory(_issuer(audience="mqtt", client_id_claim="sub", username_claim="user"))
    )
    good = _token(aud="mqtt", sub="dev-9", user="alice")
    outcome = await auth.authenticate(AuthRequest("dev-9", None, good))
    assert isinstance(outcome, Accepted) and outcome.principal.username == "alice"
    assert code(await auth.authenticate(AuthRequest("dev-8", None, good))) == 0x87
    assert code(await auth.authenticate(AuthRequest("dev-9", "bob", good))) == 0x87
    expired = _token(aud="mqtt", sub="dev-9", user="a", exp=int(time.time()) - 100)
    assert code(await auth.authenticate(AuthRequest("dev-9", None, expired))) == 0x86
    wrong_aud = _token(aud="web", sub="dev-9", user="a")
    assert code(await auth.authenticate(AuthRequest("dev-9", None, wrong_aud))) == 0x86
    other_key = jwt.encode({"exp": int(time.time()) + 60}, "x" * 40, "HS256").encode()
    assert code(await auth.authenticate(AuthRequest("dev-9", None, other_key))) == 0x86


async def test_a_verified_certificate_is_enough() -> None:
    sans = (("dns", "dev-3.fleet"),)
    identity = CertificateIdentity("dev-3.fleet", sans, "a" * 64, "CN=dev-3.fleet")
    by_cn = credential(
        "fleet", CredentialType.X509, certificate=CertificateMatch(common_name="*.fleet")
    )
    auth = Authenticator(Memory(by_cn))
    outcome = await auth.authenticate(AuthRequest("dev-3", certificate=identity))
    assert isinstance(outcome, Accepted) and outcome.principal.credential_name == "fleet"
    stranger = CertificateIdentity("x.other", (), "b" * 64, "CN=x.other")
    assert code(await auth.authenticate(AuthRequest("dev-3", certificate=stranger))) == 0x87


async def test_an_unknown_certificate_is_refused_even_with_anonymous_access() -> None:
    by_fingerprint = credential(
        "line-3", CredentialType.X509, certificate=CertificateMatch(fingerprint="c" * 64)
    )
    auth = Authenticator(Memory(by_fingerprint, BASIC), allow_anonymous=True)
    known = CertificateIdentity("line-3", (), "c" * 64, "CN=line-3")
    outcome = await auth.authenticate(AuthRequest("line-3", certificate=known))
    assert isinstance(outcome, Accepted) and outcome.principal.credential_name == "line-3"
    stranger = CertificateIdentity("line-3", (), "d" * 64, "CN=line-3")
    refused = await auth.authenticate(AuthRequest("line-3", certificate=stranger))
    assert isinstance(refused, Refused) and refused.reason_code == 0x87
    assert "CN=line-3" in refused.reason and "d" * 64 in refused.reason
    # with a User Name and Password as well, those decide
    basic = await auth.authenticate(AuthRequest("any", "dev-1", b"pw", certificate=stranger))
    assert isinstance(basic, Accepted) and basic.principal.credential_name == "dev-1"
    wrong = AuthRequest("any", "dev-1", b"nope", certificate=stranger)
    assert code(await auth.authenticate(wrong)) == 0x86
    anonymous = await auth.authenticate(AuthRequest("any"))
    assert isinstance(anonymous, Accepted) and anonymous.principal.credential_id is None


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
async def test_scram_goes_through_a_challenge(mechanism: str) -> None:
    scram = credential(
        "s",
        CredentialType.SCRAM,
        username="sam",
        scram=tuple(derive_secret(m, b"pw") for m in MECHANISMS),
    )
    auth = Authenticator(Memory(scram))
    for password, expected in (("pw", 0), ("bad", 0x86)):
        client = ScramClient([mechanism], "sam", password)
        first = await auth.authenticate(
            AuthRequest("c", method=mechanism, data=client.get_client_first().encode())
        )
        assert isinstance(first, Challenge)
        client.set_server_first(first.data.decode())
        final = AuthRequest("c", method=mechanism, data=client.get_client_final().encode())
        outcome = await auth.authenticate(final, first.exchange)
        assert code(outcome) == expected
        if isinstance(outcome, Accepted):
            assert outcome.data is not None
            client.set_server_final(outcome.data.decode())
    unknown = ScramClient([mechanism], "nobody", "pw")
    first = await auth.authenticate(
        AuthRequest("c", method=mechanism, data=unknown.get_client_first().encode())
    )
    assert isinstance(first, Challenge)  # an unknown user is not told so before its proof
    unknown.set_server_first(first.data.decode())
    final = AuthRequest("c", method=mechanism, data=unknown.get_client_final().encode())
    assert code(await auth.authenticate(final, first.exchange)) == 0x86
    bad_method = await auth.authenticate(AuthRequest("c", method="GS2-KRB5", data=b""))
    assert code(bad_method) == ReasonCode.BAD_AUTHENTICATION_METHOD
    garbage = await auth.authenticate(AuthRequest("c", method=mechanism, data=b"\x00"))
    assert code(garbage) == ReasonCode.NOT_AUTHORIZED


# ---------------------------------------------------------------------- bound identities


async def test_a_basic_credential_gives_its_own_user_name_not_the_clients() -> None:
    auth = Authenticator(Memory(BASIC, BY_ID))
    outcome = await auth.authenticate(AuthRequest("c", "dev-1", b"pw"))
    assert isinstance(outcome, Accepted) and outcome.principal.username == "dev-1"
    # Matched by its client id alone: the User Name the client sends is not its identity.
    by_id = await auth.authenticate(AuthRequest("legacy-1", "admin", None))
    assert isinstance(by_id, Accepted) and by_id.principal.username is None


async def test_a_jwt_user_name_is_its_sub_claim_by_default() -> None:
    auth = Authenticator(Memory(_issuer(audience="mqtt")))
    token = _token(aud="mqtt", sub="alice")
    outcome = await auth.authenticate(AuthRequest("any", None, token))
    assert isinstance(outcome, Accepted) and outcome.principal.username == "alice"
    same = await auth.authenticate(AuthRequest("any", "alice", token))
    assert isinstance(same, Accepted) and same.principal.username == "alice"
    refused = await auth.authenticate(AuthRequest("any", "bob", token))
    assert code(refused) == 0x87 and "'sub'" in refused.reason  # type: ignore[union-attr]
    # A token naming no subject: no User Name, and none may be claimed in its place.
    anonymous_token = _token(aud="mqtt")
    nameless = await auth.authenticate(AuthRequest("any", None, anonymous_token))
    assert isinstance(nameless, Accepted) and nameless.principal.username is None
    assert code(await auth.authenticate(AuthRequest("any", "bob", anonymous_token))) == 0x87


async def test_a_certificate_user_name_is_its_cn_or_the_san_its_credential_matches() -> None:
    by_cn = credential(
        "fleet", CredentialType.X509, certificate=CertificateMatch(common_name="*.fleet")
    )
    by_san = credential(
        "gateways", CredentialType.X509, certificate=CertificateMatch(san="dns:*.gw.example")
    )
    auth = Authenticator(Memory(by_cn, by_san))
    device = CertificateIdentity(
        "dev-3.fleet", (("dns", "dev-3.other"),), "a" * 64, "CN=dev-3.fleet"
    )
    outcome = await auth.authenticate(AuthRequest("c", certificate=device))
    assert isinstance(outcome, Accepted) and outcome.principal.username == "dev-3.fleet"
    same = await auth.authenticate(AuthRequest("c", "dev-3.fleet", certificate=device))
    assert isinstance(same, Accepted)
    other = await auth.authenticate(AuthRequest("c", "dev-4.fleet", certificate=device))
    assert code(other) == 0x87 and "CN" in other.reason  # type: ignore[union-attr]
    gateway = CertificateIdentity(
        "Gateway 1",
        (("email", "ops@example.com"), ("dns", "g-1.gw.example")),
        "b" * 64,
        "CN=Gateway 1",
    )
    outcome = await auth.authenticate(AuthRequest("c", certificate=gateway))
    assert isinstance(outcome, Accepted) and outcome.principal.username == "g-1.gw.example"
    assert code(await auth.authenticate(AuthRequest("c", "Gateway 1", certificate=gateway))) == 0x87


async def test_scram_gives_the_credentials_user_name() -> None:
    scram = credential(
        "s",
        CredentialType.SCRAM,
        username="sam",
        scram=tuple(derive_secret(m, b"pw") for m in MECHANISMS),
    )
    auth = Authenticator(Memory(scram))
    client = ScramClient(["SCRAM-SHA-256"], "sam", "pw")
    first = await auth.authenticate(
        AuthRequest("c", "x", method="SCRAM-SHA-256", data=client.get_client_first().encode())
    )
    assert isinstance(first, Challenge)
    client.set_server_first(first.data.decode())
    final = AuthRequest("c", method="SCRAM-SHA-256", data=client.get_client_final().encode())
    outcome = await auth.authenticate(final, first.exchange)
    assert isinstance(outcome, Accepted) and outcome.principal.username == "sam"


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
async def test_an_unknown_scram_user_gets_the_same_salt_from_every_node(mechanism: str) -> None:
    key = b"the cluster's scram_unknown_user_key, 32 bytes+"
    node1 = Authenticator(Memory(), scram_unknown_user_key=key)
    node2 = Authenticator(Memory(), scram_unknown_user_key=key)

    async def server_first(node: Authenticator) -> str:
        client = ScramClient([mechanism], "ghost", "any password")
        request = AuthRequest("c", method=mechanism, data=client.get_client_first().encode())
        outcome = await node.authenticate(request)
        assert isinstance(outcome, Challenge)
        salt, iterations = outcome.data.decode().split(",")[1:3]
        return f"{salt},{iterations}"

    try:
        answers = {await server_first(node) for node in (node1, node2, node1)}
    finally:
        node1.close()
        node2.close()
    assert len(answers) == 1, answers
