"""A bound on what requests hold in memory at once, counted in one unit across all of them.

Two budgets use it: the bytes of request bodies read and decoded at once per listener
(``[server] max_decoding_bytes``; the listener reserves a body's declared size, and four times
its JSON part, since JSON tensors become Python lists before numpy arrays, 3.7× measured), and
the pixels of images decoded at once (``[server] max_decoding_pixels``; the data plane reserves
an image's width × height, read from its header, before decoding it).

Each request reserves its whole cost *before* it starts and holds it until it is done.
Reserving up front, never piece by piece, means two half-served requests can never wait on
each other. Requests that do not fit wait in arrival order; one that waits longer than the
engine's request time-out is answered 503 with ``Retry-After``. A single request larger than
the budget is clamped to it, so it can always run alone.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from edgeagent.engine.errors import ServingError


class Busy(ServingError):
    """A budget stayed full for the whole wait."""

    status = 503

    def __init__(self, message: str) -> None:
        super().__init__(message, retry_after=1)


class Budget:
    """A first-come first-served weighted semaphore; ``key`` names its [server] setting and
    ``unit`` what it counts, for the 503's message."""

    def __init__(self, capacity: int, key: str = "max_decoding_bytes", unit: str = "bytes") -> None:
        self.capacity = capacity
        self.key = key
        self.unit = unit
        self.free = capacity
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()

    @asynccontextmanager
    async def hold(self, amount: int, wait_s: float) -> AsyncIterator[None]:
        """Reserve ``amount`` (at most the capacity) for the duration of the block."""
        cost = min(amount, self.capacity)
        await self._acquire(cost, wait_s)
        try:
            yield
        finally:
            self._release(cost)

    async def _acquire(self, cost: int, wait_s: float) -> None:
        if not self._waiting and cost <= self.free:
            self.free -= cost
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (cost, granted)
        self._waiting.append(entry)
        try:
            await asyncio.wait({granted}, timeout=wait_s)
        except BaseException:
            self._withdraw(entry)
            raise
        if not granted.done():
            self._withdraw(entry)
            raise Busy(
                f"the agent is decoding {self.capacity - self.free} {self.unit} of other "
                f"requests ([server] {self.key} = {self.capacity}); retry shortly"
            )

    def _withdraw(self, entry: tuple[int, asyncio.Future[None]]) -> None:
        """Leave the queue; give the bytes back if they were granted meanwhile."""
        cost, granted = entry
        if granted.done():
            self._release(cost)
            return
        granted.cancel()
        self._waiting.remove(entry)
        self._wake()

    def _release(self, cost: int) -> None:
        self.free += cost
        self._wake()

    def _wake(self) -> None:
        while self._waiting and self._waiting[0][0] <= self.free:
            cost, granted = self._waiting.popleft()
            self.free -= cost
            granted.set_result(None)
