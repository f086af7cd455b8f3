"""``cormorant api-keys add|list|delete``: the API keys of the HTTP publish API
(``POST /api/v1/publish``, docs/integrations/http-publish.md).

A thin shell over :mod:`services.common.auth.api_keys` (the admin API calls the same) on
the settings' PostgreSQL (``CORMORANT_POSTGRES_DSN`` and the PostgreSQL settings). A new
key is printed once; only its hash is stored. ``--json`` prints JSON for machines. Errors
exit with status 1 and one line saying what is wrong.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import TypeVar

import click

from services.common.auth.api_keys import (
    ApiKey,
    ApiKeyConflict,
    ApiKeyError,
    ApiKeyNotFound,
    ApiKeyStore,
    new_api_key,
    public_view,
)
from services.common.auth.store import CredentialStore
from services.common.stores.base import StoreUnavailable

T = TypeVar("T")


def _run(action: Callable[[ApiKeyStore], Awaitable[T]]) -> T:
    """Run ``action`` with a store on the settings' PostgreSQL, turning every expected
    error into a one-line ``click`` error."""
    from services.common.settings import get_settings

    async def main() -> T:
        credentials = CredentialStore.from_settings(get_settings())
        try:
            return await action(ApiKeyStore(credentials.pool))
        finally:
            await credentials.close()

    try:
        return asyncio.run(main())
    except (ApiKeyError, ApiKeyConflict, ApiKeyNotFound, StoreUnavailable) as exc:
        raise click.ClickException(str(exc)) from None


def _line(key: ApiKey) -> str:
    rules = ", ".join(str(rule) for rule in key.rules) or "no rules: may publish nothing"
    return f"{key.name}  client id {key.client_id}  ({rules})"


@click.group("api-keys")
def api_keys() -> None:
    """API keys of the HTTP publish API (POST /api/v1/publish), each with its rules."""


@api_keys.command("add")
@click.argument("name")
@click.option(
    "--rule",
    "rules",
    multiple=True,
    help="An authorization rule, '<allow|deny> <publish|all> <topic filter>' (repeatable, "
    "first match wins). Without rules the key may publish nothing.",
)
@click.option(
    "--client-id",
    help="The Client Identifier its messages are published as (default: http-NAME); "
    "${client_id} in its rules stands for it.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the key and its secret as JSON.")
def add(name: str, rules: tuple[str, ...], client_id: str | None, as_json: bool) -> None:
    """Make API key NAME and print it (once: only its hash is stored).

    \b
    cormorant api-keys add billing --rule 'allow publish commands/#'
    curl -H "Authorization: Bearer <key>" -H 'Content-Type: application/json' \\
        -d '{"topic": "commands/pump-1", "payload": "start"}' \\
        http://127.0.0.1:9170/api/v1/publish
    """
    token = ""

    async def action(store: ApiKeyStore) -> ApiKey:
        nonlocal token
        key, token = new_api_key(name, list(rules), client_id, created_by="cli")
        return await store.add(key)

    stored = _run(action)
    if as_json:
        click.echo(json.dumps({**public_view(stored), "key": token}))
    else:
        click.echo(f"API key {_line(stored)} created; the key (shown this once):\n{token}")


@api_keys.command("list")
@click.option("--json", "as_json", is_flag=True, help='Print JSON: {"api_keys": [...]}.')
def list_keys(as_json: bool) -> None:
    """The API keys, by name (never their secrets)."""
    found = _run(lambda store: store.list())
    if as_json:
        click.echo(json.dumps({"api_keys": [public_view(k) for k in found]}))
    elif not found:
        click.echo("no API keys")
    else:
        for key in found:
            click.echo(_line(key))


@api_keys.command("delete")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the deleted key as JSON.")
def delete(name: str, as_json: bool) -> None:
    """Revoke API key NAME: its next request is refused."""
    deleted = _run(lambda store: store.delete(name))
    click.echo(json.dumps(public_view(deleted)) if as_json else f"API key {name} deleted")
