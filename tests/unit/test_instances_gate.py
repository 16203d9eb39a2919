"""The device gate per device (issue 28): the governor's cap and pacing hold on each device
alone, and a batch is placed on another device rather than wait out a paced one."""

from __future__ import annotations

import asyncio

from edgeagent.engine.gate import DeviceGate
from edgeagent.engine.limits import ServingLimits
from edgeagent.hardware.instances import InstanceGroup, Lane
from edgeagent.hardware.plan_search import MeasuredPlan, PlanShape
from tests.support.fixed_time import FixedTimeSession

CAPPED = ServingLimits(max_concurrency=1, min_batch_interval_s=60.0, reason="hot: test")


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
    await gate.release("GPU0")
    assert gate.wait_s("GPU0", CAPPED) > 50  # its next batch waits out the interval
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
    await gate.release(first.device)
    placed = await gate.admit(group, lambda: CAPPED, rows=1)  # FAST waits a minute now
    assert placed.device == "SLOW"
    placed.cancel()
    await gate.release(placed.device)
