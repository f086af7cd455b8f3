"""The admin service: the operators' REST API and web console (``cormorant admin``).

One process, served by uvicorn on ``admin_host:admin_port`` (loopback by default). At start
it migrates its PostgreSQL tables, creates ``admin_bootstrap_user`` if asked, replays the
state topics, takes a first sample of the cluster and opens its Kafka producer; then it
serves, and writes its ready file. It is ready while Kafka and PostgreSQL answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

import uvicorn
from fastapi import FastAPI

from services.admin import publish_api
from services.admin.api import AdminContext, create_app
from services.admin.cluster import StatsSampler
from services.admin.commands import CommandWriter
from services.admin.publish_api import HttpPublisher
from services.admin.state import ClientState
from services.admin.users import AdminUsers, UserError, password_hasher
from services.common import metrics
from services.common.auth.manage import CredentialAdmin
from services.common.auth.store import CredentialStore
from services.common.auth.throttle import HashingPool
from services.common.kafka import uvloop_writes
from services.common.settings import Settings, get_settings
from services.common.stores import open_store
from services.common.stores.base import StoreUnavailable
from services.common.stores.postgres_pool import MigratedPool, password_of
from services.common.versions import cormorant_version
from services.common.web import Readiness

log = logging.getLogger(__name__)

#: Seconds between two samples of the cluster's figures (the console's charts).
SAMPLE_SECONDS = 2.0

#: How many store timeouts the service waits for PostgreSQL when it starts.
STARTUP_TIMEOUTS = 6

#: Seconds between two attempts to reach PostgreSQL when the service starts.
RETRY_SECONDS = 0.5


def users_of(settings: Settings) -> AdminUsers:
    """The admin users in ``settings``' PostgreSQL (the pool opens on first use)."""
    pool = MigratedPool(
        settings.postgres_dsn,
        name="admin",
        timeout=settings.store_timeout_seconds,
        pool_size=4,
        password=password_of(settings),
        sslmode=settings.postgres_sslmode,
        sslrootcert=settings.postgres_sslrootcert,
    )
    pending = settings.admin_max_pending_hashes
    hashing = HashingPool(
        settings.admin_hash_workers, pending, max(1, pending // 4), "admin-password"
    )
    return AdminUsers(pool, settings.admin_token_ttl_seconds, hashing, password_hasher(settings))


async def bootstrap_user(settings: Settings, users: AdminUsers) -> None:
    """Create ``admin_bootstrap_user`` with ``admin_bootstrap_password`` if that user does
    not exist yet (a fresh deployment's first login; the password comes from Secrets
    Manager). Raises :class:`UserError` when only one of the two is set, or for a bad name
    or a short password: the service does not start half-configured."""
    username, password = settings.admin_bootstrap_user, settings.admin_bootstrap_password
    if username is None and password is None:
        return
    if username is None or password is None:
        raise UserError(
            "admin_bootstrap_user and admin_bootstrap_password go together: set both or neither"
        )
    if await users.ensure(username, password.get_secret_value()):
        log.info("admin user %s created (admin_bootstrap_user)", username)


async def reach_postgres(users: AdminUsers, timeout: float) -> None:
    """Reach ``users``' PostgreSQL (its pool opens and migrates the schema), trying again
    until ``timeout`` seconds have passed: PostgreSQL may start after the admin service.
    Raises :class:`~services.common.stores.base.StoreUnavailable` past the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            await users.ping()
            return
        except StoreUnavailable:
            if time.monotonic() >= deadline:
                raise
            log.info("PostgreSQL at %s not reachable yet, trying again", users.pool.address)
            await asyncio.sleep(RETRY_SECONDS)


def build(settings: Settings) -> FastAPI:
    """The admin application; its lifespan starts and stops what it reads and writes."""
    users = users_of(settings)
    readiness = Readiness(settings.ready_file)
    metrics.info("admin", cormorant_version())
    publish_api.register_metrics()
    writer = CommandWriter(settings)
    credential_store = CredentialStore.from_settings(settings)
    state = ClientState(settings)
    context = AdminContext(
        settings=settings,
        state=state,
        sampler=StatsSampler(settings, SAMPLE_SECONDS),
        users=users,
        writer=writer,
        store=open_store(settings),
        readiness=readiness,
        credentials=CredentialAdmin(credential_store, settings.credential_password_min_length),
        publisher=HttpPublisher(settings, writer, credential_store, state.delayed_counts),
    )

    readiness.add("kafka", context.state.reader.end_offsets)
    readiness.add("postgres", users.ping)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await reach_postgres(users, settings.store_timeout_seconds * STARTUP_TIMEOUTS)
        await bootstrap_user(settings, users)
        await context.state.start()
        await context.writer.start()
        await context.sampler.start()
        readiness.serving(f"admin {settings.admin_port}")
        log.info("admin API and console on http://%s:%d/", settings.admin_host, settings.admin_port)
        try:
            yield
        finally:
            readiness.stopping()
            await asyncio.gather(
                context.sampler.stop(),
                context.writer.stop(),
                context.state.stop(),
                context.store.close(),
                context.credentials.close(),
                return_exceptions=True,
            )
            context.publisher.close()
            await users.pool.close()

    app = create_app(context)
    app.router.lifespan_context = lifespan
    return app


def run() -> None:
    """Entry point of ``cormorant admin``: serve until SIGTERM/SIGINT."""
    settings = get_settings()
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    uvloop_writes.install()  # uvicorn's loop is uvloop's when uvloop is installed
    uvicorn.run(
        build(settings),
        host=settings.admin_host,
        port=settings.admin_port,
        log_level=settings.log_level.lower(),
        access_log=False,
    )
