"""The execution plan's bounded measurement: which instances × threads × batch this board likes.

The same model on the same two cores spans 1:2 in throughput depending on how it is run (issue
28: batch 8 slower per image than batch 1 on one board, two single-threaded callers 1.49× the
one two-threaded caller the agent used to run), so the plan is measured, not assumed. The
search runs at probe time, never on the request path: every shape that uses the cores the
profile allows (instances × threads = cores) with each batch size is run closed-loop in
process — each instance a session of its own with its own intra-op threads, every instance
busy.

The machine it measures on drifts: on a board shared with other work, or a CI machine, the
same shape measured 2-4× apart within seconds (issue 28's first search picked a shape at 0.60
of the best). So no shape is measured in one long window: the shapes take turns in short
windows (tens of milliseconds, a few runs each), each between two windows of one reference
shape, round after round with the order reversed, and are compared only by these paired
ratios, whose median over the rounds decides (``Sandwiches``). A shape whose rounds disagree
about it by more than ``disagreement``, and that could still be the fastest, is measured again
rather than trusted, while the time budget lasts; the budget ``search_s`` covers the loads too.
The chosen plan and the figures that chose it are cached with the probe results
(``ProbeCache.put_plan``).
"""

from __future__ import annotations

import logging
import os
import platform
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from edgeagent.runtimes.base import Session

log = logging.getLogger(__name__)

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
AGREE = 0.2  # two reference windows this close measured the same machine speed
MIN_RUNS = 1  # a window holds at least this many runs of the shape (timed at warm-up)
MIN_WINDOW_S = 0.005  # a shorter window measures the timer, not the model


@dataclass(frozen=True)
class PlanShape:
    """How one variant runs: ``instances`` sessions of ``threads`` intra-op threads each,
    merging up to ``batch`` rows per run."""

    instances: int
    threads: int
    batch: int

    @property
    def label(self) -> str:
        return f"{self.threads}x{self.instances}:b{self.batch}"


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
        return f"i{self.instances or '*'}t{self.threads or '*'}b{self.max_batch}"


@dataclass(frozen=True)
class MeasuredPlan:
    """The plan in force and where it came from, with the figures that chose it."""

    shape: PlanShape
    source: str  # "search", "cached" (a search of an earlier start), "fixed" (configured)
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


class Sandwiches:
    """Each shape's throughput over a reference shape's, measured just before and just after it.

    A window of a shape sits between two windows of the reference, tens of milliseconds apart:
    a machine whose speed drifts by 2-4× over seconds (other work coming and going) changes
    both sides of the ratio alike. The median of a shape's ratios then drops the windows that
    a burst of other work hit on the shape's side only. (Simulated with bursts that slow a third
    of the time to 0.4×, this picks a shape within 5 % of the best every time; the mean of the
    two neighbours with the median, about half the time.)
    """

    def __init__(self, reference: PlanShape) -> None:
        self.reference = reference
        self.references: list[float] = []  # the reference's own rows/s, every window
        self.ratios: dict[PlanShape, list[float]] = {}

    def add(self, shape: PlanShape, rate: float, before: float, after: float) -> None:
        """One window of ``shape`` between two of the reference: its ratio to their mean where
        they agree (a steady drift cancels), else to the faster (other work only ever slows a
        window down, so a burst hit the slower one; it must not inflate the ratio)."""
        low, high = sorted((before, after))
        reference = (low + high) / 2 if low >= high * (1 - AGREE) else high
        self.ratios.setdefault(shape, []).append(rate / reference if reference > 0 else 0.0)

    def count(self, shape: PlanShape) -> int:
        """Windows measured: the reference's own, or the ratios of another shape."""
        if shape == self.reference:
            return len(self.references)
        return len(self.ratios.get(shape, []))

    def ratio(self, shape: PlanShape) -> float:
        """``shape``'s median throughput over the reference's (1 for the reference itself)."""
        if shape == self.reference:
            return 1.0
        ratios = self.ratios.get(shape)
        return statistics.median(ratios) if ratios else 0.0

    def spread(self, shape: PlanShape) -> float:
        return 0.0 if shape == self.reference else _spread(self.ratios.get(shape, []))

    def figure(self, shape: PlanShape) -> float:
        """``shape``'s rows/s on the reference's scale (the reference's median × the ratio)."""
        return statistics.median(self.references) * self.ratio(shape) if self.references else 0.0


def search(
    pool: SessionPool,
    feeds: Mapping[str, np.ndarray],
    cores: int,
    request: PlanRequest,
    clock: Callable[[], float] = time.time,
    *,
    measure: Measure = closed_loop,
    timer: Callable[[], float] = time.perf_counter,
) -> MeasuredPlan:
    """Measure the shapes of ``shapes(cores, request)`` and return the fastest (see the module
    docstring); ``pool`` then holds sessions of every thread count tried.

    ``request.search_s`` bounds everything from the first load to the last window: sessions
    are opened and warmed, then ``FIRST_ROUNDS`` rounds measure every shape, each between two
    windows of the reference shape (the first of the grid; ``Sandwiches``), the order reversed
    each round; then the shapes whose ratios disagree between rounds, and that could still be
    the fastest, run again the same way until they agree, reach ``MAX_ROUNDS`` or the budget
    is spent. ``measure`` and ``timer`` are the closed loop and the clock (a test simulates a
    drifting device with them).
    """
    began = timer()
    deadline = began + request.search_s
    tried = shapes(cores, request)
    if len(tried) == 1:  # everything is pinned: nothing to measure
        return MeasuredPlan(tried[0], "fixed", cores, search_ms=0.0, at=clock())
    inputs = {b: batch_feeds(feeds, b) for b in {s.batch for s in tried}}
    run_s = {s: _warm(pool.get(s.threads, s.instances), inputs[s.batch], timer) for s in tried}
    base = (deadline - timer()) / (PLANNED_ROUNDS * (2 * len(tried) - 1))
    window = {s: max(MIN_WINDOW_S, base, MIN_RUNS * run_s[s]) for s in tried}
    reference = tried[0]
    sandwiches = Sandwiches(reference)

    def run(shape: PlanShape) -> float:
        rate = measure(pool.get(shape.threads, shape.instances), inputs[shape.batch], window[shape])
        if shape == reference:
            sandwiches.references.append(rate)
        return rate

    def measure_round(rivals: list[PlanShape], must: bool) -> int:
        """Each rival between two windows of the reference; how many were measured."""
        measured, before = 0, run(reference)
        for shape in rivals:
            if not must and timer() + window[shape] + window[reference] > deadline:
                continue
            rate = run(shape)
            after = run(reference)
            sandwiches.add(shape, rate, before, after)
            before, measured = after, measured + 1
        return measured

    rivals = tried[1:]
    for index in range(FIRST_ROUNDS):
        measure_round(rivals if index % 2 == 0 else rivals[::-1], must=index < 2)
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


def _spread(values: list[float]) -> float:
    """How far a shape's rounds disagree: (max − min) / median."""
    if len(values) < 2:
        return 0.0
    middle = statistics.median(values)
    return (max(values) - min(values)) / middle if middle > 0 else 0.0
