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


class Sampler:
    """One sequence's sampler: its settings and its own random stream."""

    def __init__(self, sampling: Sampling) -> None:
        self.temperature = sampling.temperature
        self.top_k = sampling.top_k
        self.top_p = sampling.top_p
        self._random = np.random.default_rng(sampling.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0 or self.top_k == 1

    def candidates(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The tokens a draw may pick and their probabilities (top-k, top-p, temperature)."""
        if self.top_k > 0 and self.top_k < logits.size:
            ids = np.argpartition(logits, -self.top_k)[-self.top_k :]
        else:
            ids = np.arange(logits.size)
        values = logits[ids].astype(np.float64)
        order = np.argsort(values)[::-1]
        ids, values = ids[order], values[order]
        if self.top_p < 1.0:
            probs = _softmax(values)
            # keep the smallest head whose mass reaches top_p (at least one token)
            keep = int(np.searchsorted(np.cumsum(probs), self.top_p)) + 1
            ids, values = ids[:keep], values[:keep]
        return ids, _softmax(values / max(self.temperature, 1e-6))

    def __call__(self, logits: np.ndarray) -> int:
        if self.greedy:
            return int(np.argmax(logits))
        ids, probs = self.candidates(logits)
        return int(ids[self._random.choice(ids.size, p=probs)])


def _softmax(values: np.ndarray) -> np.ndarray:
    shifted = np.exp(values - values.max())
    return shifted / shifted.sum()
