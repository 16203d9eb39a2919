"""The plan search (issue 28): the shapes it measures, the one it picks, rounds that disagree
measured again, and plans cached with the probe cache (re-measured when a key part changes)."""

from __future__ import annotations

import json
import math
import random
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from edgeagent.hardware.instances import InstanceGroup
from edgeagent.hardware.plan_search import (
    MeasuredPlan,
    PlanRequest,
    PlanShape,
    SearchCosts,
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
    kept, lone = pool.keep(plan.shape, lone_threads=2)
    assert [s.threads for s in kept] == [1, 1] and len(opened) == 3  # 2 of 1 thread, 1 of 2
    assert lone is not None and lone.threads == 2  # the search's own, kept for lone requests
    assert pool.keep(plan.shape, lone_threads=1)[1] is None  # the plan's threads already


# The simulated board of the searches below: rows/s of every shape of 2 cores on a steady
# machine (labels: instances x threads). 2x1:b4 is the best, 5 % above 2x1:b1 (the margin the
# goal allows).
TRUE_RATES = {"1x2:b1": 560, "1x2:b4": 690, "1x2:b8": 720, "2x1:b1": 760, "2x1:b4": 800}
TRUE_RATES["2x1:b8"] = 700
LOAD_S = 0.15  # what opening one session costs on the simulated board


class SimSession(Costed):
    """A session of the simulated board: its runs advance the board's clock, not the wall."""

    def __init__(self, board: SimBoard, threads: int) -> None:
        super().__init__(threads)
        self.board = board

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = len(feeds["input"])
        instances = 2 // self.threads
        self.board.now += rows * instances / self.board.rates[f"{instances}x{self.threads}:b{rows}"]
        return {"y": feeds["input"]}


class SimBoard:
    """A drifting board on a simulated clock: loads and windows advance it, and each window
    measures the shape's true rate times the board's speed at that moment."""

    def __init__(
        self, speed=lambda t: 1.0, burst: str = "", rates=TRUE_RATES, load_s: float = LOAD_S
    ) -> None:
        self.rates = rates
        self.load_s = load_s
        self.now = 0.0
        self.speed = speed
        self.burst = burst  # this shape's first window runs 2x fast (other work paused)
        self.loads = 0
        self.windows: list[float] = []

    def open(self, threads: int) -> SimSession:
        self.loads += 1
        self.now += self.load_s
        return SimSession(self, threads)

    def measure(self, sessions, feeds, seconds: float) -> float:
        rows = len(feeds["input"])
        label = f"{len(sessions)}x{sessions[0].threads}:b{rows}"
        rate = self.rates[label] * self.speed(self.now + seconds / 2)
        if label == self.burst:
            rate, self.burst = 2 * rate, ""
        self.now += seconds
        self.windows.append(seconds)
        return rate

    def search(self, **request) -> MeasuredPlan:
        pool = SessionPool(self.open)
        pool.add(2, SimSession(self, 2))  # the probe's session of every core, open already
        return search(
            pool,
            FEEDS,
            2,
            PlanRequest(**request),
            measure=self.measure,
            timer=lambda: self.now,
            load_s=self.load_s,  # what the probe's load took
        )


def swinging(t: float) -> float:
    """Other work coming and going: the board's speed swings 2.5x with a 0.7 s period."""
    return 0.4 + 0.6 * (0.5 + 0.5 * math.sin(2 * math.pi * t / 0.7))


def slowing(t: float) -> float:
    """Other work piling up: the board slows to a third within the search."""
    return 1 / (1 + 2 * t)


@pytest.mark.parametrize("speed", [lambda t: 1.0, slowing, swinging])
def test_the_pick_is_the_best_shape_on_a_drifting_board(speed) -> None:
    """Steady, slowing to a third and swinging 2.5x: short paired windows still find the
    shape 5 % above the next; where the drift is steady across a window and its neighbours,
    every figure relative to another is the true ratio within 2 % (the speed of the moment
    scales them all alike)."""
    plan = SimBoard(speed).search()
    assert plan.shape == PlanShape(2, 1, 4), plan.figures
    if speed is swinging:  # neighbours 50 ms apart differ > AGREE here: the faster one counts
        return
    scale = plan.figures["2x1:b1"] / TRUE_RATES["2x1:b1"]
    for label, rate in TRUE_RATES.items():
        assert plan.figures[label] / scale == pytest.approx(rate, rel=0.02), plan.figures


def bursts(seed: int, slot_s: float = 0.04):
    """Other work in bursts: each 40 ms slot, at random a third of them, runs at 0.4x."""
    busy: dict[int, bool] = {}

    def speed(t: float) -> float:
        slot = int(t / slot_s)
        busy.setdefault(slot, random.Random(seed * 100_003 + slot).random() < 1 / 3)
        return 0.4 if busy[slot] else 1.0

    return speed


def test_bursts_of_other_work_leave_the_pick_within_5_percent_of_the_best() -> None:
    """A burst that hits a shape's window but not the reference's beside it, or the other way
    round, is one ratio the median drops (the mean of two neighbours, not the faster one, let
    a third of these searches pick a shape 10-30 % below the best)."""
    picks = [SimBoard(bursts(seed)).search().shape.label for seed in range(12)]
    assert all(TRUE_RATES[label] >= 0.95 * max(TRUE_RATES.values()) for label in picks), picks


@pytest.mark.parametrize(
    ("near", "pick"),
    [
        ({"1x2:b1": 790}, PlanShape(1, 2, 1)),  # 1 % below: more threads answer a lone request
        ({"2x1:b8": 792}, PlanShape(2, 1, 8)),  # 1 % below, same threads: the larger batch
        ({"1x2:b8": 760}, PlanShape(2, 1, 4)),  # 5 % below: not a tie
    ],
)
def test_near_ties_go_to_more_threads_then_the_larger_batch(near, pick) -> None:
    assert SimBoard(rates={**TRUE_RATES, **near}).search().shape == pick


def test_a_rival_whose_rounds_disagree_is_measured_again_not_trusted() -> None:
    """2x1:b8's first window ran 2x fast (a burst of other work stopped): that one round says
    it beats the leader, the others say it does not, so it runs again until they agree."""
    plan = SimBoard(burst="2x1:b8").search()
    assert plan.shape == PlanShape(2, 1, 4), plan.figures
    assert plan.rounds["2x1:b8"] > 3, plan.rounds
    assert plan.rounds["2x1:b1"] == 3, plan.rounds  # settled in the first rounds: not again


def test_the_budget_covers_loads_and_windows() -> None:
    """Everything from the first load to the last window fits in search_s (simulated time),
    and a generous budget measures every shape of the grid at least twice."""
    board = SimBoard()
    plan = board.search(search_s=2.0)
    assert board.loads == 2  # two sessions of 1 thread beside the probe's
    assert board.now <= 2.0 and plan.search_ms <= 2000
    assert sum(plan.rounds.values()) == len(board.windows)
    assert set(plan.rounds) == set(TRUE_RATES) and min(plan.rounds.values()) >= 2


@pytest.mark.parametrize("budget", [0.5, 2.0])
@pytest.mark.parametrize("slower", [1, 10, 40, 100])
def test_a_slow_model_is_searched_within_the_budget(budget: float, slower: int) -> None:
    """A model 10-100x slower than the board above (up to 180 ms a row on 2 threads, with
    loads to match) keeps to the budget: the grid is pruned to what one row's time says two
    rounds can afford — batch 1 of each split first — and a model too slow for any rival is
    served on the configured shape, measured no further."""
    rates = {label: rate / slower for label, rate in TRUE_RATES.items()}
    board = SimBoard(rates=rates, load_s=LOAD_S * min(slower, 10))
    plan = board.search(search_s=budget)
    assert board.now <= budget, (board.now, plan.rounds)
    assert plan.search_ms <= budget * 1000
    if plan.source == "fixed":
        assert plan.shape == PlanShape(1, 2, 8) and not board.windows
        assert slower >= 10  # the fast model always affords a search
    else:
        assert len(plan.rounds) >= 2 and min(plan.rounds.values()) >= 2, plan.rounds
        assert plan.shape.label in plan.rounds
        assert "1x2:b1" in plan.rounds  # the reference: the session open already, no load


def test_pruning_keeps_batch_1_of_every_split_before_larger_batches() -> None:
    """Which shapes a short budget keeps: the reference, then batch 1 of the other split,
    then larger batches; loads count (a split whose sessions must be opened costs more)."""
    grid = [PlanShape(1, 2, 1), *(s for s in shapes(2, PlanRequest()) if s != PlanShape(1, 2, 1))]
    costs = SearchCosts(cores=2, row_s=0.01, load_s=0.0)
    have = {2: 1}
    kept = costs.affordable(grid, have, budget_s=0.5)
    assert kept[0] == PlanShape(1, 2, 1) and PlanShape(2, 1, 1) in kept
    assert {s.batch for s in kept} == {1}, kept  # a batch of 4 on 1 thread: 80 ms a run
    assert costs.affordable(grid, have, budget_s=0.5 * 30) == grid  # all of them
    costly = SearchCosts(cores=2, row_s=0.01, load_s=1.0)
    kept = costly.affordable(grid, have, budget_s=0.8)  # opening the 1-thread split: 2 s
    assert kept[0] == grid[0] and len(kept) > 1 and {s.threads for s in kept} == {2}, kept
    assert costs.affordable(grid, have, budget_s=0.05) == grid[:1]  # no rival fits


def test_measured_plan_round_trips_and_refuses_garbage() -> None:
    plan = MeasuredPlan(PlanShape(2, 1, 4), "search", 2, {"2x1:b4": 600.0}, {"2x1:b4": 2}, 900.0)
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
