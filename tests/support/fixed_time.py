"""A simulated device for batcher and scheduler tests: every batch takes a fixed time.

Fast enough for unit tests (no model runs), and it records what the tests assert on: how many
batches it ran, how many threads were inside ``run`` at once (an instance must never be entered
twice), and, when given a list, when each batch ran. Its answer is the batch's first input value
in every output row, so a test sees which request's rows came back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

import numpy as np

from edgeagent.runtimes.base import Session, TensorInfo

Interval = tuple[str, float, float]  # (session name, began, ended), perf_counter seconds


class FixedTimeSession(Session):
    """Every batch takes ``service_s`` (or, with ``hold``, until the event is set)."""

    runtime, precision = "fake", "fp32"

    def __init__(
        self,
        device: str = "SIM",
        service_s: float = 0.05,
        *,
        name: str | None = None,
        hold: threading.Event | None = None,
        intervals: list[Interval] | None = None,
    ) -> None:
        self.device = device
        self.service_s = service_s
        self.name = name or device
        self.hold = hold
        self.intervals = intervals
        self.batches = 0
        self.inside = 0  # threads inside run() now
        self.max_inside = 0
        self._lock = threading.Lock()

    @property
    def inputs(self) -> list[TensorInfo]:
        return [TensorInfo("input", "float32", (-1, 3, 8, 8))]

    @property
    def outputs(self) -> list[TensorInfo]:
        return [TensorInfo("logits", "float32", (-1, 4))]

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self._lock:
            self.inside += 1
            self.max_inside = max(self.max_inside, self.inside)
        began = time.perf_counter()
        if self.hold is None:
            time.sleep(self.service_s)  # the simulated device computing
        else:
            assert self.hold.wait(10), "the test never released the device"
        with self._lock:
            self.inside -= 1
            self.batches += 1
            if self.intervals is not None:
                self.intervals.append((self.name, began, time.perf_counter()))
        rows = len(feeds["input"])
        return {"logits": np.full((rows, 4), float(feeds["input"][0, 0, 0, 0]), np.float32)}
