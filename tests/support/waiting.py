"""Wait for a condition instead of sleeping a guessed time.

A sleep long enough on a quiet machine is too short on a loaded CI runner, and too long
everywhere else. ``until`` returns as soon as the condition holds; its time-out is only the
bound that turns a hang into a failure with a message, never a measurement.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

POLL_S = 0.02


async def until(predicate: Callable[[], object], timeout: float = 20.0) -> None:
    """Return once ``predicate()`` is true; raise ``AssertionError`` after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout:g} s")
        await asyncio.sleep(POLL_S)
