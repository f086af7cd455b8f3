"""Credentials in the real PostgreSQL: the store, its change notifications and the node's cache,
the management API, and ``cormorant credentials`` as an operator runs it."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest
import pytest_asyncio
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from services.common.auth.authenticate import Authenticator
from services.common.auth.cache import CredentialCache
from services.common.auth.credentials import Credential, CredentialError, CredentialType
from services.common.auth.manage import (
    CredentialAdmin,
    CredentialChanges,
    CredentialNotFound,
    CredentialSpec,
)
from services.common.auth.principal import Accepted, AuthRequest, Refused
from services.common.auth.store import Change, CredentialConflict, CredentialStore
from services.common.records import ClientKind
from tests.commands import run_cormorant
from tests.waiting import wait_for


@pytest_asyncio.fixture(loop_scope="function")
async def admin(postgres_server: str) -> AsyncIterator[CredentialAdmin]:
    """The management API on the test session's PostgreSQL."""
    manager = CredentialAdmin(CredentialStore(postgres_server))
    yield manager
    await manager.close()


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


PW = b"long-enough-pw"
"""A password of 14 characters: the default minimum is 12."""


async def test_a_credential_is_stored_changed_and_deleted(admin: CredentialAdmin) -> None:
    name = _name("basic")
    added = await admin.add(
        CredentialSpec(name, CredentialType.MQTT_BASIC, username=name, password=PW,
                       rules=["allow publish a/${username}/#"])
    )  # fmt: skip
    assert added.revision == 1 and added.password_hash and added.created_at is not None
    assert await admin.get(name) == added
    assert await admin.get(str(added.id)) == added
    changed = await admin.update(name, CredentialChanges(rules=["deny all #"]))
    assert changed.revision == 2 and [str(r) for r in changed.rules] == ["deny all #"]
    assert changed.password_hash == added.password_hash  # kept
    disabled = await admin.set_enabled(name, False)
    assert not disabled.enabled and disabled.revision == 3
    assert name in [c.name for c in await admin.list(CredentialType.MQTT_BASIC)]
    assert (await admin.delete(name)).id == added.id
    with pytest.raises(CredentialNotFound):
        await admin.get(name)


async def test_strict_subscribe_is_stored_changed_and_set_from_the_cli(
    admin: CredentialAdmin, postgres_server: str
) -> None:
    name = _name("strict")
    added = await admin.add(
        CredentialSpec(name, CredentialType.MQTT_BASIC, client_id=name, password=PW,
                       rules=["allow all #"], strict_subscribe=True)
    )  # fmt: skip
    assert (await admin.get(name)).strict_subscribe is True
    changed = await admin.update(name, CredentialChanges(strict_subscribe=False))
    assert changed.strict_subscribe is False and changed.revision == added.revision + 1
    updated = run_cormorant("credentials", "update", name, "--strict-subscribe", "--json",
                            env=_env(postgres_server))  # fmt: skip
    assert updated.returncode == 0, updated.stderr
    assert json.loads(updated.stdout)["strict_subscribe"] is True
    assert (await admin.get(name)).strict_subscribe is True


async def test_conflicts_and_bad_input_are_refused_with_their_reason(
    admin: CredentialAdmin,
) -> None:
    name = _name("dup")
    basic = CredentialType.MQTT_BASIC
    await admin.add(CredentialSpec(name, basic, username=name, password=PW))
    with pytest.raises(CredentialConflict, match="with this name"):
        await admin.add(CredentialSpec(name, basic, username="other", password=PW))
    with pytest.raises(CredentialConflict, match="user name and client id"):
        await admin.add(CredentialSpec(_name("dup"), basic, username=name, password=PW))
    with pytest.raises(CredentialError, match="needs a client id or a user name"):
        await admin.add(CredentialSpec(_name("x"), basic, password=PW))
    with pytest.raises(CredentialError, match="has no password"):
        await admin.add(CredentialSpec(_name("x"), CredentialType.X509, password=PW))
    with pytest.raises(CredentialError, match="at most 1024 bytes"):
        await admin.add(CredentialSpec(_name("x"), basic, username="u" * 2000, password=PW))
    with pytest.raises(ValueError, match="permission must be allow or deny"):
        await admin.add(CredentialSpec(_name("x"), basic, username="r", password=PW,
                                       rules=["maybe publish a"]))  # fmt: skip
    await admin.delete(name)


async def test_no_rules_allow_nothing_and_everything_is_asked_for(
    admin: CredentialAdmin,
) -> None:
    basic = CredentialType.MQTT_BASIC
    none = await admin.add(CredentialSpec(_name("none"), basic, username=_name("u"), password=PW))
    assert none.rules == ()
    everything = await admin.add(
        CredentialSpec(
            _name("all"),
            basic,
            username=_name("u"),
            password=PW,
            rules=["deny all admin/#"],
            allow_all=True,
        )
    )
    assert [str(rule) for rule in everything.rules] == ["deny all admin/#", "allow all #"]
    changed = await admin.update(none.name, CredentialChanges(allow_all=True))
    assert [str(rule) for rule in changed.rules] == ["allow all #"]
    for credential in (none, everything):
        await admin.delete(credential.name)


async def test_passwords_are_required_and_long_enough(
    admin: CredentialAdmin, postgres_server: str
) -> None:
    basic, scram = CredentialType.MQTT_BASIC, CredentialType.SCRAM
    with pytest.raises(CredentialError, match="needs a password"):
        await admin.add(CredentialSpec(_name("x"), basic, username=_name("u")))
    with pytest.raises(CredentialError, match="at least 12 characters"):
        await admin.add(CredentialSpec(_name("x"), basic, username=_name("u"), password=b"short"))
    with pytest.raises(CredentialError, match="at least 12 characters"):
        await admin.add(CredentialSpec(_name("x"), scram, username=_name("u"), password=b"short"))
    with pytest.raises(CredentialError, match="needs a client id"):
        await admin.add(CredentialSpec(_name("x"), basic, username=_name("u"), no_password=True))
    # Twelve characters, not bytes: "é" is two bytes of UTF-8.
    with pytest.raises(CredentialError, match="at least 12 characters"):
        await admin.add(CredentialSpec(_name("x"), basic, username=_name("u"),
                                       password="ééééééééééé".encode()))  # fmt: skip
    by_id = await admin.add(
        CredentialSpec(_name("id"), basic, client_id=_name("c"), no_password=True)
    )
    assert by_id.password_hash is None
    with pytest.raises(CredentialError, match="at least 12 characters"):
        await admin.update(by_id.name, CredentialChanges(password=b"short"))
    with pytest.raises(CredentialError, match="needs a client id"):
        await admin.update(by_id.name, CredentialChanges(client_id="", username=_name("u")))
    await admin.delete(by_id.name)
    lenient = CredentialAdmin(CredentialStore(postgres_server), min_password_length=4)
    try:
        short = await lenient.add(
            CredentialSpec(_name("short"), basic, username=_name("u"), password=b"four")
        )
        await lenient.delete(short.name)
    finally:
        await lenient.close()


async def test_every_change_is_announced_and_the_cache_forgets_it(
    admin: CredentialAdmin, postgres_server: str
) -> None:
    changes: list[Change] = []
    connected = asyncio.Event()
    listener = CredentialStore(postgres_server)
    cache = CredentialCache(listener)

    def on_change(change: Change) -> None:
        cache.changed(change)
        changes.append(change)

    task = asyncio.create_task(listener.listen(on_change, connected.set))
    try:
        await asyncio.wait_for(connected.wait(), 10)
        name = _name("late")
        auth = Authenticator(cache)
        refused = await auth.authenticate(AuthRequest("c", name, PW))
        assert isinstance(refused, Refused) and len(cache) == 2  # both misses remembered
        added = await admin.add(
            CredentialSpec(name, CredentialType.MQTT_BASIC, username=name, password=PW)
        )
        await wait_for(lambda: any(c.id == added.id for c in changes), "the INSERT notification")
        assert changes[-1].op == "INSERT" and changes[-1].types == {CredentialType.MQTT_BASIC}
        assert isinstance(await auth.authenticate(AuthRequest("c", name, PW)), Accepted)
        await admin.set_enabled(name, False)
        await wait_for(lambda: changes[-1].op == "UPDATE", "the UPDATE notification")
        assert (await auth.authenticate(AuthRequest("c", name, PW))).reason_code == 0x8A  # type: ignore[union-attr]
        await admin.delete(name)
        await wait_for(lambda: changes[-1].op == "DELETE", "the DELETE notification")
        assert isinstance(await auth.authenticate(AuthRequest("c", name, PW)), Refused)
    finally:
        task.cancel()
        await listener.close()


class CountingStore(CredentialStore):
    """The real store, counting the client id lookups that reach PostgreSQL."""

    lookups = 0

    async def by_client_id(self, client_id: str) -> list[Credential]:
        self.lookups += 1
        return await super().by_client_id(client_id)


async def test_client_ids_without_a_credential_are_answered_without_postgresql(
    admin: CredentialAdmin, postgres_server: str
) -> None:
    """While the node holds the set of client ids that have a credential of their own,
    an unknown id costs no query; a credential added or deleted for a client id applies
    once the set is loaded again after the change's notification."""
    connected = asyncio.Event()
    store = CountingStore(postgres_server)
    cache = CredentialCache(store)
    auth = Authenticator(cache, allow_anonymous=True)

    def on_change(change: Change) -> None:
        cache.changed(change)

    tasks = [
        asyncio.create_task(store.listen(on_change, lambda: (cache.clear(), connected.set()))),
        asyncio.create_task(cache.follow_client_ids()),
    ]
    try:
        await asyncio.wait_for(connected.wait(), 10)
        legacy = _name("legacy")
        added = await admin.add(
            CredentialSpec(
                legacy,
                CredentialType.MQTT_BASIC,
                client_id=legacy,
                kind=ClientKind.APPLICATION,
                no_password=True,
            )
        )

        async def kind_of(client_id: str) -> ClientKind | None:
            outcome = await auth.authenticate(AuthRequest(client_id))
            assert isinstance(outcome, Accepted)
            return outcome.principal.kind

        async def known() -> bool:
            return await kind_of(legacy) is ClientKind.APPLICATION

        await wait_for(known, "the new client id credential")
        await wait_for(lambda: cache.client_ids_loaded, "the client ids loaded again")
        before = store.lookups
        for _ in range(50):
            assert await kind_of(_name("fresh")) is None  # anonymous
        assert store.lookups == before  # none of them asked PostgreSQL
        assert await kind_of(legacy) is ClientKind.APPLICATION
        await admin.delete(str(added.id))

        async def gone() -> bool:
            return await kind_of(legacy) is None

        await wait_for(gone, "the deleted client id credential")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await store.close()


# ---------------------------------------------------------------------- the CLI


def _env(postgres_server: str) -> dict[str, str]:
    return {
        **os.environ,
        "CORMORANT_POSTGRES_DSN": postgres_server,
        "CORMORANT_SETTINGS_FILE": os.devnull,
    }


def test_the_cli_manages_credentials_and_never_prints_secrets(
    postgres_server: str, tmp_path: Path
) -> None:
    env = _env(postgres_server)
    name = _name("cli")
    password = tmp_path / "password"
    password.write_text("never-shown-s3cret\n")
    added = run_cormorant(
        "credentials", "add", name, "--username", name, "--password-file", str(password),
        "--client-id", name, "--kind", "application", "--rule", "allow publish d/${client_id}/#",
        "--rule", "deny all #", "--json", env=env,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    view = json.loads(added.stdout)
    assert view["kind"] == "APPLICATION" and view["password"] == "set"
    assert view["rules"] == ["allow publish d/${client_id}/#", "deny all #"]
    listed = run_cormorant("credentials", "list", "--json", env=env)
    assert name in [c["name"] for c in json.loads(listed.stdout)]
    table = run_cormorant("credentials", "list", env=env)
    assert table.stdout.startswith("NAME") and f"username={name}" in table.stdout
    shown = run_cormorant("credentials", "show", name, env=env)
    assert "rules:\n  allow publish d/${client_id}/#\n  deny all #" in shown.stdout
    updated = run_cormorant("credentials", "update", name, "--no-rules", "--json", env=env)
    assert json.loads(updated.stdout)["rules"] == []
    disabled = run_cormorant("credentials", "disable", name, "--json", env=env)
    assert json.loads(disabled.stdout)["enabled"] is False
    gone = run_cormorant("credentials", "delete", name, env=env)
    assert gone.stdout.startswith(f"deleted {name} (")
    everything = added.stdout + listed.stdout + table.stdout + shown.stdout + updated.stdout
    # The scheme's name is shown ("password_scheme": "argon2id"), never the hash ("$argon2id$...").
    assert "never-shown-s3cret" not in everything and "$argon2" not in everything


async def test_the_cli_generates_a_secret_prints_it_once_and_stores_its_scheme(
    postgres_server: str,
) -> None:
    env = _env(postgres_server)
    name = _name("gen")
    added = run_cormorant("credentials", "add", name, "--username", name, "--generate-secret",
                          "--allow-all", "--json", env=env)  # fmt: skip
    assert added.returncode == 0, added.stderr
    view = json.loads(added.stdout)
    secret = view["secret"]
    assert len(secret) == 43 and view["password_scheme"] == "hmac-sha256"
    shown = run_cormorant("credentials", "show", name, env=env)
    assert "password_scheme: hmac-sha256" in shown.stdout and secret not in shown.stdout
    assert secret not in added.stderr + shown.stderr
    store = CredentialStore(postgres_server)
    try:
        auth = Authenticator(CredentialCache(store))
        accepted = await auth.authenticate(AuthRequest("c", name, secret.encode()))
        assert isinstance(accepted, Accepted)
        refused = await auth.authenticate(AuthRequest("c", name, secret[1:].encode()))
        assert isinstance(refused, Refused)
    finally:
        await store.close()
    async with await psycopg.AsyncConnection.connect(postgres_server) as conn:  # the column says it
        row = await (
            await conn.execute(
                "SELECT password_scheme FROM mqtt_credentials WHERE name = %s", (name,)
            )
        ).fetchone()
    assert row == ("hmac-sha256",)
    both = run_cormorant("credentials", "add", _name("g"), "--username", "u2", "--generate-secret",
                         "--password", PW.decode(), env=env)  # fmt: skip
    assert both.returncode == 1 and "replaces --password" in both.stderr


def test_the_cli_shows_jwt_and_scram_credentials_without_their_keys(
    postgres_server: str, tmp_path: Path
) -> None:
    env = _env(postgres_server)
    secret = tmp_path / "hmac"
    secret.write_text("an HMAC secret the CLI must never print!!\n")
    issuer = _name("issuer")
    added = run_cormorant(
        "credentials", "add", issuer, "--type", "jwt", "--jwt-secret-file", str(secret),
        "--jwt-audience", "mqtt", "--jwt-client-id-claim", "sub", "--json", env=env,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    jwt_view = json.loads(added.stdout)["jwt"]
    assert jwt_view["key"] == "**********" and jwt_view["algorithms"] == ["HS256"]
    scram = _name("scram")
    made = run_cormorant(
        "credentials", "add", scram, "--type", "scram", "--username", scram,
        "--password", PW.decode(), "--json", env=env,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["scram"] == [  # OWASP's PBKDF2 counts by default
        {"mechanism": "SCRAM-SHA-256", "iterations": 600_000},
        {"mechanism": "SCRAM-SHA-512", "iterations": 210_000},
    ]
    cheap = _name("scram")
    made = run_cormorant(
        "credentials", "add", cheap, "--type", "scram", "--username", cheap,
        "--password", PW.decode(), "--scram-iterations", "10000", "--json", env=env,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert {s["iterations"] for s in json.loads(made.stdout)["scram"]} == {10_000}
    for ref in (issuer, scram, cheap):
        assert run_cormorant("credentials", "delete", ref, env=env).returncode == 0


def test_the_cli_allows_everything_only_when_asked_and_reads_the_minimum(
    postgres_server: str,
) -> None:
    env = _env(postgres_server)
    nothing, everything = _name("nothing"), _name("everything")
    added = run_cormorant("credentials", "add", nothing, "--username", nothing,
                          "--password", PW.decode(), env=env)  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert "rules: (none: nothing allowed)" in added.stdout
    made = run_cormorant("credentials", "add", everything, "--username", everything,
                         "--password", PW.decode(), "--rule", "deny all admin/#",
                         "--allow-all", "--json", env=env)  # fmt: skip
    assert json.loads(made.stdout)["rules"] == ["deny all admin/#", "allow all #"]
    opened = run_cormorant("credentials", "update", nothing, "--allow-all", "--json", env=env)
    assert json.loads(opened.stdout)["rules"] == ["allow all #"]
    both = run_cormorant("credentials", "update", nothing, "--no-rules", "--allow-all", env=env)
    assert both.returncode == 2 and "--no-rules excludes" in both.stderr
    stricter = {**env, "CORMORANT_CREDENTIAL_PASSWORD_MIN_LENGTH": "20"}
    refused = run_cormorant("credentials", "update", nothing, "--password", PW.decode(),
                            env=stricter)  # fmt: skip
    assert refused.returncode == 1 and "at least 20 characters" in refused.stderr
    for name in (nothing, everything):
        assert run_cormorant("credentials", "delete", name, env=env).returncode == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["show", "no-such-credential"], "no credential named 'no-such-credential'"),
        (
            ["add", "bad rule", "--username", "u", "--password", PW.decode()],
            "name 'bad rule' must be",
        ),
        (
            [
                "add",
                "r1",
                "--username",
                "u",
                "--password",
                PW.decode(),
                "--rule",
                "allow publish a/#/b",
            ],
            "'#'",
        ),
        (["add", "n1", "--username", "u"], "needs a password"),
        (["add", "n2", "--username", "u", "--password", "eleven-char"], "at least 12 characters"),
        (["add", "n3", "--username", "u", "--no-password"], "needs a client id"),
        (["add", "n4", "--client-id", "c", "--no-password", "--password", PW.decode()], "not both"),
        (["add", "x1", "--type", "x509", "--cert-fingerprint", "abc"], "64 lowercase hex"),
        (
            [
                "add",
                "u1",
                "--username",
                "u",
                "--password",
                PW.decode(),
                "--rule",
                "allow all d/${client_id}/#",
            ],
            "not bound to a Client Identifier",
        ),
        (["add", "j1", "--type", "jwt"], "needs its token settings"),
        (["add", "s1", "--type", "scram", "--username", "s"], "needs a password"),
    ],
)
def test_bad_input_is_one_clear_line(postgres_server: str, args: list[str], message: str) -> None:
    result = run_cormorant("credentials", *args, env=_env(postgres_server))
    assert result.returncode == 1
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_a_short_hmac_secret_is_refused(postgres_server: str, tmp_path: Path) -> None:
    secret = tmp_path / "hmac"
    secret.write_text("31 bytes, one short of enough!!\n")
    result = run_cormorant(
        "credentials", "add", _name("short"), "--type", "jwt", "--jwt-secret-file", str(secret),
        env=_env(postgres_server),
    )  # fmt: skip
    assert result.returncode == 1
    assert "a JWT HMAC secret has at least 32 bytes (RFC 7518 3.2), not 31" in result.stderr


def test_a_public_key_issuer_needs_an_audience_or_no_audience(
    postgres_server: str, tmp_path: Path
) -> None:
    public = tmp_path / "issuer.pem"
    public.write_bytes(
        ec.generate_private_key(ec.SECP256R1())
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    env = _env(postgres_server)
    name = _name("issuer")
    base = ["credentials", "add", name, "--type", "jwt", "--jwt-public-key-file", str(public),
            "--jwt-algorithm", "ES256"]  # fmt: skip
    refused = run_cormorant(*base, env=env)
    assert refused.returncode == 1
    assert "a public-key JWT credential needs an audience" in refused.stderr
    accepted = run_cormorant(*base, "--no-audience", "--jwt-max-age", "300", "--json", env=env)
    assert accepted.returncode == 0, accepted.stderr
    view = json.loads(accepted.stdout)["jwt"]
    assert view["audience"] is None and view["max_age_seconds"] == 300
    assert run_cormorant("credentials", "delete", name, env=env).returncode == 0


def test_a_scram_iteration_count_out_of_range_is_a_usage_error(postgres_server: str) -> None:
    result = run_cormorant(
        "credentials", "add", _name("scram"), "--type", "scram", "--username", "s",
        "--password", "p", "--scram-iterations", "1000", env=_env(postgres_server),
    )  # fmt: skip
    assert result.returncode == 2
    assert "1000 is not in the range 4096<=x<=10000000" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_jwks_url_credential_is_https_only_and_needs_an_audience(
    postgres_server: str, tmp_path: Path
) -> None:
    env = _env(postgres_server)
    name = _name("jwks")
    base = ["credentials", "add", name, "--type", "jwt"]
    plain = run_cormorant(*base, "--jwt-jwks-url", "http://idp.example/jwks.json",
                          "--jwt-audience", "mqtt", env=env)  # fmt: skip
    assert plain.returncode == 1
    assert "a JWKS URL must be https://" in plain.stderr
    url = "https://idp.example/.well-known/jwks.json"
    no_audience = run_cormorant(*base, "--jwt-jwks-url", url, env=env)
    assert no_audience.returncode == 1
    assert "needs an audience" in no_audience.stderr
    secret = tmp_path / "hmac"
    secret.write_text("an HMAC secret of thirty-two bytes or more\n")
    both = run_cormorant(*base, "--jwt-jwks-url", url, "--jwt-secret-file", str(secret), env=env)
    assert both.returncode == 2 and "exclude each other" in both.stderr
    added = run_cormorant(*base, "--jwt-jwks-url", url, "--jwt-algorithm", "ES256",
                          "--jwt-audience", "mqtt", "--json", env=env)  # fmt: skip
    assert added.returncode == 0, added.stderr
    view = json.loads(added.stdout)["jwt"]
    assert view["jwks_url"] == url and view["key"] == "" and view["algorithms"] == ["ES256"]
    shown = run_cormorant("credentials", "show", name, "--json", env=env)
    assert json.loads(shown.stdout)["jwt"]["jwks_url"] == url
    assert run_cormorant("credentials", "delete", name, env=env).returncode == 0
