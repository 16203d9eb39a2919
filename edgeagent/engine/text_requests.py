"""What a transport asks of a language model, in the engine's words (OpenAI, Ollama → these).

The OpenAI and Ollama routes only translate their JSON into these types and the chunks back,
as the v2 routes do with ``engine/requests.py``: every decision (the chat template, the token
limits, sampling, stop strings, the queue and the KV-cache budget) is made once below them, so
the two APIs can never disagree about a model.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

ROLES = ("system", "user", "assistant", "tool")
FINISH_STOP = "stop"  # an end-of-generation token or a stop string
FINISH_LENGTH = "length"  # max_tokens, or the context ran out


@dataclass(frozen=True)
class ChatMessage:
    role: str  # one of ROLES; anything else is refused with InvalidInput
    content: str


@dataclass(frozen=True)
class Sampling:
    """Per-request sampling; None means the engine's default ([llm] keys)."""

    # None = [llm] default_max_tokens; above [llm] max_tokens: refused
    max_tokens: int | None = None
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None  # same seed, same prompt, same model → same text
    stop: tuple[str, ...] = ()  # generation ends before any of these strings; never in the text


@dataclass(frozen=True)
class GenerationRequest:
    """A chat (``messages``, rendered by the model's own template) or a raw ``prompt``."""

    model: str
    messages: tuple[ChatMessage, ...] | None = None
    prompt: str | None = None
    sampling: Sampling = field(default_factory=Sampling)
    priority: int | None = None  # 1 = most urgent; None = [server] default_priority
    timeout_s: float | None = None  # None = [server] request_timeout_s


@dataclass(frozen=True)
class TextChunk:
    """New text since the previous chunk: whole characters, stop strings held back."""

    text: str
    tokens: int  # generated tokens this chunk accounts for


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    first_token_s: float  # time to first token, from admission
    total_s: float


class Generation(Protocol):
    """One running generation: iterate its chunks; ``aclose()`` (or a dropped client) frees its
    sequence within one decode step. ``finish_reason`` and ``usage`` are set once it ends."""

    finish_reason: str | None
    usage: Usage | None

    def __aiter__(self) -> AsyncIterator[TextChunk]: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class LanguageModelInfo:
    """What ``/v1/models``, ``/api/tags`` and ``/api/show`` say of a served language model."""

    name: str
    version: str
    task: str  # "text-generation" or "embedding"
    runtime: str
    device: str
    architecture: str
    parameters: int
    quantization: str
    size_bytes: int
    context: int  # tokens a sequence may hold (prompt + answer)
    digest: str  # sha256 of the served file
    modified: float  # the package's mtime, seconds since the epoch
    chat_template: str | None


@dataclass(frozen=True)
class Embeddings:
    vectors: tuple[tuple[float, ...], ...]
    prompt_tokens: int
