"""Canary versions through the registry: a share of the traffic, then promoted or rolled back on
errors or p99 latency, with an awaitable verdict."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from devtools.waiting import until
from edgeagent.engine.canary_judge import INTERRUPTED, PROMOTED, ROLLED_BACK, CanaryPolicy
from edgeagent.engine.errors import LoadFailed, ServingError
from edgeagent.engine.registry import ModelRegistry
from edgeagent.engine.settings import EngineSettings
from edgeagent.models.session import open_variant
from tests.support.helpers import serving_registry, write_tiny_package


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


def policy(share: float, ratio: float = 1.5, **options) -> CanaryPolicy:
    return CanaryPolicy(share=share, min_requests=8, max_p99_ratio=ratio, **options)


async def start(tmp_path: Path, executor, **faults) -> tuple[ModelRegistry, Path]:
    registry = serving_registry(opener(**faults), settings=EngineSettings(), executor=executor)
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
    registry, v2 = await start(tmp_path, executor)
    # equal models: a loaded machine's jitter must not read as a latency regression here
    canary = await registry.canary(v2, policy(0.25, ratio=100))
    assert registry.versions("tiny") == ["1", "2"]
    first = await traffic(registry, 32)
    assert [v for v, _ in first].count("2") == 8  # exactly a quarter, spread evenly
    assert all(ok for _, ok in first)
    # the 8th canary answer concluded it: promoted, and version 1 no longer routable
    verdict = await canary.outcome()
    assert (verdict.outcome, verdict.decided_by) == (PROMOTED, "traffic")
    assert (verdict.canary_requests, verdict.canary_faults, verdict.stable_requests) == (8, 0, 24)
    assert verdict.canary_p99_ms and verdict.stable_p99_ms and verdict.p99_ratio
    assert registry.get("tiny").version == "2"
    await until(lambda: registry.versions("tiny") == ["2"])  # version 1 retires after draining
    assert registry.status()["tiny"]["last_canary"] == "version 2 promoted"
    await registry.close()


async def test_failing_canary_is_rolled_back_at_the_first_fault_that_decides(
    tmp_path: Path, executor
):
    registry, v2 = await start(tmp_path, executor, fail=True)
    canary = await registry.canary(v2, policy(0.5))  # max_error_rate 2% of 8: one fault decides
    outcomes = await traffic(registry, 40)
    assert all(ok for version, ok in outcomes if version == "1")
    assert [ok for version, ok in outcomes if version == "2"] == [False]  # then no more
    verdict = await canary.outcome()
    assert (verdict.outcome, verdict.canary_requests, verdict.canary_faults) == (ROLLED_BACK, 1, 1)
    assert verdict.error_rate == 1.0 and "1 of 1 requests failed" in verdict.reason
    assert registry.get("tiny").version == "1" and registry.versions("tiny") == ["1"]
    assert "rolled back: 1 of 1 requests failed" in registry.status()["tiny"]["last_canary"]
    await registry.close()


async def test_slow_canary_is_rolled_back_on_its_p99(tmp_path: Path, executor):
    registry, v2 = await start(tmp_path, executor, delay_s=0.05)
    canary = await registry.canary(v2, policy(0.5))
    outcomes = await traffic(registry, 40)
    assert all(ok for _, ok in outcomes)  # slow, not failing: every request answered
    verdict = await canary.outcome()
    assert verdict.outcome == ROLLED_BACK and verdict.p99_ratio is not None
    assert verdict.p99_ratio > 1.5 and verdict.canary_p99_ms is not None
    assert verdict.canary_p99_ms >= 50
    assert registry.get("tiny").version == "1"
    assert "p99 latency" in registry.status()["tiny"]["last_canary"]
    await registry.close()


async def test_without_traffic_max_seconds_decides_by_the_policy(tmp_path: Path, executor):
    registry, v2 = await start(tmp_path, executor)
    canary = await registry.canary(v2, policy(0.1, max_seconds=1, without_traffic="rollback"))
    verdict = await canary.outcome()  # resolved by the registry's timer, no request at all
    assert (verdict.outcome, verdict.decided_by, verdict.canary_requests) == (
        ROLLED_BACK,
        "max_seconds",
        0,
    )
    assert "0 of 8 requests in 1 s; without_traffic = rollback" in verdict.reason
    assert registry.get("tiny").version == "1"
    v3 = write_tiny_package(tmp_path / "v3", version="3", seed=3)
    promoted = await (await registry.canary(v3, policy(0.1, max_seconds=1))).outcome()
    assert (promoted.outcome, promoted.decided_by) == (PROMOTED, "max_seconds")
    assert registry.get("tiny").version == "3"
    await registry.close()


async def test_a_failing_check_keeps_all_traffic_on_the_stable_version(tmp_path: Path, executor):
    registry, v2 = await start(tmp_path, executor)
    checked = []

    async def golden(model):
        checked.append(model.version)
        raise RuntimeError("golden answer differs")

    with pytest.raises(RuntimeError, match="golden answer differs"):
        await registry.canary(v2, policy(0.5), check=golden)
    assert checked == ["2"] and registry.versions("tiny") == ["1"]
    assert {v for v, _ in await traffic(registry, 4)} == {"1"}
    await registry.close()


async def test_unloading_interrupts_the_canary(tmp_path: Path, executor):
    registry, v2 = await start(tmp_path, executor)
    canary = await registry.canary(v2, policy(0.5))
    await registry.unload("tiny")
    verdict = await canary.outcome()
    assert (verdict.outcome, verdict.reason) == (INTERRUPTED, "the model was unloaded")
    await registry.close()


async def test_canary_needs_a_new_version_and_an_active_one(tmp_path: Path, executor):
    registry, _ = await start(tmp_path, executor)
    with pytest.raises(LoadFailed, match="already loaded"):
        await registry.canary(tmp_path / "v1")
    other = serving_registry(open_variant, executor=executor)
    with pytest.raises(LoadFailed, match="no active version"):
        await other.canary(tmp_path / "v1")
    await registry.close()


async def test_an_ended_canary_is_retired_at_once_and_never_promoted(tmp_path: Path, executor):
    """``Canary.end`` (a newer release came): no more traffic, the registry retires it now,
    not at its week-long time-out, and a same-version reload is not refused as loaded."""
    registry, v2 = await start(tmp_path, executor)
    canary = await registry.canary(v2, policy(0.5, max_seconds=7 * 86400.0))
    await traffic(registry, 4)  # two canary requests of its 8: no verdict yet
    canary.end("superseded by tiny 3 (serial 3)")
    verdict = await canary.outcome()
    assert (verdict.outcome, verdict.reason) == (INTERRUPTED, "superseded by tiny 3 (serial 3)")
    assert registry.get("tiny").version == "1" and canary.timer is not None
    assert canary.timer.cancelled()  # concluded by the registry, not left for its time-out
    await until(lambda: registry.versions("tiny") == ["1"])
    assert all(version == "1" for version, _ in await traffic(registry, 16))
    assert canary.judge(registry.get("tiny")) is verdict  # never a second, promoting verdict
    again = await registry.canary(v2, policy(0.5))  # the same version may come back
    again.end("test over")
    await registry.close()
