"""Stored messages of persistent DEVICE sessions: one interface, Redis and PostgreSQL backends.

:func:`open_store` builds the store the settings choose; :mod:`.base` defines the interface.
"""

from __future__ import annotations

from services.common.settings import Settings
from services.common.stores.base import (
    AckKind,
    AckRequest,
    AppendRequest,
    AppendResult,
    MessageState,
    MessageStore,
    StoredMessage,
    StoreError,
    StoreStats,
    StoreUnavailable,
    WindowRequest,
)
from services.common.stores.postgres_pool import password_of
from services.common.stores.postgres_store import PostgresMessageStore
from services.common.stores.redis_store import RedisMessageStore

__all__ = [
    "AckKind",
    "AckRequest",
    "AppendRequest",
    "AppendResult",
    "MessageState",
    "MessageStore",
    "PostgresMessageStore",
    "RedisMessageStore",
    "StoreError",
    "StoreStats",
    "StoreUnavailable",
    "StoredMessage",
    "WindowRequest",
    "open_store",
]


def open_store(settings: Settings) -> MessageStore:
    """The message store ``settings.store_backend`` names, configured from ``settings``.

    Redis: ``redis_url`` (``rediss://`` for TLS), ``redis_password``, ``redis_ssl_cafile``,
    ``redis_key_prefix``, ``redis_sentinels`` with ``redis_sentinel_master`` (a primary
    that fails over), ``redis_wait_replicas``; PostgreSQL: ``postgres_dsn``, ``postgres_password``,
    ``postgres_sslmode``, ``postgres_sslrootcert``. Both take
    ``persisted_max_messages`` as the per-client cap and ``store_timeout_seconds`` as the
    per-operation timeout (seconds). Nothing is connected yet: the store connects (and
    PostgreSQL migrates its schema) on first use, so this never raises StoreUnavailable.
    Raises ``ValueError`` for an invalid cap or key prefix.
    """
    if settings.store_backend == "postgres":
        return PostgresMessageStore(
            settings.postgres_dsn,
            max_messages=settings.persisted_max_messages,
            timeout=settings.store_timeout_seconds,
            password=password_of(settings),
            sslmode=settings.postgres_sslmode,
            sslrootcert=settings.postgres_sslrootcert,
        )
    return RedisMessageStore(
        settings.redis_url,
        key_prefix=settings.redis_key_prefix,
        max_messages=settings.persisted_max_messages,
        timeout=settings.store_timeout_seconds,
        password=settings.redis_password,
        ssl_cafile=settings.redis_ssl_cafile,
        sentinels=settings.redis_sentinels,
        sentinel_master=settings.redis_sentinel_master,
        wait_replicas=settings.redis_wait_replicas,
    )
