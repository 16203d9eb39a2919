"""Wait for a condition instead of sleeping a guessed time.

A sleep long enough on a quiet machine is too short on a loaded CI runner, and too long
everywhere else. ``until`` returns as soon as the condition holds; its time-out is only the
bound that turns a hang into a failure with a message, never a measurement.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

POLL_S = 0.02


async def until(
    predicate: Callable[[], object | Awaitable[object]],
    timeout: float = 20.0,
    *,
    poll_s: float = POLL_S,
    what: str = "condition",
) -> None:
    """Return once ``predicate()`` is true; raise ``AssertionError`` after ``timeout`` seconds.

    ``predicate`` may be a coroutine function (a condition read over HTTP): its result is
    awaited each round. A predicate that knows the condition can no longer come (the process
    it waits for exited) raises instead of answering false. A benchmark that times the moment
    a condition starts to hold polls more often (``poll_s``).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await _holds(predicate):
        if loop.time() > deadline:
            raise AssertionError(f"{what} not met within {timeout:g} s")
        await asyncio.sleep(poll_s)


def wait_until(predicate: Callable[[], object], timeout: float = 20.0) -> None:
    """``until`` for code outside an event loop (a worker thread's effect, a file)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout:g} s")
        time.sleep(POLL_S)


async def _holds(predicate: Callable[[], object | Awaitable[object]]) -> bool:
    value = predicate()
    if inspect.isawaitable(value):
        value = await value
    return bool(value)
