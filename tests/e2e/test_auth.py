"""Authentication and authorization end to end: credentials created with the management API
(what ``cormorant credentials`` and the admin API call) in the cluster's PostgreSQL, used by
third-party clients through both ingest nodes.

The test cluster lets anonymous clients in on its loopback listener (as ``cormorant up``
does): a client that presents credentials is checked all the same, and an unknown user name
is refused rather than taken for anonymous.
"""

from __future__ import annotations

import asyncio
import hashlib
import ssl
import threading
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiomqtt
import jwt
import pytest
import pytest_asyncio
from cryptography.hazmat.primitives.asymmetric import ec
from scramp import ScramClient

from services.common.auth.certificates import CertificateMatch
from services.common.auth.credentials import Credential, CredentialType
from services.common.auth.jwt_auth import JwtSettings
from services.common.auth.manage import CredentialAdmin, CredentialChanges, CredentialSpec
from services.common.auth.store import CredentialStore
from services.common.records import ClientKind
from services.local import cluster as local_cluster
from services.local import postgres
from services.local.certificates import Issued
from tests.e2e.clients import (
    TIMEOUT,
    PahoClient,
    RawSocket,
    aio_client,
    auth_packet,
    collect,
    connect_packet,
    enhanced_connect_packet,
    mosquitto_pub,
    reason_and_properties,
    unique,
    until_marker,
)
from tests.jwks_server import public_jwk, serve_jwks, signed_token
from tests.pki import issue_client
from tests.servers import LocalCluster
from tests.waiting import wait_until

pytestmark = pytest.mark.cluster

NOT_AUTHORIZED = 0x87
JWT_SECRET = "the fleet issuer's HMAC secret (32 bytes or more)"


@pytest_asyncio.fixture(loop_scope="function")
async def admin(cluster: LocalCluster) -> AsyncIterator[CredentialAdmin]:
    """The management API on the cluster's PostgreSQL."""
    manager = CredentialAdmin(CredentialStore(postgres.dsn(cluster.settings)))
    yield manager
    await manager.close()


async def basic(
    admin: CredentialAdmin, rules: list[str] | None = None, **fields: object
) -> tuple[Credential, str]:
    """A new MQTT_BASIC credential (user name = its name) with a password and ``rules``
    (default: ``allow all #``); returns it and the password."""
    name = unique("user")
    password = unique("pw")
    given = ["allow all #"] if rules is None else rules
    credential = await admin.add(
        CredentialSpec(name, CredentialType.MQTT_BASIC, username=name,
                       password=password.encode(), rules=given, **fields)  # type: ignore[arg-type]
    )  # fmt: skip
    return credential, password


def paho(
    port: int, credential: Credential, password: str, version: int = 5, **kw: object
) -> PahoClient:
    return PahoClient(
        port,
        credential.client_id or unique("dev"),  # a credential bound to a client id needs it
        version,
        username=credential.username,
        password=password.encode(),
        **kw,  # type: ignore[arg-type]
    )


def _raw_connack(port: int, client_id: str, username: bytes | None, password: bytes | None) -> int:
    """The v3.1.1 CONNACK return code a raw CONNECT with these credentials gets."""
    with RawSocket(port) as sock:
        sock.send(connect_packet(client_id, username=username, password=password))
        first, body = sock.read_packet()
        assert first == 0x20
        return body[1]


# ---------------------------------------------------------------------- CONNECT outcomes


async def test_a_basic_credential_connects_with_every_client_and_wrong_ones_are_refused(
    cluster: LocalCluster, admin: CredentialAdmin
) -> None:
    node1, node2 = cluster.node_ports
    credential, password = await basic(admin)
    user = credential.username or ""
    client = paho(node1, credential, password)
    assert client.connect().value == 0
    client.close()
    wrong = paho(node2, credential, "not-it")
    assert wrong.connect().value == 0x86
    async with aio_client(cluster.mqtt_port, unique("aio"), 4, username=user, password=password):
        pass  # aiomqtt raises on a refused CONNECT
    ok = mosquitto_pub(cluster.mqtt_port, "auth/ok", "x", qos=1, extra=("-u", user, "-P", password))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    refused = mosquitto_pub(cluster.mqtt_port, "auth/x", "x", qos=1, extra=("-u", user, "-P", "no"))
    assert refused.returncode != 0 and "bad user name or password" in refused.stderr.lower()
    # v3.1.1 return codes, and the same answer for a user name that does not exist
    assert _raw_connack(node1, unique("raw"), user.encode(), b"no") == 4
    assert (
        _raw_connack(node1, unique("raw"), b"nobody-" + uuid.uuid4().bytes.hex().encode(), b"x")
        == 4
    )
    assert _raw_connack(node2, unique("raw"), user.encode(), password.encode()) == 0
    # a password of any bytes, and an invalid UTF-8 user name, get the spec's reactions
    assert _raw_connack(node1, unique("raw"), user.encode(), bytes(range(256))) == 4
    with RawSocket(node1) as sock:
        sock.send(connect_packet(unique("raw"), username=b"\xff\xfe", password=b"x"))
        assert sock.read_until_closed() == b""  # malformed: closed, no CONNACK (MQTT 4.8)


async def test_a_generated_secret_connects_on_every_node_and_a_wrong_one_is_refused(
    cluster: LocalCluster, admin: CredentialAdmin
) -> None:
    name = unique("fleet")
    credential, secret = await admin.add_generated(
        CredentialSpec(name, CredentialType.MQTT_BASIC, username=name, client_id=name,
                       rules=["allow all #"])
    )  # fmt: skip
    node1, node2 = cluster.node_ports
    for port in (node1, node2, cluster.mqtt_port):  # a reconnect to another node, HAProxy
        client = paho(port, credential, secret)
        assert client.connect().value == 0
        client.close()
    wrong = secret[:-1] + ("B" if secret.endswith("A") else "A")  # 1 in 64 ends with "A"
    assert paho(node2, credential, wrong).connect().value == 0x86
    assert _raw_connack(node1, name, name.encode(), secret.upper().encode()) == 4


async def test_a_disabled_credential_is_banned_and_a_client_id_credential_needs_no_password(
    cluster: LocalCluster, admin: CredentialAdmin
) -> None:
    credential, password = await basic(admin)
    await admin.set_enabled(credential.name, False)
    assert paho(cluster.mqtt_port, credential, password).connect().value == 0x8A
    assert _raw_connack(cluster.mqtt_port, unique("raw"), credential.username.encode(),  # type: ignore[union-attr]
                        password.encode()) == 5  # fmt: skip
    legacy = unique("legacy")
    await admin.add(CredentialSpec(legacy, CredentialType.MQTT_BASIC, client_id=legacy,
                                   kind=ClientKind.DEVICE, no_password=True))  # fmt: skip
    assert PahoClient(cluster.mqtt_port, legacy).connect().value == 0


def _connect_with_tokens(
    cluster: LocalCluster, device: str, cases: list[tuple[bytes, int]]
) -> None:
    """Connect as ``device`` with each token, expecting its CONNACK Reason Code; an accepted
    one must also get its QoS 1 PUBLISH under ``fleet/<device>/`` acknowledged with 0. The
    User Name is the token's sub (bound identity; paho sends no Password without one)."""
    for password, expected in cases:
        client = PahoClient(cluster.mqtt_port, device, username=device, password=password)
        assert client.connect().value == expected, password
        if expected == 0:
            mid = client.publish(f"fleet/{device}/x", b"1", 1)
            wait_until(lambda c=client, m=mid: m in c.snapshot()[0], "PUBACK")
            assert client.snapshot()[0][mid].value == 0
            client.close()


async def test_jwt_credentials_accept_valid_tokens_only(
    cluster: LocalCluster, admin: CredentialAdmin
) -> None:
    issuer = unique("issuer")
    await admin.add(
        CredentialSpec(issuer, CredentialType.JWT, rules=["allow all fleet/${client_id}/#"],
                       jwt=JwtSettings(("HS256",), JWT_SECRET, audience=issuer,
                                       client_id_claim="sub"))
    )  # fmt: skip
    now = int(time.time())

    def token(**claims: object) -> bytes:
        body = {"aud": issuer, "exp": now + 300, **claims}
        return jwt.encode(body, JWT_SECRET, "HS256").encode()

    device = unique("jwt-dev")
    cases = [
        (token(sub=device), 0),
        (token(sub=device, exp=now - 120), 0x86),  # expired
        (token(sub=device, nbf=now + 3600), 0x86),  # not yet valid
        (token(sub=device, aud="another"), 0x86),  # wrong audience
        (token(sub="someone-else"), NOT_AUTHORIZED),  # not this client's token
        (jwt.encode({"aud": issuer, "exp": now + 60}, "x" * 40, "HS256").encode(), 0x86),
        (b"not.a.token", 0x86),
    ]
    _connect_with_tokens(cluster, device, cases)
    done = mosquitto_pub(cluster.mqtt_port, f"fleet/{device}/t", "x", qos=1, client_id=device,
                         extra=("-u", device, "-P", token(sub=device).decode()))  # fmt: skip
    assert done.returncode == 0, done.stderr


async def test_a_jwks_credential_accepts_tokens_of_the_served_keys_only(
    cluster: LocalCluster, admin: CredentialAdmin
) -> None:
    # The JWKS is served under the cluster's own CA, which `cormorant up` has its nodes trust.
    tls = local_cluster.tls_dir(cluster.settings)
    key, stranger = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    with serve_jwks(tls / "server.pem", tls / "server.key") as served:
        served.keys = [public_jwk(key, "k1")]
        issuer = unique("jwks")
        await admin.add(
            CredentialSpec(issuer, CredentialType.JWT, rules=["allow all fleet/${client_id}/#"],
                           jwt=JwtSettings(("ES256",), "", audience=issuer,
                                           client_id_claim="sub", jwks_url=served.url))
        )  # fmt: skip
        device = unique("jwks-dev")
        cases = [
            (signed_token(key, "k1", aud=issuer, sub=device), 0),
            (signed_token(stranger, "k1", aud=issuer, sub=device), 0x86),  # not the served key
            (signed_token(stranger, "k9", aud=issuer, sub=device), 0x86),  # a kid not served
            (signed_token(key, "k1", aud=issuer, sub="someone-else"), NOT_AUTHORIZED),
        ]
        _connect_with_tokens(cluster, device, cases)
        # Each node fetched the set at most once: the unknown kid did not refetch it.
        assert 1 <= served.requests <= len(cluster.node_ports)


# ---------------------------------------------------------------------- authorization


async def test_rules_with_placeholders_decide_publish_and_subscribe(
    cluster: LocalCluster, admin: CredentialAdmin
) -> None:
    node1, node2 = cluster.node_ports
    rules = [
        "allow publish devices/${client_id}/#",
        "allow subscribe commands/${username}/#",
        "deny subscribe commands/#",
        "allow subscribe devices/+/status",
    ]
    # ${client_id} rules: the credential is bound to the client id (MQTT_BASIC --client-id)
    credential, password = await basic(admin, rules, client_id=unique("dev"))
    user = credential.username
    client = paho(node1, credential, password)
    assert client.connect().value == 0
    own, other = f"devices/{client.client_id}/t", "devices/someone-else/t"
    mids = [client.publish(own, b"mine", 1), client.publish(other, b"theirs", 1),
            client.publish("elsewhere", b"theirs", 1)]  # fmt: skip
    wait_until(lambda: all(m in client.snapshot()[0] for m in mids), "the acknowledgements")
    acks = client.snapshot()[0]
    assert [acks[m].value for m in mids] == [0, NOT_AUTHORIZED, NOT_AUTHORIZED]
    assert [c.value for c in client.subscribe(f"commands/{user}/#", 1)] == [1]
    assert [c.value for c in client.subscribe("commands/other/#", 1)] == [NOT_AUTHORIZED]
    assert [c.value for c in client.subscribe("#", 1)] == [1]  # filtered at delivery
    assert [c.value for c in client.subscribe("$share/g/devices/+/status", 1)] == [1]
    assert [c.value for c in client.subscribe("$share/g/commands/x/#", 1)] == [NOT_AUTHORIZED]
    client.close()
    # v3.1.1: the refused PUBLISH is acknowledged, and proven dropped by a later marker
    async with aio_client(node2, unique("watch")) as watcher:
        await watcher.subscribe("devices/#", qos=1)
        device = credential.client_id or ""
        async with aio_client(node1, device, 4, username=user, password=password) as v3:
            await v3.publish("devices/intruder/t", b"refused", qos=1)
            await v3.publish(f"devices/{device}/t", b"marker", qos=1)
            assert [m.payload for m in await until_marker(watcher, b"marker")] == []


async def test_mosquitto_pub_v5_shows_the_refusal(
    cluster: LocalCluster, admin: CredentialAdmin
) -> None:
    credential, password = await basic(admin, ["allow publish sensors/${username}/#"])
    user = credential.username or ""
    refused = mosquitto_pub(cluster.mqtt_port, "sensors/other/t", "21.5", qos=1, version=5,
                            extra=("-u", user, "-P", password))  # fmt: skip
    assert "received PUBACK (Mid: 1, RC:135)" in refused.stdout, refused.stdout
    allowed = mosquitto_pub(cluster.mqtt_port, f"sensors/{user}/t", "21.5", qos=1, version=5,
                            extra=("-u", user, "-P", password))  # fmt: skip
    assert "received PUBACK (Mid: 1, RC:0)" in allowed.stdout, allowed.stdout


async def test_a_will_topic_is_authorized_at_connect(
    cluster: LocalCluster, admin: CredentialAdmin
) -> None:
    credential, password = await basic(
        admin, ["allow publish wills/${client_id}"], client_id=unique("will")
    )
    refused = paho(cluster.mqtt_port, credential, password)
    refused.will_set("wills/someone-else", b"gone", 1)
    assert refused.connect().value == NOT_AUTHORIZED
    async with aio_client(cluster.node_ports[1], unique("watch")) as watcher:
        await watcher.subscribe("wills/#", qos=1)
        allowed = paho(cluster.node_ports[0], credential, password)
        allowed.will_set(f"wills/{allowed.client_id}", b"gone", 1)
        assert allowed.connect().value == 0
        allowed.client.socket().close()  # a lost connection publishes the Will Message
        [will] = await collect(watcher, 1)
        assert (str(will.topic), will.payload) == (f"wills/{allowed.client_id}", b"gone")


def _code(granted: object) -> int:
    """A SUBACK return/Reason Code as aiomqtt gives it (v5: a ReasonCode; v3.1.1: either)."""
    return int(getattr(granted, "value", granted))  # type: ignore[call-overload]


def _under(messages: list[aiomqtt.Message], base: str) -> list[tuple[str, bytes, bool]]:
    """The messages on topics under ``base`` (a ``#`` subscriber also gets other tests')."""
    return [
        (str(m.topic), m.payload, m.retain)  # type: ignore[misc]
        for m in messages
        if str(m.topic).startswith(f"{base}/")
    ]


@pytest.mark.parametrize("version", [4, 5], ids=["v311", "v5"])
async def test_a_wildcard_subscriber_gets_everything_but_the_denied_topics(
    cluster: LocalCluster, admin: CredentialAdmin, version: int
) -> None:
    """Rules ``deny subscribe test/nosubscribe``, ``allow all #`` (under a fresh prefix):
    ``#`` is granted, ``test/nosubscribe`` itself refused; neither a retained nor a live
    message of the denied topic reaches the ``#`` subscriber, both of ``test/other`` do.
    Absence proven by order: the denied message is published first, a marker last."""
    node1, node2 = cluster.node_ports
    base = unique("test")
    denied, other = f"{base}/nosubscribe", f"{base}/other"
    refused = NOT_AUTHORIZED if version == 5 else 0x80
    async with aio_client(node1, unique("keeper")) as keeper:
        await keeper.subscribe(f"{base}/#", qos=1)
        await keeper.publish(denied, b"retained secret", qos=1, retain=True)
        await keeper.publish(other, b"retained public", qos=1, retain=True)
        await collect(keeper, 2)  # routed: they are retained before the SUBSCRIBE below
        credential, password = await basic(admin, [f"deny subscribe {denied}", "allow all #"])
        user = credential.username
        async with aio_client(node2, unique("dev"), version, username=user,
                              password=password) as sub:  # fmt: skip
            assert [_code(c) for c in await sub.subscribe("#", qos=1)] == [1]
            assert [_code(c) for c in await sub.subscribe(denied, qos=1)] == [refused]
            # its own marker follows its retained request (one client id, one partition)
            await sub.publish(f"{base}/marker", b"marker 1", qos=1)
            retained = _under(await until_marker(sub, b"marker 1"), base)
            assert retained == [(other, b"retained public", True)]
            await keeper.publish(denied, b"live secret", qos=1)
            await keeper.publish(other, b"live public", qos=1)
            await keeper.publish(f"{base}/marker", b"marker 2", qos=1)
            live = _under(await until_marker(sub, b"marker 2"), base)
            assert live == [(other, b"live public", False)]


async def test_a_shared_wildcard_subscriber_gets_everything_but_the_denied_topics(
    cluster: LocalCluster, admin: CredentialAdmin
) -> None:
    node1, node2 = cluster.node_ports
    base = unique("test")
    denied, other = f"{base}/nosubscribe", f"{base}/other"
    credential, password = await basic(admin, [f"deny subscribe {denied}", "allow all #"])
    async with (
        aio_client(node2, unique("dev"), username=credential.username, password=password) as sub,
        aio_client(node1, unique("pub")) as pub,
    ):
        group = unique("g")
        assert [_code(c) for c in await sub.subscribe(f"$share/{group}/#", qos=1)] == [1]
        await pub.publish(denied, b"secret", qos=1)
        await pub.publish(other, b"public", qos=1)
        await pub.publish(f"{base}/marker", b"marker", qos=1)
        assert _under(await until_marker(sub, b"marker"), base) == [(other, b"public", False)]


# ---------------------------------------------------------------------- every node agrees


async def test_a_disabled_credential_disconnects_its_clients_on_every_node(
    cluster: LocalCluster, admin: CredentialAdmin
) -> None:
    node1, node2 = cluster.node_ports
    credential, password = await basic(admin, ["allow all #"])
    clients = [paho(port, credential, password) for port in (node1, node2)]
    assert [c.connect().value for c in clients] == [0, 0]
    await admin.set_enabled(credential.name, False)
    for client in clients:
        wait_until(lambda c=client: c.snapshot()[1], "the DISCONNECT")
        assert [rc.value for rc in client.snapshot()[1]] == [0x98]
    assert paho(node2, credential, password).connect().value == 0x8A
    await admin.set_enabled(credential.name, True)
    again = paho(node1, credential, password)
    assert again.connect().value == 0
    await admin.delete(credential.name)
    wait_until(lambda: again.snapshot()[1], "the DISCONNECT after delete")
    assert [rc.value for rc in again.snapshot()[1]] == [0x98]


def _connack(port: int, credential: Credential, password: str) -> int:
    """The CONNACK Reason Code a paho v5 client gets (the connection is closed after)."""
    client = paho(port, credential, password)
    try:
        return client.connect().value
    finally:
        client.close()


async def test_a_changed_password_is_no_longer_accepted_from_memory_on_any_node(
    cluster: LocalCluster, admin: CredentialAdmin
) -> None:
    """Each node remembers the password it verified (services/common/auth/verified.py): a
    wrong one is still refused while it does, and once the password changes the old one is
    refused on both nodes, the new one accepted."""
    nodes = cluster.node_ports
    credential, password = await basic(admin)
    for port in nodes:
        assert [_connack(port, credential, password) for _ in range(2)] == [0, 0]
        assert _connack(port, credential, password + "x") == 0x86
        assert _connack(port, credential, "") == 0x86
    new = unique("pw")
    await admin.update(credential.name, CredentialChanges(password=new.encode()))
    for port in nodes:
        # the new password is taken once the node has the change (PostgreSQL's NOTIFY)
        wait_until(lambda p=port: _connack(p, credential, new) == 0, "the new password")
        assert _connack(port, credential, password) == 0x86
    # remembered or not, a disabled credential is banned
    assert _connack(nodes[0], credential, new) == 0
    await admin.set_enabled(credential.name, False)
    for port in nodes:
        wait_until(lambda p=port: _connack(p, credential, new) == 0x8A, "the ban")


async def test_a_changed_rule_applies_to_the_next_publish(
    cluster: LocalCluster, admin: CredentialAdmin
) -> None:
    credential, password = await basic(admin, ["allow all #"])
    client = paho(cluster.node_ports[1], credential, password)
    assert client.connect().value == 0
    await admin.update(credential.name, CredentialChanges(rules=["deny publish locked/#",
                                                                 "allow all #"]))  # fmt: skip

    def refused() -> bool:
        mid = client.publish("locked/door", b"open", 1)
        wait_until(lambda: mid in client.snapshot()[0], "the PUBACK")
        return client.snapshot()[0][mid].value == NOT_AUTHORIZED

    wait_until(refused, "the new rule on the live connection", timeout=TIMEOUT)
    client.close()


# ---------------------------------------------------------------------- SCRAM


def _scram_connect(
    port: int, method: str, user: str, password: str
) -> tuple[RawSocket, int, ScramClient]:
    """A SCRAM exchange over AUTH packets to its CONNACK; returns the open socket, the
    CONNACK Reason Code and the client (which checked the server's signature on success)."""
    scram = ScramClient([method], user, password)
    sock = RawSocket(port)
    sock.send(enhanced_connect_packet(unique("scram"), method, scram.get_client_first().encode()))
    code, props = reason_and_properties(*sock.read_packet())
    assert code == 0x18 and props.AuthenticationMethod == method
    scram.set_server_first(props.AuthenticationData.decode())
    sock.send(auth_packet(0x18, method, scram.get_client_final().encode()))
    first, body = sock.read_packet()
    assert first >> 4 == 2, f"expected CONNACK, got {first:#x}"
    code, props = reason_and_properties(first, body)
    if code == 0:
        assert props.AuthenticationMethod == method
        scram.set_server_final(props.AuthenticationData.decode())  # raises if forged
    return sock, code, scram


@pytest.mark.parametrize("method", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_scram_enhanced_authentication_and_re_authentication(
    cluster: LocalCluster, admin: CredentialAdmin, method: str
) -> None:
    user, password = unique("scram-user"), unique("pw")
    await admin.add(CredentialSpec(user, CredentialType.SCRAM, username=user,
                                   password=password.encode()))  # fmt: skip
    sock, code, _ = _scram_connect(cluster.mqtt_port, method, user, password)
    assert code == 0
    with sock:
        again = ScramClient([method], user, password)  # re-authentication (MQTT 5.0 4.12.1)
        sock.send(auth_packet(0x19, method, again.get_client_first().encode()))
        code, props = reason_and_properties(*sock.read_packet())
        assert code == 0x18
        again.set_server_first(props.AuthenticationData.decode())
        sock.send(auth_packet(0x18, method, again.get_client_final().encode()))
        code, props = reason_and_properties(*sock.read_packet())
        assert code == 0
        again.set_server_final(props.AuthenticationData.decode())
        sock.send(auth_packet(0x19, "SCRAM-SHA-1", b"n,,n=x,r=y"))  # another method
        assert reason_and_properties(*sock.read_packet())[0] == 0x8C
    wrong, code, _ = _scram_connect(cluster.mqtt_port, method, user, "wrong")
    wrong.close()
    assert code == 0x86
    with RawSocket(cluster.mqtt_port) as other:
        other.send(enhanced_connect_packet(unique("krb"), "GS2-KRB5", b""))
        assert reason_and_properties(*other.read_packet())[0] == 0x8C


# ---------------------------------------------------------------------- X509 over mutual TLS


def _fingerprint(pem: Path) -> str:
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem.read_text())).hexdigest()


def _tls_client(cluster: LocalCluster, cert: Issued | None, version: int = 5) -> PahoClient:
    """A paho client for the TLS listener (through HAProxy, TLS passed through to a node),
    trusting the cluster's CA and presenting ``cert`` (mutual TLS) when given."""
    tls = local_cluster.tls_dir(local_cluster.local_settings(cluster.settings))
    return PahoClient(
        cluster.settings.tls_listen_port,
        unique("x509-dev"),
        version,
        ca_file=tls / "ca.pem",
        cert=None if cert is None else (cert.cert, cert.key),
    )


async def test_x509_credentials_authenticate_client_certificates_over_mutual_tls(
    cluster: LocalCluster, admin: CredentialAdmin
) -> None:
    """Certificates the cluster's CA signed, matched by CN pattern, SAN pattern and
    fingerprint; one no credential matches is refused although anonymous access is on."""
    tls = local_cluster.tls_dir(local_cluster.local_settings(cluster.settings))
    tag = unique("x509")
    by_cn = issue_client(tls, f"{tag}-line-7")
    by_san = issue_client(tls, f"{tag}-gw", alt_names=(f"gw-1.{tag}.example",))
    pinned = issue_client(tls, f"{tag}-pinned")
    stranger = issue_client(tls, f"{tag}-stranger")
    # ${username} is the certificate's CN: an X509 credential is bound to no client id.
    rules = ["allow publish x509/${username}/#", "allow subscribe x509/${username}/#"]
    specs = [
        CredentialSpec(f"{tag}-by-cn", CredentialType.X509, rules=rules,
                       certificate=CertificateMatch(common_name=f"{tag}-line-*")),
        CredentialSpec(f"{tag}-by-san", CredentialType.X509, rules=["allow all #"],
                       certificate=CertificateMatch(san=f"dns:*.{tag}.example")),
        CredentialSpec(f"{tag}-pinned", CredentialType.X509, rules=["allow all #"],
                       certificate=CertificateMatch(fingerprint=_fingerprint(pinned.cert))),
    ]  # fmt: skip
    for spec in specs:
        await admin.add(spec)
    try:
        client = _tls_client(cluster, by_cn)
        assert client.connect().value == 0
        common_name = f"{tag}-line-7"
        own, other = f"x509/{common_name}/t", "x509/someone-else/t"
        mids = [client.publish(own, b"mine", 1), client.publish(other, b"theirs", 1)]
        wait_until(lambda: all(m in client.snapshot()[0] for m in mids), "the acknowledgements")
        acks = client.snapshot()[0]
        assert [acks[m].value for m in mids] == [0, NOT_AUTHORIZED]
        assert [c.value for c in client.subscribe(f"x509/{common_name}/#", 1)] == [1]
        # A wildcard over other clients' topics is granted, their messages withheld.
        assert [c.value for c in client.subscribe("x509/#", 1)] == [1]
        assert [c.value for c in client.subscribe("elsewhere/#", 1)] == [NOT_AUTHORIZED]
        client.publish(own, b"to myself", 1)
        assert client.messages.get(timeout=TIMEOUT).payload == b"to myself"
        client.close()
        for cert, version in ((by_san, 4), (pinned, 5)):
            accepted = _tls_client(cluster, cert, version)
            assert accepted.connect().value == 0, cert.cert.name
            accepted.close()

        refused = _tls_client(cluster, stranger)
        assert refused.connect().value == NOT_AUTHORIZED
        refused.close()
        v3 = mosquitto_pub(
            cluster.settings.tls_listen_port, f"x509/{tag}/t", "x", qos=1,
            extra=("--cafile", str(tls / "ca.pem"), "--cert", str(stranger.cert),
                   "--key", str(stranger.key)),
        )  # fmt: skip
        assert v3.returncode != 0 and "not authorised" in (v3.stdout + v3.stderr).lower(), (
            v3.stdout + v3.stderr
        )
        # the same TLS listener without a client certificate: anonymous, as on plain TCP
        anonymous = _tls_client(cluster, None)
        assert anonymous.connect().value == 0
        anonymous.close()
    finally:
        for spec in specs:
            await admin.delete(spec.name)


# ---------------------------------------------------------------------- a storm


async def test_a_storm_of_wrong_passwords_does_not_stall_other_clients(
    cluster: LocalCluster, admin: CredentialAdmin
) -> None:
    """Hundreds of CONNECTs with wrong passwords from one address, each another guess (argon2
    checks queue for the node's one password thread, a bounded share of them for one
    address) while another client's PUBLISH round trips keep completing on the same node."""
    node1 = cluster.node_ports[0]
    credential, _password = await basic(admin)
    storm_size = 300
    answers: list[int] = []
    lock = threading.Lock()

    async def one() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", node1)
        try:
            # a guess each: CONNECTs with the same password share one verification
            writer.write(connect_packet(unique("storm"), username=credential.username.encode(),  # type: ignore[union-attr]
                                        password=unique("wrong").encode()))  # fmt: skip
            head = await asyncio.wait_for(reader.readexactly(4), 120)
            with lock:
                answers.append(head[3])
        finally:
            writer.close()

    async def storm() -> None:
        await asyncio.gather(*(one() for _ in range(storm_size)))

    thread = threading.Thread(target=lambda: asyncio.run(storm()), daemon=True)
    thread.start()
    wait_until(lambda: answers, "the first refusal", timeout=60)
    topic = unique("storm/rt")
    async with aio_client(node1, unique("steady")) as steady:
        await steady.subscribe(topic, qos=1)
        for i in range(20):
            await steady.publish(topic, str(i).encode(), qos=1)
            [echo] = await collect(steady, 1)
            assert echo.payload == str(i).encode()
    thread.join(180)
    assert len(answers) == storm_size and set(answers) <= {4, 3}  # bad password, or refused
    # One address holds at most auth_max_pending_per_address checks: the rest of its storm
    # is refused at once (0x9F, v3.1.1 code 3) instead of queueing ahead of other clients.
    assert answers.count(3) >= storm_size - 10 * cluster.settings.auth_max_pending_per_address
