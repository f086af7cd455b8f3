"""The HTTP publish API end to end: messages POSTed to the admin service's
``/api/v1/publish`` (and ``:batch``) with an API key made by ``cormorant api-keys add`` or
an MQTT credential's user name and password reach a paho-mqtt subscriber with their MQTT 5
properties, a retained one reaches a later subscriber; refusals are problems and write
nothing (proven by a marker published after them by the same publisher, which shares
their ``msg.all`` partition: anything written before it would arrive first)."""

from __future__ import annotations

import base64
import json
import queue
from collections.abc import AsyncIterator, Iterator

import paho.mqtt.client as paho
import pytest
import pytest_asyncio
import requests

from services.common.auth.credentials import CredentialType
from services.common.auth.manage import CredentialAdmin, CredentialSpec
from services.common.auth.store import CredentialStore
from services.common.metrics import parse_exposition, total
from services.local import cluster as local_cluster
from services.local import postgres
from tests.commands import run_cormorant
from tests.e2e.admin import admin_api
from tests.e2e.clients import TIMEOUT, PahoClient, unique
from tests.servers import DELAYED_PER_CLIENT, LocalCluster

pytestmark = pytest.mark.cluster

PROBLEM = "application/problem+json"
URN = "urn:cormorant:problem:"


def _url(cluster: LocalCluster, path: str) -> str:
    return f"http://127.0.0.1:{cluster.settings.admin_port}{path}"


def _post(
    cluster: LocalCluster, path: str, body: object, auth: str | None, **params: str
) -> requests.Response:
    headers = {"Content-Type": "application/json"}
    if auth is not None:
        headers["Authorization"] = auth
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return requests.post(_url(cluster, path), data=data, headers=headers, params=params, timeout=30)


def _api_key(cluster: LocalCluster, *rules: str) -> tuple[str, str, str]:
    """A new API key made with ``cormorant api-keys add --json``: its name, client id and
    key."""
    env = local_cluster.child_environment(local_cluster.local_settings(cluster.settings))
    args = [a for rule in rules for a in ("--rule", rule)]
    result = run_cormorant("api-keys", "add", unique("key"), *args, "--json", env=env)
    assert result.returncode == 0, result.stderr
    made = json.loads(result.stdout)
    assert made["key"].startswith("cmk_") and "key_hash" not in made
    return made["name"], made["client_id"], made["key"]


@pytest.fixture
def subscriber(cluster: LocalCluster) -> Iterator[PahoClient]:
    """A paho-mqtt v5 client connected to ingest node 1."""
    client = PahoClient(cluster.node_ports[0], unique("http-sub"))
    assert client.connect().value == 0
    yield client
    client.close()


@pytest_asyncio.fixture(loop_scope="function")
async def admin(cluster: LocalCluster) -> AsyncIterator[CredentialAdmin]:
    """The credentials' management API on the cluster's PostgreSQL."""
    manager = CredentialAdmin(CredentialStore(postgres.dsn(cluster.settings)))
    yield manager
    await manager.close()


def _next(client: PahoClient) -> paho.MQTTMessage:
    try:
        return client.messages.get(timeout=TIMEOUT)
    except queue.Empty:
        raise AssertionError(f"no message within {TIMEOUT} s") from None


def test_http_messages_reach_an_mqtt_subscriber_with_their_properties(
    cluster: LocalCluster, subscriber: PahoClient
) -> None:
    base = unique("http")
    name, client_id, key = _api_key(cluster, f"allow publish {base}/#")
    bearer = f"Bearer {key}"
    assert [c.value for c in subscriber.subscribe(f"{base}/#", 1)] == [1]
    answer = _post(
        cluster,
        "/api/v1/publish",
        {
            "topic": f"{base}/one",
            "payload": "21.5 °C",
            "qos": 1,
            "content_type": "text/plain",
            "payload_format_indicator": True,
            "message_expiry_interval": 3600,
            "response_topic": f"{base}/replies",
            "correlation_data": base64.b64encode(b"\x00req-1").decode(),
            "user_properties": [{"name": "site", "value": "lyon"}, {"name": "site", "value": "2"}],
        },
        bearer,
    )
    assert answer.status_code == 200, answer.text
    assert answer.json() == {
        "topic": f"{base}/one",
        "qos": 1,
        "retain": False,
        "stored": True,
        "delayed_id": None,
    }
    got = _next(subscriber)
    assert (got.topic, got.payload, got.qos) == (f"{base}/one", "21.5 °C".encode(), 1)
    props = got.properties
    assert props is not None
    assert (props.ContentType, props.PayloadFormatIndicator) == ("text/plain", 1)
    assert props.UserProperty == [("site", "lyon"), ("site", "2")]
    assert 3590 <= props.MessageExpiryInterval <= 3600
    assert (props.ResponseTopic, props.CorrelationData) == (f"{base}/replies", b"\x00req-1")

    batch = _post(
        cluster,
        "/api/v1/publish:batch",
        {
            "messages": [
                {"topic": f"{base}/b", "payload": base64.b64encode(b"\xff\x00").decode(),
                 "payload_encoding": "base64"},
                {"topic": f"{base}/kept", "payload": "retained", "retain": True},
            ]
        },
        bearer,
    )  # fmt: skip
    assert batch.status_code == 200, batch.text
    assert [(p["topic"], p["stored"]) for p in batch.json()["published"]] == [
        (f"{base}/b", True),
        (f"{base}/kept", True),
    ]
    assert [(m.topic, m.payload) for m in (_next(subscriber), _next(subscriber))] == [
        (f"{base}/b", b"\xff\x00"),
        (f"{base}/kept", b"retained"),
    ]
    # QoS 0: answered once handed to the producer (202), delivered all the same.
    fire = _post(cluster, "/api/v1/publish", {"topic": f"{base}/q0", "qos": 0}, bearer)
    assert (fire.status_code, fire.json()["stored"]) == (202, False)
    q0 = _next(subscriber)
    assert (q0.topic, q0.payload, q0.qos) == (f"{base}/q0", b"", 0)
    # The retained one went to msg.retained as well: a later subscriber gets it.
    later = PahoClient(cluster.node_ports[1], unique("http-later"))
    assert later.connect().value == 0
    try:
        later.subscribe(f"{base}/kept", 1)
        kept = _next(later)
        assert (kept.topic, kept.payload, kept.retain) == (f"{base}/kept", b"retained", True)
    finally:
        later.close()
    document = requests.get(_url(cluster, "/openapi.json"), timeout=30).json()
    assert {"/api/v1/publish", "/api/v1/publish:batch"} <= set(document["paths"])
    assert client_id == f"http-{name}"
    # Listed (never with its secret) and revoked through the admin API: refused at once.
    api = admin_api(cluster.settings)
    listed = api.get("/api/api-keys")["api_keys"]
    assert [k["client_id"] for k in listed if k["name"] == name] == [client_id]
    assert all("key" not in k and "key_hash" not in k for k in listed)
    assert api.call("DELETE", f"/api/api-keys/{name}").status_code == 204
    revoked = _post(cluster, "/api/v1/publish", {"topic": f"{base}/one"}, bearer)
    assert (revoked.status_code, revoked.headers["content-type"]) == (401, PROBLEM)


def test_a_delayed_http_message_is_authorized_for_its_target_bounded_and_published_later(
    cluster: LocalCluster, subscriber: PahoClient
) -> None:
    base = unique("http-delayed")
    _, _, key = _api_key(cluster, f"allow publish {base}/#")
    bearer = f"Bearer {key}"
    subscriber.subscribe(f"{base}/#", 1)
    # Authorized for its target topic, as over MQTT: no rule names $delayed/.
    denied = _post(cluster, "/api/v1/publish", {"topic": "$delayed/3/elsewhere/x"}, bearer)
    assert (denied.status_code, denied.json()["type"]) == (403, f"{URN}not-authorized")
    delayed = f"$delayed/3/{base}/later"
    later = _post(cluster, "/api/v1/publish", {"topic": delayed, "payload": "later"}, bearer)
    assert later.status_code == 200, later.text
    assert (later.json()["topic"], len(later.json()["delayed_id"])) == (delayed, 48)
    now = _post(cluster, "/api/v1/publish", {"topic": f"{base}/now", "payload": "now"}, bearer)
    assert now.status_code == 200, now.text
    # Not published at once: the message published after it arrives first.
    assert [(m.topic, m.payload) for m in (_next(subscriber), _next(subscriber))] == [
        (f"{base}/now", b"now"),
        (f"{base}/later", b"later"),
    ]
    # Bounded as over MQTT (DELAYED_PER_CLIENT may wait): a batch over it is refused whole.
    too_many = [{"topic": f"$delayed/3600/{base}/x"}] * (DELAYED_PER_CLIENT + 1)
    over = _post(cluster, "/api/v1/publish:batch", {"messages": too_many}, bearer)
    assert (over.status_code, over.json()["type"]) == (429, f"{URN}quota-exceeded")


async def test_refusals_are_problems_and_write_nothing(
    cluster: LocalCluster, subscriber: PahoClient, admin: CredentialAdmin
) -> None:
    base = unique("http-no")
    name, password = unique("http-user"), unique("pw-long-enough")
    await admin.add(
        CredentialSpec(
            name,
            CredentialType.MQTT_BASIC,
            username=name,
            password=password.encode(),
            rules=[f"deny publish {base}/denied/#", f"allow publish {base}/#"],
        )
    )
    basic = "Basic " + base64.b64encode(f"{name}:{password}".encode()).decode()
    wrong = "Basic " + base64.b64encode(f"{name}:not-{password}".encode()).decode()
    subscriber.subscribe(f"{base}/#", 1)
    forbidden_before = _refused(cluster, "forbidden")
    big = "x" * (cluster.settings.max_packet_size + 1)
    unknown_key = "Bearer cmk_" + "0" * 32 + ".not-a-key-of-this-cluster"
    not_utf8 = b'{"topic": "' + base.encode() + b'/x", "payload": "\xff\xfe"}'
    refusals: list[tuple[object, str, int, str]] = [
        ({"topic": f"{base}/+/wild", "payload": "x"}, basic, 400, "topic-invalid"),
        ({"topic": f"{base}/denied/x", "payload": "x"}, basic, 403, "not-authorized"),
        ({"topic": f"{base}/big", "payload": big}, basic, 413, "message-too-large"),
        ({"topic": f"{base}/x", "payload": "x"}, wrong, 401, "unauthenticated"),
        ({"topic": f"{base}/x", "payload": "x"}, unknown_key, 401, "unauthenticated"),
        ({"topic": f"{base}/x", "payload": "\ud800"}, basic, 400, "payload-invalid"),
        (not_utf8, basic, 400, "body-not-utf8"),
    ]
    for body, auth, status, kind in refusals:
        answer = _post(cluster, "/api/v1/publish", body, auth)
        assert (answer.status_code, answer.headers["content-type"]) == (status, PROBLEM), kind
        problem = answer.json()
        assert (problem["type"], problem["status"]) == (f"urn:cormorant:problem:{kind}", status)
        assert problem["detail"]
    # A batch is refused whole, naming the message: its valid first message is not written.
    answer = _post(
        cluster,
        "/api/v1/publish:batch",
        {"messages": [{"topic": f"{base}/ok", "payload": "x"},
                      {"topic": f"{base}/denied/y", "payload": "x"}]},
        basic,
    )  # fmt: skip
    assert (answer.status_code, answer.json()["index"]) == (403, 1)
    assert _refused(cluster, "forbidden") == forbidden_before + 2
    marker = _post(cluster, "/api/v1/publish", {"topic": f"{base}/marker", "payload": "m"}, basic)
    assert marker.status_code == 200, marker.text
    first = _next(subscriber)
    assert (first.topic, first.payload) == (f"{base}/marker", b"m")


def _refused(cluster: LocalCluster, outcome: str) -> float:
    text = requests.get(_url(cluster, "/metrics"), timeout=30).text
    return total(parse_exposition(text), "cormorant_http_publish_requests_total", outcome=outcome)
