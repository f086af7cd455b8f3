"""The HTTP authentication provider end to end: an ingest node of the test cluster that puts
every CONNECT to a local HTTP endpoint (tests/auth_server.py; failure policy fall_through,
a one-second timeout) and paho-mqtt clients connecting to it. What the endpoint allows gets
in with the answer's rules; what it denies or garbles is refused; when it hangs or is down
the stored credentials decide; its answers are cached; its metrics are served."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest
import pytest_asyncio

from services.common.auth.credentials import CredentialType
from services.common.auth.manage import CredentialAdmin, CredentialSpec
from services.common.auth.store import CredentialStore
from services.common.metrics import parse_exposition, total
from services.local import cluster as local_cluster
from services.local import postgres
from services.local.settings import LocalSettings
from tests.auth_server import SECRET, AuthServer, serve_auth
from tests.e2e.clients import PahoClient, unique
from tests.servers import LocalCluster

pytestmark = pytest.mark.cluster

TIMEOUT_SECONDS = 1.0
NOT_AUTHORIZED = 0x87


@dataclass(frozen=True)
class ProviderNode:
    """The ingest node asking the endpoint: its MQTT port, its /metrics, the endpoint."""

    port: int
    metrics_url: str
    server: AuthServer

    def metric(self, name: str, **labels: str) -> float:
        with urllib.request.urlopen(self.metrics_url, timeout=10) as response:
            return total(parse_exposition(response.read().decode()), name, **labels)


@pytest.fixture(scope="module")
def node(settings: LocalSettings) -> Iterator[ProviderNode]:
    """The provider's ingest node and its endpoint, up for this module."""
    if not all(row.healthy for row in local_cluster.status(settings)):
        local_cluster.up(settings)
    cluster = LocalCluster(settings)
    port = settings.ingest_base_port + 93  # free in this session's block (others: 90-92)
    http_port = local_cluster.free_port()
    with serve_auth() as server:
        cluster.start_extra(
            "ingest-http-auth",
            "ingest",
            port,
            node_id="httpauth",
            mqtt_port=str(port),
            http_port=str(http_port),
            auth_http_url=server.url,
            auth_http_secret=SECRET,
            auth_http_timeout_seconds=str(TIMEOUT_SECONDS),
            auth_http_failure_policy="fall_through",
        )
        try:
            yield ProviderNode(port, f"http://127.0.0.1:{http_port}/metrics", server)
        finally:
            cluster.stop_extra("ingest-http-auth")


@pytest_asyncio.fixture(loop_scope="function")
async def admin(cluster: LocalCluster) -> AsyncIterator[CredentialAdmin]:
    """The credentials' management API on the cluster's PostgreSQL."""
    manager = CredentialAdmin(CredentialStore(postgres.dsn(cluster.settings)))
    yield manager
    await manager.close()


def _connack(
    port: int, username: str, password: bytes = b"any-password", client_id: str | None = None
) -> int:
    client = PahoClient(
        port, client_id or unique("http-auth"), username=username, password=password
    )
    try:
        return client.connect().value
    finally:
        client.close()


def test_the_endpoint_decides_who_connects_and_with_which_rules(node: ProviderNode) -> None:
    base = unique("e2e/http-auth")
    node.server.rules = [f"allow publish {base}/${{username}}/#"]
    username, client_id = unique("allow"), unique("http-auth")
    client = PahoClient(node.port, client_id, username=username, password=b"pw")
    assert client.connect().value == 0
    try:
        allowed = client.publish(f"{base}/{username}/t", b"x", 1)
        denied = client.publish(f"{base}/someone-else/t", b"x", 1)
        deadline = time.monotonic() + 15
        while len(client.snapshot()[0]) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        acks = client.snapshot()[0]
        assert (acks[allowed].value, acks[denied].value) == (0, NOT_AUTHORIZED)
    finally:
        client.close()
    hits = node.metric("cormorant_auth_http_cache_hits_total", result="allow")
    assert _connack(node.port, username, b"pw", client_id) == 0  # from the cache
    assert node.server.count(username) == 1
    assert node.metric("cormorant_auth_http_cache_hits_total", result="allow") == hits + 1
    assert _connack(node.port, unique("deny")) == 0x86  # Bad User Name or Password
    assert _connack(node.port, unique("garbage")) == NOT_AUTHORIZED
    assert node.server.bad_signatures == 0
    assert node.metric("cormorant_auth_http_requests_total", outcome="malformed") >= 1


async def test_when_the_endpoint_hangs_or_is_down_the_stored_credentials_decide(
    node: ProviderNode, admin: CredentialAdmin
) -> None:
    name, password = unique("hang-stored"), unique("pw-long-enough")
    await admin.add(
        CredentialSpec(
            name, CredentialType.MQTT_BASIC, username=name, password=password.encode(),
            rules=["allow all #"],
        )
    )  # fmt: skip
    started = time.monotonic()
    assert _connack(node.port, name, password.encode()) == 0  # timed out, fell through
    assert time.monotonic() - started >= TIMEOUT_SECONDS
    assert _connack(node.port, unique("hang-unknown")) == 0x86
    assert node.metric("cormorant_auth_http_requests_total", outcome="timeout") >= 2
    # Down (last: the module's endpoint stays down): refused connections, same policy.
    node.server.stop()
    errors = node.metric("cormorant_auth_http_requests_total", outcome="error")
    assert _connack(node.port, name, password.encode(), unique("after-down")) == 0
    assert _connack(node.port, unique("allow")) == 0x86  # no stored credential of it
    # At least one request each: a node checks a CONNECT again when the credential that let
    # it in changed while it was checked (this test made it just now).
    assert node.metric("cormorant_auth_http_requests_total", outcome="error") >= errors + 2
