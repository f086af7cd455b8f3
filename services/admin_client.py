"""The admin API from the command line: a stored login and the calls made with it.

``cormorant login`` exchanges an admin user's name and password for a bearer token
(``POST /api/login``) and keeps the admin URL, the user name, the token and its expiry in
``$XDG_CONFIG_HOME/cormorant/login.json`` (``~/.config/cormorant/login.json`` by default),
a file only its owner may read or write (0600, in a 0700 directory): the token is as good
as the password until it expires or ``cormorant logout`` revokes it. The password itself is
never kept. The operators' commands (``cormorant clients|sessions|subscriptions|retained``,
``credentials import|export``) call the API at that URL with that token, so they work the
same against the local cluster and a deployed stack.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import requests

#: Seconds one API call may take (an import of 10,000 credentials with clear passwords
#: hashes them all: minutes on a small admin task).
TIMEOUT_SECONDS = 600.0


class AdminApiError(Exception):
    """A call that failed: not logged in, the API unreachable, or its error answer (the
    message says which, in one line; ``status`` is the HTTP status, 0 without one, and
    ``body`` the JSON answer, if any)."""

    def __init__(self, message: str, status: int = 0, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


@dataclass(frozen=True, slots=True)
class Login:
    """A stored login: the admin API's base URL, the user, the bearer token, when it
    expires (ISO 8601), and the CA bundle to verify the URL's TLS certificate with (None:
    the system's)."""

    url: str
    username: str
    token: str
    expires_at: str
    ca_file: str | None = None


def config_dir() -> Path:
    """``$XDG_CONFIG_HOME/cormorant``, or ``~/.config/cormorant`` (XDG Base Directory)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "cormorant"


def login_file() -> Path:
    """Where the login is kept."""
    return config_dir() / "login.json"


def save_login(login: Login) -> Path:
    """Keep ``login`` (replacing any other) in a file of mode 0600 in a directory of mode
    0700, written whole or not at all; returns the file."""
    directory = config_dir()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    directory.chmod(0o700)
    path = login_file()
    partial = path.with_suffix(".tmp")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as out:
        os.fchmod(out.fileno(), 0o600)  # a file left by an older run keeps its mode
        json.dump(asdict(login), out, indent=2)
    partial.replace(path)
    return path


def load_login() -> Login | None:
    """The stored login, or None. Raises :class:`AdminApiError` if the file is not one."""
    path = login_file()
    try:
        data = json.loads(path.read_text())
        return Login(**data)
    except FileNotFoundError:
        return None
    except (ValueError, TypeError, OSError) as exc:
        raise AdminApiError(f"{path} is not a login ({exc}): run cormorant login again") from None


def forget_login() -> bool:
    """Delete the stored login; whether there was one."""
    try:
        login_file().unlink()
    except FileNotFoundError:
        return False
    return True


def path_part(value: str) -> str:
    """``value`` (a client id, a credential name) as one percent-encoded URL path part."""
    return quote(value, safe="")


def _problem(response: requests.Response) -> tuple[str, Any]:
    """The error an answer describes, in one line (FastAPI's validation errors joined)."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:200] or response.reason, None
    detail = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, list):
        parts = []
        for error in detail:
            location = [str(part) for part in error.get("loc", ()) if part not in ("query", "body")]
            parts.append(f"{'.'.join(location)}: {error.get('msg')}" if location else error["msg"])
        return "; ".join(parts), body
    return str(detail or response.reason), body


def login(url: str, username: str, password: str, ca_file: str | None = None) -> Login:
    """Log in at the admin API ``url`` (``POST /api/login``); returns the login to keep.
    Raises :class:`AdminApiError` (wrong name or password: 401; throttled: 429)."""
    url = url.rstrip("/")
    try:
        response = requests.post(
            f"{url}/api/login",
            json={"username": username, "password": password},
            timeout=TIMEOUT_SECONDS,
            verify=ca_file or True,
        )
    except requests.RequestException as exc:
        raise AdminApiError(f"cannot reach the admin API at {url}: {exc}") from None
    if response.status_code != 200:
        message, body = _problem(response)
        raise AdminApiError(f"login refused by {url}: {message}", response.status_code, body)
    answer = response.json()
    return Login(url, answer["username"], answer["token"], answer["expires_at"], ca_file)


class AdminClient:
    """Calls to the admin API with the stored login (:func:`load_login`)."""

    def __init__(self, login: Login) -> None:
        self.login = login
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {login.token}"
        self.session.verify = login.ca_file or True

    @classmethod
    def from_stored_login(cls) -> AdminClient:
        """A client with the stored login. Raises :class:`AdminApiError` without one."""
        stored = load_login()
        if stored is None:
            raise AdminApiError(
                "not logged in: run `cormorant login [URL] --username NAME` first "
                "(the local cluster's admin API without URL)"
            )
        return cls(stored)

    def call(
        self,
        method: str,
        path: str,
        params: dict[str, Any] | None = None,
        body: Any = None,
    ) -> Any:
        """``method path`` (``/api/...``) with query ``params`` (None values left out) and
        JSON ``body``; the JSON answer (None for 204). Raises :class:`AdminApiError` with
        the API's own message for an error answer, and says to log in again on a 401."""
        url = self.login.url + path
        query = {k: v for k, v in (params or {}).items() if v is not None}
        try:
            response = self.session.request(
                method, url, params=query, json=body, timeout=TIMEOUT_SECONDS
            )
        except requests.RequestException as exc:
            raise AdminApiError(f"cannot reach the admin API at {self.login.url}: {exc}") from None
        if response.status_code == 401:
            raise AdminApiError(
                f"the login to {self.login.url} as {self.login.username} is no longer valid "
                "(expired, revoked, or the user's password changed): run cormorant login again",
                401,
            )
        if response.status_code >= 400:
            message, answer = _problem(response)
            raise AdminApiError(message, response.status_code, answer)
        if response.status_code == 204 or not response.content:
            return None
        return response.json()

    def close(self) -> None:
        """Close the HTTP connections."""
        self.session.close()
