"""What the admin API's routers share: the :class:`AdminContext` their handlers use (on
``app.state.context``, set by :func:`services.admin.api.create_app`), reading the state
topics up to now, auditing a change, paging parameters and common error responses.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import psycopg
from aiokafka.errors import KafkaError
from fastapi import HTTPException, Query, Request

from services.admin import models
from services.admin.cluster import StatsSampler
from services.admin.commands import CommandWriter
from services.admin.publish_api import HttpPublisher
from services.admin.state import ClientState
from services.admin.users import AdminUsers
from services.common.auth.manage import CredentialAdmin
from services.common.settings import Settings
from services.common.stores.base import MessageStore, StoreUnavailable
from services.common.web import Readiness

log = logging.getLogger(__name__)

#: Seconds a read waits for the state topics to be applied up to date.
SYNC_SECONDS = 2.0


@dataclass
class AdminContext:
    """What the API's handlers use."""

    settings: Settings
    state: ClientState
    sampler: StatsSampler
    users: AdminUsers
    writer: CommandWriter
    store: MessageStore
    readiness: Readiness
    credentials: CredentialAdmin
    publisher: HttpPublisher


def context_of(request: Request) -> AdminContext:
    """The :class:`AdminContext` of the application serving ``request``."""
    context: AdminContext = request.app.state.context
    return context


UNAVAILABLE: dict[int | str, dict[str, Any]] = {
    503: {"model": models.Problem, "description": "Kafka or PostgreSQL did not answer."}
}
"""The OpenAPI response of a change Kafka or PostgreSQL did not take."""

Offset = Annotated[int, Query(ge=0, le=1_000_000, description="Items to skip.")]
Limit = Annotated[int, Query(ge=1, le=500, description="Items to return.")]


async def synced(context: AdminContext) -> None:
    """Apply the state topics up to now, if Kafka answers within :data:`SYNC_SECONDS`
    (else serve what is known)."""
    try:
        async with asyncio.timeout(SYNC_SECONDS):
            await context.state.sync()
    except Exception as exc:
        log.info("serving state not synced with Kafka: %r", exc)


async def audited(
    context: AdminContext,
    user: str,
    action: str,
    target: str,
    detail: dict[str, Any],
    change: Callable[[], Awaitable[models.Accepted]],
) -> models.Accepted:
    """Carry out ``change`` and audit it with the status it ends with (202 Accepted, an
    :class:`HTTPException`'s status, 503 when Kafka did not answer); its errors go on."""
    code = 202
    try:
        return await change()
    except HTTPException as exc:
        code = exc.status_code
        raise
    except KafkaError:
        code = 503
        raise
    finally:
        await context.users.audit(user, action, target, detail, code)


T = TypeVar("T")

ExceptionKinds = type[Exception] | tuple[type[Exception], ...]
"""One exception type, or several, as ``isinstance`` takes them."""


def admin_users_of(request: Request) -> AdminUsers:
    """The app's :class:`AdminUsers` (``app.state.context.users``), who audit every change."""
    return context_of(request).users


@dataclass(frozen=True, slots=True)
class StoreChangeAudit:
    """How one PostgreSQL-backed API (credentials, blocks, API keys, integrations) answers
    its store's errors: ``invalid`` with 422, ``not_found`` with 404, ``conflict`` with 409
    (``()``: none of that kind). Called, it carries out a change and audits it."""

    invalid: ExceptionKinds = ()
    not_found: ExceptionKinds = ()
    conflict: ExceptionKinds = ()

    async def __call__(
        self,
        request: Request,
        user: str,
        action: str,
        target: str,
        detail: dict[str, Any],
        change: Callable[[], Awaitable[T]],
        status: int = 200,
    ) -> T:
        """Carry out ``change`` and have the app's admin users audit it (``user`` did
        ``action`` on ``target``; ``detail`` never holds a secret) with the HTTP status it
        ends with: ``status`` when it succeeds; this API's errors are answered with 422, 404
        or 409 and their message (:class:`HTTPException`); text PostgreSQL cannot keep (a
        lone surrogate) with 422; :class:`StoreUnavailable` goes on as 503, any other error
        as 500."""
        code = status
        try:
            return await change()
        except (UnicodeEncodeError, psycopg.DataError) as exc:
            code = 422
            raise HTTPException(422, f"a value cannot be stored: {exc}") from None
        except StoreUnavailable:
            code = 503
            raise
        except Exception as exc:
            for kinds, answer in ((self.invalid, 422), (self.not_found, 404), (self.conflict, 409)):
                if isinstance(exc, kinds):
                    code = answer
                    raise HTTPException(answer, str(exc)) from None
            code = 500
            raise
        finally:
            await admin_users_of(request).audit(user, action, target, detail, code)


ClientIdPattern = Annotated[
    str | None,
    Query(
        max_length=1024,
        description="A shell-style pattern the whole client id matches: * any characters, "
        "? one, [abc] one of these (sensor-*, line-?-[0-9]*).",
    ),
]
"""A list filter: client ids matching a pattern (:func:`client_id_matches`)."""


def client_id_matches(pattern: str | None, client_id: str) -> bool:
    """Whether ``client_id`` matches the shell-style ``pattern`` (case-sensitive, as
    Client Identifiers are; None matches every client id)."""
    return pattern is None or fnmatch.fnmatchcase(client_id, pattern)
