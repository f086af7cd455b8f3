"""The MQTT credentials API and their rules (``/api/credentials``): list, create, show,
change, enable or disable, delete.

The same code as ``cormorant credentials`` (:class:`~services.common.auth.manage.
CredentialAdmin`): checked as the CLI checks, passwords hashed with argon2id (SCRAM: salted
keys), stored in PostgreSQL, and every change reaches the ingest nodes within a second (a
disabled or deleted credential's clients are disconnected with Reason Code 0x98). Answers
never hold a secret (:func:`~services.common.auth.credentials.public_view`); every change
is audited, without its password or key.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query, Request, Response

from services.admin import models
from services.admin.auth import ERRORS, User
from services.admin.context import StoreChangeAudit
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
from services.common.auth.store import CredentialConflict
from services.common.records import ClientKind

router = APIRouter(prefix="/api/credentials", tags=["credentials"])
"""Included by :func:`services.admin.api.create_app`."""

_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": models.Problem, "description": "No such credential."}
}
_CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {
        "model": models.Problem,
        "description": "The name, or the identity (user name and client id, certificate), "
        "is another credential's.",
    },
}
_UNAVAILABLE: dict[int | str, dict[str, Any]] = {
    503: {"model": models.Problem, "description": "PostgreSQL did not answer."}
}

Ref = Annotated[
    str,
    Path(
        pattern=models.CREDENTIAL_NAME_PATTERN,
        description="The credential's name (or its id).",
    ),
]


def credential_admin(request: Request) -> CredentialAdmin:
    """The app's :class:`CredentialAdmin` (``app.state.context.credentials``)."""
    admin: CredentialAdmin = request.app.state.context.credentials
    return admin


def view(credential: Credential) -> models.CredentialView:
    """``credential`` as the API shows it: :func:`public_view`, rules as objects."""
    shown = public_view(credential)
    shown["rules"] = [rule.to_json() for rule in credential.rules]
    return models.CredentialView(**shown)


def _rules(rules: list[models.RuleBody]) -> list[dict[str, str]]:
    return [rule.model_dump() for rule in rules]


def _certificate(body: models.CertificateBody | None) -> CertificateMatch | None:
    if body is None:
        return None
    fingerprint = body.fingerprint
    if fingerprint is not None:
        fingerprint = fingerprint.replace(":", "").lower()
    return CertificateMatch(fingerprint, body.common_name, body.san)


def _jwt(body: models.JwtBody | None) -> JwtSettings | None:
    if body is None:
        return None
    return JwtSettings(
        tuple(body.algorithms),
        body.key,
        body.audience,
        body.issuer,
        body.client_id_claim,
        body.username_claim,
        body.leeway_seconds,
        body.max_age_seconds,
        body.jwks_url,
    )


def _password(value: str | None) -> bytes | None:
    """The password's UTF-8 bytes (JSON text can hold lone surrogates, which have none)."""
    if value is None:
        return None
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        raise HTTPException(422, "the password is not valid UTF-8 text") from None


_audited = StoreChangeAudit(
    invalid=(CredentialError, RuleError), not_found=CredentialNotFound, conflict=CredentialConflict
)
"""Carries out a change of the credentials and audits it (422 for a credential or rule not
valid, 404, 409)."""


@router.get("", response_model=models.CredentialList, responses={**ERRORS, **_UNAVAILABLE})
async def list_credentials(
    request: Request,
    user: User,
    type: Annotated[models.CredentialTypeName | None, Query(description="Only this type.")] = None,
) -> models.CredentialList:
    """Every credential (of one type, if given), by name, with its rules."""
    found = await credential_admin(request).list(None if type is None else CredentialType(type))
    return models.CredentialList(credentials=[view(c) for c in found])


@router.post(
    "",
    status_code=201,
    response_model=models.CredentialView,
    responses={**ERRORS, **_CONFLICT, **_UNAVAILABLE},
)
async def add_credential(
    request: Request, body: models.NewCredential, user: User
) -> models.CredentialView:
    """Create a credential; MQTT clients may connect with it within a second."""
    spec = CredentialSpec(
        name=body.name,
        type=CredentialType(body.type),
        kind=ClientKind[body.kind],
        rules=_rules(body.rules),
        strict_subscribe=body.strict_subscribe,
        client_id=body.client_id,
        username=body.username,
        password=_password(body.password),
        certificate=_certificate(body.certificate),
        jwt=_jwt(body.jwt),
        enabled=body.enabled,
        allow_all=body.allow_all,
        no_password=body.no_password,
        scram_iterations=body.scram_iterations,
        jwt_no_audience=body.jwt.no_audience if body.jwt is not None else False,
    )
    detail = {"type": body.type, "kind": body.kind, "rules": len(body.rules),
              "allow_all": body.allow_all, "generate_secret": body.generate_secret}  # fmt: skip
    admin = credential_admin(request)
    if body.generate_secret:
        created, secret = await _audited(
            request, user, "add-credential", body.name, detail,
            lambda: admin.add_generated(spec), 201,
        )  # fmt: skip
        return view(created).model_copy(update={"secret": secret})
    return view(
        await _audited(
            request, user, "add-credential", body.name, detail, lambda: admin.add(spec), 201
        )
    )


@router.get(
    "/{ref}",
    response_model=models.CredentialView,
    responses={**ERRORS, **_NOT_FOUND, **_UNAVAILABLE},
)
async def show_credential(request: Request, ref: Ref, user: User) -> models.CredentialView:
    """One credential, with its rules."""
    try:
        return view(await credential_admin(request).get(ref))
    except CredentialNotFound as exc:
        raise HTTPException(404, str(exc)) from None


@router.patch(
    "/{ref}",
    response_model=models.CredentialView,
    responses={**ERRORS, **_NOT_FOUND, **_CONFLICT, **_UNAVAILABLE},
)
async def change_credential(
    request: Request, ref: Ref, body: models.CredentialChangesBody, user: User
) -> models.CredentialView:
    """Change a credential: its rules, kind, identity, password, or whether it is enabled
    (disabling disconnects its clients, MQTT 5 Reason Code 0x98, and refuses their next
    CONNECT with 0x8A Banned)."""
    changes = CredentialChanges(
        kind=None if body.kind is None else ClientKind[body.kind],
        rules=None if body.rules is None else _rules(body.rules),
        strict_subscribe=body.strict_subscribe,
        client_id=body.client_id,
        username=body.username,
        password=_password(body.password),
        remove_password=body.remove_password,
        certificate=_certificate(body.certificate),
        jwt=_jwt(body.jwt),
        enabled=body.enabled,
        allow_all=body.allow_all,
    )
    # What changed, never a password or key.
    detail = {
        name: (value if name in ("kind", "enabled", "allow_all", "strict_subscribe") else True)
        for name, value in body.model_dump(exclude_unset=True).items()
    }
    changed = await _audited(
        request,
        user,
        "change-credential",
        ref,
        detail,
        lambda: credential_admin(request).update(ref, changes),
    )
    return view(changed)


@router.delete(
    "/{ref}",
    status_code=204,
    responses={**ERRORS, **_NOT_FOUND, **_UNAVAILABLE},
)
async def delete_credential(request: Request, ref: Ref, user: User) -> Response:
    """Delete a credential; its connected clients are disconnected (Reason Code 0x98)."""
    await _audited(
        request,
        user,
        "delete-credential",
        ref,
        {},
        lambda: credential_admin(request).delete(ref),
        204,
    )
    return Response(status_code=204)
