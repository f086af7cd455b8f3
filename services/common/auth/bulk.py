"""Credentials in bulk: the rows of ``cormorant credentials import|export`` and of the admin
API's ``POST /api/credentials:import`` and ``GET /api/credentials:export``.

A row is one credential as a JSON object (CSV: one line, the same fields as columns,
:data:`CSV_COLUMNS`):

- ``name`` (required), ``type`` (``MQTT_BASIC`` default, ``X509``, ``JWT``, ``SCRAM``),
  ``kind`` (``DEVICE`` default, ``APPLICATION``), ``enabled`` (default true), ``rules``
  (a list of rule texts such as ``allow publish sensors/${client_id}/#``; in CSV one cell,
  the rules separated by ``;``), ``strict_subscribe``, ``allow_all``;
- MQTT_BASIC: ``client_id``, ``username``, and one of ``password`` (clear text, hashed with
  argon2id on import), ``password_hash`` (a stored hash, as an export with secrets holds
  it) or ``no_password``; SCRAM: ``username`` and ``password`` (with ``scram_iterations``)
  or ``scram`` (the salted keys an export with secrets holds);
- X509: ``certificate`` (one of ``fingerprint``, ``common_name``, ``san``; in CSV the
  columns ``cert_fingerprint``, ``cert_common_name``, ``cert_san``);
- JWT: ``jwt``, an object (in CSV a cell of JSON) with ``algorithms``, ``key`` or
  ``jwks_url``, ``audience``, ``issuer``, ``client_id_claim``, ``username_claim``,
  ``leeway_seconds``, ``max_age_seconds``, ``no_audience``.

An import is all or nothing (:func:`import_rows`): every row is checked as ``credentials
add`` checks it, then all are inserted in one PostgreSQL transaction, or none when any
row is not valid or conflicts with a stored credential or an earlier row; the result says
for each row whether it is valid and why not.

An export (:func:`export_row`) holds no secret unless asked: without ``include_secrets`` a
password hash, SCRAM keys and a JWT HMAC secret are left out (such rows do not import
again without a password), with it they are written as stored (hashes and salted keys,
never a clear password: none is kept), so that an export imports into another cluster.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import csv
import io
import json
import os
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from services.common.auth.authorize import ALLOW_ALL_RULE, RuleError, parse_rules
from services.common.auth.certificates import CertificateMatch
from services.common.auth.credentials import (
    Credential,
    CredentialError,
    CredentialType,
    check_credential,
)
from services.common.auth.jwt_auth import JwtSettings
from services.common.auth.manage import CredentialAdmin, CredentialSpec
from services.common.auth.scram import ScramSecret
from services.common.records import ClientKind

MAX_ROWS = 10_000
"""The most rows one import takes (one PostgreSQL transaction)."""

CSV_COLUMNS = (
    "name", "type", "kind", "enabled", "client_id", "username", "password", "password_hash",
    "no_password", "rules", "allow_all", "strict_subscribe", "scram_iterations",
    "cert_fingerprint", "cert_common_name", "cert_san", "jwt", "scram",
)  # fmt: skip
"""The columns of a CSV file, in the order an export writes them (an import takes any
order and any subset; the first line names them)."""

_FIELDS = frozenset(CSV_COLUMNS) - {"cert_fingerprint", "cert_common_name", "cert_san"} | {
    "certificate"
}
_BOOLEANS = ("enabled", "no_password", "allow_all", "strict_subscribe")
_JWT_FIELDS = frozenset(
    ("algorithms", "key", "jwks_url", "audience", "issuer", "client_id_claim",
     "username_claim", "leeway_seconds", "max_age_seconds", "no_audience")
)  # fmt: skip
_TRUE = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


class BulkError(ValueError):
    """A file that is not a list of rows at all (the message says why); nothing is read."""


@dataclass(frozen=True, slots=True)
class RowResult:
    """One row's outcome: its number (1 = the first row, a CSV file's second line), its
    name, and why it is not valid (None: it is)."""

    row: int
    name: str | None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ImportResult:
    """An import's outcome: ``written`` (every row stored) or not, and each row's result."""

    written: bool
    dry_run: bool
    rows: list[RowResult]

    @property
    def errors(self) -> list[RowResult]:
        """The rows that are not valid."""
        return [row for row in self.rows if row.error is not None]


# ------------------------------------------------------------------------------------- files


def rows_from_json(text: str) -> list[dict[str, Any]]:
    """The rows of a JSON file: a list of objects, or ``{"credentials": [...]}`` (what an
    export writes). Raises :class:`BulkError`."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BulkError(f"not JSON: {exc}") from None
    if isinstance(data, dict) and isinstance(data.get("credentials"), list):
        data = data["credentials"]
    if not isinstance(data, list):
        raise BulkError('a JSON file holds a list of credentials, or {"credentials": [...]}')
    return _checked_count(data)


def rows_from_csv(text: str) -> list[dict[str, Any]]:
    """The rows of a CSV file whose first line names its columns (:data:`CSV_COLUMNS`; an
    empty cell is a field not given). Booleans are ``true``/``false`` (``yes``/``no``,
    ``1``/``0``), ``rules`` are separated by ``;``, ``jwt`` and ``scram`` are JSON. Raises
    :class:`BulkError` for an unknown column; a bad cell is that row's error on import."""
    reader = csv.DictReader(io.StringIO(text))
    header = [name.strip().lower() for name in reader.fieldnames or ()]
    if not header:
        raise BulkError("the CSV file is empty: its first line names the columns")
    unknown = [name for name in header if name not in CSV_COLUMNS]
    if unknown:
        raise BulkError(
            f"unknown CSV columns: {', '.join(unknown)} (known: {', '.join(CSV_COLUMNS)})"
        )
    reader.fieldnames = header
    rows: list[dict[str, Any]] = []
    for line in reader:
        rows.append(_row_of_cells({k: v for k, v in line.items() if k is not None}))
        _checked_count(rows)
    return rows


def _row_of_cells(cells: dict[str, str | None]) -> dict[str, Any]:
    row: dict[str, Any] = {}
    certificate: dict[str, str] = {}
    for column, cell in cells.items():
        value = (cell or "").strip()
        if not value:
            continue
        if column.startswith("cert_"):
            certificate[column.removeprefix("cert_")] = value
        elif column in _BOOLEANS:
            row[column] = _TRUE.get(value.lower(), value)
        elif column == "rules":
            row[column] = [rule.strip() for rule in value.split(";") if rule.strip()]
        elif column in ("jwt", "scram"):
            try:
                row[column] = json.loads(value)
            except json.JSONDecodeError:
                row[column] = value  # the row's error: not JSON
        elif column == "scram_iterations":
            row[column] = int(value) if value.isdigit() else value
        else:
            row[column] = value
    if certificate:
        row["certificate"] = certificate
    return row


def _checked_count(rows: list[Any]) -> list[Any]:
    if len(rows) > MAX_ROWS:
        raise BulkError(f"at most {MAX_ROWS:,} credentials in one import, not more")
    return rows


def rows_to_csv(rows: Iterable[dict[str, Any]]) -> str:
    """CSV text of export rows (:func:`export_row`), :data:`CSV_COLUMNS` as its header."""
    out = io.StringIO()
    writer = csv.DictWriter(out, CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        cells: dict[str, Any] = {}
        for key, value in row.items():
            if key == "certificate":
                cells.update({f"cert_{k}": v for k, v in value.items()})
            elif key == "rules":
                cells[key] = ";".join(value)
            elif key in ("jwt", "scram"):
                cells[key] = json.dumps(value)
            elif isinstance(value, bool):
                cells[key] = "true" if value else "false"
            else:
                cells[key] = value
        writer.writerow(cells)
    return out.getvalue()


# ------------------------------------------------------------------------------------ export


def export_row(credential: Credential, include_secrets: bool = False) -> dict[str, Any]:
    """``credential`` as an import row; its password hash, SCRAM keys and JWT HMAC secret
    only with ``include_secrets`` (see the module)."""
    row: dict[str, Any] = {
        "name": credential.name,
        "type": credential.type.value,
        "kind": credential.kind.name,
        "enabled": credential.enabled,
        "rules": [str(rule) for rule in credential.rules],
        "strict_subscribe": credential.strict_subscribe,
    }
    kind = credential.type
    if kind in (CredentialType.MQTT_BASIC, CredentialType.SCRAM):
        for key in ("client_id", "username"):
            if getattr(credential, key) is not None:
                row[key] = getattr(credential, key)
    if kind is CredentialType.MQTT_BASIC:
        if credential.password_hash is None:
            row["no_password"] = True
        elif include_secrets:
            row["password_hash"] = credential.password_hash
    if kind is CredentialType.SCRAM and include_secrets:
        row["scram"] = [
            {
                "mechanism": s.mechanism,
                "salt": base64.b64encode(s.salt).decode(),
                "iterations": s.iterations,
                "stored_key": base64.b64encode(s.stored_key).decode(),
                "server_key": base64.b64encode(s.server_key).decode(),
            }
            for s in credential.scram
        ]
    if credential.certificate is not None:
        row["certificate"] = credential.certificate.as_dict()
    if credential.jwt is not None:
        settings = credential.jwt
        jwt: dict[str, Any] = {"algorithms": list(settings.algorithms)}
        if settings.jwks_url is not None:
            jwt["jwks_url"] = settings.jwks_url
        elif include_secrets or not settings.hmac:
            jwt["key"] = settings.key
        for key in ("audience", "issuer", "client_id_claim", "username_claim",
                    "max_age_seconds"):  # fmt: skip
            if getattr(settings, key) is not None:
                jwt[key] = getattr(settings, key)
        jwt["leeway_seconds"] = settings.leeway_seconds
        if settings.audience is None and not settings.hmac:
            jwt["no_audience"] = True
        row["jwt"] = jwt
    return row


# ------------------------------------------------------------------------------------ import


def _text(row: dict[str, Any], key: str) -> str | None:
    value = row.get(key)
    if value is None or isinstance(value, str):
        return value
    raise CredentialError(f"{key}: expected text, not {json.dumps(value)}")


def _flag(row: dict[str, Any], key: str, default: bool = False) -> bool:
    value = row.get(key, default)
    if isinstance(value, bool):
        return value
    raise CredentialError(f"{key}: expected true or false, not {json.dumps(value)}")


def _choice(row: dict[str, Any], key: str, default: str, choices: Sequence[str]) -> str:
    value = _text(row, key) or default
    if value.upper() not in choices:
        raise CredentialError(f"{key}: one of {', '.join(choices)}, not {value!r}")
    return value.upper()


def _certificate(row: dict[str, Any]) -> CertificateMatch | None:
    value = row.get("certificate")
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"fingerprint", "common_name", "san"}:
        raise CredentialError("certificate: an object with fingerprint, common_name or san")
    fingerprint = _text(value, "fingerprint")
    if fingerprint is not None:
        fingerprint = fingerprint.replace(":", "").lower()
    return CertificateMatch(fingerprint, _text(value, "common_name"), _text(value, "san"))


def _jwt(row: dict[str, Any]) -> tuple[JwtSettings | None, bool]:
    value = row.get("jwt")
    if value is None:
        return None, False
    if not isinstance(value, dict):
        raise CredentialError("jwt: an object (in CSV: JSON text)")
    unknown = set(value) - _JWT_FIELDS
    if unknown:
        raise CredentialError(f"jwt: unknown fields {', '.join(sorted(unknown))}")
    key = _text(value, "key") or ""
    jwks_url = _text(value, "jwks_url")
    algorithms = value.get("algorithms")
    if algorithms is None:
        algorithms = ["RS256"] if jwks_url or key.startswith("-----BEGIN") else ["HS256"]
    if not isinstance(algorithms, list) or not all(isinstance(a, str) for a in algorithms):
        raise CredentialError("jwt.algorithms: a list of names such as RS256")
    numbers: dict[str, int | None] = {}
    for name in ("leeway_seconds", "max_age_seconds"):
        number = value.get(name)
        if number is not None and (not isinstance(number, int) or isinstance(number, bool)):
            raise CredentialError(f"jwt.{name}: expected a whole number of seconds")
        numbers[name] = number
    settings = JwtSettings(
        tuple(algorithms),
        key,
        _text(value, "audience"),
        _text(value, "issuer"),
        _text(value, "client_id_claim"),
        _text(value, "username_claim"),
        numbers["leeway_seconds"] or 0,
        numbers["max_age_seconds"],
        jwks_url,
    )
    return settings, _flag(value, "no_audience")


def _scram(row: dict[str, Any]) -> tuple[ScramSecret, ...]:
    value = row.get("scram")
    if value is None:
        return ()
    try:
        if not isinstance(value, list):
            raise TypeError
        return tuple(
            ScramSecret(
                str(s["mechanism"]),
                base64.b64decode(s["salt"], validate=True),
                int(s["iterations"]),
                base64.b64decode(s["stored_key"], validate=True),
                base64.b64decode(s["server_key"], validate=True),
            )
            for s in value
        )
    except (TypeError, KeyError, ValueError, binascii.Error):
        raise CredentialError(
            "scram: a list of {mechanism, salt, iterations, stored_key, server_key} "
            "(base64), as an export with secrets writes it"
        ) from None


def spec_of(row: dict[str, Any]) -> tuple[CredentialSpec, str | None, tuple[ScramSecret, ...]]:
    """The credential ``row`` describes: its spec, and the stored password hash and SCRAM
    keys it carries instead of a clear password. Raises :class:`CredentialError` naming the
    field."""
    if not isinstance(row, dict):
        raise CredentialError("a row is an object of fields")
    unknown = set(row) - _FIELDS
    if unknown:
        raise CredentialError(f"unknown fields: {', '.join(sorted(unknown))}")
    name = _text(row, "name")
    if not name:
        raise CredentialError("name: required")
    rules = row.get("rules", [])
    if isinstance(rules, str):
        rules = [r.strip() for r in rules.split(";") if r.strip()]
    if not isinstance(rules, list):
        raise CredentialError("rules: a list of rules")
    iterations = row.get("scram_iterations")
    if iterations is not None and (not isinstance(iterations, int) or isinstance(iterations, bool)):
        raise CredentialError("scram_iterations: expected a whole number")
    password = _text(row, "password")
    password_hash = _text(row, "password_hash")
    scram = _scram(row)
    if sum(x is not None for x in (password, password_hash)) + bool(scram) > 1:
        raise CredentialError("give one of password, password_hash and scram")
    jwt, no_audience = _jwt(row)
    spec = CredentialSpec(
        name=name,
        type=CredentialType(_choice(row, "type", "MQTT_BASIC", [t.value for t in CredentialType])),
        kind=ClientKind[_choice(row, "kind", "DEVICE", ["DEVICE", "APPLICATION"])],
        rules=rules,
        strict_subscribe=_flag(row, "strict_subscribe"),
        client_id=_text(row, "client_id"),
        username=_text(row, "username"),
        password=None if password is None else password.encode("utf-8"),
        certificate=_certificate(row),
        jwt=jwt,
        enabled=_flag(row, "enabled", True),
        allow_all=_flag(row, "allow_all"),
        no_password=_flag(row, "no_password"),
        scram_iterations=iterations,
        jwt_no_audience=no_audience,
    )
    return spec, password_hash, scram


async def credential_of(admin: CredentialAdmin, row: dict[str, Any]) -> Credential:
    """The checked credential ``row`` describes, its clear password hashed (argon2id or
    SCRAM, in a thread), ready to store. Raises :class:`CredentialError` or
    :class:`~.authorize.RuleError`."""
    spec, password_hash, scram = spec_of(row)
    if password_hash is None and not scram:
        return await admin.checked(spec)
    if password_hash is not None and spec.type is not CredentialType.MQTT_BASIC:
        raise CredentialError("password_hash: only an MQTT_BASIC credential has one")
    if scram and spec.type is not CredentialType.SCRAM:
        raise CredentialError("scram: only a SCRAM credential has SCRAM keys")
    if spec.no_password:
        raise CredentialError("give password_hash or no_password, not both")
    rules = parse_rules(spec.rules)
    credential = Credential(
        id=uuid.uuid4(),
        name=spec.name,
        type=spec.type,
        kind=spec.kind,
        enabled=spec.enabled,
        rules=(*rules, ALLOW_ALL_RULE) if spec.allow_all else rules,
        strict_subscribe=spec.strict_subscribe,
        client_id=spec.client_id,
        username=spec.username,
        password_hash=password_hash,
        scram=scram,
    )
    check_credential(credential)
    return credential


async def import_rows(
    admin: CredentialAdmin, rows: Sequence[Any], dry_run: bool = False
) -> ImportResult:
    """Check every row (clear passwords hashed in parallel, one thread per CPU), then, unless
    ``dry_run`` or a row is not valid, insert them all in one transaction
    (:meth:`~.store.CredentialStore.insert_all`), or none if any conflicts. Raises
    :class:`BulkError` for no rows or more than :data:`MAX_ROWS`, and
    :class:`~services.common.stores.base.StoreUnavailable`."""
    if not rows:
        raise BulkError("no credentials to import")
    _checked_count(list(rows))
    limit = asyncio.Semaphore(os.cpu_count() or 1)

    async def check(row: Any) -> Credential | str:
        async with limit:
            try:
                return await credential_of(admin, row)
            except (CredentialError, RuleError) as exc:
                return str(exc)

    built = await asyncio.gather(*(check(row) for row in rows))
    results = [
        RowResult(
            number,
            row.get("name") if isinstance(row, dict) and isinstance(row.get("name"), str) else None,
            outcome if isinstance(outcome, str) else None,
        )
        for number, (row, outcome) in enumerate(zip(rows, built, strict=True), start=1)
    ]
    valid = {i: c for i, c in enumerate(built) if isinstance(c, Credential)}
    indexes = list(valid)
    conflicts = await admin.store.insert_all(
        list(valid.values()), commit=not dry_run and len(valid) == len(built)
    )
    for position, message in conflicts.items():
        number = indexes[position]
        results[number] = RowResult(results[number].row, results[number].name, _conflict(message))
    written = not dry_run and not any(r.error for r in results)
    return ImportResult(written, dry_run, results)


def _conflict(message: str | None) -> str | None:
    return None if message is None else f"{message} (stored, or in an earlier row)"
