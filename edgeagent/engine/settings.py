"""[server] engine keys: queues, deadlines, batching, cache, workers, warm-up, canary.

They share the [server] table with the listener keys (``edgeagent.api.settings``) so existing
config files keep working; this class owns them because the engine, not a transport, uses them.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgeagent.sections import require


@dataclass(frozen=True)
class EngineSettings:
    """The serving engine's limits and knobs; None = the model package's [serving] value."""

    max_queue: int = 64  # queued requests per model before 429
    request_timeout_s: float = 10.0  # per-request deadline when the client sets none
    drain_timeout_s: float = 10.0  # on shutdown/hot swap: longest wait for in-flight requests
    max_batch_size: int | None = None  # rows merged into one batch
    max_queue_delay_ms: float | None = None  # longest wait for a batch to fill
    # Wait for a batch to fill only after a batch that served several requests (a lone client
    # is never delayed); false = always wait max_queue_delay_ms, like Triton.
    adaptive_batching: bool = True
    cache_size: int | None = None  # result-cache entries per model (0 disables)
    worker_threads: int = 4  # inference threads shared by all models (one batch per model)
    default_priority: int = 2  # priority of requests that give none (1 = most urgent)
    warmup: bool = True  # run one inference before a model (version) takes traffic
    # Canary (ModelRegistry.canary): judged after this many answered requests; rolled back when
    # its server-side failure rate or its mean latency against the stable version is above.
    canary_min_requests: int = 50
    canary_max_error_rate: float = 0.02
    canary_max_latency_ratio: float = 1.5

    def validate(self) -> None:
        require(self.max_queue > 0, "server", "max_queue", "must be positive")
        require(self.request_timeout_s > 0, "server", "request_timeout_s", "must be positive")
        require(self.drain_timeout_s >= 0, "server", "drain_timeout_s", "must not be negative")
        require(
            self.max_batch_size is None or self.max_batch_size >= 1,
            "server",
            "max_batch_size",
            "must be at least 1",
        )
        require(
            self.max_queue_delay_ms is None or self.max_queue_delay_ms >= 0,
            "server",
            "max_queue_delay_ms",
            "must not be negative",
        )
        require(
            self.cache_size is None or self.cache_size >= 0,
            "server",
            "cache_size",
            "must not be negative",
        )
        require(self.worker_threads >= 1, "server", "worker_threads", "must be at least 1")
        require(self.default_priority >= 1, "server", "default_priority", "must be at least 1")
        require(
            self.canary_min_requests >= 1, "server", "canary_min_requests", "must be at least 1"
        )
        require(
            0 <= self.canary_max_error_rate <= 1,
            "server",
            "canary_max_error_rate",
            "must be between 0 and 1",
        )
        require(
            self.canary_max_latency_ratio >= 1,
            "server",
            "canary_max_latency_ratio",
            "must be at least 1",
        )
