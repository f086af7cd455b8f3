"""The admin API end to end on the test cluster: log in, see a client's session, disconnect
it and see the client disconnected; delete sessions and retained messages; every change
audited; no call without a valid token."""

from __future__ import annotations

import pytest
import requests

from services.local.settings import LocalSettings
from tests.e2e.admin import AdminApi, admin_api, login, running
from tests.e2e.clients import PahoClient, aio_client, unique
from tests.servers import LocalCluster
from tests.waiting import wait_for, wait_until

pytestmark = pytest.mark.cluster

NOT_AUTHORIZED = 0x87

#: Seconds a change may take to reach the admin API through Kafka's state topics (a busy,
#: shared machine can take several).
STATE_SECONDS = 30.0


@pytest.fixture(scope="module")
def api(settings: LocalSettings) -> AdminApi:
    """A logged-in admin user of the running test cluster, made with ``cormorant
    admin-users add`` (the command's proof)."""
    return admin_api(running(settings), cli=True)


def session_of(api: AdminApi, client_id: str) -> dict[str, object] | None:
    page = api.get("/api/sessions", search=client_id)
    return next((item for item in page["items"] if item["client_id"] == client_id), None)


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer not-a-token"}, {"Authorization": "Basic YWRtaW46YWRtaW4="}],
    ids=["no token", "wrong token", "not bearer"],
)
@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/api/sessions"),
        ("GET", "/api/cluster"),
        ("GET", "/api/stats"),
        ("GET", "/api/retained"),
        ("GET", "/api/audit"),
        ("POST", "/api/sessions/someone/disconnect"),
        ("DELETE", "/api/sessions/someone"),
        ("DELETE", "/api/retained?topic=a/b"),
        ("GET", "/api/delayed"),
        ("DELETE", "/api/delayed/" + "0" * 48),
        ("GET", "/api/admin-users"),
        ("POST", "/api/admin-users"),
        ("PUT", "/api/admin-users/someone/password"),
        ("DELETE", "/api/admin-users/someone"),
        ("GET", "/api/credentials"),
        ("POST", "/api/credentials"),
        ("GET", "/api/credentials/someone"),
        ("PATCH", "/api/credentials/someone"),
        ("DELETE", "/api/credentials/someone"),
        ("POST", "/api/credentials:import"),
        ("GET", "/api/credentials:export"),
    ],
)
def test_calls_without_a_valid_token_are_refused(
    api: AdminApi, method: str, path: str, headers: dict[str, str]
) -> None:
    response = requests.request(method, api.url + path, headers=headers, timeout=30)
    assert response.status_code == 401, response.text
    assert response.headers["WWW-Authenticate"] == "Bearer"


def test_a_wrong_password_gets_no_token_and_is_audited(api: AdminApi) -> None:
    response = requests.post(
        api.url + "/api/login", json={"username": api.username, "password": "wrong"}, timeout=30
    )
    assert response.status_code == 401
    assert "token" not in response.json()
    [entry] = [
        e
        for e in api.get("/api/audit", limit=20)["items"]
        if e["action"] == "login" and e["username"] == api.username and e["status"] == 401
    ]
    assert entry["target"] == api.username


def test_a_revoked_token_is_refused(settings: LocalSettings, api: AdminApi) -> None:
    other = admin_api(settings)
    assert other.call("POST", "/api/logout").status_code == 204
    assert other.call("GET", "/api/sessions").status_code == 401


async def test_a_client_is_listed_then_disconnected_through_the_api(
    cluster: LocalCluster, api: AdminApi
) -> None:
    client_id = unique("admin-client")
    topic = unique("admin/topic")
    client = PahoClient(cluster.mqtt_port, client_id, version=5, session_expiry=600)
    assert client.connect() == 0
    try:
        client.subscribe(topic, 1)
        await wait_for(lambda: session_of(api, client_id), "the session in the API", STATE_SECONDS)
        summary = session_of(api, client_id)
        assert summary is not None
        assert summary["connected"] is True and summary["persistent"] is True
        assert summary["protocol_version"] == "5.0" and summary["kind"] == "DEVICE"
        assert summary["node_id"] in ("node1", "node2")
        assert str(summary["client_address"]).startswith("127.0.0.1:")
        detail = api.get(f"/api/sessions/{client_id}")
        assert [s["topic_filter"] for s in detail["subscription_list"]] == [topic]
        assert detail["stored_messages"] == 0
        assert detail["session_expiry_interval"] == 600
        assert detail["kept_seconds"] == 600  # no server maximum in the test cluster

        response = api.call("POST", f"/api/sessions/{client_id}/disconnect")
        assert response.status_code == 202, response.text
        assert response.json()["detail"]["node_id"] == summary["node_id"]
        wait_until(lambda: client.snapshot()[1], "the client disconnected")
        [reason] = client.snapshot()[1]
        assert reason.value == 0x98  # Administrative action
    finally:
        client.close()
    # Persistent: the session stays, disconnected, with its subscription.
    await wait_for(
        lambda: (s := session_of(api, client_id)) is not None and s["connected"] is False,
        "the session shown disconnected",
        STATE_SECONDS,
    )
    assert api.call("POST", f"/api/sessions/{client_id}/disconnect").status_code == 409
    entries = [e for e in api.get("/api/audit", limit=50)["items"] if e["target"] == client_id]
    assert [(e["action"], e["username"], e["status"]) for e in entries] == [
        ("disconnect", api.username, 409),  # newest first
        ("disconnect", api.username, 202),
    ]


async def test_deleting_a_connected_session_ends_it(cluster: LocalCluster, api: AdminApi) -> None:
    client_id = unique("admin-delete")
    client = PahoClient(cluster.mqtt_port, client_id, version=5, session_expiry=600)
    assert client.connect() == 0
    try:
        client.subscribe(unique("admin/gone"), 1)
        await wait_for(lambda: session_of(api, client_id), "the session in the API", STATE_SECONDS)
        assert api.call("DELETE", f"/api/sessions/{client_id}").status_code == 202
        wait_until(lambda: client.snapshot()[1], "the client disconnected")
    finally:
        client.close()
    await wait_for(lambda: session_of(api, client_id) is None, "the session gone", STATE_SECONDS)
    assert api.call("GET", f"/api/sessions/{client_id}").status_code == 404
    assert api.get("/api/subscriptions", client_id=client_id)["total"] == 0


async def test_deleting_a_disconnected_session(cluster: LocalCluster, api: AdminApi) -> None:
    client_id = unique("admin-offline")
    # One persistent connection (Clean Session 0) from the start: a non-persistent one
    # before it would end with tombstones that may land after the persistent one's
    # records (another node writes them), ending the new session too.
    paho = PahoClient(cluster.mqtt_port, client_id, version=4, clean_start=False)
    assert paho.connect() == 0
    paho.subscribe(unique("admin/offline"), 1)
    paho.close()
    await wait_for(
        lambda: (s := session_of(api, client_id)) is not None and s["connected"] is False,
        "the persistent session, disconnected",
        STATE_SECONDS,
    )
    assert api.call("DELETE", f"/api/sessions/{client_id}").status_code == 202
    await wait_for(lambda: session_of(api, client_id) is None, "the session gone", STATE_SECONDS)
    assert api.call("DELETE", f"/api/sessions/{client_id}").status_code == 404


async def test_retained_messages_are_browsed_and_deleted(
    cluster: LocalCluster, api: AdminApi
) -> None:
    base = unique("admin-retained")
    async with aio_client(cluster.mqtt_port, unique("pub")) as pub:
        await pub.publish(f"{base}/a", b"21.5", qos=1, retain=True)
        await pub.publish(f"{base}/b", bytes([0xFF, 0x00]), qos=1, retain=True)

    def listed() -> list[dict[str, object]]:
        items: list[dict[str, object]] = api.get("/api/retained", filter=f"{base}/+")["items"]
        return items

    await wait_for(lambda: len(listed()) == 2, "both retained messages listed", STATE_SECONDS)
    first, second = listed()
    assert (first["topic"], first["payload"], first["payload_encoding"]) == (
        f"{base}/a",
        "21.5",
        "utf-8",
    )
    assert (second["payload"], second["payload_encoding"]) == ("/wA=", "base64")
    assert api.call("GET", "/api/retained", params={"filter": "a/#/b"}).status_code == 422
    response = api.call("DELETE", "/api/retained", params={"topic": f"{base}/a"})
    assert response.status_code == 202
    await wait_for(
        lambda: [m["topic"] for m in listed()] == [f"{base}/b"], "a/ deleted", STATE_SECONDS
    )


def test_cluster_lists_every_service_ready(cluster: LocalCluster, api: AdminApi) -> None:
    services = {s["name"]: s for s in api.get("/api/cluster")["services"]}
    assert set(services) == {
        "ingest-node1",
        "ingest-node2",
        "router",
        "device-persist",
        "app-delivery",
        "integrations-stage",
    }
    for name, service in services.items():
        assert service["alive"] and service["ready"], (name, service)
        assert service["version"]
    assert services["ingest-node1"]["node_id"] == "node1"
    assert isinstance(services["router"]["lag"], int)


async def test_stats_count_the_connections(cluster: LocalCluster, api: AdminApi) -> None:
    def connections() -> int:
        current = api.get("/api/stats")["current"]
        return int(current["connections"])

    await wait_for(lambda: connections() == 0, "no connection left by earlier tests", 20)
    async with (
        aio_client(cluster.mqtt_port, unique("stats-a")),
        aio_client(cluster.mqtt_port, unique("stats-b")),
    ):
        await wait_for(lambda: connections() == 2, "two connections in the stats", 20)
    stats = api.get("/api/stats")
    assert stats["interval_seconds"] > 0 and len(stats["history"]) >= 2


def test_docs_page_loads_its_assets_from_the_admin_service(api: AdminApi) -> None:
    page = requests.get(api.url + "/docs", timeout=30)
    assert page.status_code == 200
    assert "/docs/assets/swagger-ui-bundle.js" in page.text
    assert "cdn" not in page.text.lower() and "https://" not in page.text
    for asset in ("swagger-ui-bundle.js", "swagger-ui.css"):
        assert requests.get(f"{api.url}/docs/assets/{asset}", timeout=30).status_code == 200
    schema = requests.get(api.url + "/openapi.json", timeout=30).json()
    assert "/api/sessions/{client_id}/disconnect" in schema["paths"]
    assert "/api/delayed/{delayed_id}" in schema["paths"]


def test_admin_users_are_managed_through_the_api(api: AdminApi) -> None:
    name = unique("ops")
    first, second = "first password of ops", "second password of ops"
    created = api.call("POST", "/api/admin-users", json={"username": name, "password": first})
    assert created.status_code == 201, created.text
    assert name in created.json()["usernames"] and api.username in created.json()["usernames"]
    # Refused with a reason: a taken name, a short password, a name that is no name.
    taken = api.call("POST", "/api/admin-users", json={"username": name, "password": first})
    assert (taken.status_code, taken.json()["detail"]) == (409, f"user {name!r} exists already")
    short = api.call("POST", "/api/admin-users", json={"username": name + "x", "password": "short"})
    assert short.status_code == 422
    bad = api.call("POST", "/api/admin-users", json={"username": "a b", "password": first})
    assert bad.status_code == 422
    # The new user logs in; a password change revokes its token.
    theirs = AdminApi(api.url, name, login(api.url, name, first))
    assert theirs.call("GET", "/api/admin-users").status_code == 200
    changed = api.call("PUT", f"/api/admin-users/{name}/password", json={"password": second})
    assert changed.status_code == 204, changed.text
    assert theirs.call("GET", "/api/sessions").status_code == 401
    theirs = AdminApi(api.url, name, login(api.url, name, second))
    # Nobody removes itself (someone must be left to log in); another user can.
    itself = theirs.call("DELETE", f"/api/admin-users/{name}")
    assert itself.status_code == 409
    assert api.call("DELETE", f"/api/admin-users/{name}").status_code == 204
    assert theirs.call("GET", "/api/sessions").status_code == 401
    assert name not in api.get("/api/admin-users")["usernames"]
    gone = api.call("PUT", f"/api/admin-users/{name}/password", json={"password": second})
    assert (gone.status_code, gone.json()["detail"]) == (404, f"no user {name!r}")
    assert api.call("DELETE", f"/api/admin-users/{name}").status_code == 404
    # Every change audited, and no password anywhere in the trail.
    trail = [e for e in api.get("/api/audit", limit=50)["items"] if e["target"] == name]
    actions = [(e["username"], e["action"], e["status"]) for e in reversed(trail)]
    assert [a for a in actions if a[1] != "login"] == [
        (api.username, "add-admin-user", 201),
        (api.username, "add-admin-user", 409),
        (api.username, "set-admin-password", 204),
        (name, "remove-admin-user", 409),
        (api.username, "remove-admin-user", 204),
        (api.username, "set-admin-password", 404),
        (api.username, "remove-admin-user", 404),
    ]
    assert first not in str(trail) and second not in str(trail)


def connect_with(port: int, username: str, password: str) -> tuple[int, PahoClient]:
    """A v5 paho client of user ``username``: CONNACK's Reason Code, and the client (open
    if it was accepted)."""
    client = PahoClient(port, unique("cred-dev"), username=username, password=password.encode())
    code = client.connect().value
    if code != 0:
        client.close()
    return code, client


def refused_with(port: int, username: str, password: str) -> int:
    """CONNACK's Reason Code for user ``username``'s CONNECT (closed whatever it is)."""
    code, client = connect_with(port, username, password)
    client.close()
    return code


def test_a_credential_made_through_the_api_connects_and_its_rules_apply(
    cluster: LocalCluster, api: AdminApi
) -> None:
    name = unique("api-user")
    password = unique("api-pw")
    # Bad User Name or Password: no such credential yet.
    assert refused_with(cluster.mqtt_port, name, password) == 0x86
    body = {
        "name": name,
        "type": "MQTT_BASIC",
        "username": name,
        "password": password,
        "rules": [{"permission": "allow", "action": "all", "topic": "api/${username}/#"}],
    }
    created = api.call("POST", "/api/credentials", json=body)
    assert created.status_code == 201, created.text
    view = created.json()
    assert (view["name"], view["username"], view["password"], view["enabled"]) == (
        name,
        name,
        "set",
        True,
    )
    assert view["rules"] == body["rules"] and password not in created.text
    assert api.call("POST", "/api/credentials", json=body).status_code == 409
    # Valid JSON, but not a credential: an MQTT_BASIC credential names a user or a client.
    nameless = api.call(
        "POST", "/api/credentials", json={"name": unique("x"), "type": "MQTT_BASIC"}
    )
    assert nameless.status_code == 422 and "client id or a user name" in nameless.text
    bad_rule = {**body, "name": unique("x"), "rules": [{**body["rules"][0], "topic": "a/#/b"}]}
    assert api.call("POST", "/api/credentials", json=bad_rule).status_code == 422
    listed = api.get("/api/credentials", type="MQTT_BASIC")["credentials"]
    assert name in [c["name"] for c in listed]
    # A generated secret: answered once, stored as a salted HMAC-SHA-256.
    device = unique("api-dev")
    generated = api.call("POST", "/api/credentials", json={
        "name": device, "type": "MQTT_BASIC", "username": device, "generate_secret": True,
    })  # fmt: skip
    assert generated.status_code == 201, generated.text
    secret = generated.json()["secret"]
    assert len(secret) == 43 and generated.json()["password_scheme"] == "hmac-sha256"
    shown = api.call("GET", f"/api/credentials/{device}")
    assert shown.json()["secret"] is None and secret not in shown.text
    wait_until(lambda: refused_with(cluster.mqtt_port, device, secret) == 0, "secret accepted")
    assert refused_with(cluster.mqtt_port, device, secret[:-2]) == 0x86

    # The ingest nodes hear of it within a second: connect with it through HAProxy.
    clients: list[PahoClient] = []

    def accepted() -> bool:
        code, client = connect_with(cluster.mqtt_port, name, password)
        if code == 0:
            clients.append(client)
        return code == 0

    wait_until(accepted, "a CONNECT with the new credential accepted")
    [client] = clients
    try:
        assert [c.value for c in client.subscribe(f"api/{name}/#", 1)] == [1]
        assert [c.value for c in client.subscribe("elsewhere/#", 1)] == [NOT_AUTHORIZED]
        assert refused_with(cluster.mqtt_port, name, "wrong password") == 0x86

        changed = api.call("PATCH", f"/api/credentials/{name}", json={"enabled": False})
        assert changed.status_code == 200, changed.text
        assert changed.json()["enabled"] is False
        # Disabled: its client is disconnected (Administrative action), and stays out.
        wait_until(lambda: client.snapshot()[1], "the client of the disabled credential cut off")
        assert [reason.value for reason in client.snapshot()[1]] == [0x98]
    finally:
        client.close()
    wait_until(  # Banned, by both nodes (each hears of the change within a second)
        lambda: all(refused_with(port, name, password) == 0x8A for port in cluster.node_ports),
        "the disabled credential's CONNECTs refused with Banned",
    )

    assert api.call("DELETE", f"/api/credentials/{name}").status_code == 204
    assert api.call("GET", f"/api/credentials/{name}").status_code == 404
    assert api.call("DELETE", f"/api/credentials/{name}").status_code == 404
    trail = [e for e in api.get("/api/audit", limit=50)["items"] if e["target"] == name]
    assert [(e["action"], e["status"]) for e in reversed(trail)] == [
        ("add-credential", 201),
        ("add-credential", 409),
        ("change-credential", 200),
        ("delete-credential", 204),
        ("delete-credential", 404),
    ]
    assert password not in str(trail)


def test_a_jwks_credential_is_made_through_the_api_with_an_https_url_only(api: AdminApi) -> None:
    url = "https://idp.example/.well-known/jwks.json"
    jwt_body = {"algorithms": ["RS256"], "jwks_url": url, "audience": "mqtt"}
    body = {"name": unique("api-jwks"), "type": "JWT", "jwt": jwt_body}
    plain = {**body, "jwt": {**jwt_body, "jwks_url": "http://idp.example/jwks.json"}}
    refused = api.call("POST", "/api/credentials", json=plain)
    assert refused.status_code == 422 and "must be https://" in refused.text
    keyless = {**body, "jwt": {"algorithms": ["RS256"], "audience": "mqtt"}}
    refused = api.call("POST", "/api/credentials", json=keyless)
    assert refused.status_code == 422 and "needs a key or a JWKS URL" in refused.text
    created = api.call("POST", "/api/credentials", json=body)
    assert created.status_code == 201, created.text
    view = created.json()["jwt"]
    assert (view["jwks_url"], view["key"], view["audience"]) == (url, "", "mqtt")
    assert api.call("DELETE", f"/api/credentials/{body['name']}").status_code in (200, 204)
