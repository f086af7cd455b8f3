"""The admin API of the test cluster, for the admin, console and fuzzing tests: an admin user
(made with ``cormorant admin-users add``, or straight through what that command calls), a
logged-in HTTP session, and the web console logged in in a real browser."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import requests
from playwright.sync_api import Browser, Page, expect

from services.admin.main import users_of
from services.local import cluster as local_cluster
from services.local.settings import LocalSettings
from tests.commands import run_cormorant

PASSWORD = "correct horse battery staple"


@dataclass
class AdminApi:
    """The test cluster's admin API: its base URL, a user and that user's bearer token."""

    url: str
    username: str
    token: str

    @property
    def headers(self) -> dict[str, str]:
        """The Authorization header of the logged-in user."""
        return {"Authorization": f"Bearer {self.token}"}

    def get(self, path: str, **params: Any) -> Any:
        """GET ``path`` as the user; the JSON body (``AssertionError`` unless 200)."""
        response = requests.get(self.url + path, params=params, headers=self.headers, timeout=30)
        assert response.status_code == 200, (response.status_code, response.text)
        return response.json()

    def call(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        """Any call as the user."""
        return requests.request(method, self.url + path, headers=self.headers, timeout=30, **kwargs)


def running(settings: LocalSettings) -> LocalSettings:
    """``settings``, once its whole test cluster runs (only what is down is started: a
    module-scoped fixture's way to the shared cluster)."""
    if not all(row.healthy for row in local_cluster.status(settings)):
        local_cluster.up(settings)
    return settings


def add_user(settings: LocalSettings, username: str, password: str = PASSWORD) -> None:
    """``cormorant admin-users add <username> --password-file -`` against the test cluster."""
    env = local_cluster.child_environment(local_cluster.local_settings(settings))
    result = run_cormorant(
        "admin-users", "add", username, "--password-file", "-", env=env, input=password
    )
    assert result.returncode == 0, result.stderr
    assert f"admin user {username} created" in result.stdout


def login(url: str, username: str, password: str = PASSWORD) -> str:
    """A bearer token from ``POST /api/login``."""
    response = requests.post(
        url + "/api/login", json={"username": username, "password": password}, timeout=30
    )
    assert response.status_code == 200, response.text
    token: str = response.json()["token"]
    return token


def add_user_directly(settings: LocalSettings, username: str, password: str = PASSWORD) -> None:
    """Create admin user ``username`` in the test cluster's PostgreSQL as ``cormorant
    admin-users add`` does (:func:`services.admin.main.users_of` with the settings the
    command gets), in this process: without the command's own Python start (seconds)."""

    async def add() -> None:
        users = users_of(local_cluster.runtime_settings(local_cluster.local_settings(settings)))
        try:
            await users.add(username, password)
        finally:
            await users.pool.close()

    # In a thread of its own: Playwright's sync API keeps an event loop running in this one
    # once a browser is open, and asyncio.run refuses to start inside a running loop.
    with ThreadPoolExecutor(1) as thread:
        thread.submit(asyncio.run, add()).result()


def admin_api(settings: LocalSettings, *, cli: bool = False) -> AdminApi:
    """A new admin user of the running test cluster, logged in: made with ``cormorant
    admin-users add`` (:func:`add_user`) when ``cli`` (tests/e2e/test_admin_api.py's user, so
    the command is proven once a session), else by :func:`add_user_directly`."""
    url = f"http://127.0.0.1:{settings.admin_port}"
    username = f"admin-{uuid.uuid4().hex[:8]}"
    if cli:
        add_user(settings, username)
    else:
        add_user_directly(settings, username)
    return AdminApi(url, username, login(url, username))


@contextmanager
def open_console(browser: Browser, api: AdminApi, **options: Any) -> Iterator[Page]:
    """The web console in a new page of ``browser`` (``options``: Playwright's
    ``new_context`` options, a 1400 x 1000 viewport unless given), logged in as ``api``'s
    user through its form; on leaving the block, AssertionError if the page requested
    anything from elsewhere than the admin service or its Content-Security-Policy blocked
    anything."""
    context = browser.new_context(**{"viewport": {"width": 1400, "height": 1000}, **options})
    page = context.new_page()
    outside: list[str] = []
    page.on(
        "request",
        lambda request: None if request.url.startswith(api.url) else outside.append(request.url),
    )
    blocked = csp_violations(page)
    try:
        page.goto(api.url + "/")
        page.fill("#login-username", api.username)
        page.fill("#login-password", PASSWORD)
        page.click("#login-form button[type=submit]")
        # The password check (argon2id) may take seconds on a loaded machine.
        expect(page.locator("#nav")).to_be_visible(timeout=15_000)
        yield page
    finally:
        context.close()
    assert outside == [], "the console loaded something from elsewhere"
    assert blocked == [], "the Content-Security-Policy blocked part of the console"


def csp_violations(page: Page) -> list[str]:
    """The Content-Security-Policy violations ``page`` reports to its console from now on
    (a list that fills as they come)."""
    found: list[str] = []
    page.on(
        "console",
        lambda message: (
            found.append(message.text) if "Content Security Policy" in message.text else None
        ),
    )
    return found
