"""Canary versions: a share of the traffic, then promoted or rolled back on errors or latency."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from edgeagent.engine.errors import LoadFailed, ServingError
from edgeagent.engine.registry import ModelRegistry
from edgeagent.engine.settings import EngineSettings
from edgeagent.models.session import open_variant
from tests.helpers import serving_registry, write_tiny_package
from tests.support.waiting import until


class Faulty:
    """A real session of version 2 that fails or slows down after its warm-up run."""

    def __init__(self, session, *, fail: bool = False, delay_s: float = 0.0) -> None:
        self.inner, self.fail, self.delay_s, self.runs = session, fail, delay_s, 0
        self.runtime, self.device, self.precision = "onnxruntime", session.device, "fp32"
        self.inputs, self.outputs = session.inputs, session.outputs

    def run(self, feeds):
        self.runs += 1
        if self.runs > 1 and self.fail:
            raise RuntimeError("accelerator fell over")
        time.sleep(self.delay_s)
        return self.inner.run(feeds)

    def close(self) -> None:
        self.inner.close()


def opener(**faults):
    def open_session(package):
        session = open_variant(package)
        return Faulty(session, **faults) if package.version == "2" and faults else session

    return open_session


@pytest.fixture
def executor():
    with ThreadPoolExecutor(4) as pool:
        yield pool


async def start(
    tmp_path: Path, executor, ratio: float = 1.5, **faults
) -> tuple[ModelRegistry, Path]:
    registry = serving_registry(
        opener(**faults),
        settings=EngineSettings(canary_min_requests=8, canary_max_latency_ratio=ratio),
        executor=executor,
    )
    registry.add(write_tiny_package(tmp_path / "v1", seed=1))
    await registry.load("tiny")
    return registry, write_tiny_package(tmp_path / "v2", version="2", seed=2)


async def traffic(registry: ModelRegistry, count: int) -> list[tuple[str, bool]]:
    """Sequential requests through get(); (version asked, succeeded)."""
    x = np.ones((1, 3, 8, 8), np.float32)
    outcomes = []
    for _ in range(count):
        model = registry.get("tiny")
        try:
            await model.infer({"input": x})
            outcomes.append((model.version, True))
        except ServingError:
            outcomes.append((model.version, False))
    return outcomes


async def test_canary_takes_its_share_then_is_promoted(tmp_path: Path, executor):
    # equal models: a loaded machine's jitter must not read as a latency regression here
    registry, v2 = await start(tmp_path, executor, ratio=100)
    await registry.canary(v2, weight=0.25)
    assert registry.versions("tiny") == ["1", "2"]
    first = await traffic(registry, 32)
    assert [v for v, _ in first].count("2") == 8  # exactly a quarter, spread evenly
    assert all(ok for _, ok in first)
    # the 8th canary answer concluded it: promoted, and version 1 no longer routable
    assert registry.get("tiny").version == "2"
    await until(lambda: registry.versions("tiny") == ["2"])  # version 1 retires after draining
    assert registry.status()["tiny"]["last_canary"] == "version 2 promoted"
    await registry.close()


async def test_failing_canary_is_rolled_back(tmp_path: Path, executor):
    registry, v2 = await start(tmp_path, executor, fail=True)
    await registry.canary(v2, weight=0.5)
    outcomes = await traffic(registry, 40)
    assert all(ok for version, ok in outcomes if version == "1")
    assert [ok for version, ok in outcomes if version == "2"] == [False] * 8  # then no more
    assert registry.get("tiny").version == "1" and registry.versions("tiny") == ["1"]
    assert "rolled back: 8 of 8 requests failed" in registry.status()["tiny"]["last_canary"]
    await registry.close()


async def test_slow_canary_is_rolled_back(tmp_path: Path, executor):
    registry, v2 = await start(tmp_path, executor, delay_s=0.05)
    await registry.canary(v2, weight=0.5)
    outcomes = await traffic(registry, 40)
    assert all(ok for _, ok in outcomes)  # slow, not failing: every request answered
    assert registry.get("tiny").version == "1"
    assert "mean latency" in registry.status()["tiny"]["last_canary"]
    await registry.close()


async def test_canary_needs_a_new_version_and_an_active_one(tmp_path: Path, executor):
    registry, _ = await start(tmp_path, executor)
    with pytest.raises(LoadFailed, match="already loaded"):
        await registry.canary(tmp_path / "v1")
    other = serving_registry(open_variant, executor=executor)
    with pytest.raises(LoadFailed, match="no active version"):
        await other.canary(tmp_path / "v1")
    await registry.close()
