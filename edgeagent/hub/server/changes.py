"""A change counter that long-polling clients wait on (``?wait=S&after=N``).

The controller bumps it whenever a deployment changed, the ingest loop after every batch of
device reports it stored; a request that saw version N waits until the version differs from
N. The counter starts again at 0 in a new process, which a client's ``after`` from before a
restart simply sees as a change.
"""

from __future__ import annotations

import asyncio
import contextlib


class Changes:
    def __init__(self) -> None:
        self.version = 0
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
