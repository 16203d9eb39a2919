"""aio.spawn: a background task that dies is logged with its traceback when it dies."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest

from edgeagent.aio import spawn


class RecorderBug(Exception):
    pass


async def _dies() -> None:
    await asyncio.sleep(0)
    raise RecorderBug("'EngineLoad' object has no attribute 'totals'")


async def test_a_task_that_raises_is_logged_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR, logger="edgeagent.aio"):
        task = spawn(_dies(), name="recorder")
        await asyncio.wait([task])
    [record] = [r for r in caplog.records if r.name == "edgeagent.aio"]
    assert record.levelno == logging.ERROR
    assert record.getMessage() == "background task recorder died"
    assert record.exc_info is not None and record.exc_info[0] is RecorderBug
    assert "Traceback (most recent call last)" in caplog.text
    assert "in _dies" in caplog.text  # the frame that raised, not just the message
    with pytest.raises(RecorderBug):  # its owner may still await it and see the error
        await task


async def test_cancelling_or_finishing_is_not_a_death(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="edgeagent.aio"):
        sleeper = spawn(asyncio.sleep(60), name="sleeper")
        quick = spawn(asyncio.sleep(0, result=7), name="quick")
        await asyncio.sleep(0)
        sleeper.cancel()
        await asyncio.wait([sleeper, quick])
    assert quick.result() == 7
    assert not [r for r in caplog.records if r.name == "edgeagent.aio"]


async def test_a_task_nobody_holds_still_runs_to_its_end() -> None:
    finished = asyncio.Event()

    async def work() -> None:
        for _ in range(3):
            gc.collect()  # the loop's own reference is weak: only spawn's keeps it alive
            await asyncio.sleep(0)
        finished.set()

    spawn(work(), name="unheld")
    await asyncio.wait_for(finished.wait(), 10)
