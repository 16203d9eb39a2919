"""How busy the engine is, as numbers rather than metric names: the governor's typed seam.

The governor turns these totals into the device's duty cycle and the mean batch time (its
pacing knob); reading them from here instead of scraping Prometheus samples by name means a
renamed metric cannot silently blind the governor.
"""

from __future__ import annotations

import threading
from typing import Protocol


class LoadSource(Protocol):
    """Totals since the engine started, over every model and backend."""

    def totals(self) -> tuple[float, int]:
        """(seconds the runtimes spent computing, batches run)."""
        ...


class LoadCounter:
    """The engine's LoadSource: every batcher adds each batch it ran."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # read from the governor's thread pool as well
        self._busy_s = 0.0
        self._batches = 0

    def record_batch(self, busy_s: float) -> None:
        with self._lock:
            self._busy_s += busy_s
            self._batches += 1

    def totals(self) -> tuple[float, int]:
        with self._lock:
            return self._busy_s, self._batches
