"""The admin login under attack: failed logins counted per IP address and per user name in
a sliding window (:class:`~services.common.auth.throttle.FailureWindow`); past
``admin_login_max_failures_per_address`` / ``admin_login_max_failures_per_user`` failures
within ``admin_login_window_seconds`` a login gets 429 Too Many Requests with
``Retry-After`` (RFC 9110 15.5.x, 10.2.3: seconds) before any password is checked. The
password checks themselves run in the admin users' bounded hashing pool
(:class:`~services.admin.users.AdminUsers`): 503 when it is full, 429 when the caller's
address holds its share.

The counts live in the admin process (each admin task counts its own callers).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from fastapi import HTTPException

from services.admin import models
from services.admin.users import AdminUsers, Token
from services.common.auth.throttle import FailureWindow, PoolBusy, SourceBusy
from services.common.settings import Settings

RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": models.Problem, "description": "Wrong name or password."},
    429: {
        "model": models.Problem,
        "description": "Too many failed logins from this address or for this user name, or "
        "too many of this address's logins being checked: try again after Retry-After "
        "seconds.",
    },
    503: {"model": models.Problem, "description": "Too many logins being checked."},
}
"""The error answers of ``POST /api/login`` (its OpenAPI ``responses``)."""


def _too_many(seconds: float, detail: str) -> HTTPException:
    return HTTPException(429, detail, {"Retry-After": str(max(1, math.ceil(seconds)))})


class LoginGuard:
    """Logins of ``users`` throttled as the module says, with the limits of ``settings``;
    ``clock`` is a monotonic clock in seconds (a test's own, or :func:`time.monotonic`)."""

    def __init__(
        self,
        users: AdminUsers,
        settings: Settings,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.users = users
        self.per_address = settings.admin_login_max_failures_per_address
        self.per_user = settings.admin_login_max_failures_per_user
        self.failures = FailureWindow(
            settings.admin_login_window_seconds, max(self.per_address, self.per_user)
        )
        self.clock = clock

    def check(self, address: str, username: str) -> None:
        """Raise a 429 :class:`HTTPException` if ``address`` or ``username`` has failed too
        often lately."""
        now = self.clock()
        wait = max(
            self.failures.retry_after(("address", address), self.per_address, now),
            self.failures.retry_after(("user", username), self.per_user, now),
        )
        if wait > 0:
            raise _too_many(wait, "too many failed logins: try again later")

    async def login(self, address: str, username: str, password: str) -> Token:
        """A token for ``username`` if ``password`` is its password. Raises
        :class:`HTTPException`: 429 (throttled, see :meth:`check`, or the address's share
        of the hashing pool is taken), 503 (the pool is full), 401 (wrong name or
        password: counted against ``address`` and ``username``)."""
        self.check(address, username)
        try:
            token = await self.users.login(username, password, address)
        except SourceBusy:
            raise _too_many(1, "too many logins from this address being checked") from None
        except PoolBusy:
            raise HTTPException(
                503, "too many logins being checked", {"Retry-After": "1"}
            ) from None
        if token is None:
            now = self.clock()
            self.failures.failed(("address", address), now)
            self.failures.failed(("user", username), now)
            raise HTTPException(401, "wrong user name or password", {"WWW-Authenticate": "Bearer"})
        self.failures.forget(("user", username))
        return token
