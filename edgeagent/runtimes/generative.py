"""The contract of a generative (language model) runtime plugin, beside the tensor contract.

A tensor runtime answers one ``run`` per batch; a language model is driven one step at a time
by the engine's continuous-batching scheduler, which must be able to add a sequence to the
running batch at any step and drop one at any step. So the contract is the one llama.cpp's own
server is written against: tokenize, one ``step`` that feeds several sequences' tokens (prompt
chunks and single decode tokens together) and returns each one's next-token logits, ``free`` a
sequence's KV cache, and the KV memory in use. Sampling, stop conditions and scheduling live
above it, written once for every runtime.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class GenerativeLoadRequest:
    """Everything needed to place one language-model variant on one device.

    ``context`` is the KV-cache length in tokens shared by all sequences (llama.cpp's
    ``n_ctx``); ``sequences`` how many sequences may hold KV cache at once (``n_seq_max``);
    ``batch_tokens`` the most tokens one ``step`` may feed (``n_batch``).
    """

    files: tuple[Path, ...]
    device: str = "CPU"
    context: int = 4096
    sequences: int = 8
    batch_tokens: int = 512
    threads: int | None = None
    embedding: bool = False
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SequenceInput:
    """What one ``step`` feeds one sequence: its next tokens, at positions from ``position``.

    A new sequence's prompt comes in one or more chunks; a running sequence gets the one token
    it sampled last. Logits are returned for the last token of each input.
    """

    sequence: int  # 0 ≤ sequence < sequences of the load request
    tokens: tuple[int, ...]
    position: int  # the position of tokens[0] in the sequence (tokens already cached before it)


@dataclass(frozen=True)
class ModelFacts:
    """What the loaded file says about itself (GGUF metadata or the equivalent)."""

    architecture: str
    context_trained: int  # the context length the model was trained with
    vocabulary: int
    parameters: int  # count, for /api/show and the memory estimate
    size_bytes: int  # the weights' size on the device
    chat_template: str | None  # Jinja2 source, None when the file has none
    bos_token: str
    eos_token: str
    quantization: str  # e.g. "Q4_1"; "" when not a quantized file
    embedding_length: int


class GenerativeSession(ABC):
    """One language-model variant loaded on one device; driven by one thread at a time."""

    facts: ModelFacts
    context: int  # KV-cache tokens in total (all sequences together)
    sequences: int

    @abstractmethod
    def tokenize(self, text: str, *, add_special: bool, parse_special: bool = True) -> list[int]:
        """Token ids of ``text``; ``add_special`` adds the model's BOS where it uses one."""

    @abstractmethod
    def piece(self, token: int) -> bytes:
        """The bytes of one token (a multi-byte character may span several tokens)."""

    @abstractmethod
    def is_end(self, token: int) -> bool:
        """True for every end-of-generation token (EOS, EOT, <|im_end|> …) of the model."""

    @abstractmethod
    def step(self, inputs: Sequence[SequenceInput]) -> dict[int, np.ndarray]:
        """Feed every input in one batch; each sequence's next-token logits (float32, vocab)."""

    @abstractmethod
    def free(self, sequence: int) -> None:
        """Drop a sequence's KV cache (all positions); the slot can be reused at once."""

    @abstractmethod
    def copy_prefix(self, source: int, target: int, length: int) -> None:
        """Share ``source``'s first ``length`` cached positions with ``target`` (prefix cache)."""

    @abstractmethod
    def kv_bytes(self) -> tuple[int, int]:
        """KV-cache bytes (in use, allocated) on the device, for the budget and the gauges."""

    def embed(self, tokens: Sequence[int]) -> np.ndarray:
        """The pooled embedding of ``tokens`` (embedding models only)."""
        raise NotImplementedError(f"{self.facts.architecture} is not loaded as an embedding model")

    @abstractmethod
    def close(self) -> None:
        """Free the model and its KV cache."""


@dataclass(frozen=True)
class GenerationSpec:
    """One whole generation for a ``GeneratingSession``: the prompt and how to sample."""

    prompt: tuple[int, ...]
    max_tokens: int
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None


@dataclass(frozen=True)
class Produced:
    """What one ``advance`` gave one sequence: its new tokens (an end token included when
    the runtime ended on one) and their text, whole UTF-8 characters only (a character split
    over tokens comes with the token that completes it)."""

    tokens: tuple[int, ...]
    text: bytes
    finished: bool  # the runtime ended it (an end token or max_tokens); free() it next


class GeneratingSession(GenerativeSession):
    """A session whose runtime samples itself (no per-step logits): driven by whole
    generations. ``step`` and ``copy_prefix`` are refused; prefix caching is the runtime's."""

    def step(self, inputs: Sequence[SequenceInput]) -> dict[int, np.ndarray]:
        raise NotImplementedError(
            f"{type(self).__name__} samples inside its runtime: it gives no logits to step"
        )

    def copy_prefix(self, source: int, target: int, length: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} caches prefixes itself")

    @abstractmethod
    def begin(self, sequence: int, spec: GenerationSpec) -> None:
        """Start a generation on a free ``sequence``; its tokens come from ``advance``."""

    @abstractmethod
    def advance(self) -> dict[int, Produced]:
        """One step of every begun generation; what each produced (absent: nothing yet)."""

    def log_likelihoods(self, tokens: Sequence[int]) -> np.ndarray:
        """Each token's log-probability given the ones before it (len(tokens) - 1 values),
        for perplexity; runtimes that cannot score a text leave it unimplemented."""
        raise NotImplementedError(f"{type(self).__name__} cannot score a text")


class GenerativeRuntime(ABC):
    """A plugin that loads language models (llama.cpp, OpenVINO GenAI …)."""

    name: str

    @abstractmethod
    def version(self) -> str: ...

    @abstractmethod
    def devices(self) -> list[str]:
        """Devices this build can place a model on, in the runtime's own words (CPU, CUDA0 …)."""

    @abstractmethod
    def load(self, request: GenerativeLoadRequest) -> GenerativeSession:
        """Load or raise ``RuntimeLoadError`` with the runtime's reason (and the numbers)."""
