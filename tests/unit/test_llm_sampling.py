"""Sampling (engine/language/sampling.py): greedy is argmax, a seed reproduces a draw, top-k
and top-p keep exactly the tokens they should."""

from __future__ import annotations

import numpy as np

from edgeagent.engine.language.sampling import Sampler
from edgeagent.engine.text_requests import Sampling

LOGITS = np.random.default_rng(7).standard_normal(1000).astype(np.float32) * 3


def _draws(sampling: Sampling, count: int = 200) -> list[int]:
    sampler = Sampler(sampling)
    return [sampler(LOGITS) for _ in range(count)]


def test_temperature_zero_and_top_k_one_are_argmax() -> None:
    best = int(np.argmax(LOGITS))
    assert set(_draws(Sampling(temperature=0.0, seed=1), 20)) == {best}
    assert set(_draws(Sampling(temperature=1.5, top_k=1, seed=1), 20)) == {best}


def test_the_same_seed_draws_the_same_tokens_and_another_seed_others() -> None:
    first = _draws(Sampling(temperature=1.0, seed=42))
    assert first == _draws(Sampling(temperature=1.0, seed=42))
    assert first != _draws(Sampling(temperature=1.0, seed=43))
    assert len(set(first)) > 10  # it does sample


def test_top_k_draws_only_among_the_k_largest() -> None:
    top = set(np.argsort(LOGITS)[-5:].tolist())
    draws = _draws(Sampling(temperature=2.0, top_k=5, seed=3), 500)
    assert set(draws) <= top and len(set(draws)) == 5


def test_top_p_keeps_the_smallest_head_reaching_the_mass() -> None:
    probs = np.exp(LOGITS - LOGITS.max())
    probs /= probs.sum()
    order = np.argsort(probs)[::-1]
    head = int(np.searchsorted(np.cumsum(probs[order]), 0.5)) + 1
    ids, kept = Sampler(Sampling(temperature=1.0, top_p=0.5)).candidates(LOGITS)
    assert ids.tolist() == order[:head].tolist()
    assert np.cumsum(probs[order])[head - 2] < 0.5 <= np.cumsum(probs[order])[head - 1]
    assert abs(kept.sum() - 1.0) < 1e-9
    draws = _draws(Sampling(temperature=1.0, top_p=0.5, seed=5), 300)
    assert set(draws) <= set(order[:head].tolist())


def test_temperature_sharpens_and_flattens() -> None:
    _, cold = Sampler(Sampling(temperature=0.2)).candidates(LOGITS)
    _, hot = Sampler(Sampling(temperature=5.0)).candidates(LOGITS)
    assert cold.max() > 0.3 > 0.01 > hot.max()  # the likeliest token's share
