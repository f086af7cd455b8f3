"""The web console as a person uses it, in a real headless Chromium (Debian's ``chromium``
driven by Playwright) against the test cluster: log in, read the connection count after
clients connect, find a client's session and disconnect it, browse retained messages, make
MQTT credentials of every type and reset a password a client then connects with, read the
infrastructure's health, talk MQTT over WebSocket from the page, follow and disable
integrations.

Each page's screenshot is taken (and must stay small); with ``CORMORANT_SCREENSHOTS=1`` it
is also written to ``docs/console-<page>.png``, the pictures of docs/operations/console.md."""

from __future__ import annotations

import asyncio
import json
import os
import re
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from playwright.sync_api import Browser, Dialog, Locator, Page, expect

from services.common.kafka.admin import TopicSpec, ensure_topics
from services.common.kafka.names import TopicNames
from services.local import cluster as local_cluster
from services.local.settings import LocalSettings
from tests.browser import chromium
from tests.e2e.admin import (
    AdminApi,
    admin_api,
    csp_violations,
    open_console,
    running,
)
from tests.e2e.clients import PahoClient, unique
from tests.servers import LocalCluster
from tests.waiting import wait_until

pytestmark = pytest.mark.cluster

#: Milliseconds the page may take to show a figure (the console polls every 2 s).
SHOW_MS = 15_000

DOCS = Path(__file__).resolve().parents[2] / "docs"

#: Milliseconds for a new integration's first message to reach its sink (its runner joins
#: its consumer group first).
SINK_MS = 90_000

#: Bytes a page's screenshot may take (the docs site keeps them).
SCREENSHOT_BYTES = 300_000

#: A time as the console shows it: ISO 8601 with the UTC offset.
ISO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d")


def screenshot(page: Page, name: str) -> None:
    """Take the page's screenshot: small enough for the docs, and written to
    ``docs/console-<name>.png`` when ``CORMORANT_SCREENSHOTS`` is 1."""
    picture = page.screenshot()
    assert len(picture) < SCREENSHOT_BYTES, (name, len(picture))
    if os.environ.get("CORMORANT_SCREENSHOTS") == "1":
        (DOCS / f"console-{name}.png").write_bytes(picture)


@pytest.fixture(scope="module")
def api(settings: LocalSettings) -> AdminApi:
    """A logged-in admin user of the running test cluster."""
    return admin_api(running(settings))


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's Chromium, headless."""
    with chromium() as found:
        yield found


@pytest.fixture
def page(browser: Browser, api: AdminApi) -> Iterator[Page]:
    """The console, logged in through its form (:func:`open_console`)."""
    with open_console(browser, api) as page:
        yield page


def test_a_wrong_password_is_told(browser: Browser, api: AdminApi) -> None:
    page = browser.new_page()
    page.goto(api.url + "/")
    page.fill("#login-username", api.username)
    page.fill("#login-password", "not the password")
    page.click("#login-form button[type=submit]")
    expect(page.locator("#login-error")).to_have_text("Wrong user name or password.")
    expect(page.locator("#nav")).to_be_hidden()
    page.close()


def test_overview_shows_the_connection_count(cluster: LocalCluster, page: Page) -> None:
    before = cluster.connections()
    clients = [PahoClient(cluster.mqtt_port, unique("console")) for _ in range(3)]
    try:
        for client in clients:
            assert client.connect() == 0
        wait_until(lambda: cluster.connections() == before + 3, "three more connections")
        expect(page.locator("#connections")).to_have_text(str(before + 3), timeout=SHOW_MS)
        # Two ingest nodes, the router, device_persist, app_delivery, the integrations stage.
        expect(page.locator("#tile-ready")).to_have_text("6 / 6")
        expect(page.locator("#services tbody tr")).to_have_count(6)
        expect(page.locator("#chart-connections .u-legend .u-label").nth(1)).to_have_text(
            "connections"
        )
        expect(page.locator("#chart-lag canvas")).to_have_count(1)
        screenshot(page, "overview")
    finally:
        for client in clients:
            client.close()
    wait_until(lambda: cluster.connections() == before, "the clients gone")
    expect(page.locator("#connections")).to_have_text(str(before), timeout=SHOW_MS)


def test_a_session_is_found_and_disconnected(cluster: LocalCluster, page: Page) -> None:
    client_id = unique("console-find")
    client = PahoClient(cluster.mqtt_port, client_id, version=5, session_expiry=300)
    assert client.connect() == 0
    try:
        client.subscribe("console/sensors/#", 1)
        page.click("#nav a[data-view=sessions]")
        page.fill("#sessions-search", client_id)
        page.click("#sessions-form button[type=submit]")
        row = page.locator("#sessions tbody tr", has_text=client_id)
        expect(row).to_contain_text("connected", timeout=SHOW_MS)
        expect(row).to_contain_text("5.0")
        expect(row).to_contain_text(ISO_TIME)
        screenshot(page, "sessions")
        row.get_by_role("link", name=client_id).click()
        expect(page.locator("#session-title")).to_have_text(client_id)
        expect(page.locator("#session-subscriptions")).to_contain_text("console/sensors/#")
        expect(page.locator("#session-facts")).to_contain_text(re.compile(r"127\.0\.0\.1:\d+"))
        expect(page.locator("#session-facts")).to_contain_text("Receive Maximum")
        screenshot(page, "session")
        page.once("dialog", lambda dialog: dialog.accept())
        page.click("#session-disconnect")
        expect(page.locator("#session-message")).to_have_text("Disconnect sent.")
        wait_until(lambda: client.snapshot()[1], "the client disconnected")
        assert client.snapshot()[1][0].value == 0x98
        expect(page.locator("#session-facts")).to_contain_text("disconnected", timeout=SHOW_MS)
    finally:
        client.close()


def test_retained_messages_are_browsed(cluster: LocalCluster, page: Page) -> None:
    topic = unique("console-retained") + "/temp"
    publisher = PahoClient(cluster.mqtt_port, unique("console-pub"))
    assert publisher.connect() == 0
    try:
        mid = publisher.client.publish(topic, b"21.5", 1, retain=True).mid
        wait_until(lambda: mid in publisher.snapshot()[0], "PUBACK")
    finally:
        publisher.close()
    page.click("#nav a[data-view=retained]")
    page.fill("#retained-filter", topic.split("/")[0] + "/+")
    page.click("#retained-form button[type=submit]")
    expect(page.locator("#retained tbody tr", has_text=topic)).to_contain_text(
        "21.5", timeout=SHOW_MS
    )
    screenshot(page, "retained")


def test_an_admin_user_added_in_the_console_logs_in(api: AdminApi, page: Page) -> None:
    name, password = unique("console-admin"), "a password for the console"
    page.click("#nav a[data-view=users]")
    expect(page.locator("#users tbody")).to_contain_text(f"{api.username} (you)")
    page.fill("#users-add-username", name)
    page.fill("#users-add-password", password)
    page.click("#users-add-form button[type=submit]")
    expect(page.locator("#users-message")).to_have_text(f"{name} added.")
    expect(page.locator("#users tbody tr", has_text=name)).to_have_count(1)
    # Another user, made through the API, that the new one will remove.
    victim = unique("console-victim")
    created = api.call("POST", "/api/admin-users", json={"username": victim, "password": password})
    assert created.status_code == 201, created.text
    page.click("#logout")
    page.fill("#login-username", name)
    page.fill("#login-password", password)
    page.click("#login-form button[type=submit]")
    expect(page.locator("#username")).to_have_text(name)
    # As that user: another user is removed; itself, it cannot remove.
    page.click("#nav a[data-view=users]")
    mine = page.locator("#users tbody tr", has_text=f"{name} (you)")
    expect(mine.get_by_role("button", name="Remove")).to_be_disabled()
    page.once("dialog", lambda dialog: dialog.accept())
    page.locator("#users tbody tr", has_text=victim).get_by_role("button", name="Remove").click()
    expect(page.locator("#users-message")).to_have_text(f"{victim} removed.")
    expect(page.locator("#users tbody tr", has_text=victim)).to_have_count(0)
    assert victim not in api.get("/api/admin-users")["usernames"]


def test_a_credential_created_in_the_console_connects(cluster: LocalCluster, page: Page) -> None:
    name, password = unique("console-cred"), "the device's password"
    page.click("#nav a[data-view=credentials]")
    page.fill("#credential-name", name)
    page.select_option("#credential-type", "MQTT_BASIC")
    page.fill("#credential-username", name)
    page.fill("#credential-password", password)
    page.fill("#credential-rules", "allow all console/${username}/#\ndeny all #")
    page.click("#credentials-add-form button[type=submit]")
    expect(page.locator("#credentials-message")).to_have_text(
        f"{name} created: clients may connect with it."
    )
    row = page.locator("#credentials tbody tr", has_text=name)
    expect(row).to_contain_text("MQTT_BASIC")
    expect(row).to_contain_text(f"user {name}")
    expect(row).to_contain_text("allow all console/${username}/#")
    expect(row).to_contain_text("enabled")
    expect(row).not_to_contain_text(password)

    clients: list[PahoClient] = []

    def accepted() -> bool:
        client = PahoClient(
            cluster.mqtt_port, unique("console-dev"), username=name, password=password.encode()
        )
        if client.connect().value == 0:
            clients.append(client)
            return True
        client.close()
        return False

    # The ingest nodes hear of the new credential within a second.
    wait_until(accepted, "a CONNECT with the credential made in the console accepted")
    [client] = clients
    try:
        assert [c.value for c in client.subscribe(f"console/{name}/#", 1)] == [1]
        assert [c.value for c in client.subscribe("console/other/#", 1)] == [0x87]
        # Its rules, changed in the console.
        page.select_option("#credential-rules-name", name)
        expect(page.locator("#credential-rules-edit")).to_have_value(
            "allow all console/${username}/#\ndeny all #"
        )
        page.fill("#credential-rules-edit", "allow all console/#")
        page.click("#credentials-rules-form button[type=submit]")
        expect(page.locator("#credentials-message")).to_have_text(f"Rules of {name} saved.")
        expect(row).to_contain_text("allow all console/#")
        # Disabled in the console: its client is disconnected (Administrative action).
        row.get_by_role("button", name="Disable").click()
        expect(row).to_contain_text("disabled")
        wait_until(lambda: client.snapshot()[1], "the client of the disabled credential cut off")
        assert [reason.value for reason in client.snapshot()[1]] == [0x98]
    finally:
        client.close()
    page.once("dialog", lambda dialog: dialog.accept())
    row.get_by_role("button", name="Delete").click()
    expect(page.locator("#credentials-message")).to_have_text(f"{name} deleted.")
    expect(page.locator("#credentials tbody tr", has_text=name)).to_have_count(0)


def test_the_docs_page_runs_under_its_content_security_policy(
    browser: Browser, api: AdminApi
) -> None:
    page = browser.new_page()
    blocked = csp_violations(page)
    page.goto(api.url + "/docs")
    expect(page.locator(".swagger-ui .information-container")).to_be_visible(timeout=SHOW_MS)
    expect(page.locator(".opblock-summary-path").first).to_be_visible()
    page.close()
    assert blocked == []


def test_a_chart_names_every_series_and_repeats_no_colour(page: Page) -> None:
    # Twelve series, one with a blank name (as cormorant_kafka_consumer_lag_records{stage=""}
    # had), drawn by the console's own chart code.
    names = ["", *(f"stage-{i}" for i in range(1, 12))]
    drawn = page.evaluate(
        """async (names) => {
            const console = await import("/console/console.js");
            const box = document.createElement("div");
            box.id = "chart-test";
            box.className = "chart";
            document.querySelector("main").append(box);
            const series = Object.fromEntries(names.map((name, i) => [name, [i, i + 1]]));
            console.lineChart(box, [1000, 1002], series, String);
            return [...box.querySelectorAll(".u-legend .u-series")].slice(1).map((row) => [
                row.querySelector(".u-label").textContent,
                getComputedStyle(row.querySelector(".u-marker")).borderColor,
            ]);
        }""",
        names,
    )
    assert [label for label, _ in drawn] == ["unnamed series", *names[1:]]
    assert len({colour for _, colour in drawn}) == len(names)
    # The cluster's own lag chart: every series named.
    labels = page.locator("#chart-lag .u-legend .u-label")
    expect(labels.nth(1)).not_to_be_empty(timeout=SHOW_MS)
    assert all(text.strip() for text in labels.all_text_contents())


def test_at_800_pixels_the_header_fits_and_times_carry_their_offset(
    browser: Browser, api: AdminApi
) -> None:
    with open_console(
        browser, api, viewport={"width": 800, "height": 900}, timezone_id="Asia/Kolkata"
    ) as page:
        expect(page.locator("#username")).to_have_text(api.username)
        fits = page.evaluate(
            """() => {
                const header = document.querySelector("header");
                const user = document.querySelector("#username");
                const box = user.getBoundingClientRect();
                return {
                    header: header.scrollWidth <= header.clientWidth,
                    page: document.documentElement.scrollWidth <= window.innerWidth,
                    user: user.scrollWidth <= user.clientWidth && box.left >= 0
                        && box.right <= window.innerWidth,
                };
            }"""
        )
        assert fits == {"header": True, "page": True, "user": True}
        # Every credential type's name shows whole in its select.
        page.click("#nav a[data-view=credentials]")
        cut = page.evaluate(
            """() => {
                const select = document.querySelector("#credential-type");
                const style = getComputedStyle(select);
                const pen = document.createElement("canvas").getContext("2d");
                pen.font = `${style.fontSize} ${style.fontFamily}`;
                // Padding and the drop-down arrow take their share of the width.
                const room = select.clientWidth - parseFloat(style.paddingLeft)
                    - parseFloat(style.paddingRight) - 20;
                return [...select.options].filter((o) => pen.measureText(o.text).width > room)
                    .map((o) => o.text);
            }"""
        )
        assert cut == []
        # Times in the browser's zone, with its offset (India: +05:30, no daylight saving).
        page.click("#nav a[data-view=infrastructure]")
        expect(page.locator("#infra-checked")).to_have_text(re.compile(r"T.*\+05:30$"))


def test_a_3_1_1_session_shows_what_3_1_1_has(
    cluster: LocalCluster, api: AdminApi, page: Page
) -> None:
    client_id = unique("console-v311")
    client = PahoClient(cluster.mqtt_port, client_id, version=4, clean_start=False)
    assert client.connect() == 0
    try:
        page.evaluate("id => { location.hash = `#/session/${encodeURIComponent(id)}`; }", client_id)
        facts = page.locator("#session-facts")
        expect(facts).to_contain_text("MQTT 3.1.1", timeout=SHOW_MS)
        expect(facts).to_contain_text("Clean Session0: the session is kept")
        expect(facts).to_contain_text(ISO_TIME)
        expect(facts).not_to_contain_text("Session Expiry Interval")
        expect(facts).not_to_contain_text("Clean Start")
        expect(facts).not_to_contain_text("Receive Maximum")
    finally:
        client.close()
        assert api.call("DELETE", f"/api/sessions/{client_id}").status_code == 202


def _connects(cluster: LocalCluster, username: str, password: str) -> bool:
    client = PahoClient(
        cluster.mqtt_port, unique("console-dev"), username=username, password=password.encode()
    )
    try:
        return client.connect().value == 0
    finally:
        client.close()


def _told(message: Locator, text: str, alerts: list[str]) -> None:
    """``message`` comes to say ``text``; AssertionError naming the alerts if not."""
    try:
        expect(message).to_have_text(text, timeout=SHOW_MS)
    except AssertionError as exc:
        raise AssertionError(f"{text!r} not told; the alerts: {alerts}") from exc


def test_credentials_of_every_type_and_a_reset_password(
    cluster: LocalCluster, api: AdminApi, page: Page
) -> None:
    x509, jwt, basic = (unique(f"console-{kind}") for kind in ("x509", "jwt", "basic"))
    old, new = "the first password", "the password reset in the console"
    created = api.call(
        "POST",
        "/api/credentials",
        json={"name": basic, "type": "MQTT_BASIC", "username": basic, "password": old,
              "allow_all": True},
    )  # fmt: skip
    assert created.status_code == 201, created.text
    fingerprint = "ab" * 32
    # The console tells an error in an alert: none may come.
    alerts: list[str] = []

    def alerted(dialog: Dialog) -> None:
        alerts.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", alerted)
    try:
        page.click("#nav a[data-view=credentials]")
        message = page.locator("#credentials-message")
        page.fill("#credential-name", x509)
        page.select_option("#credential-type", "X509")
        expect(page.locator("#credential-username")).to_be_hidden()
        page.select_option("#credential-cert-by", "fingerprint")
        page.fill("#credential-cert-value", fingerprint)
        page.click("#credentials-add-form button[type=submit]")
        _told(message, f"{x509} created: clients may connect with it.", alerts)
        expect(page.locator("#credentials tbody tr", has_text=x509)).to_contain_text(
            f"certificate {fingerprint[:16]}…"
        )
        page.fill("#credential-name", jwt)
        page.select_option("#credential-type", "JWT")
        page.fill("#credential-jwt-algorithms", "HS256")
        page.fill("#credential-jwt-key", "a shared secret of thirty-two bytes or more")
        page.fill("#credential-jwt-issuer", "https://issuer.example")
        page.fill("#credential-jwt-audience", "cormorant")
        page.fill("#credential-jwt-client-claim", "sub")
        page.fill("#credential-rules", "allow all telemetry/${client_id}/#")
        page.click("#credentials-add-form button[type=submit]")
        _told(message, f"{jwt} created: clients may connect with it.", alerts)
        expect(page.locator("#credentials tbody tr", has_text=jwt)).to_contain_text(
            "tokens of https://issuer.example (HS256)"
        )
        shown = api.get(f"/api/credentials/{jwt}")
        assert (shown["jwt"]["audience"], shown["jwt"]["client_id_claim"]) == ("cormorant", "sub")
        # Search: only the matching rows stay.
        page.fill("#credentials-search", x509)
        expect(page.locator("#credentials tbody tr:visible")).to_have_count(1)
        expect(page.locator("#credentials tbody tr:visible")).to_contain_text("X509")
        screenshot(page, "credentials")
        page.fill("#credentials-search", "")
        # A password reset: the next CONNECT needs the new one.
        wait_until(lambda: _connects(cluster, basic, old), "the credential known to the nodes")
        page.select_option("#credential-password-name", basic)
        page.fill("#credential-password-new", new)
        page.click("#credentials-password-form button[type=submit]")
        _told(message, f"Password of {basic} reset.", alerts)
        wait_until(lambda: _connects(cluster, basic, new), "a CONNECT with the new password")
        assert not _connects(cluster, basic, old)
    finally:
        for name in (x509, jwt, basic):
            api.call("DELETE", f"/api/credentials/{name}")


def test_the_infrastructure_of_the_test_cluster(
    cluster: LocalCluster, api: AdminApi, page: Page
) -> None:
    settings = cluster.settings
    found = api.get("/api/infrastructure")
    kafka = found["kafka"]
    assert kafka["reachable"], kafka["error"]
    assert len(kafka["brokers"]) == settings.kafka_brokers
    topics = {topic["topic"]: topic for topic in kafka["topics"]}
    sessions_topic = TopicNames.from_settings(settings).client_sessions
    assert topics[sessions_topic]["partitions"] == settings.state_topic_partitions
    assert (kafka["under_replicated_partitions"], kafka["offline_partitions"]) == (0, 0)
    redis = found["redis"]
    assert (redis["reachable"], redis["role"]) == (True, "master"), redis["error"]
    assert redis["used_memory_bytes"] > 0
    postgres = found["postgres"]
    assert postgres["reachable"] and postgres["version"].startswith("PostgreSQL"), postgres
    haproxy = found["haproxy"]
    assert haproxy["configured"] and haproxy["errors"] == []
    nodes = [f"node{i}" for i in range(1, settings.ingest_nodes + 1)]
    assert {(s["backend"], s["server"]) for s in haproxy["servers"] if s["in_rotation"]} == {
        (f"ingest_{kind}", node) for kind in ("mqtt", "mqtts", "ws", "wss") for node in nodes
    }
    processes = {node["name"]: node for node in found["nodes"]}
    assert processes["ingest-node1"]["rss_bytes"] > 10 * 2**20
    # CPU use needs two probes of a process: within a few of the sampler's 2 s rounds.
    wait_until(
        lambda: all(
            node["cpu_percent"] is not None for node in api.get("/api/infrastructure")["nodes"]
        ),
        "every process's CPU use measured",
    )
    page.click("#nav a[data-view=infrastructure]")
    expect(page.locator("#infra-postgres")).to_contain_text("PostgreSQL")
    expect(page.locator("#infra-redis")).to_contain_text("primary (master)")
    # Each HAProxy process has its own view of every node listener.
    listeners = len(haproxy["servers"])
    expect(page.locator("#infra-rotation")).to_have_text(f"{listeners} / {listeners}")
    expect(page.locator("#infra-nodes tbody tr", has_text="ingest-node1")).to_contain_text(
        re.compile(r"\d %.*MiB")
    )
    screenshot(page, "infrastructure")
    page.fill("#infra-topics-search", sessions_topic)
    expect(page.locator("#infra-topics tbody tr:visible")).to_have_count(1)


def test_the_websocket_client_talks_mqtt_with_a_device(
    cluster: LocalCluster, api: AdminApi, page: Page
) -> None:
    ws_url = f"ws://127.0.0.1:{cluster.settings.ws_listen_port}/mqtt"
    # The page may connect to the ws listener, and nowhere else beside its own service.
    policy = requests.get(api.url + "/", timeout=30).headers["content-security-policy"]
    assert f"; connect-src 'self' {ws_url};" in policy
    topic = unique("console-ws")
    name, password = unique("console-ws-user"), "the WebSocket client's password"
    created = api.call(
        "POST",
        "/api/credentials",
        json={"name": name, "type": "MQTT_BASIC", "username": name, "password": password,
              "rules": [{"permission": "allow", "action": "all", "topic": f"{topic}/#"}]},
    )  # fmt: skip
    assert created.status_code == 201, created.text
    device = PahoClient(cluster.mqtt_port, unique("console-ws-device"))
    try:
        wait_until(lambda: _connects(cluster, name, password), "the credential known")
        assert device.connect() == 0
        assert [c.value for c in device.subscribe(f"{topic}/down", 1)] == [1]
        page.click("#nav a[data-view=websocket]")
        expect(page.locator("#ws-url")).to_have_value(ws_url)
        page.fill("#ws-username", name)
        page.fill("#ws-password", password)
        page.click("#ws-connect")
        expect(page.locator("#ws-status")).to_contain_text("Connected", timeout=SHOW_MS)
        page.fill("#ws-sub-topic", f"{topic}/up")
        page.click("#ws-subscribe-form button[type=submit]")
        expect(page.locator("#ws-subscriptions tbody tr", has_text=f"{topic}/up")).to_have_count(1)
        # Subscribed (SUBACK came): the device's message reaches the page.
        device.client.publish(f"{topic}/up", b"from the device", 1)
        expect(page.locator("#ws-messages tbody tr", has_text=f"{topic}/up")).to_contain_text(
            "from the device", timeout=SHOW_MS
        )
        page.fill("#ws-pub-topic", f"{topic}/down")
        page.fill("#ws-pub-payload", "from the console")
        page.click("#ws-publish-form button[type=submit]")
        expect(page.locator("#ws-pub-message")).to_have_text(f"Published to {topic}/down.")
        message = device.messages.get(timeout=SHOW_MS / 1000)
        assert (message.topic, message.payload) == (f"{topic}/down", b"from the console")
        screenshot(page, "websocket")
        page.click("#ws-disconnect")
        expect(page.locator("#ws-status")).to_have_text("Disconnected.")
    finally:
        device.close()
        api.call("DELETE", f"/api/credentials/{name}")


def test_integrations_show_their_state_figures_and_last_error_and_are_disabled(
    cluster: LocalCluster, api: AdminApi, page: Page, sink_kafka: str
) -> None:
    prefix = unique("console-integrations")
    sink_topic = f"console-sink-{uuid.uuid4().hex[:8]}"
    # In a thread of its own: Playwright's sync API runs an event loop in this one.
    with ThreadPoolExecutor(1) as thread:
        thread.submit(asyncio.run, ensure_topics(sink_kafka, [TopicSpec(sink_topic, 1)])).result()
    working, broken = unique("console-export"), unique("console-broken")
    password = f"pw-{uuid.uuid4().hex}"
    bodies = [
        {"name": working, "topic_filters": [f"{prefix}/#"], "payload_format": "raw",
         "sink": {"bootstrap": sink_kafka, "topic": sink_topic}},
        # Nothing listens on port 1: its runner fails at once, and again after each backoff.
        {"name": broken, "topic_filters": [f"{prefix}/#"],
         "sink": {"bootstrap": "127.0.0.1:1", "topic": "never", "security_protocol":
                  "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-512",
                  "sasl_username": "exporter", "sasl_password": password}},
    ]  # fmt: skip
    for body in bodies:
        created = api.call("POST", "/api/integrations", json=body)
        assert created.status_code == 201, created.text
    publisher = PahoClient(cluster.mqtt_port, unique("console-publisher"))
    try:
        assert publisher.connect() == 0
        mid = publisher.client.publish(f"{prefix}/line-1", b"21.5", 1).mid
        wait_until(lambda: mid in publisher.snapshot()[0], "PUBACK")
        page.click("#nav a[data-view=integrations]")
        failing = page.locator("#integrations tbody tr", has_text=broken)
        expect(failing).to_contain_text("restarting", timeout=SHOW_MS)
        expect(failing).to_contain_text("KafkaConnectionError")
        # The password is in no answer, no page and not in the stage's metrics.
        stage = local_cluster.http_ports(cluster.settings)["integrations-stage"]
        metrics = requests.get(f"http://127.0.0.1:{stage}/metrics", timeout=30).text
        answers = json.dumps([api.get("/api/integrations"), api.get(f"/api/integrations/{broken}")])
        assert all(password not in text for text in (page.content(), answers, metrics))
        # Columns: name, kind, enabled, topic filters, sent, failed, retried, lag.
        running = page.locator("#integrations tbody tr", has_text=working)
        expect(running.locator("td").nth(4)).to_have_text("1", timeout=SINK_MS)
        expect(running).to_contain_text("running")
        screenshot(page, "integrations")
        failing.get_by_role("button", name="Disable").click()
        expect(page.locator("#integrations-message")).to_have_text(f"{broken} disabled.")
        expect(failing).to_contain_text("disabled")
        assert api.get(f"/api/integrations/{broken}")["enabled"] is False
    finally:
        publisher.close()
        for name in (working, broken):
            api.call("DELETE", f"/api/integrations/{name}")
