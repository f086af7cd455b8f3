"""Credentials in bulk without a server: CSV and JSON rows, each row's checks, exports that
leave secrets out unless asked; the stored admin login's file mode; ``--version``."""

from __future__ import annotations

import asyncio
import stat
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from services.admin_client import Login, load_login, save_login
from services.cli import main
from services.common.auth.bulk import (
    MAX_ROWS,
    BulkError,
    credential_of,
    export_row,
    rows_from_csv,
    rows_from_json,
    rows_to_csv,
)
from services.common.auth.credentials import CredentialError
from services.common.auth.manage import CredentialAdmin
from services.common.auth.store import CredentialStore

#: No PostgreSQL: checking a row never touches the store.
ADMIN = CredentialAdmin(CredentialStore("postgresql://127.0.0.1:1/none"))


def build(row: dict[str, Any]) -> Any:
    return asyncio.run(credential_of(ADMIN, row))


def test_a_csv_row_round_trips_through_an_export_with_secrets() -> None:
    [row] = rows_from_csv(
        "name,client_id,username,password,rules,enabled\n"
        "s-1,s-1,u-1,a-long-password,allow publish d/${client_id}/#;deny all #,no\n"
    )
    assert row["rules"] == ["allow publish d/${client_id}/#", "deny all #"]
    assert row["enabled"] is False
    credential = build(row)
    assert credential.password_hash.startswith("$argon2id$")

    plain = export_row(credential)
    assert "password_hash" not in plain and "password" not in plain
    [again] = rows_from_csv(rows_to_csv([export_row(credential, include_secrets=True)]))
    assert build(again).password_hash == credential.password_hash
    assert build(again).rules == credential.rules


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"name": "x", "client_id": "c", "no_password": True, "enabled": "maybe"},
         'enabled: expected true or false, not "maybe"'),
        ({"name": "x", "colour": "red"}, "unknown fields: colour"),
        ({"client_id": "c"}, "name: required"),
        ({"name": "x", "type": "radius"}, "type: one of MQTT_BASIC, X509, JWT, SCRAM"),
        ({"name": "x", "username": "u", "password": "a-long-password",
          "password_hash": "$argon2id$x"}, "give one of password, password_hash and scram"),
        ({"name": "x", "type": "X509"}, "needs a certificate"),
        ({"name": "x", "type": "JWT", "jwt": "not an object"}, "jwt: an object"),
    ],
)  # fmt: skip
def test_a_bad_row_names_its_field(row: dict[str, Any], message: str) -> None:
    with pytest.raises(CredentialError, match=message):
        build(row)


def test_files_that_are_not_rows_are_refused_whole() -> None:
    with pytest.raises(BulkError, match="unknown CSV columns: colour"):
        rows_from_csv("name,colour\nx,red\n")
    with pytest.raises(BulkError, match="a JSON file holds a list"):
        rows_from_json('{"name": "x"}')
    with pytest.raises(BulkError, match="at most 10,000 credentials"):
        rows_from_json("[" + ",".join(["{}"] * (MAX_ROWS + 1)) + "]")


def test_the_login_is_kept_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    (tmp_path / "cormorant").mkdir(mode=0o755)
    (tmp_path / "cormorant" / "login.tmp").write_text("left over")
    (tmp_path / "cormorant" / "login.tmp").chmod(0o644)
    login = Login("http://127.0.0.1:9170", "alice", "token", "2026-11-28T00:00:00Z")
    path = save_login(login)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert load_login() == login


def test_version_comes_from_the_package_metadata() -> None:
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    assert result.stdout == f"cormorant {metadata.version('cormorant')}\n"
