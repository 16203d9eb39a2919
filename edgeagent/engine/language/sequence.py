"""One sequence as the scheduler tracks it: its tokens, sampler, text and timings."""

from __future__ import annotations

from dataclasses import dataclass, field

from edgeagent.engine.language.sampling import Sampler
from edgeagent.engine.language.stream import GenerationStream
from edgeagent.engine.language.text import TextAssembler


@dataclass(eq=False)
class SequenceState:
    prompt: list[int]
    max_tokens: int
    sampler: Sampler
    text: TextAssembler
    priority: int
    order: int
    deadline: float | None  # monotonic; the whole generation (None: none)
    admit_by: float  # monotonic; the wait for a slot
    stream: GenerationStream
    reserve: int  # KV tokens held for it: prompt + max_tokens, capped by the context
    slot: int = -1
    fed: int = 0  # positions in its KV cache
    cached_from: int = 0  # prompt tokens shared from another sequence's cache
    generated: list[int] = field(default_factory=list)
    pending_tokens: int = 0  # generated tokens not yet reported in a chunk
    admitted_at: float = 0.0
    first_at: float | None = None
    last_at: float = 0.0

    @property
    def tokens(self) -> list[int]:
        """Its tokens whose KV is cached (the last sampled one is not fed yet)."""
        return (self.prompt + self.generated)[: self.fed]


@dataclass
class StepEvent:
    """What one step produced for one sequence."""

    sequence: SequenceState
    text: str
    finish: str | None
