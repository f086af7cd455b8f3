"""The admin API fuzzed from its own OpenAPI document (schemathesis): whatever the input, no
5xx, and every answer matches the document (status, content type, body schema). Bounded
examples per operation keep it well under a minute. The token of a logged-in user is sent
with every call, so the operations behind it are reached too; logout is left out (it would
revoke that token)."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from services.local.settings import LocalSettings
from tests.e2e.admin import AdminApi, admin_api, running

pytestmark = pytest.mark.cluster

#: Examples generated per API operation.
EXAMPLES = 12


@pytest.fixture(scope="module")
def api(settings: LocalSettings) -> AdminApi:
    """A logged-in admin user of the running test cluster."""
    return admin_api(running(settings))


@pytest.fixture(scope="module")
def admin_schema(api: AdminApi) -> schemathesis.BaseSchema:
    """The admin API's OpenAPI document, as the running service serves it."""
    return schemathesis.openapi.from_url(api.url + "/openapi.json")


def test_the_admin_api_keeps_its_openapi_document(
    admin_schema: schemathesis.BaseSchema, api: AdminApi
) -> None:
    # Each operation's cases drawn by Hypothesis from the document (schemathesis' pytest
    # plugin does not run on pytest 9 yet, so its strategies are driven here).
    calls: list[int] = []
    operations = [result.ok() for result in admin_schema.get_all_operations()]
    assert len(operations) >= 9
    for operation in operations:
        if operation.path == "/api/logout":
            continue

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def check(case: schemathesis.Case) -> None:
            response = case.call_and_validate(base_url=api.url, headers=api.headers)
            calls.append(response.status_code)

        check()
    assert len(calls) > 5 * EXAMPLES, calls  # the operations were reached
