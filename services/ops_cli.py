"""The operators' commands on live objects, through the admin API with the stored login
(:mod:`services.admin_client`), so that they work the same on the local cluster and on a
deployed stack:

- ``cormorant login [URL]`` / ``cormorant logout``;
- ``cormorant clients list|show|kick``: connected clients (their sessions' connections);
- ``cormorant sessions list|show|delete``: sessions, connected or persistent and waiting;
- ``cormorant subscriptions list``;
- ``cormorant retained list|show|delete``: retained messages (MQTT 3.3.1.3);
- ``cormorant delayed list|cancel``: delayed publications still waiting
  (``$delayed/<seconds>/<topic>``, docs/concepts/delayed-publish.md).

Lists take filters and pages (``--offset``, ``--limit``, or ``--all`` for every page);
every list and show takes ``--json`` (the API's own answer). Errors exit with status 1 and
one line saying what is wrong.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import click

from services.admin_client import (
    AdminApiError,
    AdminClient,
    forget_login,
    load_login,
    login_file,
    path_part,
    save_login,
)
from services.admin_client import login as api_login
from services.cli_common import PASSWORD_FILE_HELP, print_table, read_secret

#: Items one page request asks for with --all (the API's largest page).
PAGE_MAX = 500

_JSON = click.option("--json", "as_json", is_flag=True, help="Print the API's JSON answer.")


@contextmanager
def admin_client() -> Iterator[AdminClient]:
    """The API client of the stored login; its errors as one-line ``click`` errors."""
    try:
        client = AdminClient.from_stored_login()
        try:
            yield client
        finally:
            client.close()
    except AdminApiError as exc:
        raise click.ClickException(str(exc)) from None


def _page_options(command: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(
        [
            click.option("--offset", type=click.IntRange(0), default=0, show_default=True,
                         help="Items to skip."),
            click.option("--limit", type=click.IntRange(1, PAGE_MAX), default=50,
                         show_default=True, help="Items to show."),
            click.option("--all", "every_page", is_flag=True,
                         help="Every item (all pages); --offset and --limit ignored."),
            _JSON,
        ]
    ):  # fmt: skip
        command = option(command)
    return command


def _pages(
    client: AdminClient, path: str, params: dict[str, Any], offset: int, limit: int, every: bool
) -> dict[str, Any]:
    """One page of a list (``{"total", "offset", "limit", "items"}``), or with ``every``
    all of it as one page."""
    if not every:
        page: dict[str, Any] = client.call(
            "GET", path, {**params, "offset": offset, "limit": limit}
        )
        return page
    items: list[Any] = []
    while True:
        page = client.call("GET", path, {**params, "offset": len(items), "limit": PAGE_MAX})
        items.extend(page["items"])
        if not page["items"] or len(items) >= page["total"]:
            return {"total": page["total"], "offset": 0, "limit": len(items), "items": items}


def _print_page(
    page: dict[str, Any],
    as_json: bool,
    none: str,
    header: tuple[str, ...],
    row: Callable[[dict[str, Any]], tuple[str, ...]],
) -> None:
    """A page as JSON, or as a table with a line on standard error when more pages
    follow, or the line ``none`` when nothing matches."""
    if as_json:
        click.echo(json.dumps(page, indent=2))
        return
    items = page["items"]
    if not items:
        click.echo(none if page["offset"] == 0 else f"{none} past --offset {page['offset']}")
        return
    print_table(header, [row(item) for item in items])
    shown_to = page["offset"] + len(items)
    if shown_to < page["total"]:
        click.echo(
            f"{page['offset'] + 1}-{shown_to} of {page['total']}: --offset {shown_to} for "
            "the next page, --all for every one",
            err=True,
        )


def _when(value: str | None) -> str:
    return "-" if value is None else value.replace("T", " ")[:19] + "Z"


def _yes(value: bool) -> str:
    return "yes" if value else "no"


def _print_detail(detail: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(detail, indent=2))
        return
    for key, value in detail.items():
        if key == "subscription_list":
            click.echo("subscriptions:" + ("" if value else " (none)"))
            for sub in value:
                click.echo(f"  {sub['topic_filter']}  qos={sub['qos']}")
        elif key != "subscriptions":
            click.echo(f"{key}: {'-' if value is None else value}")


# ------------------------------------------------------------------------------ login, logout


@click.command("login")
@click.argument("url", required=False)
@click.option("--username", prompt=True, help="The admin user (cormorant admin-users add).")
@click.option("--password-file", type=click.Path(allow_dash=True), help=PASSWORD_FILE_HELP)
@click.option(
    "--stack-outputs",
    type=click.File("r"),
    help="Take the URL from a deployed stack's outputs (its adminUrl): `pulumi stack output "
    "--json` saved to a file, or - for standard input.",
)
@click.option(
    "--ca-file",
    type=click.Path(exists=True, dir_okay=False, resolve_path=True),
    help="CA bundle (PEM) to verify the admin URL's TLS certificate with (default: the "
    "system's); kept with the login.",
)
def login(
    url: str | None,
    username: str,
    password_file: str | None,
    stack_outputs: Any,
    ca_file: str | None,
) -> None:
    """Log in to the admin API at URL (default: the local cluster's,
    http://127.0.0.1:CORMORANT_ADMIN_PORT) and keep the token for the other commands in
    ~/.config/cormorant/login.json (mode 0600; $XDG_CONFIG_HOME moves it). The password
    is never kept.

    \b
    cormorant login --username alice
    cormorant login https://admin.example.com --username alice --password-file -
    cormorant login --stack-outputs outputs.json --username admin --password-file pw.txt
    """
    if url is not None and stack_outputs is not None:
        raise click.UsageError("give URL or --stack-outputs, not both")
    if stack_outputs is not None:
        url = _admin_url_of(stack_outputs.read())
    if url is None:
        from services.common.settings import get_settings

        url = f"http://127.0.0.1:{get_settings().admin_port}"
    if not url.startswith(("http://", "https://")):
        raise click.UsageError(f"URL {url!r}: an http:// or https:// URL")
    host = urlsplit(url).hostname or ""
    if url.startswith("http://") and host not in ("127.0.0.1", "::1", "localhost"):
        click.echo(
            f"warning: {url} is plain HTTP: the password and the token cross the network "
            "unencrypted (use the stack's https:// admin URL)",
            err=True,
        )
    if password_file is not None:
        password = read_secret(password_file).decode("utf-8", "surrogateescape")
    else:
        password = click.prompt("Password", hide_input=True)
    try:
        stored = save_login(api_login(url, username, password, ca_file))
    except AdminApiError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"logged in to {url.rstrip('/')} as {username} (login kept in {stored})")


def _admin_url_of(text: str) -> str:
    """The ``adminUrl`` of ``pulumi stack output --json``."""
    try:
        outputs = json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.UsageError(f"--stack-outputs: not JSON ({exc})") from None
    url = outputs.get("adminUrl") if isinstance(outputs, dict) else None
    if not isinstance(url, str):
        raise click.UsageError(
            "--stack-outputs has no adminUrl: the stack serves the admin API over HTTPS only "
            "with adminCertificateArn set (docs: Deploy to AWS); give the URL instead"
        )
    return url


@click.command("logout")
def logout() -> None:
    """Revoke the stored login's token at its admin API and forget the login."""
    try:
        stored = load_login()
    except AdminApiError as exc:
        forget_login()
        raise click.ClickException(f"{exc}; the file is deleted") from None
    if stored is None:
        click.echo("not logged in")
        return
    client = AdminClient(stored)
    try:
        client.call("POST", "/api/logout")
    except AdminApiError as exc:
        if exc.status != 401:  # an expired token needs no revoking
            click.echo(f"warning: the token was not revoked: {exc}", err=True)
    finally:
        client.close()
    forget_login()
    click.echo(f"logged out of {stored.url} ({login_file()} deleted)")


# ------------------------------------------------------------------------------------ clients

_CLIENT_ID_PATTERN = click.option(
    "--client-id",
    "pattern",
    help="Only client ids matching this shell-style pattern: * any characters, ? one, "
    "[abc] one of these ('sensor-*').",
)
_NODE = click.option("--node", help="Only those of this ingest node (its node id).")
_KIND = click.option(
    "--kind",
    type=click.Choice(["device", "application"], case_sensitive=False),
    help="DEVICE or APPLICATION.",
)


def _session_filters(pattern: str | None, node: str | None, kind: str | None) -> dict[str, Any]:
    return {"pattern": pattern, "node": node, "kind": None if kind is None else kind.upper()}


@click.group()
def clients() -> None:
    """Connected MQTT clients, on every ingest node (through the admin API: cormorant login)."""


@clients.command("list")
@_CLIENT_ID_PATTERN
@_NODE
@_KIND
@_page_options
def clients_list(
    pattern: str | None,
    node: str | None,
    kind: str | None,
    offset: int,
    limit: int,
    every_page: bool,
    as_json: bool,
) -> None:
    """The connected clients, by client id."""
    params = {**_session_filters(pattern, node, kind), "connected": "true"}
    with admin_client() as client:
        page = _pages(client, "/api/sessions", params, offset, limit, every_page)
    _print_page(
        page, as_json, "no connected clients",
        ("CLIENT ID", "NODE", "MQTT", "KIND", "ADDRESS", "CONNECTED AT", "SUBSCRIPTIONS"),
        lambda c: (c["client_id"], c["node_id"], c["protocol_version"], c["kind"],
                   c["client_address"] or "-", _when(c["connected_at"]), str(c["subscriptions"])),
    )  # fmt: skip


@clients.command("show")
@click.argument("client_id")
@_JSON
def clients_show(client_id: str, as_json: bool) -> None:
    """A connected client: its connection, session and subscriptions."""
    with admin_client() as client:
        detail = _session(client, client_id)
    if not detail["connected"]:
        raise click.ClickException(
            f"client {client_id!r} is not connected (its session waits for it: "
            f"cormorant sessions show {client_id})"
        )
    _print_detail(detail, as_json)


@clients.command("kick")
@click.argument("client_id")
@_JSON
def clients_kick(client_id: str, as_json: bool) -> None:
    """Disconnect CLIENT_ID (DISCONNECT with Reason Code 0x98 Administrative action, MQTT
    5.0 3.14.2.1; a 3.1.1 client's connection is closed). Its session stays as its Session
    Expiry Interval says: `cormorant sessions delete` ends it too."""
    with admin_client() as client:
        answer = _change(client, "POST", f"/api/sessions/{path_part(client_id)}/disconnect")
    if as_json:
        click.echo(json.dumps(answer, indent=2))
    else:
        click.echo(f"disconnecting {client_id} (node {answer['detail']['node_id']})")


def _session(client: AdminClient, client_id: str) -> dict[str, Any]:
    try:
        detail: dict[str, Any] = client.call("GET", f"/api/sessions/{path_part(client_id)}")
    except AdminApiError as exc:
        if exc.status == 404:
            raise AdminApiError(f"no client {client_id!r}: no session has this client id") from None
        raise
    return detail


def _change(client: AdminClient, method: str, path: str, **params: Any) -> Any:
    return client.call(method, path, params)


# ----------------------------------------------------------------------------------- sessions


@click.group()
def sessions() -> None:
    """MQTT sessions: connected clients' and persistent ones waiting for their client
    (through the admin API: cormorant login)."""


@sessions.command("list")
@_CLIENT_ID_PATTERN
@click.option("--connected/--disconnected", default=None,
              help="Only sessions whose client is connected, or is not.")  # fmt: skip
@click.option("--persistent/--not-persistent", default=None,
              help="Only sessions kept after their connection ends, or not.")  # fmt: skip
@_NODE
@_KIND
@_page_options
def sessions_list(
    pattern: str | None,
    connected: bool | None,
    persistent: bool | None,
    node: str | None,
    kind: str | None,
    offset: int,
    limit: int,
    every_page: bool,
    as_json: bool,
) -> None:
    """Sessions, by client id."""
    params = {
        **_session_filters(pattern, node, kind),
        "connected": None if connected is None else str(connected).lower(),
        "persistent": None if persistent is None else str(persistent).lower(),
    }
    with admin_client() as client:
        page = _pages(client, "/api/sessions", params, offset, limit, every_page)
    _print_page(
        page, as_json, "no sessions",
        ("CLIENT ID", "CONNECTED", "NODE", "MQTT", "KIND", "PERSISTENT", "EXPIRY (S)",
         "SUBSCRIPTIONS"),
        lambda s: (s["client_id"], _yes(s["connected"]), s["node_id"], s["protocol_version"],
                   s["kind"], _yes(s["persistent"]), str(s["session_expiry_interval"]),
                   str(s["subscriptions"])),
    )  # fmt: skip


@sessions.command("show")
@click.argument("client_id")
@_JSON
def sessions_show(client_id: str, as_json: bool) -> None:
    """CLIENT_ID's session: connection, subscriptions, messages waiting for it."""
    with admin_client() as client:
        detail = _session(client, client_id)
    _print_detail(detail, as_json)


@sessions.command("delete")
@click.argument("client_id")
@_JSON
def sessions_delete(client_id: str, as_json: bool) -> None:
    """End CLIENT_ID's session: a connected client is disconnected (0x98); its
    subscriptions and stored messages are deleted."""
    with admin_client() as client:
        answer = _change(client, "DELETE", f"/api/sessions/{path_part(client_id)}")
    if as_json:
        click.echo(json.dumps(answer, indent=2))
    else:
        click.echo(f"deleting the session of {client_id}")


# ------------------------------------------------------------------------------ subscriptions


@click.group()
def subscriptions() -> None:
    """Clients' subscriptions (through the admin API: cormorant login)."""


@subscriptions.command("list")
@_CLIENT_ID_PATTERN
@click.option("--topic-filter", "search", help="Only Topic Filters containing this text.")
@_page_options
def subscriptions_list(
    pattern: str | None,
    search: str | None,
    offset: int,
    limit: int,
    every_page: bool,
    as_json: bool,
) -> None:
    """Subscriptions, by client id (MQTT 3.8.3.1: QoS, No Local, Retain As Published,
    Retain Handling, Subscription Identifier)."""
    params = {"pattern": pattern, "search": search}
    with admin_client() as client:
        page = _pages(client, "/api/subscriptions", params, offset, limit, every_page)
    _print_page(
        page, as_json, "no subscriptions",
        ("CLIENT ID", "TOPIC FILTER", "QOS", "NO LOCAL", "RETAIN AS PUBLISHED",
         "RETAIN HANDLING", "SUBSCRIPTION ID"),
        lambda s: (s["client_id"], s["topic_filter"], str(s["qos"]), _yes(s["no_local"]),
                   _yes(s["retain_as_published"]), str(s["retain_handling"]),
                   "-" if s["subscription_identifier"] is None
                   else str(s["subscription_identifier"])),
    )  # fmt: skip


# ----------------------------------------------------------------------------------- retained


@click.group()
def retained() -> None:
    """Retained messages (through the admin API: cormorant login)."""


def _preview(message: dict[str, Any], width: int = 40) -> str:
    payload = str(message["payload"])
    text = payload if message["payload_encoding"] == "utf-8" else "base64:" + payload
    text = text.replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 3] + "..."


@retained.command("list")
@click.option(
    "--filter",
    "topic_filter",
    default="#",
    show_default=True,
    help="Only the Topic Names this MQTT Topic Filter matches ('sensors/+/temp').",
)
@_page_options
def retained_list(
    topic_filter: str, offset: int, limit: int, every_page: bool, as_json: bool
) -> None:
    """Retained messages whose Topic Name matches a Topic Filter (MQTT 4.7), by topic."""
    with admin_client() as client:
        page = _pages(client, "/api/retained", {"filter": topic_filter}, offset, limit, every_page)
    _print_page(
        page, as_json, "no retained messages",
        ("TOPIC", "QOS", "BYTES", "RECEIVED AT", "PAYLOAD"),
        lambda m: (m["topic"], str(m["qos"]), str(m["payload_size"]), _when(m["received_at"]),
                   _preview(m)),
    )  # fmt: skip


def _topic_name(topic: str) -> str:
    if "+" in topic or "#" in topic:
        raise click.UsageError(
            f"{topic!r} is a Topic Filter: name one topic (no + or #), or use retained list "
            "--filter"
        )
    return topic


@retained.command("show")
@click.argument("topic")
@_JSON
def retained_show(topic: str, as_json: bool) -> None:
    """The retained message of TOPIC (a Topic Name): QoS, size, when it came, and its
    payload's first 1,024 bytes (as text, or base64 when not UTF-8)."""
    with admin_client() as client:
        page = client.call("GET", "/api/retained", {"filter": _topic_name(topic), "limit": 1})
    if not page["items"]:
        raise click.ClickException(f"no retained message on {topic!r}")
    message = page["items"][0]
    if as_json:
        click.echo(json.dumps(message, indent=2))
        return
    for key in ("topic", "qos", "payload_size", "received_at", "payload_encoding"):
        click.echo(f"{key}: {message[key]}")
    shown = "" if message["payload_size"] <= 1024 else " (first 1,024 bytes)"
    click.echo(f"payload{shown}:")
    click.echo(message["payload"])


@retained.command("delete")
@click.argument("topic")
@_JSON
def retained_delete(topic: str, as_json: bool) -> None:
    """Delete TOPIC's retained message, as an empty retained PUBLISH would (MQTT 3.3.1.3)."""
    with admin_client() as client:
        answer = _change(client, "DELETE", "/api/retained", topic=_topic_name(topic))
    if as_json:
        click.echo(json.dumps(answer, indent=2))
    else:
        click.echo(f"deleting the retained message of {topic}")


# ------------------------------------------------------------------------------------ delayed


@click.group()
def delayed() -> None:
    """Delayed publications still waiting ($delayed/<seconds>/<topic>; through the admin
    API: cormorant login)."""


@delayed.command("list")
@click.option("--client-id", help="Only the messages this client published.")
@_page_options
def delayed_list(
    client_id: str | None, offset: int, limit: int, every_page: bool, as_json: bool
) -> None:
    """Delayed publications still waiting, the soonest due first: id, publisher, target
    topic, QoS, RETAIN, size, when due, payload."""
    with admin_client() as client:
        page = _pages(client, "/api/delayed", {"client_id": client_id}, offset, limit, every_page)
    _print_page(
        page, as_json, "no delayed publications wait",
        ("ID", "CLIENT ID", "TOPIC", "QOS", "RETAIN", "BYTES", "DUE AT", "PAYLOAD"),
        lambda m: (m["id"], m["client_id"], m["topic"], str(m["qos"]), _yes(m["retain"]),
                   str(m["payload_size"]), _when(m["due_at"]), _preview(m)),
    )  # fmt: skip


@delayed.command("cancel")
@click.argument("delayed_id", metavar="ID")
@_JSON
def delayed_cancel(delayed_id: str, as_json: bool) -> None:
    """Cancel the delayed publication ID (as `delayed list` shows it): once the ingest node
    holding it decided, says "cancelled" (it is never published), or fails saying it was
    published already (its due time came first)."""
    with admin_client() as client:
        answer = _change(client, "DELETE", f"/api/delayed/{path_part(delayed_id)}")
    if as_json:
        click.echo(json.dumps(answer, indent=2))
    else:
        detail = answer["detail"]
        click.echo(f"cancelled {delayed_id} (from {detail['client_id']} to {detail['topic']})")


# -------------------------------------------------------------------------------------- drain


@click.command()
@click.argument("node")
@click.option(
    "--window",
    type=click.FloatRange(0, 3600),
    default=60.0,
    show_default=True,
    help="The longest the node takes to disconnect its clients (seconds); its drain_rate "
    "paces them, faster if needed to finish within it.",
)
@_JSON
def drain(node: str, window: float, as_json: bool) -> None:
    """Drain ingest node NODE (its node id) by hand: it leaves the load balancer's rotation
    (/ready fails), stops accepting, and disconnects its clients in paced batches within
    --window (DISCONNECT 0x9C Use another server, MQTT 5.0 3.14.2.1; a 3.1.1 client's
    connection is closed); they reconnect to the other nodes. The node stays up, out of
    rotation, until it is stopped. `cormorant clients list --node NODE` shows it empty
    once done."""
    with admin_client() as client:
        answer = client.call("POST", f"/api/nodes/{path_part(node)}/drain", {"window": window})
    if as_json:
        click.echo(json.dumps(answer, indent=2))
    else:
        click.echo(f"draining {node} within {window:g} s")


COMMANDS = (login, logout, clients, sessions, subscriptions, retained, delayed, drain)
"""The commands :mod:`services.cli` adds to ``cormorant``."""
