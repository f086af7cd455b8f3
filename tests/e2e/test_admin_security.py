"""The admin service under attack, through its HTTP interface on the test cluster: failed
logins throttled per address and per user name (429 with Retry-After), security headers on
every response. Each attacking address is a loopback address of its own (127.x.y.z), so the
other tests' logins from 127.0.0.1 are not throttled."""

from __future__ import annotations

import http.client
import json
import random
import re

import pytest

from services.common.settings import Settings
from services.local.settings import LocalSettings
from tests.e2e.admin import PASSWORD, AdminApi, admin_api, running
from tests.e2e.clients import unique

pytestmark = pytest.mark.cluster

DEFAULTS = Settings()


@pytest.fixture(scope="module")
def api(settings: LocalSettings) -> AdminApi:
    """A logged-in admin user of the running test cluster."""
    return admin_api(running(settings))


def an_address() -> str:
    """A loopback address no other test uses."""
    return f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(2, 254)}"


def post_login(
    api: AdminApi, source: str, username: str, password: str
) -> http.client.HTTPResponse:
    """``POST /api/login`` from the address ``source``; the response, read."""
    port = int(api.url.rsplit(":", 1)[1])
    connection = http.client.HTTPConnection(
        "127.0.0.1", port, timeout=60, source_address=(source, 0)
    )
    body = json.dumps({"username": username, "password": password})
    connection.request("POST", "/api/login", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    response.read()
    connection.close()
    return response


def test_failed_logins_from_one_address_are_throttled(api: AdminApi) -> None:
    attacker = an_address()
    limit = DEFAULTS.admin_login_max_failures_per_address
    for attempt in range(limit):
        response = post_login(api, attacker, unique("nobody"), f"guess {attempt}")
        assert response.status == 401, attempt
    throttled = post_login(api, attacker, api.username, PASSWORD)
    assert throttled.status == 429  # even the right password: nothing is checked
    retry_after = int(throttled.headers["Retry-After"])
    assert 0 < retry_after <= DEFAULTS.admin_login_window_seconds
    # Another address logs in as ever.
    assert post_login(api, an_address(), api.username, PASSWORD).status == 200


def test_failed_logins_of_one_user_are_throttled_from_any_address(
    settings: LocalSettings, api: AdminApi
) -> None:
    limit = DEFAULTS.admin_login_max_failures_per_user
    for attempt in range(limit):
        assert post_login(api, an_address(), api.username, f"guess {attempt}").status == 401
    throttled = post_login(api, an_address(), api.username, PASSWORD)
    assert throttled.status == 429
    assert int(throttled.headers["Retry-After"]) > 0
    # Another user is not held up by it.
    other = admin_api(settings)
    assert post_login(api, an_address(), other.username, PASSWORD).status == 200


@pytest.mark.parametrize(
    "path", ["/", "/console/console.js", "/health", "/api/sessions", "/openapi.json", "/nothing"]
)
def test_every_response_carries_the_security_headers(api: AdminApi, path: str) -> None:
    port = int(api.url.rsplit(":", 1)[1])
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("GET", path)
    response = connection.getresponse()
    response.read()
    connection.close()
    assert response.headers["X-Frame-Options"] == "DENY"
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["Referrer-Policy"] == "no-referrer"
    policy = response.headers["Content-Security-Policy"]
    assert "script-src 'self';" in policy
    assert "frame-ancestors 'none'" in policy
    assert "unsafe-inline" not in policy


def test_the_docs_page_allows_only_its_own_inline_script(api: AdminApi) -> None:
    port = int(api.url.rsplit(":", 1)[1])
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("GET", "/docs")
    response = connection.getresponse()
    response.read()
    connection.close()
    policy = response.headers["Content-Security-Policy"]
    assert re.search(r"script-src 'self' 'sha256-[A-Za-z0-9+/=]+';", policy), policy
    assert "unsafe-inline" not in policy
    assert response.headers["X-Frame-Options"] == "DENY"
