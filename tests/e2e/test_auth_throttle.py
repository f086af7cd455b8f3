"""MQTT authentication under attack, end to end (and SCRAM's answer to an unknown user, the
same from every node): wrong passwords from one source address to a node are answered 0x86
up to the cluster's ``auth_failure_limit``, then 0x9F Connection rate exceeded (v3.1.1: 3),
then the address is banned (0x8A; v3.1.1: 5); a client of another address connects
meanwhile.

The attacker is a loopback address of its own (127.x.y.z): the test cluster exempts
127.0.0.1, where the other tests' clients come from (tests/servers.py)."""

from __future__ import annotations

import random
import socket

import pytest
import pytest_asyncio
from scramp import ScramClient

from services.common.auth.credentials import CredentialType
from services.common.auth.manage import CredentialAdmin, CredentialSpec
from services.common.auth.scram import ITERATIONS
from services.common.auth.store import CredentialStore
from services.local import postgres
from tests.e2e.clients import (
    TIMEOUT,
    RawSocket,
    connect_packet,
    enhanced_connect_packet,
    reason_and_properties,
    unique,
)
from tests.servers import LocalCluster

pytestmark = pytest.mark.cluster


@pytest_asyncio.fixture(loop_scope="function")
async def credential(cluster: LocalCluster) -> tuple[str, str]:
    """A new MQTT_BASIC credential: its user name and password."""
    manager = CredentialAdmin(CredentialStore(postgres.dsn(cluster.settings)))
    name, password = unique("user"), unique("password")
    try:
        await manager.add(
            CredentialSpec(
                name,
                CredentialType.MQTT_BASIC,
                username=name,
                password=password.encode(),
                rules=["allow all #"],
            )
        )
    finally:
        await manager.close()
    return name, password


def connack(port: int, source: str, level: int, username: str, password: str) -> int:
    """The Reason Code (v5) or return code (v3.1.1) of a CONNECT from address ``source``."""
    sock = socket.create_connection(("127.0.0.1", port), TIMEOUT, source_address=(source, 0))
    raw = RawSocket.__new__(RawSocket)
    raw.sock = sock
    with raw:
        raw.send(connect_packet(unique("c"), level=level, username=username.encode(),
                                password=password.encode()))  # fmt: skip
        kind, body = raw.read_packet()
        assert kind == 0x20, kind
        return body[1]


async def test_wrong_passwords_from_one_address_are_throttled_then_banned(
    cluster: LocalCluster, credential: tuple[str, str]
) -> None:
    settings = cluster.settings
    attacker = f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(2, 254)}"
    port = cluster.node_ports[0]  # each node counts its own (HAProxy would spread them)
    username, password = credential
    answers = [
        connack(port, attacker, 5, unique("nobody"), "guess")
        for _ in range(settings.auth_failure_limit)
    ]
    assert answers == [0x86] * settings.auth_failure_limit
    assert connack(port, attacker, 5, unique("nobody"), "guess") == 0x9F
    assert connack(port, attacker, 4, unique("nobody"), "guess") == 3
    # The right password from the attacker's address is not even checked...
    assert connack(port, attacker, 5, username, password) == 0x9F
    # ...another address connects with it...
    assert connack(port, "127.0.0.1", 5, username, password) == 0
    # ...and the refused attempts keep counting until the address is banned.
    refused = settings.auth_failure_limit + 3
    answers = [
        connack(port, attacker, 5, unique("nobody"), "guess")
        for _ in range(settings.auth_failure_ban_after - refused)
    ]
    assert answers == [0x9F] * (settings.auth_failure_ban_after - refused)
    assert connack(port, attacker, 5, username, password) == 0x8A
    assert connack(port, attacker, 4, username, password) == 5
    assert connack(port, "127.0.0.1", 4, username, password) == 0


@pytest.mark.parametrize("method", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_an_unknown_scram_user_gets_the_same_salt_from_every_node(
    cluster: LocalCluster, method: str
) -> None:
    user = unique("ghost")

    def server_first(port: int) -> str:
        scram = ScramClient([method], user, "any password")
        with RawSocket(port) as sock:
            sock.send(enhanced_connect_packet(unique("scram"), method,
                                              scram.get_client_first().encode()))  # fmt: skip
            code, props = reason_and_properties(*sock.read_packet())
        assert code == 0x18
        salt, iterations = props.AuthenticationData.decode().split(",")[1:3]
        return f"{salt},{iterations}"

    ports = cluster.node_ports
    answers = {server_first(port) for port in (*ports, *ports)}
    assert len(ports) >= 2 and len(answers) == 1, answers
    assert answers.pop().endswith(f",i={ITERATIONS[method]}")
