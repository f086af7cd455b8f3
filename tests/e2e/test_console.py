"""The web console as a person uses it, in a real headless Chromium (Debian's ``chromium``
driven by Playwright) against the test cluster: log in, read the connection count after
clients connect, find a client's session and disconnect it, browse retained messages, make
an MQTT credential a client then connects with."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect

from services.local.settings import LocalSettings
from tests.browser import chromium
from tests.e2e.admin import AdminApi, admin_api, csp_violations, open_console, running
from tests.e2e.clients import PahoClient, unique
from tests.servers import LocalCluster
from tests.waiting import wait_until

pytestmark = pytest.mark.cluster

#: Milliseconds the page may take to show a figure (the console polls every 2 s).
SHOW_MS = 15_000


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
        expect(page.locator("#tile-ready")).to_have_text("5 / 5")
        expect(page.locator("#services tbody tr")).to_have_count(5)
        expect(page.locator("#chart-connections path.line")).to_have_count(1)
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
        row.get_by_role("link", name=client_id).click()
        expect(page.locator("#session-title")).to_have_text(client_id)
        expect(page.locator("#session-subscriptions")).to_contain_text("console/sensors/#")
        expect(page.locator("#session-facts")).to_contain_text(re.compile(r"127\.0\.0\.1:\d+"))
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
