"""The engine's telemetry: Prometheus metric objects and the per-version v2 statistics.

Every metric lives on a CollectorRegistry that the daemon creates once and hands to each part,
never on prometheus_client's global registry: several daemons (tests) can then live in one
process, and /metrics shows exactly what this agent registered.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)

from edgeagent import __version__
from edgeagent.runtimes import runtime_status

# Latency buckets from 0.5 ms (a tiny model on a desktop CPU) to 10 s (a cold accelerator).
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.004,
    0.008,
    0.016,
    0.032,
    0.064,
    0.128,
    0.256,
    0.512,
    1.0,
    2.5,
    5.0,
    10.0,
)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


def new_registry() -> CollectorRegistry:
    """The daemon's one registry, with process metrics (RSS, CPU, fds) and Python's own."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    register_build_info(registry)
    return registry


def register_build_info(registry: CollectorRegistry) -> None:
    """``edgeagent_build_info{version, onnxruntime, litert, openvino} 1``: what this agent is.

    One label per runtime with its installed version ("" when not installed), read from package
    metadata so no runtime is imported for it.
    """
    runtimes = runtime_status(load=False)
    versions = {name: str(info.get("version", "")) for name, info in runtimes.items()}
    info = Gauge(
        "edgeagent_build_info",
        "Always 1; the labels are the agent's version and each runtime's installed version",
        ["version", *versions],
        registry=registry,
    )
    info.labels(__version__, *versions.values()).set(1)


class EngineMetrics:
    """Serving metrics, labelled per model, version and backend (runtime:device:precision)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "edgeagent_inference_requests_total",
            "Inference requests answered, by model, version and backend",
            ["model", "version", "backend"],
            registry=registry,
        )
        self.errors = Counter(
            "edgeagent_inference_errors_total",
            "Inference requests that failed, by kind (invalid_input, queue_full, throttled, "
            "deadline, not_ready, failed)",
            ["model", "kind"],
            registry=registry,
        )
        self.latency = Histogram(
            "edgeagent_inference_latency_seconds",
            "Time from enqueue to answer of one request in the engine",
            ["model", "version", "backend"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.queue_wait = Histogram(
            "edgeagent_queue_wait_seconds",
            "Time a request waited before its batch started",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.compute = Histogram(
            "edgeagent_batch_compute_seconds",
            "Runtime time per batch",
            ["model", "backend"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.batch_size = Histogram(
            "edgeagent_batch_size",
            "Rows per executed batch",
            ["model", "backend"],
            buckets=BATCH_BUCKETS,
            registry=registry,
        )
        self.queue_depth = Gauge(
            "edgeagent_queue_depth",
            "Requests waiting for a batch",
            ["model"],
            registry=registry,
        )
        self.busy = Counter(
            "edgeagent_inference_busy_seconds_total",
            "Seconds the runtime spent computing (its rate is the accelerator's duty cycle)",
            ["model", "backend"],
            registry=registry,
        )
        self.cache_hits = Counter(
            "edgeagent_cache_hits_total", "Result-cache hits", ["model"], registry=registry
        )
        self.cache_misses = Counter(
            "edgeagent_cache_misses_total", "Result-cache misses", ["model"], registry=registry
        )
        self.demotions = Counter(
            "edgeagent_accelerator_demotions_total",
            "Times a candidate (runtime:device:precision) was demoted for failing, by model",
            ["model", "candidate"],
            registry=registry,
        )
        self.loaded = Gauge(
            "edgeagent_model_loaded",
            "1 for each model version that takes traffic, with the backend it runs on",
            ["model", "version", "runtime", "device", "precision"],
            registry=registry,
        )


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
