"""The device gate: where the batches of every model are admitted to the device that runs them.

One gate per engine, shared by every model, with one admission state per device (the device
key of ``hardware.spread``: CPU, GPU0, NPU …): batches of all models on one device count
against that device's concurrency cap and pacing, batches on another device do not — a device
that is paced does not pace the others. The governor sets one set of limits for the board
(``ServingLimits``; its sensors are not attributed to devices), and each device's gate applies
them to that device alone. A peer (``peer:<name>``, ``hardware.peers``) is another board with
its own governor: this board's limits never apply to it, which is how a throttled board's work
moves to its peers.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

from edgeagent.engine.limits import UNTHROTTLED, ServingLimits
from edgeagent.hardware.instances import Placement, place
from edgeagent.runtimes.base import Session
from edgeagent.runtimes.remote import is_remote

LimitsProvider = Callable[[], ServingLimits]


class _Device:
    """One device's admission state: batches running on it and its pacing account.

    ``ready_at`` is the earliest time the next batch may start under pacing (a virtual
    finishing time, as in GCRA): each batch pushes it on by its busy time divided by the duty,
    so the device is busy at most ``duty`` of the time whatever its batches' sizes or speeds.
    """

    def __init__(self) -> None:
        self.running = 0
        self.ready_at = -math.inf
        self.last_busy_s = 0.0  # the busy time of its last batch: what a new one reserves
        self.reserved_s = 0.0  # busy seconds reserved by the batches running now
        self.reservations = 0
        self.duty = 1.0  # the duty in force when the last batch started


class DeviceGate:
    """Admits batches to their device: the governor's concurrency cap and pacing, per device.

    Pacing holds the device to the governor's duty cycle in busy time, not in batch starts: a
    batch that was busy ``b`` seconds lets the next one start ``b / duty`` after it began. So a
    batch of more rows, or one slowed by a busy machine, earns a longer rest, and the device's
    real busy fraction is the duty the governor asked for, not a guess from the mean batch time
    that a batch of another size or a contended moment would exceed. Almost nothing is banked:
    a batch that starts late by less than one period keeps its place on the schedule (event-loop
    and wake-up delays do not erode the duty), but after a longer stall or an idle spell the
    schedule restarts from now, so the device never catches up on time it did not use with a
    burst of batches (at most one batch runs early, after one that started late). Each batch
    reserves the busy time of the device's last one when it starts, so a second batch
    (concurrency cap above 1) waits for the first one's share; the reservation is replaced by
    the real busy time when the batch ends (``release``). The duty is re-read from the limits
    in force while waiting, so a relaxed limit takes effect at once.
    """

    RECHECK_S = 0.25  # how often a paced batch re-reads the limits while it waits

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._devices: dict[str, _Device] = {}
        self._changed: asyncio.Condition | None = None
        self._clock = clock

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
        if limits.duty_cycle >= 1.0 or is_remote(device):
            return 0.0
        return max(0.0, self._device(device).ready_at - self._clock())

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
        if is_remote(device):  # another board: its own governor paces it
            limits = _unthrottled
        changed = self._condition()
        state = self._device(device)
        async with changed:

            def free() -> bool:
                cap = limits().max_concurrency
                return cap is None or state.running < max(1, cap)

            await changed.wait_for(free)
            state.running += 1
        try:
            while (wait := self.wait_s(device, limits())) > 0:
                await asyncio.sleep(min(wait, self.RECHECK_S))
        except BaseException:  # given up while paced: it holds no reservation
            async with changed:
                state.running -= 1
                changed.notify_all()
            raise
        state.duty = limits().duty_cycle
        state.reserved_s += state.last_busy_s
        state.reservations += 1
        now = self._clock()
        if state.duty < 1.0:
            period = state.last_busy_s / state.duty
            # a start late by less than one period keeps its place on the schedule (a slow
            # wake-up must not lower the duty); after a longer stall the schedule restarts
            # from now: the time not used is forgotten, never made up in a burst
            keeps_place = now - state.ready_at < period
            state.ready_at = (state.ready_at if keeps_place else now) + period
        else:  # unpaced: owes nothing, so pacing that starts later starts clean
            state.ready_at = -math.inf

    async def release(self, device: str = "", busy_s: float | None = None) -> None:
        """An admitted batch on ``device`` ended after ``busy_s`` seconds of device time
        (None: not known, e.g. it failed, so its reservation stands for it)."""
        changed = self._condition()
        state = self._device(device)
        async with changed:
            reserved = state.reserved_s / max(1, state.reservations)  # its share, on average
            state.reserved_s = max(0.0, state.reserved_s - reserved)
            state.reservations = max(0, state.reservations - 1)
            if busy_s is not None:
                if state.duty < 1.0:
                    state.ready_at += (busy_s - reserved) / state.duty
                state.last_busy_s = busy_s
            state.running -= 1
            changed.notify_all()


def _unthrottled() -> ServingLimits:
    return UNTHROTTLED
