"""A service's main task (services/common/faust_app.py ``until_shutdown``): it runs until
shutdown, and ending any other way crashes the worker instead of leaving a process that
looks alive and does nothing."""

from __future__ import annotations

import asyncio

import pytest

from services.common.faust_app import TaskEnded, until_shutdown, watched


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


async def test_a_background_task_that_ends_first_fails_the_main_task_by_name() -> None:
    # As the ingest node's wills owner did: its read loop raised, and nothing noticed.
    async def loop() -> None:
        raise KeyError("partition 3")

    background = asyncio.create_task(loop(), name="ingest-wills")
    main_cancelled = asyncio.Event()

    async def main() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            main_cancelled.set()
            raise

    with pytest.raises(TaskEnded, match="ingest-wills failed: KeyError") as caught:
        await watched(main(), [background], lambda: False)
    assert isinstance(caught.value.__cause__, KeyError)
    assert main_cancelled.is_set()


async def test_background_tasks_returning_or_cancelled_fail_it_too_but_not_at_shutdown() -> None:
    async def returns() -> None:
        return None

    with pytest.raises(TaskEnded, match="follow returned"):
        await watched(
            asyncio.Event().wait(), [asyncio.create_task(returns(), name="follow")], lambda: False
        )
    cancelled = asyncio.create_task(asyncio.Event().wait(), name="listen")
    cancelled.cancel()
    with pytest.raises(TaskEnded, match="listen was cancelled"):
        await watched(asyncio.Event().wait(), [cancelled], lambda: False)

    stopped = asyncio.create_task(asyncio.Event().wait(), name="listen")
    stopped.cancel()
    main_done = asyncio.Event()

    async def main() -> None:
        await main_done.wait()

    waiting = asyncio.create_task(watched(main(), [stopped], lambda: True))
    main_done.set()
    await asyncio.wait_for(waiting, 5)  # the main task's end, nothing raised


async def test_the_main_tasks_own_failure_is_raised_as_it_is() -> None:
    async def main() -> None:
        raise ConnectionError("Kafka")

    other = asyncio.create_task(asyncio.Event().wait(), name="listen")
    with pytest.raises(ConnectionError):
        await watched(main(), [other], lambda: False)
    assert not other.done()  # the caller's to stop
    other.cancel()
