"""An ingest node's credential cache, kept right by the store's change notifications.

Lookups by key (user name, client id, certificate fingerprint) go to PostgreSQL once and
are remembered, found or not (an anonymous client's id is looked up at every CONNECT, and
misses are the common case); the few credentials no key finds (X509 patterns, JWT issuers)
are held together. A :class:`~.store.Change` forgets the keys it names (and the pattern and
issuer set when it is of those types), so every node agrees within the notification's
delay (milliseconds). When the listening connection is re-established the whole cache is
forgotten: notifications sent meanwhile are lost.

A lookup that raced with a change (started before the change was seen, answered after) is
used once but not remembered. While PostgreSQL is unreachable, cached entries keep serving
and other lookups raise :class:`~services.common.stores.base.StoreUnavailable`.

Client ids: a CONNECT without a User Name looks its Client Identifier up (a credential may
name a client id alone), and a fleet connecting for the first time, or again after a node
restart, brings ids the cache has never seen: one PostgreSQL query each (a fifth of an
ingest node's CPU while anonymous clients connected, bench/NOTES.md). So
:meth:`CredentialCache.follow_client_ids` keeps the set of client ids that have such a
credential (usually few; up to :data:`MAX_CLIENT_IDS`), loaded again after every change of
an MQTT_BASIC credential and after a resync; while it is loaded, an id not in it is
answered at once with no credential. While it is being loaded (or there are too many),
lookups go to PostgreSQL as above.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from services.common.auth.credentials import Credential, CredentialType
from services.common.auth.store import Change, CredentialStore, lookup_key
from services.common.stores.base import StoreUnavailable

log = logging.getLogger(__name__)

MAX_ENTRIES = 100_000
"""Lookup results kept (least recently used dropped first)."""

MAX_CLIENT_IDS = 100_000
"""The most client ids with a credential of their own held as a set; past it every
unknown id is looked up."""

RELOAD_BACKOFF_SECONDS = 1.0
"""Pause before loading the client ids again after PostgreSQL failed to answer."""

_UNKEYED = frozenset((CredentialType.X509, CredentialType.JWT))


class CredentialCache:
    """Cached lookups over ``store`` (see the module); at most ``max_entries`` results."""

    def __init__(self, store: CredentialStore, max_entries: int = MAX_ENTRIES) -> None:
        self.store = store
        self._max_entries = max_entries
        self._entries: OrderedDict[str, tuple[Credential, ...]] = OrderedDict()
        self._unkeyed: tuple[Credential, ...] | None = None
        self._generation = 0
        # The client ids that have a credential of their own (None: not known right now),
        # and whether they must be loaded (again).
        self._client_ids: frozenset[str] | None = None
        self._client_ids_stale = asyncio.Event()
        self._client_ids_stale.set()

    def __len__(self) -> int:
        return len(self._entries)

    async def _cached(
        self, key: str, load: Callable[[], Awaitable[list[Credential]]]
    ) -> tuple[Credential, ...]:
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
            return found
        generation = self._generation
        loaded = tuple(await load())
        if generation == self._generation:
            self._entries[key] = loaded
            if len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)
        return loaded

    async def by_username(self, username: str) -> tuple[Credential, ...]:
        """The MQTT_BASIC and SCRAM credentials naming ``username``."""
        return await self._cached(
            lookup_key("u:", username), lambda: self.store.by_username(username)
        )

    async def by_client_id(self, client_id: str) -> tuple[Credential, ...]:
        """The MQTT_BASIC credentials naming ``client_id`` and no user name."""
        known = self._client_ids
        if known is not None and client_id not in known:
            return ()
        return await self._cached(
            lookup_key("c:", client_id), lambda: self.store.by_client_id(client_id)
        )

    async def by_fingerprint(self, fingerprint: str) -> tuple[Credential, ...]:
        """The X509 credential of that certificate fingerprint, if any."""
        return await self._cached(
            lookup_key("f:", fingerprint), lambda: self.store.by_fingerprint(fingerprint)
        )

    async def unkeyed(self) -> tuple[Credential, ...]:
        """The X509 credentials matched by CN/SAN pattern and the JWT issuers."""
        if self._unkeyed is not None:
            return self._unkeyed
        generation = self._generation
        loaded: tuple[Credential, ...] = tuple(await self.store.patterns_and_issuers())
        if generation == self._generation:
            self._unkeyed = loaded
        return loaded

    async def get(self, credential_id: uuid.UUID) -> Credential | None:
        """The credential with that id, read from PostgreSQL (not cached)."""
        return await self.store.get(credential_id)

    @property
    def client_ids_loaded(self) -> bool:
        """Whether the client ids that have a credential of their own are known now (an id
        outside them is then answered without PostgreSQL)."""
        return self._client_ids is not None

    async def follow_client_ids(self) -> None:
        """Keep the set of client ids that have a credential of their own loaded (see the
        module), until cancelled: load it now and again whenever a change may have made it
        stale. A load that raced with a change is not used; PostgreSQL unreachable is
        logged and tried again after :data:`RELOAD_BACKOFF_SECONDS`."""
        while True:
            await self._client_ids_stale.wait()
            self._client_ids_stale.clear()
            generation = self._generation
            try:
                loaded = await self.store.client_ids(MAX_CLIENT_IDS)
            except StoreUnavailable as exc:
                log.warning("client ids with credentials not loaded: %s", exc)
                self._client_ids_stale.set()
                await asyncio.sleep(RELOAD_BACKOFF_SECONDS)
                continue
            if generation != self._generation:
                self._client_ids_stale.set()  # a change came meanwhile: load again
            elif loaded is not None:
                self._client_ids = frozenset(loaded)

    def _client_ids_changed(self) -> None:
        self._client_ids = None
        self._client_ids_stale.set()

    def changed(self, change: Change) -> None:
        """Forget what ``change`` makes stale."""
        self._generation += 1
        for key in change.keys:
            self._entries.pop(key, None)
        if change.types & _UNKEYED:
            self._unkeyed = None
        if CredentialType.MQTT_BASIC in change.types:
            self._client_ids_changed()

    def clear(self) -> None:
        """Forget everything (the notifications were not followed for a while)."""
        self._generation += 1
        self._entries.clear()
        self._unkeyed = None
        self._client_ids_changed()
