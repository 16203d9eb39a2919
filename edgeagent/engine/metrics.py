"""The engine's telemetry: Prometheus metric objects (the v2 statistics are in stats.py).

Every metric lives on a CollectorRegistry that the daemon creates once and hands to each part,
never on prometheus_client's global registry: several daemons (tests) can then live in one
process, and /metrics shows exactly what this agent registered.
"""

from __future__ import annotations

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
        self.detections = Counter(
            "edgeagent_detections_total",
            "Objects a detection model reported (after thresholds and NMS), by model",
            ["model"],
            registry=registry,
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
        self.plan = Gauge(
            "edgeagent_execution_plan",
            "Each loaded version's execution plan: instances, threads (per instance), "
            "max_batch_size (rows merged) and rows_per_s (the search's figure for it); "
            "source = search, cached, fixed or default",
            ["model", "version", "source", "field"],
            registry=registry,
        )
        self.instance = Gauge(
            "edgeagent_execution_instance",
            "Each execution instance of a loaded version, by device: service_seconds (EWMA of "
            "its most frequent batch size), batches, share (of the version's batches), in_flight",
            ["model", "version", "instance", "device", "field"],
            registry=registry,
        )
