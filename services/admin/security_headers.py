"""Security headers on every response of the admin service (its API, console, docs page and
health endpoints), as OWASP's Secure Headers Project recommends:

- ``Content-Security-Policy``: everything from the admin service itself and nothing inline
  (:data:`POLICY`: the console is plain files with no inline script or style), and the one
  MQTT over WebSocket URL its WebSocket client connects to (setting
  ``admin_console_ws_url``, :func:`policy`); the docs
  page, whose Swagger UI starts from one inline script, allows that script by its SHA-256
  (:func:`swagger_page`) rather than any inline script;
- ``X-Frame-Options: DENY`` and CSP ``frame-ancestors 'none'``: no page is framed
  (clickjacking);
- ``X-Content-Type-Options: nosniff``: a response is read as the type it says;
- ``Referrer-Policy: no-referrer``: the console's URLs (client ids, topics in the fragment
  and query) are not sent to other sites.
"""

from __future__ import annotations

import base64
import hashlib
import re

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
"""The Content-Security-Policy of every response that sets none of its own (CSP Level 3)."""

HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
)
"""The other headers every response carries."""

_INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)


def policy(ws_url: str | None) -> str:
    """:data:`POLICY`, its ``connect-src`` also allowing ``ws_url`` (an exact ``ws://`` or
    ``wss://`` URL, CSP Level 3 host-source with a path) when given."""
    if ws_url is None:
        return POLICY
    return POLICY.replace("connect-src 'self'", f"connect-src 'self' {ws_url}")


class SecurityHeaders:
    """ASGI middleware: adds :data:`HEADERS` to every HTTP response of ``app``, and
    ``Content-Security-Policy: <csp>`` (default :data:`POLICY`) to those that carry no
    policy of their own."""

    def __init__(self, app: ASGIApp, csp: str = POLICY) -> None:
        self.app = app
        self.csp = csp.encode("ascii")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve ``scope`` with the headers added (other scopes pass untouched)."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                names = {name.lower() for name, _ in headers}
                headers += [(name, value) for name, value in HEADERS if name not in names]
                if b"content-security-policy" not in names:
                    headers.append((b"content-security-policy", self.csp))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)


def install(app: FastAPI, ws_url: str | None = None) -> None:
    """Put :class:`SecurityHeaders` around ``app`` (outermost: error pages get them too),
    its policy allowing connections to ``ws_url`` (:func:`policy`)."""
    app.add_middleware(SecurityHeaders, csp=policy(ws_url))


def swagger_page(title: str, openapi_url: str, assets: str) -> HTMLResponse:
    """The API's docs page: Swagger UI of ``openapi_url`` from the files under ``assets``
    (a URL path), with a Content-Security-Policy that allows its one inline script by hash
    (CSP Level 3, ``'sha256-...'`` source expression)."""
    page = get_swagger_ui_html(
        openapi_url=openapi_url,
        title=title,
        swagger_js_url=f"{assets}/swagger-ui-bundle.js",
        swagger_css_url=f"{assets}/swagger-ui.css",
        swagger_favicon_url=f"{assets}/favicon-32x32.png",
    )
    hashes = " ".join(
        "'sha256-{}'".format(
            base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
        )
        for script in _INLINE_SCRIPT.findall(bytes(page.body).decode("utf-8"))
    )
    policy = POLICY.replace("script-src 'self'", f"script-src 'self' {hashes}")
    page.headers["content-security-policy"] = policy
    return page
