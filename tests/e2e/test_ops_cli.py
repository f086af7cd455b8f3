"""The operators' CLI end to end on the test cluster, through the admin API with a stored
login: ``cormorant login|logout``, ``clients list|show|kick``, ``sessions list|show|delete``,
``subscriptions list``, ``retained list|show|delete``, ``delayed list|cancel`` and
``credentials import|export``,
driven with click's runner against live paho clients."""

from __future__ import annotations

import csv
import json
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import requests
from click.testing import CliRunner, Result

from services.cli import main
from services.common.settings import get_settings
from services.local import cluster as local_cluster
from services.local.settings import LocalSettings
from tests.e2e.admin import PASSWORD, AdminApi, admin_api, running
from tests.e2e.clients import PahoClient, unique
from tests.servers import LocalCluster
from tests.waiting import wait_until

pytestmark = pytest.mark.cluster

#: Seconds a change may take to reach the admin API through Kafka's state topics.
STATE_SECONDS = 30.0


class Cli:
    """``cormorant`` run in this process with its own configuration directory (its login)."""

    def __init__(self, config_home: Path) -> None:
        self.env = {"XDG_CONFIG_HOME": str(config_home)}

    def __call__(self, *args: str, input: str | None = None, code: int = 0) -> Result:
        """Run ``cormorant args``; AssertionError unless it exits with ``code``."""
        result = CliRunner().invoke(main, list(args), input=input, env=self.env)
        assert result.exit_code == code, (args, result.output, result.exception)
        return result

    def json(self, *args: str) -> Any:
        """The JSON ``cormorant args --json`` prints."""
        return json.loads(self(*args, "--json").stdout)


@pytest.fixture(scope="module")
def api(settings: LocalSettings) -> AdminApi:
    """A logged-in admin user of the running test cluster."""
    return admin_api(running(settings))


@pytest.fixture(scope="module")
def cli(api: AdminApi, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    """The CLI logged in as ``api``'s user."""
    cli = Cli(tmp_path_factory.mktemp("config"))
    cli("login", api.url, "--username", api.username, "--password-file", "-", input=PASSWORD)
    yield cli
    cli("logout")


def test_login_keeps_a_private_token_and_logout_revokes_it(api: AdminApi, tmp_path: Path) -> None:
    cli = Cli(tmp_path)
    refused = cli("sessions", "list", code=1)
    assert "not logged in: run `cormorant login" in refused.stderr
    cli("login", api.url, "--username", api.username, "--password-file", "-", input=PASSWORD)
    stored = tmp_path / "cormorant" / "login.json"
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    assert stat.S_IMODE(stored.parent.stat().st_mode) == 0o700
    assert PASSWORD not in stored.read_text()
    token = json.loads(stored.read_text())["token"]
    assert cli.json("sessions", "list", "--limit", "1")["limit"] == 1

    assert "logged out" in cli("logout").stdout
    assert not stored.exists()
    gone = requests.get(
        api.url + "/api/sessions", headers={"Authorization": f"Bearer {token}"}, timeout=30
    )
    assert gone.status_code == 401
    wrong = cli(
        "login", api.url, "--username", api.username, "--password-file", "-",
        input="not the password", code=1,
    )  # fmt: skip
    assert "login refused" in wrong.stderr and not stored.exists()


def test_clients_are_listed_shown_and_kicked(cluster: LocalCluster, cli: Cli) -> None:
    prefix = unique("cli-client")
    topic = unique("cli/topic")
    clients = [PahoClient(cluster.mqtt_port, f"{prefix}-{n}", session_expiry=600) for n in (1, 2)]
    for client in clients:
        assert client.connect() == 0
    try:
        clients[0].subscribe(topic, 1)
        wait_until(
            lambda: cli.json("clients", "list", "--client-id", f"{prefix}-*")["total"] == 2,
            "both clients listed",
            STATE_SECONDS,
        )
        first = cli("clients", "list", "--client-id", f"{prefix}-*", "--limit", "1")
        assert f"{prefix}-1" in first.stdout and f"{prefix}-2" not in first.stdout
        assert "--offset 1 for the next page" in first.stderr
        every = cli.json("clients", "list", "--client-id", f"{prefix}-*", "--all")
        assert [c["client_id"] for c in every["items"]] == [f"{prefix}-1", f"{prefix}-2"]
        assert "no connected clients" in cli("clients", "list", "--client-id", "x-*-y").stdout

        shown = cli("clients", "show", f"{prefix}-1").stdout
        assert "connected: True" in shown and f"  {topic}  qos=1" in shown
        subscriptions = cli.json("subscriptions", "list", "--client-id", f"{prefix}-*")
        assert [(s["client_id"], s["topic_filter"]) for s in subscriptions["items"]] == [
            (f"{prefix}-1", topic)
        ]

        assert "disconnecting" in cli("clients", "kick", f"{prefix}-1").stdout
        wait_until(lambda: clients[0].snapshot()[1], "the kicked client disconnected")
        assert [reason.value for reason in clients[0].snapshot()[1]] == [0x98]
    finally:
        for client in clients:
            client.close()
    # The persistent session stays, disconnected, until deleted.
    wait_until(
        lambda: (
            cli.json("sessions", "list", "--client-id", f"{prefix}-1", "--disconnected")["total"]
            == 1
        ),
        "the session waiting",
        STATE_SECONDS,
    )
    refused = cli("clients", "show", f"{prefix}-1", code=1)
    assert "is not connected" in refused.stderr
    assert cli.json("sessions", "show", f"{prefix}-1")["subscription_list"][0]["topic_filter"] == (
        topic
    )
    cli("sessions", "delete", f"{prefix}-1")
    wait_until(
        lambda: cli.json("sessions", "list", "--client-id", f"{prefix}-1")["total"] == 0,
        "the session gone",
        STATE_SECONDS,
    )
    assert "no session has this client id" in cli("sessions", "show", f"{prefix}-1", code=1).stderr


def test_retained_messages_are_listed_shown_and_deleted(cluster: LocalCluster, cli: Cli) -> None:
    base = unique("cli-retained")
    publisher = PahoClient(cluster.mqtt_port, unique("cli-pub"))
    assert publisher.connect() == 0
    try:
        mids = [
            publisher.client.publish(f"{base}/{name}", payload, 1, retain=True).mid
            for name, payload in (("a", b"21.5"), ("b", b"\xff\x00"))
        ]
        wait_until(lambda: set(mids) <= set(publisher.snapshot()[0]), "both PUBACKs")
    finally:
        publisher.close()
    wait_until(
        lambda: cli.json("retained", "list", "--filter", f"{base}/+")["total"] == 2,
        "both retained messages listed",
        STATE_SECONDS,
    )
    listed = cli("retained", "list", "--filter", f"{base}/+").stdout
    assert "21.5" in listed and "base64:/wA=" in listed
    shown = cli("retained", "show", f"{base}/a").stdout
    assert "payload_size: 4" in shown and shown.endswith("21.5\n")
    assert "is a Topic Filter" in cli("retained", "show", f"{base}/+", code=2).stderr
    cli("retained", "delete", f"{base}/a")
    wait_until(
        lambda: (
            [m["topic"] for m in cli.json("retained", "list", "--filter", f"{base}/#")["items"]]
            == [f"{base}/b"]
        ),
        "a's retained message deleted",
        STATE_SECONDS,
    )
    assert "no retained message" in cli("retained", "show", f"{base}/a", code=1).stderr


def test_delayed_publications_are_listed_and_cancelled(
    cluster: LocalCluster, api: AdminApi, cli: Cli
) -> None:
    publisher_id, topic = unique("cli-delayer"), unique("cli-delayed")
    publisher = PahoClient(cluster.mqtt_port, publisher_id)
    assert publisher.connect() == 0
    try:
        mids = [
            publisher.client.publish(f"$delayed/{delay}/{topic}/{name}", payload, 1).mid
            for delay, name, payload in ((900, "b", b"\xff"), (600, "a", b"first"))
        ]
        wait_until(lambda: set(mids) <= set(publisher.snapshot()[0]), "both PUBACKs")
        assert [publisher.snapshot()[0][mid] for mid in mids] == [0, 0]
    finally:
        publisher.close()

    def listed() -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = cli.json("delayed", "list", "--client-id", publisher_id)[
            "items"
        ]
        return items

    wait_until(lambda: len(listed()) == 2, "both delayed messages listed", STATE_SECONDS)
    first, second = listed()  # the soonest due first
    assert (first["topic"], first["payload"], first["qos"]) == (f"{topic}/a", "first", 1)
    assert second["payload_encoding"] == "base64"
    table = cli("delayed", "list", "--client-id", publisher_id).stdout
    assert first["id"] in table and "base64:/w==" in table
    cancelled = cli("delayed", "cancel", first["id"]).stdout
    assert f"from {publisher_id} to {topic}/a" in cancelled
    wait_until(lambda: listed() == [second], "a cancelled", STATE_SECONDS)
    assert "no delayed publication" in cli("delayed", "cancel", first["id"], code=1).stderr
    assert api.call("DELETE", "/api/delayed/not-an-id").status_code == 422
    assert api.call("DELETE", f"/api/delayed/{second['id']}").status_code == 202
    wait_until(lambda: listed() == [], "b cancelled", STATE_SECONDS)
    trail = [e for e in api.get("/api/audit", limit=50)["items"] if e["action"] == "cancel-delayed"]
    assert {e["target"] for e in trail} >= {first["id"], second["id"]}


def test_a_credentials_import_is_all_or_nothing(
    cluster: LocalCluster, cli: Cli, tmp_path: Path
) -> None:
    prefix = unique("bulk")
    rows: list[dict[str, Any]] = [
        {"name": f"{prefix}-{n}", "client_id": f"{prefix}-{n}", "no_password": True,
         "rules": [f"allow publish d/{prefix}-{n}/#"]}
        for n in range(300)
    ]  # fmt: skip
    rows[100]["rules"] = ["allow publish a/#/b"]  # not a Topic Filter
    rows[299]["name"] = rows[0]["name"]  # a name twice
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(rows))
    refused = cli("credentials", "import", str(bad), code=1)
    assert f"row 101 ({prefix}-100): rule filter 'a/#/b'" in refused.stdout
    assert f"row 300 ({prefix}-0): a credential with this name exists already" in refused.stdout
    assert "2 of 300 rows are not valid: nothing written" in refused.stdout
    assert _count_credentials(cluster.settings, prefix) == 0

    rows[100]["rules"] = [f"allow publish d/{prefix}-100/#"]
    rows[299]["name"] = f"{prefix}-299"
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"credentials": rows}))
    assert "300 credentials created" in cli("credentials", "import", str(good)).stdout
    assert _count_credentials(cluster.settings, prefix) == 300
    again = json.loads(cli("credentials", "import", str(good), "--json", code=1).stdout)
    assert again["written"] is False and again["errors"] == 300
    _delete_credentials(cluster.settings, prefix)

    too_many = tmp_path / "too-many.json"
    too_many.write_text(json.dumps([rows[0]] * 10_001))
    assert "at most 10,000 credentials in one import" in (
        cli("credentials", "import", str(too_many), code=1).stderr
    )


def test_a_csv_import_hashes_passwords_and_exports_hide_them(
    cluster: LocalCluster, cli: Cli, tmp_path: Path
) -> None:
    name = unique("csv")
    password = "a-long-enough-password"
    source = tmp_path / "in.csv"
    source.write_text(
        "name,client_id,username,password,rules\n"
        f"{name},{name},{name},{password},allow publish d/${{client_id}}/#;deny all #\n"
    )
    cli("credentials", "import", str(source))
    client = PahoClient(cluster.mqtt_port, name, username=name, password=password.encode())
    try:
        assert client.connect() == 0
    finally:
        client.close()

    plain = tmp_path / "plain.csv"
    cli("credentials", "export", "--output", str(plain))
    assert stat.S_IMODE(plain.stat().st_mode) == 0o600
    [row] = [r for r in csv.DictReader(plain.open()) if r["name"] == name]
    assert row["password_hash"] == "" and row["password"] == ""
    assert row["rules"] == "allow publish d/${client_id}/#;deny all #"
    secret = json.loads(cli("credentials", "export", "--include-secrets").stdout)
    [stored] = [r for r in secret["credentials"] if r["name"] == name]
    assert stored["password_hash"].startswith("$argon2id$")
    assert password not in json.dumps(stored)
    _delete_credentials(cluster.settings, name)


def _count_credentials(settings: LocalSettings, prefix: str) -> int:
    """How many credentials are named ``prefix-*``."""
    with psycopg.connect(local_cluster.local_settings(settings).postgres_dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM mqtt_credentials WHERE name LIKE %s", (f"{prefix}-%",)
        ).fetchone()
    assert row is not None
    return int(row[0])


def _delete_credentials(settings: LocalSettings, prefix: str) -> None:
    """Delete the credentials named ``prefix`` or ``prefix-*`` in one statement (the
    test's own rows)."""
    dsn = local_cluster.local_settings(settings).postgres_dsn
    with psycopg.connect(dsn) as conn:
        conn.execute(
            "DELETE FROM mqtt_credentials WHERE name = %s OR name LIKE %s",
            (prefix, f"{prefix}-%"),
        )


def test_local_commands_print_json_and_take_the_old_spellings(
    settings: LocalSettings, tmp_path: Path
) -> None:
    cli = Cli(tmp_path)
    cli.env.update(local_cluster.child_environment(local_cluster.local_settings(running(settings))))
    get_settings.cache_clear()  # this process's settings: the test cluster's, for a moment
    try:
        username = unique("cli-admin")
        added = cli("admin-users", "add", username, "--password-stdin", input=PASSWORD)
        assert "--password-stdin is deprecated and will be removed; use --password-file -" in (
            added.stderr
        )
        assert username in cli.json("admin-users", "list")["usernames"]
        removed = cli("admin-users", "remove", username)
        assert f"admin user {username} deleted" in removed.stdout
        assert "'remove' is deprecated and will be removed; use 'admin-users delete'" in (
            removed.stderr
        )
        parts = cli.json("status", "--interval", "0.1")["parts"]
        assert all(part["healthy"] for part in parts)
        ingest = [p for p in parts if p["name"].startswith("ingest-node")]
        assert ingest and all(isinstance(p["connections"], int) for p in ingest)
    finally:
        get_settings.cache_clear()
