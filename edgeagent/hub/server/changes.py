"""A change counter that long-polling clients wait on (``?wait=S&after=N``).

The controller bumps it whenever a deployment changed, the ingest loop after every batch of
device reports it stored — both after their transaction committed. A request that saw version
N waits until the version differs from N.

Two rules keep a client from missing a change:

- **A restart is a change.** The counter does not start at 0: it starts at the process's start
  time in microseconds (``epoch``), so a version a client kept from before a restart is never
  the new process's (it is below it, unless the old process averaged more than one change per
  microsecond of its life). With a counter from 0, a page that had seen version 3 waited, after
  the restart, for the new process to pass 3 — changes in between went unseen.
- **Read the version before the state it describes** (``snapshot``). A version read after the
  state may already count a change the state does not show; the client then waits past it and
  misses it until the next, unrelated change (or its wait's end).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def epoch_version() -> int:
    """Where a new process's counter starts: now, in microseconds (fits the API's 2**62)."""
    return time.time_ns() // 1000


class Changes:
    def __init__(self, start: int | None = None) -> None:
        self.epoch = epoch_version() if start is None else start
        self.version = self.epoch
        self._condition = asyncio.Condition()

    async def bump(self) -> None:
        async with self._condition:
            self.version += 1
            self._condition.notify_all()

    async def wait_past(self, seen: int, timeout_s: float) -> int:
        """Return as soon as the version is not ``seen`` (or after ``timeout_s``)."""
        async with self._condition:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(
                    self._condition.wait_for(lambda: self.version != seen), timeout_s
                )
            return self.version

    async def snapshot(self, read: Callable[[], Awaitable[T]]) -> tuple[int, T]:
        """``read()`` and a version no newer than what it read (see the module docstring)."""
        version = self.version
        return version, await read()
