"""Language-model telemetry on the agent's registry: the latencies users feel and the KV use.

Time to first token (admission → first token), inter-token latency, each generation's decode
rate, the KV cache in use and allocated, and sequences running and waiting, per model — what
``edgeagent status`` and dashboards need to tell "slow model" from "too many clients".
"""

from __future__ import annotations

import contextlib
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from edgeagent.engine.metrics import LATENCY_BUCKETS

RATE_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)


class LanguageMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, ["model"], registry=registry, buckets=buckets)

        def by(label: str, kind: type[Counter] | type[Gauge], name: str, doc: str) -> Any:
            return kind(name, doc, ["model", label], registry=registry)

        self.first_token = histogram(
            "edgeagent_llm_time_to_first_token_seconds",
            "From admission to the first generated token",
            (*LATENCY_BUCKETS, 30.0),
        )
        self.inter_token = histogram(
            "edgeagent_llm_inter_token_seconds",
            "Between consecutive generated tokens of one sequence",
            LATENCY_BUCKETS,
        )
        self.rate = histogram(
            "edgeagent_llm_tokens_per_second",
            "Each generation's decode rate (tokens after the first / their time)",
            RATE_BUCKETS,
        )
        self.tokens = by(
            "kind",
            Counter,
            "edgeagent_llm_tokens",
            "Tokens processed, by kind (prompt, completion, prompt_cached)",
        )
        self.generations = by(
            "outcome",
            Counter,
            "edgeagent_llm_generations",
            "Generations ended, by outcome (stop, length, cancelled, deadline, shed, failed)",
        )
        self.kv_bytes = by(
            "state",
            Gauge,
            "edgeagent_llm_kv_cache_bytes",
            "KV-cache bytes, by state (used by running sequences, cached prefixes, allocated)",
        )
        self.sequences = by(
            "state", Gauge, "edgeagent_llm_sequences", "Sequences, by state (running, waiting)"
        )

    def forget(self, model: str) -> None:
        """Drop an unloaded model's gauges (its histograms keep their history)."""
        for gauge, states in (
            (self.kv_bytes, ("used", "cached", "allocated")),
            (self.sequences, ("running", "waiting")),
        ):
            for state in states:
                with contextlib.suppress(KeyError):
                    gauge.remove(model, state)
