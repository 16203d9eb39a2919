"""A language model's golden record (golden.json) and the two measures that judge a model by it.

``edgeagent package`` writes the record; the updater's health check replays it on the device.
Both must drive the model the same way, so the drive lives here once, on the generative
runtime contract (any runtime): greedy decoding of the golden prompts from their recorded
prompt token ids (the chat template was rendered once, at packaging: the check is about the
model's arithmetic, not about a template renderer), and perplexity on a held-out text.

The record, per variant (``llama_cpp/q4_1``): each prompt's greedy token ids and the decode
tokens/s measured at packaging; for the package: the prompts (chat messages, rendered text,
token ids), the held-out text with each variant's perplexity.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgeagent.runtimes.generative import (
    GeneratingSession,
    GenerationSpec,
    GenerativeSession,
    SequenceInput,
)

FORMAT = 1
GOLDEN_FILE = "golden.json"
PREFILL_CHUNK = 256  # prompt tokens per step: at most a load request's batch_tokens


class TextGoldenError(ValueError):
    """golden.json cannot be read, or lacks what the check needs; the message names both."""


@dataclass(frozen=True)
class GoldenPrompt:
    messages: tuple[Mapping[str, str], ...]  # the chat, as a client would send it
    prompt: str  # rendered by the model's own chat template
    prompt_tokens: tuple[int, ...]
    tokens: Mapping[str, tuple[int, ...]]  # variant key → its greedy continuation


@dataclass(frozen=True)
class TextGolden:
    max_tokens: int  # greedy tokens per prompt
    prompts: tuple[GoldenPrompt, ...]
    heldout_tokens: tuple[int, ...]
    perplexity: Mapping[str, float]  # variant key → perplexity on the held-out tokens
    tokens_per_second: Mapping[str, float]  # variant key → decode rate at packaging
    reference: str  # the variant the others were judged against
    threads: int = 0  # threads the rates were measured with (0: the runtime's default)
    heldout: str = field(default="", repr=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "reference": self.reference,
            "max_tokens": self.max_tokens,
            "threads": self.threads,
            "prompts": [
                {
                    "messages": [dict(m) for m in p.messages],
                    "prompt": p.prompt,
                    "prompt_tokens": list(p.prompt_tokens),
                    "tokens": {k: list(v) for k, v in p.tokens.items()},
                }
                for p in self.prompts
            ],
            "heldout": {"text": self.heldout, "tokens": list(self.heldout_tokens)},
            "perplexity": dict(self.perplexity),
            "tokens_per_second": dict(self.tokens_per_second),
        }


def load_text_golden(path: Path) -> TextGolden:
    """The record in ``path``; TextGoldenError naming the file and the field otherwise."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TextGoldenError(f"{path}: not a readable JSON golden record: {exc}") from exc

    def fail(what: str) -> TextGoldenError:
        return TextGoldenError(f"{path}: {what}")

    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise fail(f"format must be {FORMAT} (a language model's golden record)")
    try:
        prompts = tuple(
            GoldenPrompt(
                messages=tuple(dict(m) for m in p["messages"]),
                prompt=str(p["prompt"]),
                prompt_tokens=_ids(p["prompt_tokens"]),
                tokens={str(k): _ids(v) for k, v in p["tokens"].items()},
            )
            for p in data["prompts"]
        )
        golden = TextGolden(
            max_tokens=int(data["max_tokens"]),
            prompts=prompts,
            heldout=str(data["heldout"]["text"]),
            heldout_tokens=_ids(data["heldout"]["tokens"]),
            perplexity={str(k): float(v) for k, v in data["perplexity"].items()},
            tokens_per_second={str(k): float(v) for k, v in data["tokens_per_second"].items()},
            reference=str(data["reference"]),
            threads=int(data.get("threads", 0)),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise fail(f"malformed record ({type(exc).__name__}: {exc})") from exc
    if not prompts or not all(p.prompt_tokens for p in prompts):
        raise fail("no golden prompts (each needs its prompt token ids)")
    if golden.max_tokens < 1:
        raise fail("max_tokens must be at least 1")
    return golden


def _ids(values: Any) -> tuple[int, ...]:
    if not isinstance(values, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values
    ):
        raise ValueError("token ids must be a list of non-negative integers")
    return tuple(values)


@dataclass(frozen=True)
class Greedy:
    tokens: tuple[int, ...]
    decode_s: float  # time spent on the decode steps (after the prompt), for tokens/s


def _prefill(session: GenerativeSession, sequence: int, tokens: Sequence[int]) -> np.ndarray:
    """Feed ``tokens`` from position 0 in chunks; the logits after the last one."""
    logits: np.ndarray | None = None
    for start in range(0, len(tokens), PREFILL_CHUNK):
        chunk = tuple(tokens[start : start + PREFILL_CHUNK])
        logits = session.step([SequenceInput(sequence, chunk, start)])[sequence]
    if logits is None:
        raise ValueError("an empty prompt has no continuation")
    return logits


def greedy(
    session: GenerativeSession, prompt: Sequence[int], count: int, sequence: int = 0
) -> Greedy:
    """The ``count`` most likely next tokens one after the other (argmax), up to an end token.

    The sequence's KV cache is freed afterwards whatever happens, so it can be called again.
    A runtime that samples itself is asked for the greedy generation whole.
    """
    if isinstance(session, GeneratingSession):
        return _greedy_generation(session, prompt, count, sequence)
    tokens: list[int] = []
    decode_s = 0.0
    try:
        logits = _prefill(session, sequence, prompt)
        position = len(prompt)
        while len(tokens) < count:
            token = int(np.argmax(logits))
            tokens.append(token)
            if session.is_end(token) or len(tokens) == count:
                break
            started = time.perf_counter()
            logits = session.step([SequenceInput(sequence, (token,), position)])[sequence]
            decode_s += time.perf_counter() - started
            position += 1
    finally:
        session.free(sequence)
    return Greedy(tuple(tokens), decode_s)


def _greedy_generation(
    session: GeneratingSession, prompt: Sequence[int], count: int, sequence: int
) -> Greedy:
    """Greedy through ``begin``/``advance``; the decode time runs from the first token on."""
    tokens: list[int] = []
    first = last = 0.0
    session.begin(sequence, GenerationSpec(tuple(prompt), count))
    try:
        # every step after the prompt's yields a token; the prompt takes a few at most
        for _ in range(len(prompt) + count + 2):
            got = session.advance().get(sequence)
            if got is None:
                continue
            now = time.perf_counter()
            if got.tokens:
                first = first or now
                last = now
                tokens.extend(got.tokens)
            if got.finished or len(tokens) >= count:
                break
        else:
            raise RuntimeError(f"no end of the greedy generation after {len(tokens)} tokens")
    finally:
        session.free(sequence)
    return Greedy(tuple(tokens[:count]), last - first)


def perplexity(session: GenerativeSession, tokens: Sequence[int], sequence: int = 0) -> float:
    """exp(mean negative log-likelihood) of each token given the ones before it.

    The contract returns logits for the last token an input feeds, so the text goes one token
    a step: n-1 decode steps, a few seconds for 300 tokens of a small model.
    """
    if len(tokens) < 2:
        raise ValueError("perplexity needs at least two tokens")
    if isinstance(session, GeneratingSession):  # it scores the whole text at once
        return math.exp(-float(np.mean(session.log_likelihoods(tokens))))
    total = 0.0
    try:
        for position, (token, following) in enumerate(itertools.pairwise(tokens)):
            logits = session.step([SequenceInput(sequence, (token,), position)])[sequence]
            row = logits.astype(np.float64)
            peak = float(row.max())
            log_sum = peak + math.log(float(np.exp(row - peak).sum()))
            total += log_sum - float(row[following])
    finally:
        session.free(sequence)
    return math.exp(total / (len(tokens) - 1))


def agreement(reference: Sequence[int], variant: Sequence[int]) -> float:
    """The share of the reference's greedy tokens the variant repeats before they first differ.

    Prefix agreement, not position-wise: after a first different token the two continue
    different texts, and equal tokens further on would be chance.
    """
    if not reference:
        return 1.0 if not variant else 0.0
    same = 0
    for expected, got in zip(reference, variant, strict=False):
        if expected != got:
            break
        same += 1
    return same / len(reference)


@dataclass(frozen=True)
class Replay:
    """One variant's answers to the golden prompts, and its decode rate while answering."""

    tokens: tuple[tuple[int, ...], ...]
    tokens_per_second: float


def replay(session: GenerativeSession, golden: TextGolden) -> Replay:
    """Greedy continuations of every golden prompt, as the record's ``max_tokens`` asks."""
    return answer_all(session, [p.prompt_tokens for p in golden.prompts], golden.max_tokens)


def answer_all(
    session: GenerativeSession, prompts: Sequence[Sequence[int]], count: int, sequence: int = 0
) -> Replay:
    """Greedy continuations of ``prompts`` (on ``sequence``) and the decode rate over all."""
    answers = [greedy(session, prompt, count, sequence) for prompt in prompts]
    steps = sum(max(0, len(a.tokens) - 1) for a in answers)
    seconds = sum(a.decode_s for a in answers)
    rate = steps / seconds if seconds > 0 else 0.0
    return Replay(tuple(a.tokens for a in answers), rate)


def replay_problem(golden: TextGolden, variant: str, answer: Replay, floor: float) -> str:
    """Why ``answer`` breaks the record of ``variant``, or "": every prompt's greedy tokens
    equal to the record, and the decode rate at least ``floor`` × the recorded one."""
    for index, (prompt, got) in enumerate(zip(golden.prompts, answer.tokens, strict=False)):
        expected = prompt.tokens.get(variant)
        if expected is None:
            return f"the golden record has no greedy tokens of {variant} (prompt {index})"
        if tuple(got) != tuple(expected):
            same = round(agreement(expected, got) * len(expected))
            return (
                f"golden prompt {index}: greedy tokens {list(got)} differ from the record "
                f"{list(expected)} after {same} of {len(expected)}"
            )
    recorded = golden.tokens_per_second.get(variant, 0.0)
    if floor > 0 and recorded > 0 and answer.tokens_per_second < floor * recorded:
        return (
            f"decodes {answer.tokens_per_second:.1f} tokens/s, below {floor:g} × the "
            f"{recorded:.1f} tokens/s recorded at packaging"
        )
    return ""
