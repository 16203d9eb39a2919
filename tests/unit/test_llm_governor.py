"""Language models under the governor and priorities: decode steps pass the device gate the
vision batches pass (its pacing holds them), count as engine load, and a freed sequence goes
to the most urgent waiting request."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

pytest.importorskip("llama_cpp")
from edgeagent.engine.busy_counter import LoadCounter
from edgeagent.engine.gate import DeviceGate
from edgeagent.engine.language.plane import LanguagePlane
from edgeagent.engine.language.settings import LanguageSettings
from edgeagent.engine.limits import UNTHROTTLED, ServingLimits
from edgeagent.engine.text_requests import GenerationRequest, Sampling
from tests.support.language import write_text_package

LONG = Sampling(max_tokens=400, temperature=0.0)  # greedy: " upon" is the first chunk


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_text_package(tmp_path_factory.mktemp("llm") / "smollm2")


async def test_pacing_holds_decode_steps_and_steps_count_as_load(package: Path) -> None:
    now = [1000.0]  # the gate's clock stands still: a paced device never becomes free
    limits = [ServingLimits(duty_cycle=0.5)]
    gate, load = DeviceGate(clock=lambda: now[0]), LoadCounter()
    plane = LanguagePlane(
        LanguageSettings(context=256, sequences=1, threads=2),
        metrics=CollectorRegistry(),
        gate=gate,
        limits=lambda: limits[0],
        load=load,
    )
    await plane.load(package)
    scheduler = plane._models["smollm2"].scheduler
    try:
        generation = await plane.generate(
            GenerationRequest("smollm2", prompt="Once", sampling=LONG)
        )
        await anext(aiter(generation))  # the first step ran: it owes busy / duty of rest
        steps = scheduler.steps
        assert gate.wait_s("CPU", limits[0]) > 0
        with pytest.raises(TimeoutError):  # held by the pacing, however long one waits
            await asyncio.wait_for(scheduler.iteration(), 3 * DeviceGate.RECHECK_S)
        assert scheduler.steps == steps
        limits[0] = UNTHROTTLED  # re-read while it waits: the steps go on
        await scheduler.iteration()
        assert scheduler.steps > steps
        assert load.totals()[1] >= scheduler.steps  # what the governor reads as engine load
        await generation.aclose()
    finally:
        await plane.close()


async def test_a_freed_sequence_goes_to_the_most_urgent_waiting_request(package: Path) -> None:
    plane = LanguagePlane(
        LanguageSettings(context=256, sequences=1, threads=2), metrics=CollectorRegistry()
    )
    await plane.load(package)
    try:
        running = await plane.generate(GenerationRequest("smollm2", prompt="Once", sampling=LONG))
        await anext(aiter(running))
        later = asyncio.create_task(
            plane.generate(GenerationRequest("smollm2", prompt="a", priority=3))
        )
        urgent = asyncio.create_task(
            plane.generate(GenerationRequest("smollm2", prompt="b", priority=1))
        )
        for _ in range(1000):  # both queued (bounded; submit queues before it waits)
            if plane.status()["models"]["smollm2"]["waiting"] == 2:
                break
            await asyncio.sleep(0)
        assert plane.status()["models"]["smollm2"]["waiting"] == 2
        await running.aclose()
        done, _ = await asyncio.wait({later, urgent}, return_when=asyncio.FIRST_COMPLETED)
        assert done == {urgent}  # arrived second, admitted first
        await (await urgent).aclose()
        await (await later).aclose()
    finally:
        await plane.close()
