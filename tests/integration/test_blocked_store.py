"""Blocked clients in the real PostgreSQL: the store, its change notifications on the
credentials' listening connection, and the node's follower that keeps a gate's blocks."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from services.common.auth.blocked import FLAPPING_CREATOR, Block, BlockKind, ConnectGate
from services.common.auth.blocked_store import (
    CHANNEL,
    BlockConflict,
    BlockedFollower,
    BlockedStore,
    BlockNotFound,
    new_block,
)
from services.common.auth.store import CredentialStore
from services.common.clock import now_ms
from tests.waiting import wait_for


@pytest_asyncio.fixture(loop_scope="function")
async def store(postgres_server: str) -> AsyncIterator[BlockedStore]:
    credentials = CredentialStore(postgres_server)
    yield BlockedStore(credentials.pool)
    await credentials.close()


def _id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def test_blocks_are_added_listed_and_deleted(store: BlockedStore) -> None:
    client_id = _id("c")
    block = new_block(BlockKind.CLIENT_ID, client_id, reason="why", created_by="ops")
    added = await store.add(block)
    assert added == block  # nothing lost on the way (times at ms precision)
    assert added in await store.list()
    with pytest.raises(BlockConflict):
        await store.add(new_block(BlockKind.CLIENT_ID, client_id))
    network = await store.add(new_block(BlockKind.ADDRESS, "198.51.100.9/24"))
    assert network.value == "198.51.100.0/24"
    assert (await store.delete_value(BlockKind.ADDRESS, "198.51.100.0/24")).id == network.id
    assert (await store.delete(added.id)).id == added.id
    with pytest.raises(BlockNotFound):
        await store.delete(added.id)


async def test_flapping_blocks_lengthen_but_never_shorten_a_block(store: BlockedStore) -> None:
    client_id = _id("flappy")
    now = now_ms()

    def flap(expires_in_ms: int) -> Block:
        return Block(uuid.uuid4(), BlockKind.CLIENT_ID, client_id, "flapping",
                     now + expires_in_ms, now, FLAPPING_CREATOR)  # fmt: skip

    def expiry(blocks: list[Block]) -> int | None:
        return next(b.expires_at_ms for b in blocks if b.value == client_id)

    await store.extend(flap(60_000))
    await store.extend(flap(30_000))  # another node, a little later: shorter, ignored
    assert expiry(await store.list()) == now + 60_000
    await store.extend(flap(120_000))
    assert expiry(await store.list()) == now + 120_000
    await store.delete_value(BlockKind.CLIENT_ID, client_id)
    forever = await store.add(new_block(BlockKind.CLIENT_ID, client_id))
    await store.extend(flap(60_000))
    assert expiry(await store.list()) is None  # an operator's permanent block stays
    await store.delete(forever.id)


async def test_an_expired_block_is_not_in_force_and_may_be_added_again(
    store: BlockedStore,
) -> None:
    client_id = _id("old")
    now = now_ms()
    await store.extend(Block(uuid.uuid4(), BlockKind.CLIENT_ID, client_id, "", now + 1, now - 5))
    await wait_for(lambda: now_ms() > now + 1, "the expiry")
    assert client_id not in [b.value for b in await store.list()]
    assert client_id in [b.value for b in await store.list(include_expired=True)]
    again = await store.add(new_block(BlockKind.CLIENT_ID, client_id))
    assert [b.id for b in await store.list() if b.value == client_id] == [again.id]
    await store.delete(again.id)


async def test_a_node_follows_the_blocks_through_the_credentials_listener(
    store: BlockedStore, postgres_server: str
) -> None:
    listener = CredentialStore(postgres_server)
    gate = ConnectGate()
    follower = BlockedFollower(BlockedStore(listener.pool), gate)
    connected = asyncio.Event()

    def reconnected() -> None:
        follower.changed()
        connected.set()

    tasks = [
        asyncio.create_task(
            listener.listen(lambda _c: None, reconnected, {CHANNEL: follower.changed})
        ),
        asyncio.create_task(follower.run()),
    ]
    try:
        await asyncio.wait_for(connected.wait(), 10)
        await asyncio.wait_for(follower.loaded.wait(), 10)
        client_id = _id("late")
        assert gate.check(client_id, None, "", now_ms()) is None
        added = await store.add(new_block(BlockKind.CLIENT_ID, client_id))
        await wait_for(
            lambda: gate.check(client_id, None, "", now_ms()) is not None, "the block", 2
        )
        await store.delete(added.id)
        await wait_for(lambda: gate.check(client_id, None, "", now_ms()) is None, "the unblock", 2)
    finally:
        for task in tasks:
            task.cancel()
        await listener.close()
