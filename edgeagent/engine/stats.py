"""Per-version counters in the shape of the v2 statistics extension (Triton's).

Kept apart from the Prometheus metrics: these are the numbers ``/v2/models/{name}/stats`` shows
and a canary is judged on, owned by one loaded version and gone with it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np


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


class LatencyRing:
    """The service times (ns) of the last ``size`` answered requests, for a canary's p99.

    A preallocated list written in a circle: one store per request on the hot path, bounded
    memory however long a version serves; the percentile is computed (numpy) only when a
    canary is judged. ``count`` never wraps, so it doubles as a mark of "from here on".
    """

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"a latency ring needs at least one slot, got {size}")
        self._samples = [0] * size
        self.count = 0

    def add(self, ns: int) -> None:
        self._samples[self.count % len(self._samples)] = ns
        self.count += 1

    def since(self, mark: int) -> np.ndarray:
        """The samples recorded after ``count`` was ``mark`` — the newest ``size`` of them."""
        size = len(self._samples)
        wanted = min(self.count - mark, size)
        if wanted <= 0:
            return np.empty(0, dtype=np.int64)
        end = self.count % size
        start = end - wanted
        if start >= 0:
            return np.array(self._samples[start:end], dtype=np.int64)
        return np.array(self._samples[start:] + self._samples[:end], dtype=np.int64)


DEFAULT_LATENCY_SAMPLES = 2048


class ModelStats:
    """Counters of one model version in the shape of the v2 statistics extension (Triton's).

    Written from the event loop and read by the HTTP handler, guarded by a lock because a
    snapshot must never show a batch half-counted. Answered requests' latencies also go into
    bounded rings (``latency_samples`` each): their service times, which a canary's p99 is
    taken from, and the latencies a client saw, which ``traffic`` summarises for the fleet.
    """

    def __init__(self, latency_samples: int = DEFAULT_LATENCY_SAMPLES) -> None:
        self._lock = threading.Lock()
        self._latencies = LatencyRing(latency_samples)
        self._answered = LatencyRing(latency_samples)  # what clients saw, cache hits included
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
        self,
        ok: bool,
        total_ns: int,
        queue_ns: int | None = None,
        *,
        server_fault: bool = False,
        service_ns: int | None = None,
    ) -> None:
        """One answered or failed request; ``server_fault`` marks failures that are the
        model's or device's doing (run errors, missed deadlines), not the client's.

        ``service_ns`` (its batch's compute on the worker thread, without queue, gate or
        executor wait; default ``total_ns``) goes into the latency ring: a canary shares the
        device and the worker threads with the stable version, so a slow canary would slow
        the stable version's total latency as well and hide itself in the ratio.
        """
        with self._lock:
            (self.success if ok else self.fail).add(total_ns)
            if ok:
                self._latencies.add(total_ns if service_ns is None else service_ns)
                self._answered.add(total_ns)
            if queue_ns is not None:
                self.queue.add(queue_ns)
            if server_fault:
                self.server_faults += 1

    def health(self) -> tuple[int, int, int]:
        """(answered, their total ns, server faults): what a canary is judged on."""
        with self._lock:
            return self.success.count, self.success.ns, self.server_faults

    def latency_mark(self) -> int:
        """A mark for ``latencies_since``: answered requests counted so far."""
        with self._lock:
            return self._latencies.count

    def latencies_since(self, mark: int) -> np.ndarray:
        """Latencies (ns) of the requests answered after ``mark`` (bounded by the ring)."""
        with self._lock:
            return self._latencies.since(mark)

    def record_cache(self, hit: bool, ns: int) -> None:
        with self._lock:
            (self.cache_hit if hit else self.cache_miss).add(ns)
            if hit:
                self.last_inference_ms = int(time.time() * 1000)
                self._answered.add(ns)

    def traffic(self) -> dict[str, int | float | None]:
        """What the fleet sees of this version: requests and failures since it loaded
        (counters, so the hub takes rates from two reports) and the p50 / p95 latency in ms
        of the newest answered requests (at most ``latency_samples``; None before any)."""
        with self._lock:
            requests = self.success.count + self.fail.count + self.cache_hit.count
            errors = self.fail.count
            recent = self._answered.since(0)
        if not len(recent):
            return {"requests": requests, "errors": errors, "p50_ms": None, "p95_ms": None}
        p50, p95 = np.percentile(recent, [50, 95]) / 1e6
        return {
            "requests": requests,
            "errors": errors,
            "p50_ms": round(float(p50), 3),
            "p95_ms": round(float(p95), 3),
        }

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
