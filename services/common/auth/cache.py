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
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from services.common.auth.credentials import Credential, CredentialType
from services.common.auth.store import Change, CredentialStore, lookup_key

MAX_ENTRIES = 100_000
"""Lookup results kept (least recently used dropped first)."""

_UNKEYED = frozenset((CredentialType.X509, CredentialType.JWT))


class CredentialCache:
    """Cached lookups over ``store`` (see the module); at most ``max_entries`` results."""

    def __init__(self, store: CredentialStore, max_entries: int = MAX_ENTRIES) -> None:
        self.store = store
        self._max_entries = max_entries
        self._entries: OrderedDict[str, tuple[Credential, ...]] = OrderedDict()
        self._unkeyed: tuple[Credential, ...] | None = None
        self._generation = 0

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

    def changed(self, change: Change) -> None:
        """Forget what ``change`` makes stale."""
        self._generation += 1
        for key in change.keys:
            self._entries.pop(key, None)
        if change.types & _UNKEYED:
            self._unkeyed = None

    def clear(self) -> None:
        """Forget everything (the notifications were not followed for a while)."""
        self._generation += 1
        self._entries.clear()
        self._unkeyed = None
