"""devtools.background.WatchedTasks: a bench's background task that dies stops the bench."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from devtools.background import BackgroundTaskDied, WatchedTasks
from tests.support.helpers import REPO

pytestmark = pytest.mark.timeout(30)  # a watcher that fails to stop the block hangs it


async def fail_after(started: asyncio.Event, error: Exception) -> None:
    started.set()
    raise error


async def test_a_task_that_dies_cancels_the_block_and_raises_its_error() -> None:
    error = AttributeError("'EngineLoad' object has no attribute 'totals'")
    reached_the_end = False
    with pytest.raises(BackgroundTaskDied, match="recorder died") as raised:
        async with WatchedTasks() as tasks:
            tasks.spawn(fail_after(asyncio.Event(), error), name="recorder")
            await asyncio.Event().wait()  # the bench's measurement, which would never end
            reached_the_end = True
    assert raised.value.__cause__ is error
    assert not reached_the_end
    current = asyncio.current_task()
    assert current is not None and current.cancelling() == 0  # the cancel was undone


async def test_leaving_the_block_cancels_what_still_runs() -> None:
    forever = asyncio.Event()
    async with WatchedTasks() as tasks:
        loop = tasks.spawn(forever.wait(), name="sampler")
        await asyncio.sleep(0)
    assert loop.cancelled()


async def test_a_task_that_fails_while_being_stopped_is_reported() -> None:
    async def cleanup_fails() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            raise OSError("listener could not close")

    with pytest.raises(BackgroundTaskDied, match="listener") as raised:
        async with WatchedTasks() as tasks:
            tasks.spawn(cleanup_fails(), name="listener")
            await asyncio.sleep(0)
    assert isinstance(raised.value.__cause__, OSError)


async def test_the_first_death_is_the_one_reported() -> None:
    first, second = ValueError("first"), ValueError("second")
    with pytest.raises(BackgroundTaskDied) as raised:
        async with WatchedTasks() as tasks:
            tasks.spawn(fail_after(asyncio.Event(), first), name="a")
            tasks.spawn(fail_after(asyncio.Event(), second), name="b")
            await asyncio.Event().wait()
    assert raised.value.__cause__ is first


def test_a_bench_whose_task_dies_exits_non_zero_with_the_traceback(tmp_path: Path) -> None:
    """What a user sees from the command line: the task's own traceback, exit status 1."""
    bench = tmp_path / "bench_dies.py"
    bench.write_text(
        textwrap.dedent(
            """
        import asyncio
        from devtools.background import WatchedTasks

        async def record():
            raise AttributeError("no attribute 'totals'")

        async def main():
            async with WatchedTasks() as tasks:
                tasks.spawn(record(), name="recorder")
                await asyncio.Event().wait()
            print("figures")

        asyncio.run(main())
        """
        )
    )
    done = subprocess.run(
        [sys.executable, str(bench)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1
    assert done.stdout == ""
    assert "in record\n    raise AttributeError(\"no attribute 'totals'\")" in done.stderr
    assert "BackgroundTaskDied: background task recorder died" in done.stderr
