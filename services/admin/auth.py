"""Who is calling the admin API: the bearer token of ``Authorization: Bearer <token>``
(RFC 6750), looked up in the admin users' tokens (:mod:`services.admin.users`).

Every ``/api`` router depends on :data:`User` (401 without a valid token) and lists
:data:`ERRORS` in its OpenAPI responses: the sessions API (:mod:`services.admin.api`), the
admin users API (:mod:`services.admin.admin_users_api`) and the MQTT credentials and
rules API (:mod:`services.admin.credentials_api`).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from services.admin import models
from services.admin.users import AdminUsers

ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": models.Problem, "description": "No valid bearer token."},
    422: {"model": models.Problem, "description": "A parameter is not valid."},
}
"""The error answers every authenticated call may give (its OpenAPI ``responses``)."""

_BEARER = HTTPBearer(auto_error=False)
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]
"""The request's ``Authorization`` header, parsed (None without one)."""


async def current_user(request: Request, credentials: Credentials) -> str:
    """The admin user whose valid bearer token the request carries; 401 otherwise. The
    users are ``request.app.state.context.users`` (:class:`AdminUsers`)."""
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise HTTPException(401, "log in first", {"WWW-Authenticate": "Bearer"})
    users: AdminUsers = request.app.state.context.users
    username = await users.user_of(credentials.credentials)
    if username is None:
        raise HTTPException(401, "the token is not valid", {"WWW-Authenticate": "Bearer"})
    return username


User = Annotated[str, Depends(current_user)]
"""A handler parameter: the calling admin user's name."""
