"""The admin users API: list, create, change a password, remove (``/api/admin-users``).

What ``cormorant admin-users`` does on a machine that reaches PostgreSQL, for operators
who reach only the admin API (a deployment's first login is ``admin``, whose password is
in Secrets Manager: they make their own users here and change that password). Every
change is audited; passwords never reach the audit trail or the logs. A user cannot
remove itself, so there is always one left who can log in.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Request, Response

from services.admin import models
from services.admin.auth import ERRORS, User
from services.admin.context import admin_users_of
from services.admin.users import UserError

router = APIRouter(prefix="/api/admin-users", tags=["admin users"])
"""Included by :func:`services.admin.api.create_app`."""

_NO_USER: dict[int | str, dict[str, Any]] = {
    404: {"model": models.Problem, "description": "No such admin user."}
}

Username = Annotated[str, Path(pattern=models.USERNAME_PATTERN, description="An admin user.")]


@router.get("", response_model=models.AdminUserList, responses=ERRORS)
async def list_admin_users(request: Request, user: User) -> models.AdminUserList:
    """Every admin user."""
    return models.AdminUserList(usernames=await admin_users_of(request).names())


@router.post(
    "",
    status_code=201,
    response_model=models.AdminUserList,
    responses={**ERRORS, 409: {"model": models.Problem, "description": "The name is taken."}},
)
async def add_admin_user(
    request: Request, body: models.NewAdminUser, user: User
) -> models.AdminUserList:
    """Create an admin user (its password hashed with argon2id); answers every user."""
    users = admin_users_of(request)
    try:
        await users.add(body.username, body.password)
    except UserError as exc:
        await users.audit(user, "add-admin-user", body.username, {}, 409)
        raise HTTPException(409, str(exc)) from exc
    await users.audit(user, "add-admin-user", body.username, {}, 201)
    return models.AdminUserList(usernames=await users.names())


@router.put("/{username}/password", status_code=204, responses={**ERRORS, **_NO_USER})
async def set_admin_password(
    request: Request, username: Username, body: models.NewPassword, user: User
) -> Response:
    """Change an admin user's password; its tokens are revoked (a user changing its own
    logs in again)."""
    users = admin_users_of(request)
    try:
        await users.set_password(username, body.password)
    except UserError as exc:
        await users.audit(user, "set-admin-password", username, {}, 404)
        raise HTTPException(404, str(exc)) from exc
    await users.audit(user, "set-admin-password", username, {}, 204)
    return Response(status_code=204)


@router.delete(
    "/{username}",
    status_code=204,
    responses={
        **ERRORS,
        **_NO_USER,
        409: {"model": models.Problem, "description": "A user cannot remove itself."},
    },
)
async def remove_admin_user(request: Request, username: Username, user: User) -> Response:
    """Remove an admin user and revoke its tokens."""
    users = admin_users_of(request)
    if username == user:
        await users.audit(user, "remove-admin-user", username, {}, 409)
        raise HTTPException(409, "you cannot remove yourself: log in as another admin user")
    removed = await users.remove(username)
    await users.audit(user, "remove-admin-user", username, {}, 204 if removed else 404)
    if not removed:
        raise HTTPException(404, f"no admin user {username!r}")
    return Response(status_code=204)
