"""The device gate per device (issue 28): the governor's cap and pacing hold on each device
alone, and a batch is placed on another device rather than wait out a paced one."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from edgeagent.engine.gate import DeviceGate
from edgeagent.engine.limits import ServingLimits
from edgeagent.hardware.instances import InstanceGroup, Lane
from edgeagent.hardware.plan_search import MeasuredPlan, PlanShape
from tests.support.fixed_time import FixedTimeSession

CAPPED = ServingLimits(max_concurrency=1, duty_cycle=0.01, reason="hot: test")


async def test_a_capped_device_does_not_hold_back_another() -> None:
    gate = DeviceGate()
    await gate.acquire(lambda: ServingLimits(max_concurrency=1), "NPU")
    second = asyncio.ensure_future(gate.acquire(lambda: ServingLimits(max_concurrency=1), "NPU"))
    cpu = gate.acquire(lambda: ServingLimits(max_concurrency=1), "CPU")
    await asyncio.wait_for(cpu, 10)  # at once, not behind the NPU (a shared gate hangs here)
    assert gate.running_on("CPU") == 1 and gate.running_on("NPU") == 1
    assert not second.done()  # the NPU's cap holds its own second batch
    await gate.release("NPU")
    await second
    assert gate.running == 2
    await gate.release("NPU")
    await gate.release("CPU")
    assert gate.running == 0


async def test_pacing_holds_only_the_device_that_ran() -> None:
    gate = DeviceGate()
    await gate.acquire(lambda: CAPPED, "GPU0")
    await gate.release("GPU0", 1.0)  # busy 1 s at duty 0.01
    assert gate.wait_s("GPU0", CAPPED) > 50  # its next batch rests ~99 s
    assert gate.wait_s("GPU1", CAPPED) == 0
    await asyncio.wait_for(gate.acquire(lambda: CAPPED, "GPU1"), 10)  # the other: not paced
    await gate.release("GPU1")


async def test_admit_places_a_batch_beside_a_paced_device() -> None:
    fast, slow = FixedTimeSession("FAST", 0.0), FixedTimeSession("SLOW", 0.0)
    plan = MeasuredPlan(PlanShape(1, 1, 1), "fixed", 1)
    group = InstanceGroup([fast], plan, [Lane("SLOW", plan, [slow])])
    group.scheduler.instances[0].times.observe(1, 0.001)
    group.scheduler.instances[1].times.observe(1, 0.010)
    gate = DeviceGate()
    first = await gate.admit(group, lambda: CAPPED, rows=1)
    assert first.device == "FAST"  # idle and ten times as fast
    first.cancel()
    await gate.release(first.device, 1.0)
    placed = await gate.admit(group, lambda: CAPPED, rows=1)  # FAST rests ~99 s now
    assert placed.device == "SLOW"
    placed.cancel()
    await gate.release(placed.device)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def run_batch(gate: DeviceGate, clock: Clock, limits: ServingLimits, busy_s: float) -> float:
    """Admit one batch when the gate lets it start (the clock jumps to that moment), run it for
    ``busy_s`` and release it; the time it started."""
    clock.now += gate.wait_s("CPU", limits)
    await asyncio.wait_for(gate.acquire(lambda: limits, "CPU"), 10)
    start = clock.now
    clock.now += busy_s
    await gate.release("CPU", busy_s)
    return start


async def test_pacing_holds_the_busy_fraction_whatever_the_batch_lengths() -> None:
    """Batches of 1 to 8 rows, or slowed by a busy machine, each earn a rest in proportion to
    the device time they took: over the run the device is busy exactly the duty. (Pacing by
    the mean batch time let a long batch after short ones run over it.)"""
    clock = Clock()
    gate = DeviceGate(clock)
    limits = ServingLimits(duty_cycle=0.25)
    lengths = [0.01, 0.08, 0.01, 0.01, 0.2, 0.03, 0.08, 0.01, 0.15, 0.01]
    starts = [await run_batch(gate, clock, limits, b) for b in lengths]
    span = starts[-1] - starts[0]
    assert sum(lengths[:-1]) / span == pytest.approx(0.25)
    for before, after, busy in zip(starts, starts[1:], lengths, strict=False):
        assert after - before == pytest.approx(busy / 0.25)  # its own rest, not a mean's


async def test_pacing_banks_no_burst_after_a_stall() -> None:
    """After the loop stalled or the device idled, the schedule restarts from now: never a
    burst of batches that makes up the time not used."""
    clock = Clock()
    gate = DeviceGate(clock)
    limits = ServingLimits(duty_cycle=0.5)
    for _ in range(3):
        await run_batch(gate, clock, limits, 0.1)
    clock.now += 60.0  # a minute of nothing
    starts = [await run_batch(gate, clock, limits, 0.1) for _ in range(5)]
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert all(gap == pytest.approx(0.2) for gap in gaps)  # paced from the first one on


async def test_a_late_start_keeps_its_place_on_the_schedule() -> None:
    """A batch woken a little late (a busy event loop) does not push every later one back:
    wake-up delays must not lower the duty below what the governor asked for."""
    clock = Clock()
    gate = DeviceGate(clock)
    limits = ServingLimits(duty_cycle=0.5)
    first = await run_batch(gate, clock, limits, 0.1)
    clock.now += 0.1 + 0.05  # the rest, and 50 ms late
    await gate.acquire(lambda: limits, "CPU")
    clock.now += 0.1
    await gate.release("CPU", 0.1)
    assert clock.now + gate.wait_s("CPU", limits) == pytest.approx(first + 0.4)


async def test_relaxed_duty_stops_pacing_and_owes_nothing_later() -> None:
    clock = Clock()
    gate = DeviceGate(clock)
    paced, free = ServingLimits(duty_cycle=0.1), ServingLimits()
    await run_batch(gate, clock, paced, 1.0)
    assert gate.wait_s("CPU", paced) == pytest.approx(9.0)
    assert gate.wait_s("CPU", free) == 0.0  # unpaced: no wait at all
    for _ in range(5):  # busy flat out while unpaced
        await run_batch(gate, clock, free, 1.0)
    await run_batch(gate, clock, paced, 1.0)  # paced again: starts at once, owes no backlog
    assert gate.wait_s("CPU", paced) == pytest.approx(9.0)


async def test_a_second_concurrent_batch_waits_for_the_first_ones_share() -> None:
    clock = Clock()
    gate = DeviceGate(clock)
    limits = ServingLimits(duty_cycle=0.5, max_concurrency=2)
    await run_batch(gate, clock, limits, 0.2)  # the device's batches take 0.2 s
    clock.now += gate.wait_s("CPU", limits)
    await gate.acquire(lambda: limits, "CPU")  # running; it reserved 0.2 s of device time
    assert gate.wait_s("CPU", limits) == pytest.approx(0.4)  # a second one may not start yet
    await gate.release("CPU", None)  # failed: its reservation stands for it
    assert gate.wait_s("CPU", limits) == pytest.approx(0.4)
    assert gate.running == 0
