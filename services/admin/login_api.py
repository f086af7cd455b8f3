"""Logging in and out of the admin API (``/api/login``, ``/api/logout``): an admin user's
name and password for a bearer token, throttled by the application's
:class:`~services.admin.login_throttle.LoginGuard` (on ``app.state.login_guard``, set by
:func:`services.admin.api.create_app`). Both are audited.
"""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request

from services.admin import models
from services.admin.auth import ERRORS, Credentials, User
from services.admin.context import context_of
from services.admin.login_throttle import RESPONSES as LOGIN_RESPONSES
from services.admin.login_throttle import LoginGuard

router = APIRouter(prefix="/api", tags=["login"])
"""Included by :func:`services.admin.api.create_app`."""


def _guard(request: Request) -> LoginGuard:
    guard: LoginGuard = request.app.state.login_guard
    return guard


@router.post("/login", response_model=models.TokenResponse, responses=LOGIN_RESPONSES)
async def login(body: models.LoginRequest, request: Request) -> models.TokenResponse:
    """Exchange an admin user's name and password for a bearer token (429 after too
    many failed logins from the address or for the user name)."""
    users = context_of(request).users
    address = request.client.host if request.client else ""
    try:
        token = await _guard(request).login(address, body.username, body.password)
    except HTTPException as exc:
        if exc.status_code == 401:  # a throttled storm is not written to the audit trail
            await users.audit(body.username, "login", body.username, {}, 401)
        raise
    await users.audit(body.username, "login", body.username, {}, 200)
    return models.TokenResponse(
        token=token.value, username=token.username, expires_at=token.expires_at
    )


@router.post("/logout", status_code=204, responses=ERRORS)
async def logout(request: Request, user: User, credentials: Credentials) -> None:
    """Revoke the token of this request."""
    assert credentials is not None  # current_user checked it
    users = context_of(request).users
    await users.logout(credentials.credentials)
    await users.audit(user, "logout", user, {}, 204)
