"""A service's main task (services/common/faust_app.py ``until_shutdown``): it runs until
shutdown, and ending any other way crashes the worker instead of leaving a process that
looks alive and does nothing."""

from __future__ import annotations

import asyncio

import pytest

from services.common.faust_app import TaskEnded, until_shutdown


async def test_a_task_that_returns_before_shutdown_ends_the_service() -> None:
    async def serve() -> None:
        return None

    with pytest.raises(TaskEnded, match="serve returned"):
        await until_shutdown(serve, lambda: False)


async def test_a_task_cancelled_from_inside_before_shutdown_ends_the_service() -> None:
    async def serve() -> None:
        # As aiokafka did: a future the consumer loop awaited was cancelled under it.
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.cancel()
        await future

    with pytest.raises(TaskEnded, match="serve was cancelled"):
        await until_shutdown(serve, lambda: False)


async def test_a_task_that_fails_before_shutdown_ends_the_service() -> None:
    async def serve() -> None:
        raise ConnectionError("Kafka")

    with pytest.raises(TaskEnded, match="serve failed") as caught:
        await until_shutdown(serve, lambda: False)
    assert isinstance(caught.value.__cause__, ConnectionError)


async def test_at_shutdown_the_task_ends_as_it_does() -> None:
    started = asyncio.Event()

    async def serve() -> None:
        started.set()
        await asyncio.Event().wait()

    running = asyncio.create_task(until_shutdown(serve, lambda: True))
    await started.wait()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running

    async def done() -> None:
        return None

    await until_shutdown(done, lambda: True)  # returned during shutdown: nothing to report
