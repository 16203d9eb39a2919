"""The device gate: where the batches of every model are admitted to the device that runs them.

One gate per engine, shared by every model, with one admission state per device (the device
key of ``hardware.spread``: CPU, GPU0, NPU …): batches of all models on one device count
against that device's concurrency cap and pacing, batches on another device do not — a device
that is paced does not pace the others. The governor sets one set of limits for the board
(``ServingLimits``; its sensors are not attributed to devices), and each device's gate applies
them to that device alone.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

from edgeagent.engine.limits import ServingLimits
from edgeagent.hardware.instances import Placement, place
from edgeagent.runtimes.base import Session

LimitsProvider = Callable[[], ServingLimits]


class _Device:
    """One device's admission state: batches running on it and when the last one started."""

    def __init__(self) -> None:
        self.running = 0
        self.last_start = -math.inf


class DeviceGate:
    """Admits batches to their device: the governor's concurrency cap and pacing, per device.

    Pacing keeps batch starts on a device ``min_batch_interval_s`` apart (the governor's duty
    cycle). The wait is re-read from the limits in force while waiting, so a relaxed limit
    takes effect at once rather than after a slot reserved under the old one.
    """

    RECHECK_S = 0.25  # how often a paced batch re-reads the limits while it waits

    def __init__(self) -> None:
        self._devices: dict[str, _Device] = {}
        self._changed: asyncio.Condition | None = None

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:  # created lazily: it belongs to the running loop
            self._changed = asyncio.Condition()
        return self._changed

    def _device(self, device: str) -> _Device:
        return self._devices.setdefault(device, _Device())

    @property
    def running(self) -> int:
        """Batches running now, on every device."""
        return sum(d.running for d in self._devices.values())

    def running_on(self, device: str) -> int:
        return self._device(device).running

    def wait_s(self, device: str, limits: ServingLimits) -> float:
        """How long pacing would hold a batch back on ``device`` now."""
        state = self._device(device)
        return max(0.0, state.last_start + limits.min_batch_interval_s - time.monotonic())

    async def admit(
        self, session: Session, limits: LimitsProvider, rows: int, waiting: int = 0
    ) -> Placement:
        """Place a batch of ``rows`` (``waiting`` more queued behind it) on the instance of
        ``session`` expected to finish it first — pacing counted — and wait for its device."""
        placement = place(session, rows, waiting, lambda device: self.wait_s(device, limits()))
        try:
            await self.acquire(limits, placement.device)
        except BaseException:
            placement.cancel()
            raise
        return placement

    async def acquire(self, limits: LimitsProvider, device: str = "") -> None:
        changed = self._condition()
        state = self._device(device)
        async with changed:

            def free() -> bool:
                cap = limits().max_concurrency
                return cap is None or state.running < max(1, cap)

            await changed.wait_for(free)
            state.running += 1
        while True:
            wait = state.last_start + limits().min_batch_interval_s - time.monotonic()
            if wait <= 0:
                break
            await asyncio.sleep(min(wait, self.RECHECK_S))
        state.last_start = time.monotonic()

    async def release(self, device: str = "") -> None:
        changed = self._condition()
        async with changed:
            self._device(device).running -= 1
            changed.notify_all()
