"""Credentials in bulk (``POST /api/credentials:import``, ``GET /api/credentials:export``):
what ``cormorant credentials import|export`` call.

An import takes up to :data:`~services.common.auth.bulk.MAX_ROWS` rows
(:mod:`services.common.auth.bulk` says their fields), checks every one as a single
``POST /api/credentials`` would, and stores all of them in one PostgreSQL transaction, or
none: a row that is not valid, or that conflicts with a stored credential or an earlier
row, is named in the answer (422) with its error, and nothing is written. ``dry_run``
checks without writing. An export holds no secret unless ``include_secrets`` (password
hashes, SCRAM keys, JWT HMAC secrets as stored; never a clear password, which is not
kept). Both are audited (the import with its row count, never a password).

The paths carry a custom method (``:import``, as Google's API guide AIP-136 writes them)
so that no credential name (``/api/credentials/{name}``) is shadowed.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from services.admin import models
from services.admin.auth import ERRORS, User
from services.admin.context import StoreChangeAudit, admin_users_of
from services.admin.credentials_api import credential_admin
from services.common.auth.bulk import MAX_ROWS, BulkError, export_row, import_rows
from services.common.auth.credentials import CredentialType

router = APIRouter(prefix="/api", tags=["credentials"])
"""Included by :func:`services.admin.api.create_app`."""


class ImportRequest(BaseModel):
    """Credentials to create, all or none."""

    credentials: list[dict[str, Any]] = Field(
        max_length=MAX_ROWS,
        description="The rows: objects with the fields of `cormorant credentials import` "
        "(name, type, kind, enabled, rules, client_id, username, password or password_hash "
        "or no_password, certificate, jwt, scram, ...).",
    )
    dry_run: bool = Field(False, description="Check every row, write nothing.")


class RowView(BaseModel):
    """One row's outcome."""

    row: int = Field(description="1 for the first row (a CSV file's second line).")
    name: str | None
    error: str | None = Field(description="Why the row is not valid; null: it is.")


class ImportResponse(BaseModel):
    """What an import did: written (all rows) or not (none), and each row's outcome."""

    detail: str
    written: bool
    dry_run: bool
    total: int
    errors: int
    rows: list[RowView]


class ExportResponse(BaseModel):
    """Every credential as an import row (secrets only when asked)."""

    include_secrets: bool
    credentials: list[dict[str, Any]]


@router.post(
    "/credentials:import",
    response_model=ImportResponse,
    responses={
        **ERRORS,
        422: {
            # Rows refused (each with its error), or the request itself (a row that is not
            # an object, text PostgreSQL cannot keep): nothing written either way.
            "model": ImportResponse | models.Problem,
            "description": "A row or the request is not valid: nothing written.",
        },
        503: {"model": models.Problem, "description": "PostgreSQL did not answer."},
    },
)
async def import_credentials(request: Request, body: ImportRequest, user: User) -> JSONResponse:
    """Create up to 10,000 credentials in one transaction, all or none, each checked as
    `POST /api/credentials` checks one; the answer lists every row's outcome."""
    admin = credential_admin(request)
    detail = {"rows": len(body.credentials), "dry_run": body.dry_run}

    async def change() -> Any:
        try:
            return await import_rows(admin, body.credentials, body.dry_run)
        except BulkError as exc:
            return str(exc)

    outcome = await StoreChangeAudit()(
        request, user, "import-credentials", f"{len(body.credentials)} credentials", detail, change
    )
    if isinstance(outcome, str):
        return JSONResponse({"detail": outcome}, 422)
    errors = outcome.errors
    if errors:
        summary = f"{len(errors)} of {len(outcome.rows)} rows are not valid: nothing written"
    elif outcome.dry_run:
        summary = f"all {len(outcome.rows)} rows are valid (dry run: nothing written)"
    else:
        summary = f"{len(outcome.rows)} credentials created"
    answer = ImportResponse(
        detail=summary,
        written=outcome.written,
        dry_run=outcome.dry_run,
        total=len(outcome.rows),
        errors=len(errors),
        rows=[RowView(row=r.row, name=r.name, error=r.error) for r in outcome.rows],
    )
    return JSONResponse(answer.model_dump(mode="json"), 422 if errors else 200)


@router.get(
    "/credentials:export",
    response_model=ExportResponse,
    responses={
        **ERRORS,
        503: {"model": models.Problem, "description": "PostgreSQL did not answer."},
    },
)
async def export_credentials(
    request: Request,
    user: User,
    include_secrets: Annotated[
        bool,
        Query(
            description="Add password hashes, SCRAM keys and JWT HMAC secrets as stored "
            "(audited); without them such credentials do not import again."
        ),
    ] = False,
    type: Annotated[models.CredentialTypeName | None, Query(description="Only this type.")] = None,
) -> ExportResponse:
    """Every credential (of one type, if given) as an import row, by name."""
    found = await credential_admin(request).list(None if type is None else CredentialType(type))
    if include_secrets:
        await admin_users_of(request).audit(
            user, "export-credentials", f"{len(found)} credentials", {"secrets": True}, 200
        )
    return ExportResponse(
        include_secrets=include_secrets,
        credentials=[export_row(c, include_secrets) for c in found],
    )
