"""Choosing the next token from a sequence's logits: greedy, temperature, top-k, top-p.

Written once in numpy for every generative runtime, with one random generator per sequence
seeded from the request, so the same seed, prompt and model give the same text whatever
other sequences share the batch (llama.cpp's own samplers hold per-context state instead).
The order is llama.cpp's default chain: top-k, then top-p over the survivors' softmax, then
temperature, then a draw.
"""

from __future__ import annotations

import numpy as np

from edgeagent.engine.text_requests import Sampling

HEAD = 512  # tokens sorted for top-p before falling back to the whole vocabulary


class Sampler:
    """One sequence's sampler: its settings and its own random stream."""

    def __init__(self, sampling: Sampling) -> None:
        self.temperature = sampling.temperature
        self.top_k = sampling.top_k
        self.top_p = sampling.top_p
        self.seed = sampling.seed  # a runtime that samples itself is given it
        self._random = np.random.default_rng(sampling.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0 or self.top_k == 1

    def candidates(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The tokens a draw may pick and their probabilities (top-k, top-p, temperature);
        sorted likeliest first where top-k or top-p needed an order."""
        values = logits.astype(np.float64)
        if 0 < self.top_k < values.size:
            ids = np.argpartition(values, -self.top_k)[-self.top_k :]
            ids = ids[np.argsort(values[ids])[::-1]]
        elif self.top_p < 1.0:
            ids = self._nucleus_order(values)
        else:  # the whole vocabulary: no order needed for a draw
            ids = np.arange(values.size)
        if self.top_p < 1.0:
            probs = _softmax(values[ids])
            # keep the smallest head whose mass reaches top_p (at least one token)
            keep = int(np.searchsorted(np.cumsum(probs), self.top_p)) + 1
            ids = ids[:keep]
        return ids, _softmax(values[ids] / max(self.temperature, 1e-6))

    def _nucleus_order(self, values: np.ndarray) -> np.ndarray:
        """The likeliest tokens, sorted, enough to hold top_p of the mass: the best
        ``HEAD`` when they do (a 49152-token argsort costs milliseconds a step), else all."""
        if values.size > HEAD:
            head = np.argpartition(values, -HEAD)[-HEAD:]
            head = head[np.argsort(values[head])[::-1]]
            shifted = np.exp(values - values[head[0]])
            if shifted[head].sum() >= self.top_p * shifted.sum():
                return head
        return np.argsort(values)[::-1]

    def __call__(self, logits: np.ndarray) -> int:
        if self.greedy:
            return int(np.argmax(logits))
        ids, probs = self.candidates(logits)
        index = int(np.searchsorted(np.cumsum(probs), self._random.random() * probs.sum()))
        return int(ids[min(index, ids.size - 1)])


def _softmax(values: np.ndarray) -> np.ndarray:
    shifted = np.exp(values - values.max())
    return shifted / shifted.sum()
