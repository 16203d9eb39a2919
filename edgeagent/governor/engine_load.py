"""How busy the inference engine really is, read from its own Prometheus counters.

The engine counts the seconds its runtimes compute (``edgeagent_inference_busy_seconds_total``)
and the batches it runs (``edgeagent_batch_compute_seconds_count``) on the daemon's shared
registry. Their rates give the device's real duty cycle (what heats it; the simulator's
input) and the mean batch time, which turns the governor's duty cycle into the engine's pacing
knob: batches that take t seconds, started t/d apart, keep the device busy a fraction d.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry

BUSY = "edgeagent_inference_busy_seconds"
BATCHES = "edgeagent_batch_compute_seconds"


def _total(registry: CollectorRegistry, metric: str, sample: str) -> float:
    """The sum of one sample over all label sets (every model and backend)."""
    total = 0.0
    for family in registry.collect():
        if family.name == metric:
            total += sum(s.value for s in family.samples if s.name == sample)
    return total


class EngineLoad:
    def __init__(
        self, registry: CollectorRegistry, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.registry = registry
        self.clock = clock
        self.batch_seconds: float | None = None  # mean batch time, last known
        self._last = self._read()

    def totals(self) -> tuple[float, float]:
        """Busy seconds and batches since the engine started (all models)."""
        busy = _total(self.registry, BUSY, BUSY + "_total")
        return busy, _total(self.registry, BATCHES, BATCHES + "_count")

    def _read(self) -> tuple[float, float, float]:
        return (self.clock(), *self.totals())

    def sample(self) -> float:
        """Utilisation (busy seconds per second, clipped to [0, 1]) since the last sample; also
        updates ``batch_seconds`` when batches ran."""
        now = self._read()
        (t0, busy0, batches0), self._last = self._last, now
        busy, batches = now[1] - busy0, now[2] - batches0
        if batches > 0:
            self.batch_seconds = busy / batches
        elapsed = now[0] - t0
        return 0.0 if elapsed <= 0 else max(0.0, min(1.0, busy / elapsed))
