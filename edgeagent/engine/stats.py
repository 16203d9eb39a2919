"""Per-version counters in the shape of the v2 statistics extension (Triton's).

Kept apart from the Prometheus metrics: these are the numbers ``/v2/models/{name}/stats`` shows
and a canary is judged on, owned by one loaded version and gone with it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def to_json(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class _BatchStat:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


class ModelStats:
    """Counters of one model version in the shape of the v2 statistics extension (Triton's).

    Written from the event loop and read by the HTTP handler, guarded by a lock because a
    snapshot must never show a batch half-counted.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.last_inference_ms = 0
        self.inference_count = 0  # rows answered
        self.execution_count = 0  # batches run
        self.success = Duration()
        self.fail = Duration()
        self.queue = Duration()
        self.compute_input = Duration()
        self.compute_infer = Duration()
        self.compute_output = Duration()
        self.cache_hit = Duration()
        self.cache_miss = Duration()
        self.server_faults = 0
        self._batches: dict[int, _BatchStat] = {}

    def record_batch(
        self, rows: int, requests: int, input_ns: int, infer_ns: int, output_ns: int
    ) -> None:
        """One executed batch of ``rows`` rows from ``requests`` requests."""
        with self._lock:
            self.execution_count += 1
            self.inference_count += rows
            self.last_inference_ms = int(time.time() * 1000)
            self.compute_input.add(input_ns, requests)
            self.compute_infer.add(infer_ns, requests)
            self.compute_output.add(output_ns, requests)
            stat = self._batches.setdefault(rows, _BatchStat())
            stat.compute_input.add(input_ns)
            stat.compute_infer.add(infer_ns)
            stat.compute_output.add(output_ns)

    def record_request(
        self, ok: bool, total_ns: int, queue_ns: int | None = None, *, server_fault: bool = False
    ) -> None:
        """One answered or failed request; ``server_fault`` marks failures that are the
        model's or device's doing (run errors, missed deadlines), not the client's."""
        with self._lock:
            (self.success if ok else self.fail).add(total_ns)
            if queue_ns is not None:
                self.queue.add(queue_ns)
            if server_fault:
                self.server_faults += 1

    def health(self) -> tuple[int, int, int]:
        """(answered, their total ns, server faults): what a canary is judged on."""
        with self._lock:
            return self.success.count, self.success.ns, self.server_faults

    def record_cache(self, hit: bool, ns: int) -> None:
        with self._lock:
            (self.cache_hit if hit else self.cache_miss).add(ns)
            if hit:
                self.last_inference_ms = int(time.time() * 1000)

    def to_v2(self, name: str, version: str) -> dict:
        """One entry of ``model_stats`` in ``GET /v2/models/{name}/stats``."""
        with self._lock:
            return {
                "name": name,
                "version": version,
                "last_inference": self.last_inference_ms,
                "inference_count": self.inference_count,
                "execution_count": self.execution_count,
                "inference_stats": {
                    "success": self.success.to_json(),
                    "fail": self.fail.to_json(),
                    "queue": self.queue.to_json(),
                    "compute_input": self.compute_input.to_json(),
                    "compute_infer": self.compute_infer.to_json(),
                    "compute_output": self.compute_output.to_json(),
                    "cache_hit": self.cache_hit.to_json(),
                    "cache_miss": self.cache_miss.to_json(),
                },
                "batch_stats": [
                    {
                        "batch_size": size,
                        "compute_input": stat.compute_input.to_json(),
                        "compute_infer": stat.compute_infer.to_json(),
                        "compute_output": stat.compute_output.to_json(),
                    }
                    for size, stat in sorted(self._batches.items())
                ],
            }
