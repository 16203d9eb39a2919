"""The execution plan's bounded measurement: which instances × threads × batch this board likes.

The same model on the same two cores spans 1:2 in throughput depending on how it is run (batch
8 slower per image than batch 1 on one board, two single-threaded callers 1.49× one
two-threaded caller), so the plan is measured, not assumed. The
search runs at probe time, never on the request path: every shape that uses the cores the
profile allows (instances × threads = cores) with each batch size is run closed-loop in
process — each instance a session of its own with its own intra-op threads, every instance
busy.

The machine it measures on drifts: on a board shared with other work, or a CI machine, the same
shape measured 2-4× apart within seconds (a search of single long windows picked a shape at 0.60
of the best). So no shape is measured in one long window: the shapes take turns in short windows
(tens of milliseconds, a few runs each), each between two windows of one reference shape, round
after round with the order reversed, and are compared only by these paired ratios, whose median
over the rounds decides (``Sandwiches``). A shape whose rounds disagree about it by more than
``disagreement``, and that could still be the fastest, is measured again rather than trusted,
while the time budget lasts; the budget ``search_s`` covers the loads too, whatever the model's
speed: one row's time decides which shapes two rounds can afford (a model at 120 ms a row
measures a few batch-1 shapes, or none and keeps the configured one).
The chosen plan and the figures that chose it are cached with the probe results
(``ProbeCache.put_plan``). The agent serves a new model at once on a safe plan (``PENDING``)
and searches afterwards, in the background (``engine.registry``).
"""

from __future__ import annotations

import logging
import os
import platform
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from edgeagent.hardware.plan_ratios import Sandwiches
from edgeagent.hardware.plan_shape import PENDING, PlanShape
from edgeagent.runtimes.base import Session

log = logging.getLogger(__name__)

__all__ = ["PENDING", "MeasuredPlan", "PlanRequest", "PlanShape", "search"]

SEARCH_BATCHES = (1, 4, 8)  # batch sizes tried (up to the model's max_batch_size)
# Shapes this close to the best count as equal, and the more threads per instance, then the
# larger batch, wins: a lone request runs on one instance, so more threads answer it sooner (c=1
# p50 on the socket: 3.6-3.9 ms with 2 threads, 4.9 ms with 1, same throughput), and serving
# pays per batch what the in-process figure does not (the hand-offs between the event loop and
# a worker thread, the batcher's bookkeeping: at c=16 batch 4 served 1.2-1.3x batch 1 where in
# process they were 5 % apart). The batcher merges only what is already waiting, so a lone
# request is not delayed by a larger batch.
TIE = 0.02
FIRST_ROUNDS = 3  # rounds of every shape before the leader is chosen (2 when the budget is short)
PLANNED_ROUNDS = 6  # the budget is split into windows as if every shape ran this many rounds
MAX_ROUNDS = 12  # rounds of one shape at most, disagreement or not
MIN_RUNS = 1  # a window holds at least this many runs of the shape (timed at warm-up)
MIN_WINDOW_S = 0.005  # a shorter window measures the timer, not the model


@dataclass(frozen=True)
class PlanRequest:
    """What the configuration fixes and what is left to the search.

    ``auto`` false runs no search: the pinned values, else one instance of ``cores`` threads
    and ``max_batch`` (the behaviour before plans). With ``auto``, a pinned ``instances`` or
    ``threads`` narrows the search to shapes that have it; ``max_batch`` bounds the batch sizes
    tried (1 for a model that cannot batch).
    """

    auto: bool = True
    instances: int | None = None
    threads: int | None = None
    max_batch: int = 8
    search_s: float = 2.0
    disagreement: float = 0.1
    lone: bool = True  # keep a session of all the cores for a lone request (InstanceGroup)

    @property
    def keeps_lone_session(self) -> bool:
        """Whether a session of all the cores may serve beside the plan's instances: not
        beside a thread count the operator pinned."""
        return self.lone and self.auto and self.threads is None

    @property
    def fingerprint(self) -> str:
        """What a cached plan was searched under: a changed pin must search again."""
        # "2": figures labelled instances x threads (an older cache's labels read the other way)
        return f"2i{self.instances or '*'}t{self.threads or '*'}b{self.max_batch}"


@dataclass(frozen=True)
class MeasuredPlan:
    """The plan in force and where it came from, with the figures that chose it."""

    shape: PlanShape
    # "search", "cached" (a search of an earlier start), "fixed" (configured, or a model too
    # slow for any search within the budget), PENDING (serving until the search ends)
    source: str
    cores: int  # the threads the profile allows (instances × threads ≤ cores)
    figures: Mapping[str, float] = field(default_factory=dict)  # label → rows/s (median)
    rounds: Mapping[str, int] = field(default_factory=dict)  # label → rounds measured
    search_ms: float = 0.0  # loads + measurement
    at: float = 0.0  # wall-clock time of the search

    @property
    def rows_per_s(self) -> float | None:
        """The chosen shape's measured throughput (None for a fixed plan)."""
        return self.figures.get(self.shape.label)

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self.shape),
            "source": self.source,
            "cores": self.cores,
            "rows_per_s": self.rows_per_s,
            "figures": dict(self.figures),
            "rounds": dict(self.rounds),
            "search_ms": self.search_ms,
            "at": self.at,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MeasuredPlan | None:
        """A cached plan, or None when the entry is not one (hand-edited, older format)."""
        try:
            shape = PlanShape(int(data["instances"]), int(data["threads"]), int(data["batch"]))
            figures = {str(k): float(v) for k, v in dict(data.get("figures", {})).items()}
            rounds = {str(k): int(v) for k, v in dict(data.get("rounds", {})).items()}
            plan = cls(
                shape,
                "cached",
                int(data["cores"]),
                figures,
                rounds,
                float(data.get("search_ms", 0.0)),
                float(data.get("at", 0.0)),
            )
        except (KeyError, TypeError, ValueError):
            return None
        if min(shape.instances, shape.threads, shape.batch, plan.cores) < 1:
            return None
        return plan


def hardware_key(profile: str, cores: int) -> str:
    """What the board is, for the plan cache: a plan measured elsewhere is measured again."""
    return f"{profile}:{platform.machine()}:{os.cpu_count() or 0}cpu:{cores}t"


def shapes(cores: int, request: PlanRequest) -> list[PlanShape]:
    """The shapes worth measuring: every split of ``cores`` into instances × threads (or the
    pinned one) with every batch size up to ``max_batch``."""
    cores = max(1, cores)
    if request.threads is not None:
        splits = [(request.instances or max(1, cores // request.threads), request.threads)]
    elif request.instances is not None:
        splits = [(request.instances, max(1, cores // request.instances))]
    else:
        splits = [(cores // t, t) for t in range(1, cores + 1) if cores % t == 0]
    batches = sorted({b for b in SEARCH_BATCHES if b <= request.max_batch} | {1})
    if request.max_batch < max(SEARCH_BATCHES):
        batches = sorted({*batches, request.max_batch})
    return [PlanShape(n, t, b) for n, t in splits for b in batches]


def fixed_shape(cores: int, request: PlanRequest) -> PlanShape:
    """The configured shape when no search runs: one instance of every core unless pinned."""
    threads = request.threads or max(1, cores // (request.instances or 1))
    return PlanShape(request.instances or 1, threads, request.max_batch)


def batch_feeds(feeds: Mapping[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
    """The batch-1 sample feeds repeated to ``rows`` rows."""
    return {name: np.concatenate([value] * rows) for name, value in feeds.items()}


def closed_loop(sessions: list[Session], feeds: Mapping[str, np.ndarray], seconds: float) -> float:
    """Rows per second with every session run back to back by its own thread.

    Each thread counts the runs that ended inside the window and divides by the time to the
    last of them: a window a few runs long then measures the model, not where the stop fell
    within a run (a run cut off by the stop is not counted, unless it is the thread's only one).
    """
    rows = len(next(iter(feeds.values())))
    stop = threading.Event()
    start = threading.Barrier(len(sessions) + 1)
    done: list[tuple[int, float]] = [(0, 0.0)] * len(sessions)

    def work(index: int) -> None:
        session = sessions[index]
        start.wait()
        began = time.perf_counter()
        runs, last = 0, began
        while not stop.is_set():
            session.run(feeds)
            ended = time.perf_counter()
            if stop.is_set() and runs:
                break
            runs, last = runs + 1, ended
        done[index] = (runs, last - began)

    workers = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(len(sessions))]
    for worker in workers:
        worker.start()
    start.wait()
    stop.wait(seconds)  # the measurement window itself, not a synchronisation
    stop.set()
    for worker in workers:
        worker.join()
    return sum(runs * rows / took for runs, took in done if took > 0)


class SessionPool:
    """Sessions of the variant by intra-op thread count, opened as the search needs them;
    those of the chosen shape go on to serve, the rest are closed."""

    def __init__(self, open_session: Callable[[int], Session]) -> None:
        self._open = open_session
        self._by_threads: dict[int, list[Session]] = {}

    def add(self, threads: int, session: Session) -> None:
        self._by_threads.setdefault(threads, []).append(session)

    def have(self) -> dict[int, int]:
        """Sessions open now, by thread count."""
        return {t: len(sessions) for t, sessions in self._by_threads.items()}

    def get(self, threads: int, count: int) -> list[Session]:
        have = self._by_threads.setdefault(threads, [])
        while len(have) < count:
            have.append(self._open(threads))
        return have[:count]

    def keep(
        self, shape: PlanShape, lone_threads: int | None = None
    ) -> tuple[list[Session], Session | None]:
        """The chosen shape's sessions (opened if missing) and, with ``lone_threads`` other than
        the shape's threads, one session of that many threads too (the lone request's); every
        other session is closed."""
        kept = self.get(shape.threads, shape.instances)
        lone = None
        if lone_threads is not None and lone_threads != shape.threads:
            lone = self.get(lone_threads, 1)[0]
        self.close(keep=[*kept, *([lone] if lone is not None else [])])
        return kept, lone

    def close(self, keep: list[Session] | None = None) -> None:
        for sessions in self._by_threads.values():
            for session in sessions:
                if keep is None or all(session is not k for k in keep):
                    session.close()
        self._by_threads = {}


Measure = Callable[[list[Session], Mapping[str, np.ndarray], float], float]


def search(
    pool: SessionPool,
    feeds: Mapping[str, np.ndarray],
    cores: int,
    request: PlanRequest,
    clock: Callable[[], float] = time.time,
    *,
    measure: Measure = closed_loop,
    timer: Callable[[], float] = time.perf_counter,
    load_s: float | None = None,
) -> MeasuredPlan:
    """Measure the shapes of ``shapes(cores, request)`` that fit the budget and return the
    fastest (see the module docstring); ``pool`` then holds sessions of every thread count tried.

    ``request.search_s`` bounds everything from the first load to the last window, whatever the
    model's speed: one batch-1 run of the session already open times a row, and the grid is
    pruned to the shapes whose loads, warm-up runs and two rounds of windows that row time says
    fit (``affordable``: batch 1 of every split first, then larger batches); ``load_s`` is what
    opening one session is expected to cost (the probe's load time), corrected by the first
    load measured. When not even one rival fits, nothing is measured and the configured shape
    serves (source "fixed"). The kept shapes are opened and warmed, then rounds measure every
    shape between two windows of the reference shape (batch 1 on sessions already open, else
    the grid's first; ``Sandwiches``),
    the order reversed each round, while the budget lasts; then the shapes whose ratios
    disagree between rounds, and that could still be the fastest, run again the same way until
    they agree, reach ``MAX_ROUNDS`` or the budget is spent. ``measure`` and ``timer`` are the
    closed loop and the clock (a test simulates a drifting device with them).
    """
    began = timer()
    deadline = began + request.search_s
    grid = shapes(cores, request)
    if len(grid) == 1:  # everything is pinned: nothing to measure
        return MeasuredPlan(grid[0], "fixed", cores, search_ms=0.0, at=clock())
    inputs = {b: batch_feeds(feeds, b) for b in {s.batch for s in grid}}
    costs = SearchCosts(cores, _row_s(pool, cores, inputs[1], timer), load_s)
    have = pool.have()  # the reference: a shape already open (no load), else the grid's first
    grid.sort(key=lambda s: s.batch > 1 or s.instances > have.get(s.threads, 0))
    tried = costs.affordable(grid, have, deadline - timer())
    waiting = tried
    while len(tried) > 1 and waiting:  # each warm-up corrects the estimates: a shape may go
        shape = waiting[0]  # (a slow load) or come back (a batch cheaper than rows x batch)
        sessions = _opened(pool, shape, costs, timer)
        costs.runs[shape] = _warm(sessions, inputs[shape.batch], timer)
        tried = costs.affordable(grid, pool.have(), deadline - timer())
        waiting = sorted((s for s in tried if s not in costs.runs), key=lambda s: s.batch)
    if len(tried) < 2:
        log.info(
            "plan search: %.0f ms a row leaves no room for a second shape in %.1f s; serving %s",
            costs.row_s * 1e3, request.search_s, fixed_shape(cores, request).label,
        )  # fmt: skip
        took = round((timer() - began) * 1000, 1)
        return MeasuredPlan(fixed_shape(cores, request), "fixed", cores, search_ms=took, at=clock())
    base = (deadline - timer()) / (PLANNED_ROUNDS * (2 * len(tried) - 1))
    window = {s: max(MIN_WINDOW_S, base, MIN_RUNS * costs.runs[s]) for s in tried}
    reference = tried[0]
    sandwiches = Sandwiches(reference)

    def run(shape: PlanShape) -> float:
        rate = measure(pool.get(shape.threads, shape.instances), inputs[shape.batch], window[shape])
        if shape == reference:
            sandwiches.references.append(rate)
        return rate

    def next_pair(shape: PlanShape) -> float:
        return costs.span(shape, window[shape]) + costs.span(reference, window[reference])

    def measure_round(rivals: list[PlanShape], must: bool) -> int:
        """Each rival between two windows of the reference; how many were measured."""
        first = costs.span(reference, window[reference])
        if not must and timer() + first + min(map(next_pair, rivals)) > deadline:
            return 0
        measured, before = 0, run(reference)
        for shape in rivals:
            if not must and timer() + next_pair(shape) > deadline:
                continue
            rate = run(shape)
            after = run(reference)
            sandwiches.add(shape, rate, before, after)
            before, measured = after, measured + 1
        return measured

    rivals = tried[1:]
    for index in range(FIRST_ROUNDS):
        measure_round(rivals if index % 2 == 0 else rivals[::-1], must=index == 0)
    while True:
        best = max(sandwiches.ratio(s) for s in tried)
        unsure = [
            s
            for s in rivals
            if sandwiches.spread(s) > request.disagreement
            and max(sandwiches.ratios[s]) >= best * (1 - request.disagreement)
            and sandwiches.count(s) < MAX_ROUNDS
        ]
        if not unsure or not measure_round(unsure, must=False):
            break
    best = max(sandwiches.ratio(s) for s in tried)
    near = [s for s in tried if sandwiches.ratio(s) >= best * (1 - TIE)]
    chosen = max(near, key=lambda s: (s.threads, s.batch))
    return MeasuredPlan(
        chosen,
        "search",
        cores,
        {s.label: round(sandwiches.figure(s), 1) for s in tried},
        {s.label: sandwiches.count(s) for s in tried},
        round((timer() - began) * 1000, 1),
        clock(),
    )


@dataclass
class SearchCosts:
    """What measuring a set of shapes will cost, from one row's time on ``cores`` threads.

    A run of ``batch`` rows on ``threads`` of the ``cores`` threads is taken to last
    ``row_s × batch × cores / threads`` (perfect scaling: an over-estimate where threads scale
    worse, so the budget holds) until its warm-up timed it (``runs``); a window lasts at least
    one run, plus the run in flight when it closes; a load lasts ``load_s`` (the probe's load
    time, replaced by a slower one measured here; before either, the time of 20 rows).
    """

    cores: int
    row_s: float
    load_s: float | None = None
    runs: dict[PlanShape, float] = field(default_factory=dict)  # measured at warm-up

    def run(self, shape: PlanShape) -> float:
        """A run's time: measured, else scaled from the largest smaller batch measured on the
        same sessions (per row no slower than that), else from the row time."""
        if shape in self.runs:
            return self.runs[shape]
        split = (shape.instances, shape.threads)
        same = [s for s in self.runs if (s.instances, s.threads) == split]
        if same:
            known = max(same, key=lambda s: s.batch)
            return self.runs[known] * shape.batch / known.batch
        return self.row_s * shape.batch * self.cores / shape.threads

    def span(self, shape: PlanShape, window_s: float) -> float:
        """A window of ``shape`` as it really lasts: the window and the run in flight."""
        return window_s + self.run(shape)

    @staticmethod
    def loads(shapes: list[PlanShape], have: Mapping[int, int]) -> int:
        """Sessions still to open for ``shapes``, given ``have`` open by thread count."""
        wanted: dict[int, int] = {}
        for s in shapes:
            wanted[s.threads] = max(wanted.get(s.threads, 0), s.instances)
        return sum(max(0, n - have.get(t, 0)) for t, n in wanted.items())

    def cost(self, shapes: list[PlanShape], have: Mapping[int, int]) -> float:
        """Loads, warm-up runs (of shapes not warmed yet) and two rounds of the shortest
        windows, the first of ``shapes`` being the reference."""
        load = self.load_s if self.load_s is not None else 20 * self.row_s
        warm = sum((s.instances + 1) * self.run(s) for s in shapes if s not in self.runs)
        spans = [self.span(s, max(MIN_WINDOW_S, MIN_RUNS * self.run(s))) for s in shapes]
        rounds = 2 * (len(shapes) * spans[0] + sum(spans[1:]))
        return self.loads(shapes, have) * load + warm + rounds

    def affordable(
        self, grid: list[PlanShape], have: Mapping[int, int], budget_s: float
    ) -> list[PlanShape]:
        """The reference (the grid's first) and, in order of worth — batch 1 of every split,
        then the larger batches — every shape whose measurement still fits ``budget_s``."""
        kept = grid[:1]
        for shape in sorted(grid[1:], key=lambda s: (s.batch, grid.index(s))):
            if self.cost([*kept, shape], have) <= budget_s:
                kept.append(shape)
        return sorted(kept, key=grid.index)


def _row_s(
    pool: SessionPool,
    cores: int,
    feeds: Mapping[str, np.ndarray],
    timer: Callable[[], float],
) -> float:
    """One batch-1 run's time on a session of every core (the one open already): the yardstick
    of what the search can afford. It runs once untimed first (first runs allocate)."""
    session = pool.get(cores, 1)[0]
    session.run(feeds)
    start = timer()
    session.run(feeds)
    return max(timer() - start, 1e-6)


def _opened(
    pool: SessionPool, shape: PlanShape, costs: SearchCosts, timer: Callable[[], float]
) -> list[Session]:
    """The shape's sessions, opening the missing ones; the first load measured replaces the
    expected load time."""
    missing = max(0, shape.instances - pool.have().get(shape.threads, 0))
    start = timer()
    sessions = pool.get(shape.threads, shape.instances)
    if missing:
        measured = (timer() - start) / missing
        costs.load_s = measured if costs.load_s is None else max(costs.load_s, measured)
    return sessions


def _warm(
    sessions: list[Session], feeds: Mapping[str, np.ndarray], timer: Callable[[], float]
) -> float:
    """Run every session once (first runs allocate: not inside any window); one more timed
    run of the first, whose length sets the shortest window that holds a few runs."""
    for session in sessions:
        session.run(feeds)
    start = timer()
    sessions[0].run(feeds)
    return timer() - start
