"""The node's credential cache (services/common/auth/cache.py) over a store held in memory:
the set of client ids with a credential of their own, and its races with changes. Over the
real PostgreSQL and its notifications: tests/integration/test_credentials.py."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from services.common.auth import cache as cache_module
from services.common.auth.cache import CredentialCache
from services.common.auth.credentials import Credential, CredentialType
from services.common.auth.store import Change, CredentialStore
from services.common.stores.base import StoreUnavailable


class MemoryStore(CredentialStore):
    """The two lookups the client id set uses, over a list; ``gate`` holds a load of the
    set until the test opens it, ``down`` makes PostgreSQL unreachable."""

    def __init__(self, *credentials: Credential) -> None:
        self.credentials = list(credentials)
        self.lookups = 0
        self.gate = asyncio.Event()
        self.gate.set()
        self.loads = 0
        self.down = False

    async def client_ids(self, limit: int) -> list[str] | None:
        self.loads += 1
        await self.gate.wait()
        if self.down:
            raise StoreUnavailable("PostgreSQL at test is unavailable")
        found = [c.client_id for c in self.credentials if c.client_id and not c.username]
        return None if len(found) > limit else found

    async def by_client_id(self, client_id: str) -> list[Credential]:
        self.lookups += 1
        return [c for c in self.credentials if c.client_id == client_id and not c.username]


def _legacy(client_id: str) -> Credential:
    return Credential(uuid.uuid4(), client_id, CredentialType.MQTT_BASIC, client_id=client_id)


def _change(credential: Credential) -> Change:
    return Change(credential.id, "INSERT", frozenset({credential.type}), frozenset())


async def _settled(cache: CredentialCache, store: MemoryStore, loads: int) -> None:
    """Return once the store has seen ``loads`` loads and the loop ran what followed."""
    while store.loads < loads:
        await asyncio.sleep(0)
    for _ in range(5):
        await asyncio.sleep(0)


async def test_unknown_client_ids_cost_no_lookup_once_the_set_is_loaded() -> None:
    store = MemoryStore(_legacy("old-device"))
    cache = CredentialCache(store)
    assert await cache.by_client_id("new-1") == ()
    assert store.lookups == 1  # not loaded yet: asked
    task = asyncio.create_task(cache.follow_client_ids())
    try:
        await _settled(cache, store, 1)
        assert cache.client_ids_loaded
        assert [await cache.by_client_id(f"new-{i}") for i in range(100)] == [()] * 100
        assert store.lookups == 1
        assert len(await cache.by_client_id("old-device")) == 1
        assert store.lookups == 2
    finally:
        task.cancel()


async def test_a_change_during_a_load_makes_it_load_again() -> None:
    store = MemoryStore()
    cache = CredentialCache(store)
    task = asyncio.create_task(cache.follow_client_ids())
    try:
        store.gate.clear()
        await _settled(cache, store, 1)  # the first load is waiting for its answer
        added = _legacy("added-meanwhile")
        store.credentials.append(added)
        cache.changed(_change(added))
        store.gate.set()
        await _settled(cache, store, 2)
        assert cache.client_ids_loaded and store.loads == 2
        assert len(await cache.by_client_id("added-meanwhile")) == 1
        # Any change of an MQTT_BASIC credential unloads the set until it is read again.
        cache.changed(_change(added))
        assert not cache.client_ids_loaded
        await _settled(cache, store, 3)
        assert cache.client_ids_loaded
        # A resync (notifications missed) too.
        cache.clear()
        assert not cache.client_ids_loaded
        await _settled(cache, store, 4)
        assert cache.client_ids_loaded
    finally:
        task.cancel()


async def test_without_postgresql_lookups_go_on_as_before_and_the_load_is_retried() -> None:
    store = MemoryStore()
    store.down = True
    cache = CredentialCache(store)
    task = asyncio.create_task(cache.follow_client_ids())
    try:
        await _settled(cache, store, 1)
        assert not cache.client_ids_loaded
        await cache.by_client_id("any")
        assert store.lookups == 1
    finally:
        task.cancel()


async def test_too_many_client_ids_are_not_held(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_module, "MAX_CLIENT_IDS", 2)
    store = MemoryStore(*(_legacy(f"d{i}") for i in range(3)))
    cache = CredentialCache(store)
    task = asyncio.create_task(cache.follow_client_ids())
    try:
        await _settled(cache, store, 1)
        assert not cache.client_ids_loaded
        assert await cache.by_client_id("new") == ()
        assert store.lookups == 1  # asked, as without the set
    finally:
        task.cancel()
