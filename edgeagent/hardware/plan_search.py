"""The execution plan's bounded measurement: which instances × threads × batch this board likes.

The same model on the same two cores spans 1:2 in throughput depending on how it is run (issue
28: batch 8 slower per image than batch 1 on one board, two single-threaded callers 1.49× the
one two-threaded caller the agent used to run), so the plan is measured, not assumed. The
search runs at probe time, never on the request path: every shape that uses the cores the
profile allows (instances × threads = cores) with each batch size is run closed-loop in
process — each instance a session of its own with its own intra-op threads, every instance
busy — in alternating rounds (the order reverses each round, so a drifting machine favours
no shape). A shape whose rounds disagree by more than ``disagreement`` is measured again
rather than trusted, while the time budget lasts. The chosen plan and the figures that chose
it are cached with the probe results (``ProbeCache.put_plan``).
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
TIE = 0.02  # shapes this close to the best count as equal: the smaller batch, more threads win
MAX_ROUNDS = 4  # rounds of one shape at most, disagreement or not
MIN_WINDOW_S = 0.03  # a shorter window measures the timer, not the model


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
    """Rows per second with every session run back to back by its own thread."""
    rows = len(next(iter(feeds.values())))
    stop = threading.Event()
    start = threading.Barrier(len(sessions) + 1)
    counts = [0] * len(sessions)

    def work(index: int) -> None:
        session = sessions[index]
        start.wait()
        while not stop.is_set():
            session.run(feeds)
            counts[index] += 1

    workers = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(len(sessions))]
    for worker in workers:
        worker.start()
    start.wait()
    began = time.perf_counter()
    stop.wait(seconds)  # the measurement window itself, not a synchronisation
    stop.set()
    for worker in workers:
        worker.join()
    return sum(counts) * rows / (time.perf_counter() - began)


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

    def keep(self, shape: PlanShape) -> list[Session]:
        """The chosen shape's sessions (opened if missing); every other session is closed."""
        kept = self.get(shape.threads, shape.instances)
        self.close(keep=kept)
        return kept

    def close(self, keep: list[Session] | None = None) -> None:
        for sessions in self._by_threads.values():
            for session in sessions:
                if keep is None or all(session is not k for k in keep):
                    session.close()
        self._by_threads = {}


def search(
    pool: SessionPool,
    feeds: Mapping[str, np.ndarray],
    cores: int,
    request: PlanRequest,
    clock: Callable[[], float] = time.time,
) -> MeasuredPlan:
    """Measure every shape of ``shapes(cores, request)`` and return the fastest (see the
    module docstring); ``pool`` then holds sessions of every thread count tried."""
    began = time.perf_counter()
    tried = shapes(cores, request)
    if len(tried) == 1:  # everything is pinned: nothing to measure
        return MeasuredPlan(tried[0], "fixed", cores, search_ms=0.0, at=clock())
    # Two rounds of every shape, a third of the budget left for rounds that disagree.
    window = max(MIN_WINDOW_S, request.search_s / (3 * len(tried)))
    inputs = {b: batch_feeds(feeds, b) for b in {s.batch for s in tried}}
    for shape in tried:  # first runs allocate: not inside any window
        for session in pool.get(shape.threads, shape.instances):
            session.run(inputs[shape.batch])
    samples: dict[PlanShape, list[float]] = {s: [] for s in tried}
    for round_ in range(2):
        for shape in tried if round_ == 0 else reversed(tried):
            sessions = pool.get(shape.threads, shape.instances)
            samples[shape].append(closed_loop(sessions, inputs[shape.batch], window))
    deadline = began + request.search_s + 0.5 * request.search_s / 3
    while time.perf_counter() + window < deadline:
        unsure = [s for s in tried if _spread(samples[s]) > request.disagreement]
        unsure = [s for s in unsure if len(samples[s]) < MAX_ROUNDS]
        if not unsure:
            break
        for shape in unsure:
            if time.perf_counter() + window >= deadline:
                break
            sessions = pool.get(shape.threads, shape.instances)
            samples[shape].append(closed_loop(sessions, inputs[shape.batch], window))
    figures = {s.label: round(statistics.median(v), 1) for s, v in samples.items()}
    best = max(figures.values())
    near = [s for s in tried if figures[s.label] >= best * (1 - TIE)]
    chosen = min(near, key=lambda s: (s.batch, -s.threads))
    return MeasuredPlan(
        chosen,
        "search",
        cores,
        figures,
        {s.label: len(v) for s, v in samples.items()},
        round((time.perf_counter() - began) * 1000, 1),
        clock(),
    )


def _spread(values: list[float]) -> float:
    """How far a shape's rounds disagree: (max − min) / median."""
    if len(values) < 2:
        return 0.0
    middle = statistics.median(values)
    return (max(values) - min(values)) / middle if middle > 0 else 0.0
