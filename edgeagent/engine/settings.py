"""[server] engine keys: queues, deadlines, batching, cache, workers, warm-up, canary.

They share the [server] table with the listener keys (``edgeagent.api.settings``) so existing
config files keep working; this class owns them because the engine, not a transport, uses them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from edgeagent.sections import require, setting


@dataclass(frozen=True)
class EngineSettings:
    """The serving engine's limits and knobs; None = the model package's [serving] value."""

    max_queue: int = setting(64, "queued requests per model before 429")
    request_timeout_s: float = setting(10.0, "per-request deadline when the client sets none", "s")
    drain_timeout_s: float = setting(
        10.0, "on shutdown/hot swap: longest wait for in-flight requests", "s"
    )
    max_batch_size: int | None = setting(
        None, "rows merged into one batch; unset = the package's [serving] max_batch_size"
    )
    max_queue_delay_ms: float | None = setting(
        None, "longest wait for a batch to fill; unset = the package's [serving] value", "ms"
    )
    adaptive_batching: bool = setting(
        True,
        "wait for a batch to fill only after a batch that served several requests (a lone "
        "client is never delayed); false = always wait max_queue_delay_ms, like Triton",
    )
    plan: Literal["auto", "fixed"] | None = setting(
        None,
        "execution plan: auto = measure instances x threads x batch on the device after the "
        "version serves (cached with the probe cache), fixed = plan_instances x plan_threads at "
        "max_batch_size; unset = the package's [serving] plan (default auto)",
    )
    plan_instances: int | None = setting(
        None, "execution instances (sessions) per model version; unset = the plan's choice"
    )
    plan_threads: int | None = setting(
        None, "intra-op threads per instance; unset = the plan's choice"
    )
    plan_search_s: float = setting(
        2.0,
        "time the plan search takes for one variant, its loads included, however slow the "
        "model (a slow one measures fewer shapes)",
        "s",
    )
    plan_lone_session: bool = setting(
        True,
        "when the plan runs instances of fewer threads than the cores, keep one session of all "
        "the cores for a request that arrives while every instance is idle (c=1 latency), at "
        "the memory of one more session",
    )
    plan_disagreement: float = setting(
        0.1, "plan search: a shape whose rounds differ more than this is measured again", "ratio"
    )
    cache_size: int | None = setting(
        None, "result-cache entries per model (0 disables); unset = the package's"
    )
    worker_threads: int = setting(4, "inference threads shared by all models (one batch per model)")
    max_image_pixels: int = setting(
        40_000_000,  # models.preprocess.MAX_IMAGE_PIXELS, what local `infer` and packaging use
        "largest image /classify, /detect and DeepStack decode (width x height, read from its "
        "header before decoding); 400 above",
        "pixels",
    )
    max_decoding_pixels: int = setting(
        40_000_000,
        "image pixels decoded at once across all requests (each image reserves its width x "
        "height first; ~3-8 bytes of memory a pixel while decoded and resized); an image that "
        "cannot get its share within request_timeout_s gets 503",
        "pixels",
    )
    default_priority: int = setting(2, "priority of requests that give none (1 = most urgent)")
    warmup: bool = setting(True, "run one inference before a model (version) takes traffic")
    canary_min_requests: int = setting(
        50, "a canary is judged after this many requests (a release's canary may say more)"
    )
    canary_max_error_rate: float = setting(
        0.02, "a canary whose server-side failure rate is above this is rolled back", "ratio"
    )
    canary_max_p99_ratio: float = setting(
        1.5, "a canary whose p99 latency / the stable version's p99 is above this is rolled back"
    )
    max_sequences: int = setting(
        64,
        "live sequences per stateful model version (a stream's state, or for state inside the "
        "runtime a session of its own, is kept per sequence); a sequence_start beyond it gets 429",
    )
    sequence_idle_timeout_s: float = setting(
        60.0,
        "a stateful model's sequence with no request for this long is evicted (its state "
        "dropped) when the model's next request arrives",
        "s",
    )
    latency_samples: int = setting(
        2048,
        "answered-request latencies kept per model version (rings) for a canary's p99 and the "
        "state report's p50/p95",
    )

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
        require(self.max_image_pixels >= 1, "server", "max_image_pixels", "must be at least 1")
        require(
            self.max_decoding_pixels >= self.max_image_pixels,
            "server",
            "max_decoding_pixels",
            "must be at least max_image_pixels (one largest image must fit)",
        )
        for key in ("plan_instances", "plan_threads"):
            value = getattr(self, key)
            require(value is None or 1 <= value <= 256, "server", key, "must be 1 to 256")
        require(
            0 < self.plan_search_s <= 60, "server", "plan_search_s", "must be in (0, 60] seconds"
        )
        require(
            0 < self.plan_disagreement <= 1,
            "server",
            "plan_disagreement",
            "must be in (0, 1]",
        )
        require(
            1 <= self.max_sequences <= 100_000,
            "server",
            "max_sequences",
            "must be between 1 and 100000",
        )
        require(
            self.sequence_idle_timeout_s > 0,
            "server",
            "sequence_idle_timeout_s",
            "must be positive",
        )
        require(self.default_priority >= 1, "server", "default_priority", "must be at least 1")
        require(
            1 <= self.canary_min_requests <= 1_000_000,
            "server",
            "canary_min_requests",
            "must be between 1 and 1000000",
        )
        require(
            0 <= self.canary_max_error_rate <= 1,
            "server",
            "canary_max_error_rate",
            "must be between 0 and 1",
        )
        require(
            1 <= self.canary_max_p99_ratio <= 100,
            "server",
            "canary_max_p99_ratio",
            "must be between 1 and 100",
        )
        require(
            1 <= self.latency_samples <= 1_000_000,
            "server",
            "latency_samples",
            "must be between 1 and 1000000",
        )
