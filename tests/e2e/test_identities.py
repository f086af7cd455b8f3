"""Who a client is, end to end (docs/security/identities.md): a session belongs to the
principal that made it, and no other credential (nor an anonymous client) resumes, replaces or
takes it over, on either ingest node; ``${username}`` is the identity authentication bound,
not the User Name a client claims; a credential without rules may do nothing.

Credentials are created with the management API (what ``cormorant credentials`` and the admin
API call) in the cluster's PostgreSQL; the clients are paho-mqtt, aiomqtt and raw sockets.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import AsyncIterator
from functools import partial

import jwt
import pytest
import pytest_asyncio

from services.common.auth.credentials import Credential, CredentialType
from services.common.auth.jwt_auth import JwtSettings
from services.common.auth.manage import CredentialAdmin, CredentialSpec
from services.common.auth.store import CredentialStore
from services.common.kafka.names import TopicNames
from services.common.metrics import parse_exposition, total
from services.common.records import EventKind, decode_event
from services.local import cluster as local_cluster
from services.local import haproxy, postgres
from tests.e2e.clients import (
    TIMEOUT,
    PahoClient,
    RawSocket,
    aio_client,
    connect_packet,
    log_excerpt,
    unique,
    until_marker,
)
from tests.e2e.kafka_view import TopicTail
from tests.servers import LocalCluster
from tests.waiting import wait_until

pytestmark = pytest.mark.cluster

NOT_AUTHORIZED = 0x87
V3_NOT_AUTHORIZED = 0x05


@pytest_asyncio.fixture(loop_scope="function")
async def admin(cluster: LocalCluster) -> AsyncIterator[CredentialAdmin]:
    """The management API on the cluster's PostgreSQL."""
    manager = CredentialAdmin(CredentialStore(postgres.dsn(cluster.settings)))
    yield manager
    await manager.close()


async def basic(admin: CredentialAdmin, rules: list[str]) -> tuple[Credential, str]:
    """A new MQTT_BASIC credential (user name = its name, a 13-character password) with
    ``rules``; returns it and the password."""
    name, password = unique("user"), unique("pw")
    credential = await admin.add(
        CredentialSpec(
            name, CredentialType.MQTT_BASIC, username=name, password=password.encode(), rules=rules
        )
    )
    return credential, password


def _persistent(port: int, client_id: str, credential: Credential, password: str) -> PahoClient:
    """A v5 paho client resuming (Clean Start 0) a session kept an hour."""
    return PahoClient(
        port,
        client_id,
        5,
        clean_start=False,
        session_expiry=3600,
        username=credential.username,
        password=password.encode(),
    )


def _owner_refusals(cluster: LocalCluster, node: int) -> float:
    """``cormorant_mqtt_session_owner_refusals_total`` of ingest node ``node`` (1 or 2)."""
    port = local_cluster.http_ports(cluster.settings)[haproxy.node_name(node)]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        samples = parse_exposition(response.read().decode())
    return total(samples, "cormorant_mqtt_session_owner_refusals_total")


async def test_another_credential_cannot_take_over_a_stored_session(
    cluster: LocalCluster, admin: CredentialAdmin
) -> None:
    node1, node2 = cluster.node_ports
    topic = unique("takeover")
    owner, owner_password = await basic(admin, [f"allow all {topic}/#"])
    intruder, intruder_password = await basic(admin, [f"allow all {unique('elsewhere')}/#"])
    client_id = unique("victim")
    names = TopicNames.from_settings(cluster.settings)

    # V's persistent session with a QoS 1 subscription, then V goes away.
    victim = _persistent(node1, client_id, owner, owner_password)
    assert victim.connect().value == 0
    assert [c.value for c in victim.subscribe(f"{topic}/#", 1)] == [1]
    victim.close()
    # A message stored for V while it is away.
    async with aio_client(node2, unique("pub")) as publisher:
        await publisher.publish(f"{topic}/secret", b"for V only", qos=1)

    refusals_before = _owner_refusals(cluster, 2)
    async with TopicTail.open(cluster.kafka_bootstrap, names.client_events) as events:
        # A, with V's Client Identifier and Clean Start 0, on the other node: refused.
        thief = _persistent(node2, client_id, intruder, intruder_password)
        assert thief.connect().value == NOT_AUTHORIZED
        event = decode_event((await events.next_with_key(client_id.encode())).value)
        assert (event.kind, event.reason_code) == (EventKind.AUTH_FAILED, NOT_AUTHORIZED)
    thief.close()  # the server closed the connection: its network thread has ended
    assert thief.messages.empty()
    # Nor with Clean Start 1 (which would have discarded V's session), nor in MQTT 3.1.1.
    fresh = PahoClient(node1, client_id, 5, username=intruder.username,
                       password=intruder_password.encode())  # fmt: skip
    assert fresh.connect().value == NOT_AUTHORIZED
    fresh.close()
    with RawSocket(node2) as sock:
        user = (intruder.username or "").encode()
        sock.send(connect_packet(client_id, username=user, password=intruder_password.encode()))
        first, body = sock.read_packet()
        assert (first, body[1]) == (0x20, V3_NOT_AUTHORIZED)
    wait_until(
        lambda: _owner_refusals(cluster, 2) >= refusals_before + 2, "node2's refusal counter"
    )

    # V comes back, on either node, and still gets what was stored for it.
    back = _persistent(node2, client_id, owner, owner_password)
    assert back.connect().value == 0
    message = back.messages.get(timeout=TIMEOUT)
    assert (message.topic, message.payload) == (f"{topic}/secret", b"for V only")
    back.close()


async def test_a_connected_owner_is_not_kicked_out_by_another_principal(
    cluster: LocalCluster, admin: CredentialAdmin
) -> None:
    node1, node2 = cluster.node_ports
    topic = unique("held")
    owner, owner_password = await basic(admin, [f"allow all {topic}/#"])
    client_id = unique("held")
    async with aio_client(
        node1, client_id, username=owner.username, password=owner_password
    ) as holder:
        await holder.subscribe(f"{topic}/#", qos=1)
        # Anonymous is a principal of its own: it may not take the credential's session.
        anonymous = PahoClient(node2, client_id, 5)
        assert anonymous.connect().value == NOT_AUTHORIZED
        anonymous.close()
        with RawSocket(node1) as sock:
            sock.send(connect_packet(client_id))
            first, body = sock.read_packet()
            assert (first, body[1]) == (0x20, V3_NOT_AUTHORIZED)
        # The owner is still connected and subscribed: a message and a marker arrive, in order.
        async with aio_client(node2, unique("pub")) as publisher:
            await publisher.publish(f"{topic}/a", b"still here", qos=1)
            await publisher.publish(f"{topic}/a", b"marker", qos=1)
        before = await until_marker(holder, b"marker")
        assert [m.payload for m in before] == [b"still here"]


# ---------------------------------------------------------------------- bound identities


async def test_a_jwt_client_cannot_choose_the_user_name_its_rules_are_built_from(
    cluster: LocalCluster, admin: CredentialAdmin
) -> None:
    # A secret of its own: a token that verifies under another JWT credential's key (test_auth
    # uses a fixed one) is that credential's, and is refused for its audience.
    issuer, secret = unique("issuer"), unique("this issuer's HMAC secret, 32 bytes or more")
    base = unique("secbar")
    await admin.add(
        CredentialSpec(
            issuer,
            CredentialType.JWT,
            rules=[f"allow all {base}/${{username}}/#"],
            jwt=JwtSettings(("HS256",), secret, audience=issuer),
        )
    )
    token = jwt.encode(
        {"aud": issuer, "sub": "alice", "exp": int(time.time()) + 300}, secret, "HS256"
    ).encode()
    node1, node2 = cluster.node_ports

    def accepted_on(port: int) -> bool:
        probe = PahoClient(port, unique("jwt"), username="alice", password=token)
        ok = probe.connect().value == 0
        probe.close()
        return ok

    # Each node learns of the new issuer through the store's change notification: until
    # then its token is refused with 0x86, which is not what this test is about.
    for port in (node1, node2):
        wait_until(partial(accepted_on, port), f"the new JWT credential on port {port}")
    bob = PahoClient(node1, unique("jwt"), username="bob", password=token)
    assert bob.connect().value == NOT_AUTHORIZED
    bob.close()
    alice = PahoClient(node2, unique("jwt"), username="alice", password=token)
    assert alice.connect().value == 0
    assert [c.value for c in alice.subscribe(f"{base}/alice/#", 1)] == [1]
    assert [c.value for c in alice.subscribe(f"{base}/bob/#", 1)] == [NOT_AUTHORIZED]
    alice.close()


# ---------------------------------------------------------------------- deny by default


async def test_a_credential_without_rules_may_do_nothing(
    cluster: LocalCluster, admin: CredentialAdmin
) -> None:
    credential, password = await basic(admin, [])
    client = PahoClient(cluster.mqtt_port, unique("norules"), username=credential.username,
                        password=password.encode())  # fmt: skip
    assert client.connect().value == 0
    assert [c.value for c in client.subscribe("#", 1)] == [NOT_AUTHORIZED]
    mid = client.publish(unique("norules/t"), b"x", 1)
    wait_until(lambda: mid in client.snapshot()[0], "the PUBACK")
    assert client.snapshot()[0][mid].value == NOT_AUTHORIZED
    client.close()
    # The local cluster's anonymous clients are allowed everything, explicitly, and said so.
    for node in (1, 2):
        logged = log_excerpt(cluster.log(haproxy.node_name(node)), "anonymous MQTT clients")
        assert any("['allow all #']" in line for line in logged), logged
