"""cancel_and_wait: a shutdown never hangs on a task that will not stop."""

from __future__ import annotations

import asyncio
import logging

import pytest

from edgeagent.aio import cancel_and_wait


async def test_cooperative_tasks_are_cancelled_and_awaited() -> None:
    task = asyncio.create_task(asyncio.sleep(60), name="sleeper")
    await cancel_and_wait([task], timeout_s=5)
    assert task.cancelled()


async def test_a_task_that_swallows_cancellation_is_abandoned_in_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    never = asyncio.Event()

    async def stubborn() -> None:  # like a library awaiting a peer's acknowledgement forever
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            await never.wait()

    task = asyncio.create_task(stubborn(), name="stubborn")
    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with caplog.at_level(logging.ERROR):
        await cancel_and_wait([task], timeout_s=0.2)
    assert loop.time() - started < 2
    assert "task stubborn did not stop within 0.2 s; abandoned" in caplog.text
    await asyncio.sleep(0)
    assert task.done()  # the second cancel reached it
