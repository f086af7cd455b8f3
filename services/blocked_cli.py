"""``cormorant blocked add|list|delete``: the clients every ingest node refuses at CONNECT
(CONNACK 0x8A Banned; v3.1.1: 0x05), before their credentials are checked.

A thin shell over :class:`services.common.auth.blocked_store.BlockedStore` (the admin API
calls the same) on the settings' PostgreSQL (``CORMORANT_POSTGRES_DSN`` and the PostgreSQL
settings); every change reaches the ingest nodes within a second. ``--json`` prints JSON for
machines. Errors exit with status 1 and one line saying what is wrong.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import click

from services.common.auth.blocked import Block, BlockError, BlockKind
from services.common.auth.blocked_store import (
    BlockConflict,
    BlockedStore,
    BlockNotFound,
    new_block,
)
from services.common.auth.store import CredentialStore
from services.common.clock import now_ms
from services.common.stores.base import StoreUnavailable

T = TypeVar("T")

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")


def parse_duration(text: str) -> float:
    """Seconds of a duration written ``<number><unit>``, unit ``s``, ``m``, ``h`` or ``d``
    (``90s``, ``10m``, ``1.5h``, ``7d``). Raises ``click.BadParameter`` otherwise."""
    match = _DURATION.match(text.strip())
    if match is None or float(match.group(1)) <= 0:
        raise click.BadParameter(f"{text!r} is not a duration such as 90s, 10m, 2h or 7d")
    return float(match.group(1)) * _UNITS[match.group(2)]


def _run(action: Callable[[BlockedStore], Awaitable[T]]) -> T:
    """Run ``action`` with a store on the settings' PostgreSQL, turning every expected
    error into a one-line ``click`` error."""
    from services.common.settings import get_settings

    async def main() -> T:
        credentials = CredentialStore.from_settings(get_settings())
        try:
            return await action(BlockedStore(credentials.pool))
        finally:
            await credentials.close()

    try:
        return asyncio.run(main())
    except (BlockError, BlockConflict, BlockNotFound, StoreUnavailable) as exc:
        raise click.ClickException(str(exc)) from None


def _iso(ms: int | None) -> str | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC).isoformat()


def block_json(block: Block) -> dict[str, Any]:
    """``block`` as ``--json`` (and the admin API) shows it: times as ISO 8601 UTC."""
    return {
        "id": str(block.id),
        "kind": block.kind.value,
        "value": block.value,
        "reason": block.reason,
        "expires_at": _iso(block.expires_at_ms),
        "created_at": _iso(block.created_at_ms),
        "created_by": block.created_by,
    }


def _line(block: Block) -> str:
    expires = _iso(block.expires_at_ms) or "never"
    reason = f"  ({block.reason})" if block.reason else ""
    return f"{block.id}  {block.kind.value:<16} {block.value}  expires {expires}{reason}"


def _kind_and_value(options: dict[str, str | None]) -> tuple[BlockKind, str]:
    given = [(BlockKind(name), value) for name, value in options.items() if value is not None]
    if len(given) != 1:
        raise click.UsageError(
            "name exactly one of --client-id, --username, --address, --client-id-regex"
        )
    return given[0]


def _what_options(f: Callable[..., Any]) -> Callable[..., Any]:
    for name, help_text in reversed(
        [
            ("client-id", "A Client Identifier, exactly."),
            ("username", "A User Name, exactly."),
            ("address", "A source IP address or CIDR network (10.0.0.0/8, 2001:db8::/32)."),
            (
                "client-id-regex",
                "A regular expression the whole Client Identifier matches ('bot-[0-9]+').",
            ),
        ]
    ):
        f = click.option(f"--{name}", name.replace("-", "_"), help=help_text)(f)
    return f


@click.group()
def blocked() -> None:
    """Block clients by Client Identifier, User Name, source address or CIDR, or a regular
    expression over the client id (refused at CONNECT on every node within a second)."""


@blocked.command("add")
@_what_options
@click.option("--reason", default="", help="Why (shown by list; never sent to the client).")
@click.option("--expires-in", help="Lift the block after this long: 90s, 10m, 2h, 7d.")
@click.option("--json", "as_json", is_flag=True, help="Print the block as JSON.")
def add(
    client_id: str | None,
    username: str | None,
    address: str | None,
    client_id_regex: str | None,
    reason: str,
    expires_in: str | None,
    as_json: bool,
) -> None:
    """Block one client id, user name, address or network, or client id expression."""
    kind, value = _kind_and_value(
        {
            "client_id": client_id,
            "username": username,
            "address": address,
            "client_id_regex": client_id_regex,
        }
    )
    now = now_ms()
    expires = None if expires_in is None else now + round(parse_duration(expires_in) * 1000)

    async def action(store: BlockedStore) -> Block:
        block = new_block(
            kind, value, reason=reason, expires_at_ms=expires, created_by="cli", now=now
        )
        return await store.add(block)

    stored = _run(action)
    click.echo(json.dumps(block_json(stored)) if as_json else f"blocked: {_line(stored)}")


@blocked.command("list")
@click.option("--all", "include_expired", is_flag=True, help="Expired blocks too.")
@click.option("--json", "as_json", is_flag=True, help='Print JSON: {"blocked": [...]}.')
def list_blocks(include_expired: bool, as_json: bool) -> None:
    """The blocks in force (with --all: expired ones too), by kind and value."""
    found = _run(lambda store: store.list(include_expired))
    if as_json:
        click.echo(json.dumps({"blocked": [block_json(b) for b in found]}))
    elif not found:
        click.echo("no blocked clients")
    else:
        for block in found:
            click.echo(_line(block))


@blocked.command("delete")
@click.argument("block_id", required=False)
@_what_options
@click.option("--json", "as_json", is_flag=True, help="Print the deleted block as JSON.")
def delete(
    block_id: str | None,
    client_id: str | None,
    username: str | None,
    address: str | None,
    client_id_regex: str | None,
    as_json: bool,
) -> None:
    """Lift a block, named by its id (BLOCK_ID) or by what it blocks (one option)."""
    options = {
        "client_id": client_id,
        "username": username,
        "address": address,
        "client_id_regex": client_id_regex,
    }
    if block_id is not None:
        if any(v is not None for v in options.values()):
            raise click.UsageError("name the block by its id or by one option, not both")
        try:
            ident = uuid.UUID(block_id)
        except ValueError:
            raise click.UsageError(f"{block_id!r} is not a block id") from None
        deleted = _run(lambda store: store.delete(ident))
    else:
        kind, value = _kind_and_value(options)
        deleted = _run(lambda store: store.delete_value(kind, value))
    click.echo(json.dumps(block_json(deleted)) if as_json else f"unblocked: {_line(deleted)}")
