"""The plan search (issue 28): the shapes it measures, the one it picks, rounds that disagree
measured again, and plans cached with the probe cache (re-measured when a key part changes)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from edgeagent.hardware.instances import InstanceGroup
from edgeagent.hardware.plan_search import (
    MeasuredPlan,
    PlanRequest,
    PlanShape,
    SessionPool,
    fixed_shape,
    search,
    shapes,
)
from edgeagent.hardware.probe import ProbeCache
from edgeagent.hardware.service import Accelerators
from edgeagent.hardware.settings import HardwareSettings
from edgeagent.models.package import load_package
from edgeagent.runtimes.base import Session, TensorInfo
from tests.support.hardware import FIXTURES
from tests.support.helpers import write_tiny_package


class Costed(Session):
    """A simulated device whose batch of B rows takes ``cost(threads, B)`` ms; ``slow_first``
    runs take 5× as long (a machine that drifts while the search measures)."""

    runtime, device, precision = "fake", "SIM", "fp32"

    def __init__(self, threads: int, slow_first: int = 0) -> None:
        self.threads = threads
        self.slow_first = slow_first
        self.runs = 0
        self._lock = threading.Lock()

    inputs = [TensorInfo("input", "float32", (-1, 2))]
    outputs = [TensorInfo("y", "float32", (-1, 2))]

    def cost_ms(self, rows: int) -> float:
        if self.threads == 1:  # one thread: batch 4 pays, batch 8 thrashes its cache
            return 4 + 2 * rows if rows <= 4 else 4 + 4 * rows
        return 3 + 1.5 * rows

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = len(feeds["input"])
        with self._lock:
            self.runs += 1
            slow = self.runs <= self.slow_first
        ms = self.cost_ms(rows)
        time.sleep(ms / 1000 * (5 if slow else 1))  # the simulated device computing
        return {"y": feeds["input"]}


FEEDS = {"input": np.zeros((1, 2), np.float32)}


def test_shapes_split_the_cores_and_honour_pins() -> None:
    grid = shapes(2, PlanRequest())
    assert {(s.instances, s.threads) for s in grid} == {(2, 1), (1, 2)}
    assert {s.batch for s in grid} == {1, 4, 8}
    assert {s.batch for s in shapes(4, PlanRequest(max_batch=1))} == {1}
    assert {(s.instances, s.threads) for s in shapes(4, PlanRequest())} == {(4, 1), (2, 2), (1, 4)}
    assert {(s.instances, s.threads) for s in shapes(4, PlanRequest(threads=2))} == {(2, 2)}
    assert {(s.instances, s.threads) for s in shapes(4, PlanRequest(instances=4))} == {(4, 1)}
    assert {s.batch for s in shapes(2, PlanRequest(max_batch=2))} == {1, 2}
    assert fixed_shape(4, PlanRequest(auto=False)) == PlanShape(1, 4, 8)
    assert fixed_shape(4, PlanRequest(auto=False, instances=2)) == PlanShape(2, 2, 8)


def test_search_picks_the_fastest_shape_and_keeps_its_sessions() -> None:
    opened: list[Costed] = []

    def open_session(threads: int) -> Costed:
        opened.append(Costed(threads))
        return opened[-1]

    pool = SessionPool(open_session)
    plan = search(pool, FEEDS, 2, PlanRequest(search_s=1.5))
    # 1 thread × 2 instances at batch 4: 667 rows/s; the next best (2 × 1 at batch 8) 533.
    assert plan.shape == PlanShape(2, 1, 4), plan.figures
    assert plan.source == "search"
    assert set(plan.figures) == {s.label for s in shapes(2, PlanRequest())}
    assert all(count >= 2 for count in plan.rounds.values())
    kept = pool.keep(plan.shape)
    assert [s.threads for s in kept] == [1, 1] and len(opened) == 3  # 2 of 1 thread, 1 of 2


def test_rounds_that_disagree_are_measured_again() -> None:
    pool = SessionPool(lambda threads: Costed(threads, slow_first=12 if threads == 2 else 0))
    plan = search(pool, FEEDS, 2, PlanRequest(search_s=1.5, disagreement=0.1))
    assert plan.rounds["2x1:b1"] > 2, plan.rounds  # its first round ran slow: not trusted


def test_measured_plan_round_trips_and_refuses_garbage() -> None:
    plan = MeasuredPlan(PlanShape(2, 1, 4), "search", 2, {"1x2:b4": 600.0}, {"1x2:b4": 2}, 900.0)
    again = MeasuredPlan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again is not None and again.shape == plan.shape and again.source == "cached"
    assert again.rows_per_s == 600.0
    assert MeasuredPlan.from_dict({"instances": "x"}) is None
    assert MeasuredPlan.from_dict({**plan.to_dict(), "threads": 0}) is None


def test_plans_persist_in_the_probe_cache_and_old_caches_still_read(tmp_path: Path) -> None:
    path = tmp_path / "probe-cache.json"
    path.write_text(json.dumps({"format": 1, "probes": {}, "decisions": {}}))  # before plans
    cache = ProbeCache(path)
    assert cache.get_plan("k") is None
    cache.put_plan("k", {"instances": 2})
    assert ProbeCache(path).get_plan("k") == {"instances": 2}


def test_accelerators_search_once_then_serve_the_cached_plan(tmp_path: Path) -> None:
    """A real ONNX model: measured at the first open, cached for the next start, searched
    again when a pin changes; plan = fixed measures nothing."""
    package = load_package(write_tiny_package(tmp_path / "pkg"))
    settings = HardwareSettings(root=FIXTURES / "raspberry-pi-5", threads=2)
    feeds = {"input": np.ones((1, 3, 8, 8), np.float32)}
    first = Accelerators(settings, tmp_path / "state")
    group = first.open(package, PlanRequest(search_s=0.3))
    assert isinstance(group, InstanceGroup) and group.plan.source == "search"
    shape = group.plan.shape
    assert shape.instances * shape.threads == 2 and group.instances == shape.instances
    assert group.status()["plan"]["threads"] == shape.threads
    expected = group.run(feeds)["logits"]
    group.close()
    again = Accelerators(settings, tmp_path / "state").open(package, PlanRequest(search_s=0.3))
    assert isinstance(again, InstanceGroup)
    assert again.plan.source == "cached" and again.plan.shape == shape
    np.testing.assert_allclose(again.run(feeds)["logits"], expected, rtol=1e-5)
    again.close()
    pinned = Accelerators(settings, tmp_path / "state").open(
        package, PlanRequest(threads=1, search_s=0.3)
    )
    assert isinstance(pinned, InstanceGroup) and pinned.plan.source == "search"
    assert pinned.plan.shape.threads == 1 and pinned.instances == 2
    pinned.close()
    fixed = Accelerators(settings, tmp_path / "state").open(package, PlanRequest(auto=False))
    assert isinstance(fixed, InstanceGroup) and fixed.plan.source == "fixed"
    assert (fixed.plan.shape, fixed.plan.figures) == (PlanShape(1, 2, 8), {})
    fixed.close()
