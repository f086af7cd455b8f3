"""The admin API fuzzed from its own OpenAPI document (schemathesis): whatever the input, no
5xx, and every answer matches the document (status, content type, body schema). A bounded
number of examples per operation (one for an operation without input) keeps it short. The
token of a logged-in user is sent with every call, so the operations behind it are reached
too; logout is left out (it would revoke that token)."""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.config import SchemathesisConfig

from services.local.settings import LocalSettings
from tests.e2e.admin import AdminApi, admin_api, running

pytestmark = pytest.mark.cluster

#: Examples generated per API operation that takes input (parameters or a body).
EXAMPLES = 12

#: The bearer token every call carries (the logged-in user's), not drawn: an operation
#: without any other parameter and without a body is the same request whatever is drawn,
#: so one example proves all it can (GET /api/cluster, /api/stats, /api/admin-users;
#: /api/cluster drew 14 identical calls of about a second each on the loaded machine).
AUTHORIZATION = "Authorization"

#: A credential's validity spans its fields and its key material, which JSON Schema cannot
#: say (an MQTT_BASIC credential names a user or a client, an X509 match exactly one of
#: fingerprint, CN and SAN, a JWT public key must load for its algorithms, a rule's
#: placeholders stand for whole levels): a well-formed credential may be refused with 422,
#: which says why. So may a block (an address that is no address, an expression that does
#: not compile; 409 when it exists), an API key (a rule that does not parse, a client id
#: holding U+0000), and an integration (a Topic Filter MQTT refuses, SASL without its
#: password; 409 when its name is taken). Every other operation accepts what its schema
#: allows.
CONFIG = SchemathesisConfig.from_dict(
    {
        "operations": [
            {
                "include-path-regex": path,
                "checks": {
                    "positive_data_acceptance": {
                        "expected-statuses": ["2xx", "401", "404", "409", "422"]
                    }
                },
            }
            for path in (
                "^/api/credentials",
                "^/api/blocked",
                "^/api/api-keys",
                "^/api/integrations",
            )
        ]
    }
)


@pytest.fixture(scope="module")
def api(settings: LocalSettings) -> AdminApi:
    """A logged-in admin user of the running test cluster."""
    return admin_api(running(settings))


@pytest.fixture(scope="module")
def admin_schema(api: AdminApi) -> schemathesis.BaseSchema:
    """The admin API's OpenAPI document, as the running service serves it."""
    return schemathesis.openapi.from_url(api.url + "/openapi.json", config=CONFIG)


def test_the_admin_api_keeps_its_openapi_document(
    admin_schema: schemathesis.BaseSchema, api: AdminApi
) -> None:
    # Each operation's cases drawn by Hypothesis from the document (schemathesis' pytest
    # plugin does not run on pytest 9 yet, so its strategies are driven here).
    calls: list[int] = []
    credentials_before = {c["name"] for c in api.get("/api/credentials")["credentials"]}
    blocks_before = {b["id"] for b in api.get("/api/blocked")["blocked"]}
    keys_before = {k["name"] for k in api.get("/api/api-keys")["api_keys"]}
    operations = [result.ok() for result in admin_schema.get_all_operations()]
    assert len(operations) >= 9
    try:
        _fuzz(operations, api, calls)
    finally:
        # The credentials the fuzzing made go: a CN pattern "*" would let any client
        # certificate in for the tests that follow.
        for credential in api.get("/api/credentials")["credentials"]:
            if credential["name"] not in credentials_before:
                api.call("DELETE", f"/api/credentials/{credential['id']}")
        # And the blocks it made: an address block of 0.0.0.0/0 or the expression .* would
        # refuse every client of the tests that follow.
        for block in api.get("/api/blocked")["blocked"]:
            if block["id"] not in blocks_before:
                api.call("DELETE", f"/api/blocked/{block['id']}")
        for key in api.get("/api/api-keys")["api_keys"]:
            if key["name"] not in keys_before:
                api.call("DELETE", f"/api/api-keys/{key['name']}")
    assert len(calls) > 5 * EXAMPLES, calls  # the operations were reached
    assert {c["name"] for c in api.get("/api/credentials")["credentials"]} <= credentials_before
    assert {b["id"] for b in api.get("/api/blocked")["blocked"]} <= blocks_before


def _fuzz(operations: list[Any], api: AdminApi, calls: list[int]) -> None:
    """Call each operation but logout with the cases drawn for it, adding to ``calls``."""
    for operation in operations:
        if operation.path == "/api/logout":
            continue

        takes_input = len(operation.body) > 0 or any(
            parameter.name != AUTHORIZATION for parameter in operation.iter_parameters()
        )

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES if takes_input else 1,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def check(case: schemathesis.Case) -> None:
            response = case.call_and_validate(base_url=api.url, headers=api.headers)
            calls.append(response.status_code)

        check()
