"""A model serves at once on a safe plan and its execution plan is measured afterwards: the
plan search (2 s a model, longer on a slow one) no longer holds a start, a reload or an
update's canary in LOADING. The searched plan then hot swaps in for the same version, no
request lost; a cached plan serves at once with no search; a model still LOADING answers 503
saying how to wait."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from edgeagent.engine.errors import NotReady
from edgeagent.engine.metrics import EngineMetrics
from edgeagent.hardware.plan_search import PENDING, PlanRequest
from edgeagent.hardware.service import Accelerators
from edgeagent.models.package import ModelPackage
from edgeagent.runtimes.base import Session
from tests.support.hardware import board_accelerators
from tests.support.helpers import serving_registry, write_tiny_package

SEARCH = PlanRequest(search_s=0.3)
X = {"input": np.ones((1, 3, 8, 8), np.float32)}


@pytest.fixture
def executor():
    with ThreadPoolExecutor(4) as pool:
        yield pool


def wired(accelerators: Accelerators, executor, metrics: EngineMetrics | None = None, **hooks):
    """The registry as the daemon wires it: serve at once, search in the background."""
    return serving_registry(
        hooks.get("opener") or (lambda p: accelerators.open(p, SEARCH, search=False)),
        executor=executor,
        metrics=metrics,
        plan=hooks.get("plan") or (lambda p: accelerators.open(p, SEARCH)),
    )


def accelerators_at(tmp_path: Path) -> Accelerators:
    return board_accelerators(tmp_path, ["onnxruntime:CPUExecutionProvider:fp32"], threads=2)


async def test_a_version_serves_on_the_probes_session_then_swaps_in_its_searched_plan(
    tmp_path: Path, executor
) -> None:
    prometheus = CollectorRegistry()
    registry = wired(accelerators_at(tmp_path), executor, EngineMetrics(prometheus))
    registry.add(write_tiny_package(tmp_path / "tiny"))
    first = await registry.load("tiny")
    shown = registry.status()["tiny"]["versions"]["1"]["plan"]
    assert (shown["source"], shown["instances"], shown["threads"]) == (PENDING, 1, 2)
    expected = (await first.infer(X))["logits"]
    answered = 0
    settled = asyncio.ensure_future(registry.plans_settled())
    while not settled.done():  # requests all along the search and the swap: none fails
        answer = await registry.get("tiny").infer(X)
        np.testing.assert_allclose(answer["logits"], expected, rtol=1e-5)
        answered += 1
    await settled
    active = registry.get("tiny")
    assert active is not first and active.version == "1"
    assert active.plan.measured is not None and active.plan.measured.source == "search"
    assert registry.status()["tiny"]["versions"]["1"]["plan"]["source"] == "search"
    assert active.stats is first.stats  # the same version's statistics carry on
    assert active.stats.health()[0] >= answered + 1
    np.testing.assert_allclose((await active.infer(X))["logits"], expected, rtol=1e-5)
    scraped = generate_latest(prometheus).decode().splitlines()
    loaded = [line for line in scraped if line.startswith("edgeagent_model_loaded{")]
    assert len(loaded) == 1 and 'version="1"' in loaded[0] and loaded[0].endswith(" 1.0")
    plans = {line.split('source="')[1].split('"')[0] for line in scraped if "source=" in line}
    assert plans == {"search"}, plans  # the pending plan's series went with its version
    await registry.close()

    again = wired(accelerators_at(tmp_path), executor)  # a restart: the plan is cached
    again.add(write_tiny_package(tmp_path / "tiny"))
    model = await again.load("tiny")
    assert model.plan.measured is not None and model.plan.measured.source == "cached"
    await again.plans_settled()
    assert again.get("tiny") is model  # nothing searched, nothing swapped
    await again.close()


async def test_a_failed_search_keeps_the_safe_plan_and_an_unload_discards_one(
    tmp_path: Path, executor
) -> None:
    accelerators = accelerators_at(tmp_path)

    def failing(package: ModelPackage) -> Session:
        raise RuntimeError("the runtime refused batch 4")

    registry = wired(accelerators, executor, plan=failing)
    registry.add(write_tiny_package(tmp_path / "tiny"))
    model = await registry.load("tiny")
    await registry.plans_settled()
    assert registry.get("tiny") is model and model.plan.pending
    assert (await model.infer(X))["logits"].shape == (1, 4)
    await registry.close()

    held, release = threading.Event(), threading.Event()
    opened: list[Session] = []

    def slow(package: ModelPackage) -> Session:
        held.set()
        release.wait(30)
        opened.append(accelerators.open(package, SEARCH))
        return opened[-1]

    registry = wired(accelerators, executor, plan=slow)
    registry.add(write_tiny_package(tmp_path / "tiny"))
    await registry.load("tiny")
    await asyncio.to_thread(held.wait, 30)
    await registry.unload("tiny")  # while the search runs
    release.set()
    await registry.plans_settled()
    assert len(opened) == 1 and opened[0].closed  # the searched sessions were closed unused
    with pytest.raises(NotReady, match="unloaded"):
        registry.get("tiny")
    await registry.close()


async def test_a_model_still_loading_answers_503_saying_how_to_wait(
    tmp_path: Path, executor
) -> None:
    accelerators = accelerators_at(tmp_path)
    held, release = threading.Event(), threading.Event()

    def opener(package: ModelPackage) -> Session:
        held.set()
        release.wait(30)
        return accelerators.open(package, SEARCH, search=False)

    registry = wired(accelerators, executor, opener=opener)
    registry.add(write_tiny_package(tmp_path / "tiny"))
    loading = asyncio.ensure_future(registry.load("tiny"))
    await asyncio.to_thread(held.wait, 30)
    with pytest.raises(NotReady) as refused:
        registry.get("tiny")
    assert refused.value.status == 503 and refused.value.retry_after == 1
    assert "LOADING" in refused.value.message
    assert "GET /v2/models/tiny/ready" in refused.value.message
    release.set()
    await loading
    assert (await registry.get("tiny").infer(X))["logits"].shape == (1, 4)
    await registry.close()
