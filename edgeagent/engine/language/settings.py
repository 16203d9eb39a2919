"""[llm]: the language-model engine's limits (KV cache, sequences, queue, token caps)."""

from __future__ import annotations

from dataclasses import dataclass

from edgeagent.sections import require, setting


@dataclass(frozen=True)
class LanguageSettings:
    """Every limit that protects the device from a language model's memory and time."""

    context: int = setting(
        4096,
        "KV-cache tokens shared by a model's sequences; one sequence's prompt + answer may use "
        "at most this (or the model's trained context, if smaller); a longer prompt gets 400",
        "tokens",
    )
    sequences: int = setting(8, "sequences generated at once per model (continuous batching)")
    cache_mib: int = setting(
        256,
        "most KV-cache memory per model; the usable context is the smaller of context and what "
        "fits in this",
        "MiB",
    )
    max_tokens: int = setting(
        2048, "most tokens a request may ask to generate; above it the request gets 400", "tokens"
    )
    default_max_tokens: int = setting(
        512, "tokens generated when a request sets no max_tokens", "tokens"
    )
    queue: int = setting(
        64, "requests waiting for a sequence per model; beyond it 429 with Retry-After"
    )
    prefill_chunk: int = setting(
        256,
        "prompt tokens fed per decode step across sequences, so running streams keep flowing "
        "while a long prompt is read",
        "tokens",
    )
    threads: int = setting(0, "CPU threads per model; 0 = the device profile's, else every core")

    def validate(self) -> None:
        require(16 <= self.context <= 1 << 20, "llm", "context", "must be 16 to 1048576 tokens")
        require(1 <= self.sequences <= 256, "llm", "sequences", "must be 1 to 256")
        require(1 <= self.cache_mib <= 1 << 20, "llm", "cache_mib", "must be 1 to 1048576 MiB")
        require(self.max_tokens >= 1, "llm", "max_tokens", "must be at least 1")
        require(
            1 <= self.default_max_tokens <= self.max_tokens,
            "llm",
            "default_max_tokens",
            "must be between 1 and max_tokens",
        )
        require(self.queue >= 1, "llm", "queue", "must be at least 1")
        require(1 <= self.prefill_chunk <= 8192, "llm", "prefill_chunk", "must be 1 to 8192")
        require(0 <= self.threads <= 256, "llm", "threads", "must be 0 (auto) to 256")
