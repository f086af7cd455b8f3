"""The API keys API (``/api/api-keys``): list, add, delete the keys of the HTTP publish API.

The same code as ``cormorant api-keys`` (:mod:`services.common.auth.api_keys`, over the
credential store's PostgreSQL pool). A new key is shown once, in the answer that makes it;
only its hash is stored. Deleting a key revokes it at once. Every change is audited.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from services.admin import models
from services.admin.auth import ERRORS, User
from services.admin.context import StoreChangeAudit
from services.common.auth.api_keys import (
    ApiKey,
    ApiKeyConflict,
    ApiKeyError,
    ApiKeyNotFound,
    ApiKeyStore,
    new_api_key,
    public_view,
)
from services.common.auth.credentials import NAME_PATTERN

router = APIRouter(prefix="/api/api-keys", tags=["API keys"])
"""Included by :func:`services.admin.api.create_app`."""

_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": models.Problem, "description": "No such API key."}
}
_CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {"model": models.Problem, "description": "An API key of this name exists."}
}
_UNAVAILABLE: dict[int | str, dict[str, Any]] = {
    503: {"model": models.Problem, "description": "PostgreSQL did not answer."}
}


class ApiKeyView(BaseModel):
    """One API key, without its secret: the Client Identifier it publishes as, its rules."""

    id: uuid.UUID
    name: str
    client_id: str
    rules: list[str]
    created_at: str = Field(description="ISO 8601, UTC.")
    created_by: str


class NewApiKeyView(ApiKeyView):
    """A key just made: ``key`` is what its client sends (``Authorization: Bearer <key>``),
    shown this once."""

    key: str


class ApiKeyListView(BaseModel):
    """The API keys, by name."""

    api_keys: list[ApiKeyView]


class NewApiKey(BaseModel):
    """A key to make: its ``name``, ``rules`` (``allow publish sensors/#``; none: it may
    publish nothing) and the ``client_id`` its messages are published as (default
    ``http-<name>``)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN.pattern)
    rules: list[str] = Field(default_factory=list, max_length=1000)
    client_id: str | None = Field(None, min_length=1, max_length=1024)


def _store(request: Request) -> ApiKeyStore:
    return ApiKeyStore(request.app.state.context.credentials.store.pool)


_audited = StoreChangeAudit(invalid=ApiKeyError, not_found=ApiKeyNotFound, conflict=ApiKeyConflict)
"""Carries out a change of the API keys and audits it (422, 404, 409 for their errors)."""


@router.get("", response_model=ApiKeyListView, responses={**ERRORS, **_UNAVAILABLE})
async def list_api_keys(request: Request, user: User) -> ApiKeyListView:
    """The API keys, by name (never their secrets)."""
    found = await _store(request).list()
    return ApiKeyListView(api_keys=[ApiKeyView(**public_view(k)) for k in found])


@router.post(
    "",
    status_code=201,
    response_model=NewApiKeyView,
    responses={**ERRORS, **_CONFLICT, **_UNAVAILABLE},
)
async def add_api_key(request: Request, body: NewApiKey, user: User) -> NewApiKeyView:
    """Make an API key for the HTTP publish API; the answer holds the key, shown once."""
    token = ""

    async def change() -> ApiKey:
        nonlocal token
        key, token = new_api_key(body.name, body.rules, body.client_id, created_by=user)
        return await _store(request).add(key)

    detail = {"rules": body.rules, "client_id": body.client_id}
    added = await _audited(request, user, "add API key", body.name, detail, change, 201)
    return NewApiKeyView(**public_view(added), key=token)


@router.delete("/{name}", status_code=204, responses={**ERRORS, **_NOT_FOUND, **_UNAVAILABLE})
async def delete_api_key(
    request: Request,
    name: Annotated[str, Path(description="The key's name.", max_length=128)],
    user: User,
) -> Response:
    """Revoke an API key: its next request is refused (401)."""
    await _audited(
        request, user, "delete API key", name, {}, lambda: _store(request).delete(name), 204
    )
    return Response(status_code=204)
