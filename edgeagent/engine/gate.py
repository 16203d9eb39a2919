"""The device gate: one admission point for the batches of every model on the accelerator."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

from edgeagent.engine.limits import ServingLimits

LimitsProvider = Callable[[], ServingLimits]


class DeviceGate:
    """Admits batches of all models to the device: the governor's concurrency cap and pacing.

    Pacing keeps batch starts ``min_batch_interval_s`` apart (the governor's duty cycle). The
    wait is re-read from the limits in force while waiting, so a relaxed limit takes effect at
    once rather than after a slot reserved under the old one.
    """

    RECHECK_S = 0.25  # how often a paced batch re-reads the limits while it waits

    def __init__(self) -> None:
        self._running = 0
        self._last_start = -math.inf
        self._changed: asyncio.Condition | None = None

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:  # created lazily: it belongs to the running loop
            self._changed = asyncio.Condition()
        return self._changed

    @property
    def running(self) -> int:
        return self._running

    async def acquire(self, limits: LimitsProvider) -> None:
        changed = self._condition()
        async with changed:

            def free() -> bool:
                cap = limits().max_concurrency
                return cap is None or self._running < max(1, cap)

            await changed.wait_for(free)
            self._running += 1
        while True:
            wait = self._last_start + limits().min_batch_interval_s - time.monotonic()
            if wait <= 0:
                break
            await asyncio.sleep(min(wait, self.RECHECK_S))
        self._last_start = time.monotonic()

    async def release(self) -> None:
        changed = self._condition()
        async with changed:
            self._running -= 1
            changed.notify_all()
