"""``cormorant credentials add|list|show|update|enable|disable|delete``: manage the credentials
MQTT clients connect with.

A thin shell over :class:`services.common.auth.manage.CredentialAdmin` (the admin API calls
the same): PostgreSQL is the one of the settings (``CORMORANT_POSTGRES_DSN`` and the
PostgreSQL settings); every change reaches the ingest nodes within a second. ``--json``
prints JSON for machines; secrets (passwords, HMAC keys, SCRAM keys) are never printed,
except the secret ``add --generate-secret`` makes, printed once, on standard output only.
Errors exit with status 1 and one line saying what is wrong.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import ssl
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click

from services.cli_common import deprecated_option, read_secret
from services.common.auth.authorize import RuleError
from services.common.auth.certificates import CertificateMatch
from services.common.auth.credentials import (
    Credential,
    CredentialError,
    CredentialType,
    public_view,
)
from services.common.auth.jwt_auth import JwtSettings
from services.common.auth.manage import (
    CredentialAdmin,
    CredentialChanges,
    CredentialNotFound,
    CredentialSpec,
)
from services.common.auth.store import CredentialConflict, CredentialStore
from services.common.records import ClientKind
from services.common.stores.base import StoreUnavailable

T = TypeVar("T")

_TYPES = click.Choice([t.value.lower() for t in CredentialType], case_sensitive=False)
_KINDS = click.Choice(["device", "application"], case_sensitive=False)


def _run(action: Callable[[CredentialAdmin], Awaitable[T]]) -> T:
    """Run ``action`` with a :class:`CredentialAdmin` on the settings' PostgreSQL, turning
    every expected error into a one-line ``click`` error."""
    from services.common.settings import get_settings

    async def main() -> T:
        settings = get_settings()
        admin = CredentialAdmin(
            CredentialStore.from_settings(settings), settings.credential_password_min_length
        )
        try:
            return await action(admin)
        finally:
            await admin.close()

    try:
        return asyncio.run(main())
    except (
        CredentialError,
        RuleError,
        CredentialNotFound,
        CredentialConflict,
        StoreUnavailable,
    ) as exc:
        raise click.ClickException(str(exc)) from None


def _password(value: str | None, file: Path | None) -> bytes | None:
    """The password of ``--password`` or ``--password-file`` (``-``: standard input; one
    trailing newline dropped)."""
    if value is not None and file is not None:
        raise click.UsageError("--password and --password-file exclude each other")
    if value is not None:
        return value.encode("utf-8")
    if file is None:
        return None
    return read_secret(file)


def _certificate(
    fingerprint: str | None, cert_file: Path | None, cn: str | None, san: str | None
) -> CertificateMatch | None:
    if cert_file is not None:
        if fingerprint is not None:
            raise click.UsageError("--cert-file and --cert-fingerprint exclude each other")
        try:
            der = ssl.PEM_cert_to_DER_cert(cert_file.read_text())
        except (ValueError, OSError) as exc:
            message = f"--cert-file {cert_file}: not a PEM certificate ({exc})"
            raise click.UsageError(message) from None
        fingerprint = hashlib.sha256(der).hexdigest()
    if fingerprint is None and cn is None and san is None:
        return None
    if fingerprint is not None:
        fingerprint = fingerprint.replace(":", "").lower()
    return CertificateMatch(fingerprint, cn, san)


def _jwt(options: dict[str, Any], current: JwtSettings | None = None) -> JwtSettings | None:
    """JWT settings from the ``--jwt-*`` options, on top of ``current`` (an update)."""
    given = {k: v for k, v in options.items() if k.startswith("jwt_") and v not in (None, ())}
    if not given:
        return None
    secret, public = options.get("jwt_secret_file"), options.get("jwt_public_key_file")
    jwks_url: str | None = options.get("jwt_jwks_url")
    if sum(given is not None for given in (secret, public, jwks_url)) > 1:
        raise click.UsageError(
            "--jwt-secret-file, --jwt-public-key-file and --jwt-jwks-url exclude each other"
        )
    key = current.key if current else ""
    if jwks_url is None and secret is None and public is None and current is not None:
        jwks_url = current.jwks_url
    if secret is not None:
        key = Path(secret).read_text().strip()
    elif public is not None:
        key = Path(public).read_text()
    elif jwks_url is not None:
        key = ""
    algorithms = tuple(options.get("jwt_algorithm") or ())
    if not algorithms:
        if current is not None and secret is None and public is None and jwks_url is None:
            algorithms = current.algorithms
        else:
            algorithms = ("HS256",) if secret is not None else ("RS256",)
    previous = current or JwtSettings(algorithms, key)

    def pick(name: str, option: str) -> Any:
        value = options.get(option)
        return getattr(previous, name) if value is None else value

    return JwtSettings(
        algorithms=algorithms,
        key=key,
        audience=pick("audience", "jwt_audience"),
        issuer=pick("issuer", "jwt_issuer"),
        client_id_claim=pick("client_id_claim", "jwt_client_id_claim"),
        username_claim=pick("username_claim", "jwt_username_claim"),
        leeway_seconds=pick("leeway_seconds", "jwt_leeway"),
        max_age_seconds=pick("max_age_seconds", "jwt_max_age"),
        jwks_url=jwks_url,
    )


def _print(credential: Credential, as_json: bool, secret: str | None = None) -> None:
    """Print ``credential`` without its secrets, and ``secret`` (a generated one, shown
    this once) when given."""
    view = public_view(credential)
    if secret is not None:
        view["secret"] = secret
    if as_json:
        click.echo(json.dumps(view, indent=2))
        return
    for key, value in view.items():
        if key == "rules":
            click.echo("rules:" + ("" if value else " (none: nothing allowed)"))
            for rule in value:
                click.echo(f"  {rule}")
        elif isinstance(value, dict | list):
            click.echo(f"{key}: {json.dumps(value)}")
        elif value is not None:
            click.echo(f"{key}: {value}")


def _identity(view: dict[str, Any]) -> str:
    parts = []
    for key in ("username", "client_id"):
        if view.get(key):
            parts.append(f"{key}={view[key]}")
    for key, value in (view.get("certificate") or {}).items():
        parts.append(f"{key}={value}")
    if "jwt" in view:
        jwt = view["jwt"]
        parts.append(f"issuer={jwt['issuer'] or '-'} audience={jwt['audience'] or '-'}")
    return " ".join(parts)


_TYPE_OPTIONS: list[Callable[[Callable[..., Any]], Callable[..., Any]]] = [
    click.option("--kind", type=_KINDS, help="DEVICE (default) or APPLICATION."),
    click.option("--client-id", help="MQTT_BASIC: the Client Identifier it is for."),
    click.option("--username", help="MQTT_BASIC, SCRAM: the User Name it is for."),
    deprecated_option("--password", "--password-file -",
                      help="Deprecated (`ps` shows it): --password-file."),
    click.option("--password-file", type=click.Path(path_type=Path, allow_dash=True),
                 help="MQTT_BASIC, SCRAM: read the password from this file ('-': standard "
                 "input; one trailing newline dropped)."),
    click.option("--rule", "rules", multiple=True,
                 help="'<allow|deny> <publish|subscribe|all> <topic filter>', repeatable, in "
                 "order; ${client_id} and ${username} stand for whole topic levels. "
                 "Without rules a credential may do nothing."),
    click.option("--allow-all", is_flag=True,
                 help="Allow everything: adds the rule 'allow all #' after the --rule ones."),
    click.option("--strict-subscribe/--filtered-subscribe", default=None,
                 help="Refuse a SUBSCRIBE whose filter overlaps a denied subtree (strict), or "
                 "grant it and withhold the denied topics at delivery (filtered, the default)."),
    click.option("--cert-fingerprint", help="X509: SHA-256 of the DER certificate (hex)."),
    click.option("--cert-file", type=click.Path(path_type=Path, exists=True, dir_okay=False),
                 help="X509: the client's certificate (PEM); its SHA-256 fingerprint is kept."),
    click.option("--cert-cn", help="X509: a pattern (* ? [..]) over the certificate's CN."),
    click.option(
        "--cert-san",
        help="X509: a typed pattern over one type of its Subject Alternative Names: "
        "dns:*.devices.example.com, uri:spiffe://example.com/*, email:*@example.com, "
        "ip:10.0.0.0/8.",
    ),
    click.option("--jwt-secret-file", type=click.Path(exists=True, dir_okay=False),
                 help="JWT: the HMAC secret (HS256/384/512), from a file."),
    click.option("--jwt-public-key-file", type=click.Path(exists=True, dir_okay=False),
                 help="JWT: the issuer's RSA/EC/Ed25519 public key (PEM)."),
    click.option("--jwt-jwks-url",
                 help="JWT: the https:// URL of the issuer's JSON Web Key Set; the key is "
                 "picked by the token's 'kid'."),
    click.option("--jwt-algorithm", multiple=True,
                 help="JWT: accepted algorithms (default HS256 with a secret, RS256 with a key)."),
    click.option("--jwt-audience", help="JWT: the 'aud' tokens must carry."),
    click.option("--jwt-issuer", help="JWT: the 'iss' tokens must carry."),
    click.option("--jwt-client-id-claim", help="JWT: the claim that must equal the client id."),
    click.option("--jwt-username-claim", help="JWT: the claim that must equal the user name."),
    click.option("--jwt-leeway", type=int, help="JWT: clock skew allowed on exp/nbf, seconds."),
    click.option("--jwt-max-age", type=click.IntRange(min=1),
                 help="JWT: tokens must carry an 'iat' no older than this, seconds."),
    click.option("--json", "as_json", is_flag=True, help="Print JSON."),
]  # fmt: skip


def _type_options(command: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(_TYPE_OPTIONS):
        command = option(command)
    return command


def _check_required(credential_type: str, options: dict[str, Any], passwordless: bool) -> None:
    """Raise ``click.ClickException`` naming the options a credential of
    ``credential_type`` needs and has not been given (``passwordless``: --no-password or
    --generate-secret)."""
    given = {name for name, value in options.items() if value not in (None, (), False)}
    password = bool(given & {"password", "password_file"})
    kind = CredentialType(credential_type.upper())
    missing: str | None = None
    if kind is CredentialType.MQTT_BASIC:
        if not given & {"client_id", "username"}:
            missing = (
                "an MQTT_BASIC credential needs a client id or a user name: --client-id, --username"
            )
        elif not passwordless and not password:
            missing = (
                "an MQTT_BASIC credential needs a password: --password-file (- for standard "
                "input), or --generate-secret, or --no-password"
            )
    elif kind is CredentialType.SCRAM:
        if "username" not in given:
            missing = "a SCRAM credential needs a user name: --username"
        elif not password:
            missing = "a SCRAM credential needs a password: --password-file (- for standard input)"
    elif kind is CredentialType.X509:
        if not given & {"cert_file", "cert_fingerprint", "cert_cn", "cert_san"}:
            missing = (
                "an X509 credential needs a certificate: --cert-file, --cert-fingerprint, "
                "--cert-cn or --cert-san"
            )
    elif not given & {"jwt_secret_file", "jwt_public_key_file", "jwt_jwks_url"}:
        missing = (
            "a JWT credential needs its token settings: the issuer's key (--jwt-secret-file "
            "for HMAC, --jwt-public-key-file) or --jwt-jwks-url, and --jwt-audience with a "
            "public key (or --no-audience)"
        )
    if missing is not None:
        raise click.ClickException(missing)


def _kind(value: str | None) -> ClientKind | None:
    return None if value is None else ClientKind[value.upper()]


@click.group()
def credentials() -> None:
    """Manage MQTT credentials (PostgreSQL of the settings; changes reach every node)."""


@credentials.command()
@click.argument("name")
@click.option("--type", "credential_type", type=_TYPES, default="mqtt_basic", show_default=True)
@click.option("--disabled", is_flag=True, help="Create it disabled.")
@click.option(
    "--no-password",
    is_flag=True,
    help="MQTT_BASIC: no password; the client is recognised by its --client-id alone.",
)
@click.option(
    "--generate-secret",
    is_flag=True,
    help="MQTT_BASIC: generate a 256-bit random secret as the password, print it once "
    "(keep it: it cannot be shown again) and store only its salted HMAC-SHA-256, which "
    "verifies in microseconds at every CONNECT.",
)
@click.option("--scram-iterations", type=click.IntRange(4096, 10_000_000),
              help="SCRAM: PBKDF2 iterations (default 600,000 for SHA-256, 210,000 for "
              "SHA-512; each client connect pays them).")  # fmt: skip
@click.option("--no-audience", is_flag=True,
              help="JWT with a public key or JWKS URL: accept tokens whatever their "
              "'aud'.")  # fmt: skip
@_type_options
def add(
    name: str,
    credential_type: str,
    disabled: bool,
    no_password: bool,
    generate_secret: bool,
    scram_iterations: int | None,
    no_audience: bool,
    **options: Any,
) -> None:
    """Create credential NAME. Without --rule or --allow-all it may do nothing; an
    MQTT_BASIC credential needs a password (at least credential_password_min_length
    characters, default 12, hashed with argon2id) unless --no-password or
    --generate-secret.

    \b
    cormorant credentials add sensor-1 --client-id sensor-1 --username sensor-1 \\
        --password-file - --rule 'allow publish sensors/${client_id}/#'
    cormorant credentials add sensor-2 --client-id sensor-2 --username sensor-2 \\
        --generate-secret --rule 'allow publish sensors/${client_id}/#'
    """
    _check_required(credential_type, options, no_password or generate_secret)
    spec = CredentialSpec(
        name=name,
        type=CredentialType(credential_type.upper()),
        kind=_kind(options["kind"]) or ClientKind.DEVICE,
        rules=options["rules"],
        strict_subscribe=bool(options["strict_subscribe"]),
        client_id=options["client_id"],
        username=options["username"],
        password=_password(options["password"], options["password_file"]),
        certificate=_certificate(
            options["cert_fingerprint"],
            options["cert_file"],
            options["cert_cn"],
            options["cert_san"],
        ),
        jwt=_jwt(options),
        enabled=not disabled,
        allow_all=options["allow_all"],
        no_password=no_password,
        scram_iterations=scram_iterations,
        jwt_no_audience=no_audience,
    )
    if generate_secret:
        created, secret = _run(lambda admin: admin.add_generated(spec))
        _print(created, options["as_json"], secret)
        return
    _print(_run(lambda admin: admin.add(spec)), options["as_json"])


@credentials.command("list")
@click.option("--type", "credential_type", type=_TYPES, help="Only credentials of this type.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def list_command(credential_type: str | None, as_json: bool) -> None:
    """List every credential, by name."""
    kind = None if credential_type is None else CredentialType(credential_type.upper())
    found = _run(lambda admin: admin.list(kind))
    views = [public_view(c) for c in found]
    if as_json:
        click.echo(json.dumps(views, indent=2))
        return
    rows = [("NAME", "TYPE", "KIND", "ENABLED", "RULES", "IDENTITY")] + [
        (v["name"], v["type"], v["kind"], "yes" if v["enabled"] else "no",
         str(len(v["rules"])), _identity(v))
        for v in views
    ]  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


@credentials.command()
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def show(name: str, as_json: bool) -> None:
    """Show credential NAME (by name or id), without its secrets."""
    _print(_run(lambda admin: admin.get(name)), as_json)


@credentials.command()
@click.argument("name")
@click.option("--no-rules", is_flag=True, help="Remove every rule (nothing allowed).")
@click.option("--no-password", is_flag=True, help="MQTT_BASIC: remove the password.")
@_type_options
def update(name: str, no_rules: bool, no_password: bool, **options: Any) -> None:
    """Change credential NAME: the options given replace what it has (--rule replaces
    every rule). A client connected with it gets the new rules at once."""
    if no_rules and (options["rules"] or options["allow_all"]):
        raise click.UsageError("--no-rules excludes --rule and --allow-all")
    rules: Sequence[object] | None = () if no_rules else (options["rules"] or None)
    password = _password(options["password"], options["password_file"])

    async def change(admin: CredentialAdmin) -> Credential:
        current = await admin.get(name)
        changes = CredentialChanges(
            kind=_kind(options["kind"]),
            rules=rules,
            strict_subscribe=options["strict_subscribe"],
            client_id=options["client_id"],
            username=options["username"],
            password=password,
            remove_password=no_password,
            certificate=_certificate(
                options["cert_fingerprint"],
                options["cert_file"],
                options["cert_cn"],
                options["cert_san"],
            ),
            jwt=_jwt(options, current.jwt),
            allow_all=options["allow_all"],
        )
        return await admin.update(name, changes)

    _print(_run(change), options["as_json"])


def _toggle(enabled: bool) -> Callable[[str, bool], None]:
    def command(name: str, as_json: bool) -> None:
        _print(_run(lambda admin: admin.set_enabled(name, enabled)), as_json)

    return command


_NAME = click.argument("name")
_JSON = click.option("--json", "as_json", is_flag=True, help="Print JSON.")
credentials.command("enable", help="Enable credential NAME: its clients may connect again.")(
    _NAME(_JSON(_toggle(True)))
)
credentials.command(
    "disable",
    help="Disable credential NAME: its live clients are disconnected (v5 DISCONNECT 0x98) "
    "and its CONNECTs refused (v5 0x8A Banned, v3.1.1 return code 5).",
)(_NAME(_JSON(_toggle(False))))


@credentials.command()
@_NAME
@_JSON
def delete(name: str, as_json: bool) -> None:
    """Delete credential NAME; its live clients are disconnected (v5 DISCONNECT 0x98)."""
    gone = _run(lambda admin: admin.delete(name))
    if as_json:
        click.echo(json.dumps({"deleted": public_view(gone)}, indent=2))
    else:
        click.echo(f"deleted {gone.name} ({gone.id})")


# ---------------------------------------------------------------------------- import, export

_FORMAT = click.option(
    "--format",
    "file_format",
    type=click.Choice(["csv", "json"]),
    help="The file's format (default: from its extension; JSON for standard input/output).",
)


def _format_of(path: str, given: str | None) -> str:
    if given is not None:
        return given
    suffix = Path(path).suffix.lower()
    return "csv" if suffix == ".csv" else "json"


@credentials.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@_FORMAT
@click.option("--dry-run", is_flag=True, help="Check every row, write nothing.")
@click.option(
    "--json", "as_json", is_flag=True, help="Print the API's answer: every row's outcome."
)
def import_command(file: str, file_format: str | None, dry_run: bool, as_json: bool) -> None:
    """Create the credentials of FILE (CSV or JSON, up to 10,000), all or none: every row
    is checked first (as `credentials add` checks), then all are stored in one transaction;
    if any row is not valid or conflicts with a stored credential, nothing is written and
    each such row is named with its error. Through the admin API (cormorant login).

    \b
    name,type,client_id,username,password,rules
    sensor-1,MQTT_BASIC,sensor-1,sensor-1,a-long-password-1,allow publish sensors/${client_id}/#
    gateway-7,MQTT_BASIC,gateway-7,,,allow all gw/7/#
    """
    from services.admin_client import AdminApiError
    from services.common.auth.bulk import BulkError, rows_from_csv, rows_from_json
    from services.ops_cli import admin_client

    try:
        text = sys.stdin.read() if file == "-" else Path(file).read_text(encoding="utf-8-sig")
        reader = rows_from_csv if _format_of(file, file_format) == "csv" else rows_from_json
        rows = reader(text)
    except (BulkError, UnicodeDecodeError) as exc:
        raise click.ClickException(f"{file}: {exc}") from None
    body = {"credentials": rows, "dry_run": dry_run}
    with admin_client() as client:
        try:
            answer = client.call("POST", "/api/credentials:import", body=body)
        except AdminApiError as exc:
            if not isinstance(exc.body, dict) or "rows" not in exc.body:
                raise
            answer = exc.body
    if as_json:
        click.echo(json.dumps(answer, indent=2))
    else:
        for row in answer["rows"]:
            if row["error"] is not None:
                click.echo(f"row {row['row']} ({row['name'] or 'no name'}): {row['error']}")
        click.echo(answer["detail"])
    if answer["errors"]:
        sys.exit(1)


@credentials.command("export")
@_FORMAT
@click.option("--output", "-o", default="-", show_default=True,
              help="The file to write (mode 0600), or - for standard output.")  # fmt: skip
@click.option(
    "--include-secrets",
    is_flag=True,
    help="Add password hashes, SCRAM keys and JWT HMAC secrets as stored (never a clear "
    "password: none is kept), so that the file imports elsewhere; audited. Keep such a "
    "file as you would the passwords.",
)
@click.option("--type", "credential_type", type=_TYPES, help="Only credentials of this type.")
def export_command(
    file_format: str | None, output: str, include_secrets: bool, credential_type: str | None
) -> None:
    """Write every credential as rows `credentials import` takes, by name. Without
    --include-secrets a credential's secrets are left out: one with a password then
    imports only with a password added. Through the admin API (cormorant login)."""
    import os

    from services.common.auth.bulk import rows_to_csv
    from services.ops_cli import admin_client

    params = {
        "include_secrets": str(include_secrets).lower(),
        "type": None if credential_type is None else credential_type.upper(),
    }
    with admin_client() as client:
        answer = client.call("GET", "/api/credentials:export", params)
    rows = answer["credentials"]
    if _format_of(output, file_format) == "csv":
        text = rows_to_csv(rows)
    else:
        text = json.dumps({"credentials": rows}, indent=2) + "\n"
    if output == "-":
        click.echo(text, nl=False)
        return
    descriptor = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as out:
        os.fchmod(out.fileno(), 0o600)  # an older file keeps its mode otherwise
        out.write(text)
    click.echo(f"{len(rows)} credentials written to {output}", err=True)
